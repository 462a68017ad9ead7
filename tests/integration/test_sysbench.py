"""Sysbench's OLTP workloads against mirrored ``sbtest*`` tables, verified by every reader.

sysbench (Debian's ``sysbench``, installed by ``make install``) prepares 4 tables, then runs
``oltp_read_write``, ``oltp_update_index``, ``oltp_update_non_index``, ``oltp_delete`` and
``oltp_insert`` (4 threads, a few seconds each) while the service mirrors them; afterwards every table
is compared with Postgres at one LSN by the union read, and (after a persist) by PyIceberg and by
DuckDB's iceberg extension.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from psycopg.conninfo import conninfo_to_dict

from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service

WORKLOADS = ("oltp_read_write", "oltp_update_index", "oltp_update_non_index", "oltp_delete", "oltp_insert")
TABLES = [f"sbtest{i}" for i in range(1, 5)]


def _sysbench(dsn: str, workload: str, command: str, seconds: int = 3) -> None:
    d = conninfo_to_dict(dsn)
    args = [
        "sysbench",
        workload,
        "--db-driver=pgsql",
        f"--pgsql-host={d.get('host', '127.0.0.1')}",
        f"--pgsql-port={d.get('port', 5432)}",
        f"--pgsql-user={d.get('user', 'postgres')}",
        f"--pgsql-db={d['dbname']}",
        "--tables=4",
        "--table-size=2000",
        "--threads=4",
        f"--time={seconds}",
        "--report-interval=0",
        "--db-ps-mode=disable",
    ]
    if d.get("password"):
        args.append(f"--pgsql-password={d['password']}")
    r = subprocess.run(args + [command], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"sysbench {workload} {command} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sysbench") is None, reason="sysbench is not installed (make install installs it)")
def test_sysbench_oltp_workloads_match_with_every_reader(pg_dsn, state_dir):
    _sysbench(pg_dsn, "oltp_common", "prepare")
    settings = make_settings(state_dir, pg_dsn, maintenance="auto")
    with running_service(settings) as client:
        for t in TABLES:
            client.call("create_table", dst=t, src=f"public.{t}", timeout=600)
        for w in WORKLOADS:
            _sysbench(pg_dsn, w, "run")
            client.call("flush", table=TABLES[0])  # rows in every place: persisted, staged and buffered
        results, lsn = verify(settings, TABLES, "union", client)
        bad = [r.line() for r in results if not r.match]
        assert len(results) == 4 and not bad, f"union at LSN {lsn}: {bad}"
        for t in TABLES:
            client.call("persist", table=t)
        for reader in ("pyiceberg", "duckdb-iceberg"):
            results, lsn = verify(settings, TABLES, reader, client)
            bad = [r.line() for r in results if not r.match]
            assert len(results) == 4 and not bad, f"{reader} at LSN {lsn}: {bad}"
        assert all(r.source_rows > 0 for r in results)
        st = {t["name"]: t for t in client.status()["tables"]}
        assert all(st[t]["state"] == "ready" for t in TABLES), st
