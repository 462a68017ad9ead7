"""Probe: our side of the ingest bench's large-transaction cases alone, optionally under cProfile.

The bench's own pieces (``mooncake_assets.bench.ingest``: the table DDL, the workload, ``_OurSide.consume``:
the stream thread's compiled read and apply) on a scratch database of the embedded Postgres of ``STATE``
(started if needed): one INSERT of ``ROWS`` rows in one transaction (streamed: the bench's
``logical_decoding_work_mem``), then our side reads and applies it from its slot. Prints wall and CPU
seconds and CPU µs per row; with ``--profile`` the top functions by own time (Cython functions do not show
apart: their time counts in the Python function that called them). Usage::

    .venv/bin/python scripts/probe_streamed_ingest.py STATE ROWS [--shape wide|narrow] [--mode large|small] [--profile]

Prints user and system CPU, minor page faults and max RSS beside. ``--mode small``: the same rows in
10-row transactions (the bench's ``wide``/``narrow`` cases), for comparison.

Measured 2026-12-03 (quiet 2-core machine, 400,000 wide rows): 5.1–5.9 s wall, 4.4–5.2 s CPU (11–13 µs per
row, against ~6.5 µs for the same rows in 10-row transactions); of it ~3.0 s inside
``ReplicationConnection.read_transactions`` (the C receive/decode loop, returned to 188,848 times),
``MemSlice._compact`` 0.46 s, the numeric casts 0.37 s. ``perf record`` then showed ~18 % of all samples in
the kernel zeroing fresh anonymous pages (``clear_page_erms``), faulted in by the transaction's buffer
growing to hundreds of MiB and by the runs built from it after the commit: the reason the service now
spills an open transaction every 16 MiB (``engine/service/memory.py``, ``SPILL_BYTES``, with the figures).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import tempfile
from pathlib import Path

import psycopg

from mooncake_assets.bench import ingest
from mooncake_assets.bench.common import BenchDatabase
from mooncake_assets.config import load_settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("state")
    ap.add_argument("rows", type=int)
    ap.add_argument("--shape", choices=("wide", "narrow"), default="wide")
    ap.add_argument("--mode", choices=("large", "small"), default="large", help="one transaction, or 10-row ones")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    dsn = load_settings(a.state).source_dsn()
    with BenchDatabase(dsn, prefix="mc_probe_streamed") as db:
        table, pub, slot = "b_probe", "p_probe", "s_probe"
        db.execute((ingest.WIDE_DDL if a.shape == "wide" else ingest.NARROW_DDL).format(t=table))
        db.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
        with psycopg.connect(db.dsn, autocommit=True) as c:
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        ours = ingest._OurSide(db.dsn, table, Path(tempfile.mkdtemp(prefix="mc-probe-", dir="/var/tmp")))
        ingest._workload(db.dsn, table, a.shape, a.mode, a.rows)
        prof = cProfile.Profile() if a.profile else None
        if prof is not None:
            prof.enable()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        secs, cpu, _ = ours.consume(slot, pub, a.rows, 600.0)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if prof is not None:
            prof.disable()
        print(
            f"{a.shape} {a.mode}, {a.rows:,} rows: {secs:.2f} s wall, {cpu:.2f} s CPU, {cpu / a.rows * 1e6:.1f} µs/row"
        )
        print(
            f"user {ru1.ru_utime - ru0.ru_utime:.2f} s, system {ru1.ru_stime - ru0.ru_stime:.2f} s, "
            f"minor page faults {ru1.ru_minflt - ru0.ru_minflt:,}, max RSS {ru1.ru_maxrss / 1024:.0f} MiB"
        )
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
