"""Sysbench benchmark: replication lag under an OLTP write load, and the catch-up after it.

In a scratch database of the bench's Postgres: ``sysbench oltp_common prepare`` (Debian's sysbench
1.0, ``--db-driver=pgsql``: one table ``sbtest1 (id serial PRIMARY KEY, k int, c char(120),
pad char(60))`` of ``sysbench_rows`` rows with a secondary index on ``k``), then a real service
(``mooncake serve`` as a background process, ``maintenance: auto`` with its default policy: it
flushes and persists while we measure) mirrors it (``create_table``: the initial copy). Then, one
after the other, each workload of :data:`WORKLOADS` runs for ``sysbench_seconds`` seconds with 4
threads (``--db-ps-mode=disable``):

- ``oltp_update_index``: one ``UPDATE sbtest1 SET k=k+1 WHERE id=?`` per transaction (an indexed
  column: a non-HOT update, one pgoutput Update message each);
- ``oltp_insert``: one ``INSERT INTO sbtest1 (k, c, pad)`` per transaction (the id from the serial's
  sequence: sysbench 1.0's pgsql path with ``auto_inc`` on, its default).

While a workload runs, once a second and once more as it stops: the **lag** of the service's slot in bytes,
``pg_wal_lsn_diff(pg_current_wal_lsn(), write_lsn)`` from ``pg_stat_replication`` (the service
reports its applied LSN as ``write_lsn`` after every applied batch; PostgreSQL docs, "The Statistics
Collector", ``pg_stat_replication``), and the slot's durable lag from ``confirmed_flush_lsn``
(``pg_replication_slots``; what the slot may not drop yet: persisted to Iceberg). After sysbench
exits: **catch-up** = seconds from its exit until a read-your-writes union read answers —
:meth:`~mooncake_assets.engine.read.UnionReader.barrier_lsn` (``pg_current_wal_lsn()``) then
``register(..., wait_lsn=...)`` (the service waits until that LSN is applied, then hands over the
ReadState) and ``SELECT count(*)``, by a reader that read the table once before the load (a
long-lived reader's: a cold process would add its first imports, pandas among them, 0.3-1.3 s); what
a user querying right after the load sees.

Figures per workload: ``tps`` (sysbench's), ``max_lag_bytes``, ``catch_up_seconds`` (and of it
``catch_up_apply_seconds``: until the service has applied the load's last LSN, before the read), ``wal_bytes``
(WAL written meanwhile), ``lag_samples``. Afterwards ``verify`` (union reader) compares the mirror with
Postgres at one LSN: ``sysbench.verify.match``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .common import BenchDatabase, Sizes

WORKLOADS = ("oltp_update_index", "oltp_insert")
THREADS = 4
TABLE = "sbtest1"

_LAG_SQL = (
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), r.write_lsn)::bigint, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint "
    "FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid "
    "WHERE s.slot_name = %s"
)


def sysbench_args(dsn: str, workload: str, rows: int, seconds: int = 10) -> tuple[list[str], dict[str, str]]:
    """The ``sysbench`` command line (without the command: ``prepare``/``run``) for one table of ``rows``
    rows in the database of ``dsn``, and the environment to run it in (the password, if any, goes
    through ``PGPASSWORD``, not the command line: libpq reads it when sysbench passes an empty one)."""
    d = conninfo_to_dict(dsn)
    args = [
        shutil.which("sysbench") or "sysbench",
        workload,
        "--db-driver=pgsql",
        f"--pgsql-host={d.get('host', '127.0.0.1')}",
        f"--pgsql-port={d.get('port', 5432)}",
        f"--pgsql-user={d.get('user', 'postgres')}",
        f"--pgsql-db={d['dbname']}",
        "--tables=1",
        f"--table-size={rows}",
        f"--threads={THREADS}",
        f"--time={seconds}",
        "--report-interval=0",
        "--db-ps-mode=disable",
    ]
    env = dict(os.environ)
    if d.get("password"):
        env["PGPASSWORD"] = d["password"]
    return args, env


def parse_tps(out: str) -> tuple[int | None, float | None]:
    """(transactions, transactions/s) from sysbench 1.0's report (``transactions: N (X per sec.)``)."""
    m = re.search(r"transactions:\s+(\d+)\s+\(([\d.]+) per sec", out)
    return (int(m.group(1)), float(m.group(2))) if m else (None, None)


def _sample_once(c: psycopg.Connection, slot: str, t0: float, samples: list[tuple[float, int | None, int]]) -> None:
    """Append (seconds since ``t0``, applied-lag bytes or None when the service is not connected,
    durable-lag bytes) of ``slot``."""
    row = c.execute(_LAG_SQL, (slot,)).fetchone()
    if row is not None:
        samples.append((round(time.perf_counter() - t0, 2), row[0], int(row[1] or 0)))


