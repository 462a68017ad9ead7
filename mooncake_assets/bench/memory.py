"""Memory benchmark: the service's peak RSS per million buffered rows, and index bytes per row.

A real service (background process, flushes switched off: ``maintenance: dagster`` with flush
thresholds out of reach) mirrors an empty narrow table (``pgbench_accounts``' shape); its RSS is read
(``/proc/<pid>/status`` VmRSS); ``rows`` rows are inserted in transactions of 50,000 and the service
is waited for (read-your-writes barrier); then its peak RSS (VmHWM) is read.
``service_rss_bytes_per_million_rows`` = (VmHWM after − VmRSS before) ÷ millions of rows buffered —
the buffer itself (MemSlice, Arrow batches) plus the MemIndex plus whatever the apply loop keeps.
Then the table is flushed: ``index_bytes_per_row`` = bytes of the IndexBlock files on disk ÷ rows
(the FileIndex of docs/architecture.md#data-path: bit-packed hash, file and row per entry plus the bucket table).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg

from .common import BenchDatabase, Sizes
from .ingest import NARROW_DDL, NARROW_SELECT


def _proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def run_memory_bench(admin_dsn: str, sizes: Sizes, log=print) -> dict:
    from ..config import Settings
    from ..engine.service import ServiceClient
    from ..engine.service.process import service_pid, start_service, stop_service

    rows = sizes.memory_rows
    scratch = Path(tempfile.mkdtemp(prefix="mc-bench-mem-", dir="/var/tmp"))
    try:
        with BenchDatabase(admin_dsn) as db:
            db.execute(NARROW_DDL.format(t="buffered"))
            settings = Settings(
                state_dir=scratch,
                dsn=db.dsn,
                maintenance="dagster",
                flush_rows=1 << 60,
                flush_bytes=1 << 60,
                persist_interval_s=1e9,
            )
            settings.save()
            start_service(settings)
            client = ServiceClient(settings.socket_path)
            try:
                client.call("create_table", dst="buffered", src="public.buffered")
                pid = service_pid(settings)
                time.sleep(0.5)
                before = _proc_status(pid)
                step = 50_000
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    for a in range(1, rows + 1, step):
                        c.execute("INSERT INTO buffered " + NARROW_SELECT.format(a=a, b=min(a + step - 1, rows)))
                    lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
                t0 = time.perf_counter()
                client.wait_lsn(lsn, timeout=600)
                apply_s = time.perf_counter() - t0
                st = next(t for t in client.status()["tables"] if t["name"] == "buffered")
                after = _proc_status(pid)
                client.call("flush", table="buffered")
                idx = sum(p.stat().st_size for p in (scratch / "tables" / "buffered" / "index").glob("*"))
                st2 = next(t for t in client.status()["tables"] if t["name"] == "buffered")
            finally:
                client.close()
                stop_service(settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    grown = after["VmHWM"] - before["VmRSS"]
    out = {
        "rows": rows,
        "buffer_rows": st.get("buffer_rows"),
        "buffer_bytes": st.get("buffer_bytes"),
        "rss_before_bytes": before["VmRSS"],
        "rss_after_bytes": after["VmRSS"],
        "peak_rss_bytes": after["VmHWM"],
        "service_rss_bytes_per_million_rows": grown / (rows / 1e6),
        "buffer_bytes_per_row": (st.get("buffer_bytes") or 0) / rows,
        "index_bytes": idx,
        "index_blocks": st2.get("index_blocks"),
        "index_bytes_per_row": idx / rows,
        "seconds_to_apply_after_commit": apply_s,
        "method": "service process VmHWM after buffering rows (no flush) minus VmRSS before; index = IndexBlock "
        "files after one flush",
    }
    log(
        f"  memory: {rows:,} rows buffered, +{grown / 1e6:.0f} MB peak RSS "
        f"({out['service_rss_bytes_per_million_rows'] / 1e6:.0f} MB per million rows), "
        f"index {out['index_bytes_per_row']:.2f} bytes/row"
    )
    return out
