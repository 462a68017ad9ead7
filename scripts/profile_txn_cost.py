"""Per-transaction fixed cost of the apply path: single-row UPDATE transactions vs. 10-row ones.

A measurement, not a test: a throwaway embedded PostgreSQL (``EmbeddedPostgres`` under /var/tmp), a
narrow table (``pgbench_accounts``' shape) of ``--rows`` seeded rows, applied and flushed to a data file
by the ingest bench's apply loop (``mooncake_assets.bench.ingest._OurSide``: ``read_native_batch`` +
``apply_native_batch``, the stream thread's calls) so the updates find their rows through the FileIndex.
Then ``--rows`` updates, one row each, either in ``--rows`` transactions (``per=1``, sysbench's
``oltp_update_non_index`` shape) or in ``--rows/10`` transactions (``per=10``); each is consumed from
its own slot over the same WAL: once without a profiler (CPU seconds of this process, ``time.process_time``)
and once under cProfile (top self/cumulative functions printed). CPU µs per transaction and per row
are printed for each case.

Usage: ``nice .venv/bin/python scripts/profile_txn_cost.py --rows 5000 [--top 35]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import tempfile
from pathlib import Path

import psycopg

from mooncake_assets.bench.common import BenchDatabase
from mooncake_assets.bench.ingest import NARROW_DDL, NARROW_SELECT, _advance_slots, _OurSide
from mooncake_assets.engine.pg import EmbeddedPostgres


def _case(db: BenchDatabase, per: int, rows: int, scratch: Path, top: int) -> dict:
    table, pub = f"u{per}", f"p_u{per}"
    db.execute(NARROW_DDL.format(t=table))
    db.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    slots = [f"s_u{per}_plain", f"s_u{per}_prof"]
    with psycopg.connect(db.dsn, autocommit=True) as c:
        for s in slots:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
    sides = [_OurSide(db.dsn, table, scratch / s) for s in slots]
    db.execute(f"INSERT INTO {table} " + NARROW_SELECT.format(a=1, b=rows))
    for side, s in zip(sides, slots):
        side.consume(s, pub, rows, 300)
        side.table.flush()
    with psycopg.connect(db.dsn, autocommit=True) as c:
        _advance_slots(c, slots, c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        body = f"UPDATE {table} SET abalance = abalance + 1 WHERE aid BETWEEN i * {per} + 1 AND i * {per} + {per}"
        c.execute(f"DO $$ BEGIN FOR i IN 0..{rows // per - 1} LOOP {body}; COMMIT; END LOOP; END $$")
        c.execute(f"INSERT INTO {table} VALUES (2147483647, 0, 0, 'sentinel')")
    # consume() waits for MemSlice rows: the seed was flushed (an empty MemSlice), then every update
    # adds its new version, and the sentinel one more
    expect = rows + 1
    secs, cpu, txns = sides[0].consume(slots[0], pub, expect, 300)
    prof = cProfile.Profile()
    prof.enable()
    psecs, pcpu, ptxns = sides[1].consume(slots[1], pub, expect, 300)
    prof.disable()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    info = sides[0].info(txns)
    return {
        "per": per,
        "transactions": txns,
        "rows": rows,
        "wall_s": secs,
        "cpu_s": cpu,
        "cpu_us_per_txn": cpu / max(txns, 1) * 1e6,
        "cpu_us_per_row": cpu / rows * 1e6,
        "profiled_cpu_s": pcpu,
        "missing_keys": info["missing_keys"],
        "table_error": info["table_error"],
        "profile": out.getvalue(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--per", type=int, nargs="*", default=[1, 10])
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mooncake-prof-pg-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "state")
    pg.start()
    try:
        with BenchDatabase(pg.dsn()) as db:
            for per in a.per:
                r = _case(db, per, a.rows, root / f"scratch{per}", a.top)
                print(f"\n===== per={per} =====")
                print(r.pop("profile"))
                print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()})
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