def _sample_lag(dsn: str, slot: str, t0: float, stop: threading.Event, samples: list) -> None:
    """:func:`_sample_once` once a second until ``stop``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        while not stop.is_set():
            _sample_once(c, slot, t0, samples)
            stop.wait(1.0)


def _run_workload(db: BenchDatabase, client: Any, slot: str, workload: str, sizes: Sizes, log) -> dict[str, Any]:
    """One sysbench workload under the running service: tps, lag samples, catch-up seconds."""
    from ..engine.read import UnionReader

    args, env = sysbench_args(db.dsn, workload, sizes.sysbench_rows, sizes.sysbench_seconds)
    with psycopg.connect(db.dsn, autocommit=True) as c:
        lsn0 = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    samples: list[tuple[float, int | None, int]] = []
    # a long-lived reader, as a user's (the Dagster IO manager, sql-server, a notebook): warmed by one
    # read before the load, so the catch-up counts the mirror, not this process's first imports
    # (pyarrow imports pandas on its first array: 0.3-1.3 s here)
    reader = UnionReader(client, db.dsn, wait_timeout=600)
    reader.register(TABLE, wait_lsn=reader.barrier_lsn())
    reader.con.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
    stop = threading.Event()
    t0 = time.perf_counter()
    sampler = threading.Thread(target=_sample_lag, args=(db.dsn, slot, t0, stop, samples), daemon=True)
    sampler.start()
    try:
        r = subprocess.run(
            args + ["run"], capture_output=True, text=True, env=env, timeout=sizes.sysbench_seconds + 300
        )
        t_stop = time.perf_counter()
    finally:
        stop.set()
        sampler.join(timeout=10)
    with psycopg.connect(db.dsn, autocommit=True) as c:  # the lag as the load stops (the largest, usually)
        _sample_once(c, slot, t0, samples)
    if r.returncode != 0:
        reader.close()
        raise RuntimeError(f"sysbench {workload} run failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
    try:
        wait = reader.barrier_lsn()
        client.wait_lsn(wait, timeout=600)  # the service has applied everything up to the load's end
        applied = time.perf_counter() - t_stop
        reader.register(TABLE, wait_lsn=wait)
        rows = reader.con.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
        catch_up = time.perf_counter() - t_stop
    finally:
        reader.close()
    with psycopg.connect(db.dsn, autocommit=True) as c:
        wal = c.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", (wait, lsn0)).fetchone()[0]
    txns, tps = parse_tps(r.stdout)
    lag = [s[1] if s[1] is not None else s[2] for s in samples]
    fig = {
        "tps": tps,
        "transactions": txns,
        "threads": THREADS,
        "seconds": sizes.sysbench_seconds,
        "max_lag_bytes": max(lag) if lag else None,
        "lag_at_stop_bytes": lag[-1] if lag else None,
        "max_durable_lag_bytes": max((s[2] for s in samples), default=None),
        "catch_up_seconds": catch_up,
        "catch_up_apply_seconds": applied,
        "catch_up_lsn": str(wait),
        "rows_after": rows,
        "wal_bytes": int(wal),
        "lag_samples": [{"t": t, "lag_bytes": a, "durable_lag_bytes": d} for t, a, d in samples],
    }
    log(
        f"  sysbench {workload}: {tps} tps, max lag {_mb(fig['max_lag_bytes'])} MiB, catch-up {catch_up:.3f} s "
        f"(applied after {applied:.3f} s), "
        f"WAL {_mb(wal)} MiB"
    )
    return fig


def _mb(v) -> str:
    return "n/a" if v is None else f"{v / 2**20:.2f}"


def run_sysbench_bench(admin_dsn: str, sizes: Sizes, log=print) -> dict[str, Any]:
    """Run the sysbench suite against the cluster of ``admin_dsn``; returns the ``sysbench`` section.
    Raises ``RuntimeError`` when sysbench is missing or fails."""
    from ..config import Settings
    from ..engine.service import ServiceClient
    from ..engine.service.process import start_service, stop_service
    from ..verify import verify

    if shutil.which("sysbench") is None:
        raise RuntimeError("sysbench is not installed (make install installs Debian's sysbench)")
    out: dict[str, Any] = {
        "method": "sysbench 1.0 (pgsql driver), 4 threads, one table, mirrored by a running service "
        "(maintenance auto); lag sampled once a second; see mooncake_assets/bench/sysbench.py",
        "table_rows": sizes.sysbench_rows,
    }
    scratch = Path(tempfile.mkdtemp(prefix="mc-bench-sysbench-", dir="/var/tmp"))
    try:
        with BenchDatabase(admin_dsn, prefix="mooncake_bench_sb") as db:
            args, env = sysbench_args(db.dsn, "oltp_common", sizes.sysbench_rows)
            r = subprocess.run(args + ["prepare"], capture_output=True, text=True, env=env, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"sysbench prepare failed ({r.returncode}): {(r.stdout + r.stderr)[-1500:]}")
            settings = Settings(state_dir=scratch, dsn=db.dsn, maintenance="auto")
            settings.save()
            start_service(settings)
            client = ServiceClient(settings.socket_path)
            try:
                t0 = time.perf_counter()
                client.call("create_table", dst=TABLE, src=f"public.{TABLE}", timeout=600)
                out["create_table_seconds"] = time.perf_counter() - t0
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    slot = c.execute(
                        "SELECT slot_name FROM pg_replication_slots WHERE database = %s AND NOT temporary",
                        (db.name,),
                    ).fetchone()[0]
                out["slot"] = slot
                for w in WORKLOADS:
                    out[w] = _run_workload(db, client, slot, w, sizes, log)
                results, lsn = verify(settings, [TABLE], "union", client)
                out["verify"] = {
                    "match": all(x.match for x in results),
                    "lsn": lsn,
                    "tables": [x.line() for x in results],
                }
                log(f"  sysbench verify: {'; '.join(out['verify']['tables'])}")
            finally:
                client.close()
                stop_service(settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
