"""Where create-table's initial copy spends its time (issue 14 item 4), against ``psql COPY TO STDOUT``.

The bench's narrow table (``bench/ingest.py``: int key, two ints, char(84)), ``ROWS`` rows, copied by
cumulative stages, each timed twice in rotated order (best wall time, and this process's CPU, all
threads): the COPY read and decode alone (``initial_copy`` on one and on ``PARALLEL`` connections at
one snapshot, key texts as Arrow), plus the key hashes, plus the zstd Parquet write, then the whole
``ReplicatorService.create_table`` (slot, copy, IndexBlock, persist). Run against the embedded
Postgres of a state directory (started if needed):

    .venv/bin/python scripts/probe_copy_stages.py /var/tmp/probe-state 500000 2

Measured 2026-12-03 on the 2-core machine at load ~4.5, 500k rows, 2 connections (wall s):
psql 0.79, copy 1 conn 0.99, copy 2 conn 0.95, + key hash 0.84, + Parquet 0.94, create_table 1.59;
a second run psql 0.55, 1.05, 0.78, 0.71, 0.81, create_table 1.83 (load moves every figure).
The copy into Arrow on 2 connections runs at ~0.7-0.8 of psql; create_table's remainder is serial work after the copy
(cProfile: Parquet write 0.38 s, IndexBlock build 0.31 s, key hash 0.12 s of 1.45 s). The first
create_table of a process on the 500k table took 2.3 s against ~1.2-1.6 s after (one cold call is
what ``mooncake bench``'s ``initial_copy.ratio`` times).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow.parquet as pq

from mooncake_assets.bench.common import BenchDatabase, pg_bin
from mooncake_assets.bench.ingest import NARROW_DDL, NARROW_SELECT
from mooncake_assets.config import Settings, load_settings
from mooncake_assets.engine.cdc.copy import initial_copy
from mooncake_assets.engine.index.key_hash import KeyHash
from mooncake_assets.engine.pg.catalog import describe_table
from mooncake_assets.engine.pg.conninfo import with_options
from mooncake_assets.engine.service.service import ReplicatorService


def main(state: Path, rows: int, par: int) -> None:
    admin = load_settings(state).source_dsn()
    scratch = Path(tempfile.mkdtemp(prefix="probe-copy-", dir="/var/tmp"))
    with BenchDatabase(admin) as db:
        db.execute(NARROW_DDL.format(t="b_copy"))
        db.execute("INSERT INTO b_copy " + NARROW_SELECT.format(a=1, b=rows))
        db.execute("VACUUM ANALYZE b_copy")
        with psycopg.connect(db.dsn, autocommit=True) as c:
            schema = describe_table(c, "public.b_copy")
        keys = list(schema.key_columns)
        hasher = KeyHash([col.type_oid for col in schema.columns if col.name in keys], keyed=True)

        def psql() -> None:
            cmd = [pg_bin("psql"), "-X", "-q", "-d", db.dsn, "-c", "COPY b_copy TO STDOUT"]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)

        def stage(p: int, hash_: bool = False, write: bool = False) -> None:
            writer = None
            with psycopg.connect(with_options(db.dsn)) as c:
                for rb, kt in initial_copy(
                    c,
                    schema,
                    None,
                    text_columns=keys,
                    text_as_arrow=True,
                    parallel=p,
                    connect=lambda: psycopg.connect(with_options(db.dsn)),
                ):
                    if hash_:
                        hasher.hash_columns(kt)
                    if write:
                        writer = writer or pq.ParquetWriter(scratch / "x.parquet", rb.schema, compression="zstd")
                        writer.write_batch(rb, row_group_size=128 * 1024)
            if writer is not None:
                writer.close()

        def create() -> None:
            st = Path(tempfile.mkdtemp(dir=scratch))
            svc = ReplicatorService(Settings(state_dir=st, dsn=db.dsn, maintenance="dagster").service_config())
            try:
                svc.create_table("copy", "public.b_copy")
                svc.drop_table("copy")
            finally:
                svc.stop()

        cases: dict[str, Callable[[], None]] = {
            "psql COPY TO STDOUT": psql,
            "copy 1 conn (COPY+CSV+decode)": lambda: stage(1),
            f"copy {par} conn (COPY+CSV+decode)": lambda: stage(par),
            "+ key hash": lambda: stage(par, True),
            "+ parquet zstd write": lambda: stage(par, True, True),
            "create_table (all)": create,
        }
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for r in range(2):
            names = list(cases)
            for k in names[r:] + names[:r]:
                t, cpu = time.perf_counter(), time.process_time()
                cases[k]()
                res[k].append((time.perf_counter() - t, time.process_time() - cpu))
    for k, v in res.items():
        wall, cpu = min(x[0] for x in v), min(x[1] for x in v)
        print(f"{k:34s} wall {wall:6.2f} s ({rows / wall:10,.0f} rows/s)  this process's CPU {cpu:6.2f} s")


if __name__ == "__main__":
    main(
        Path(sys.argv[1]),
        int(sys.argv[2]) if len(sys.argv) > 2 else 500_000,
        int(sys.argv[3]) if len(sys.argv) > 3 else 2,
    )
