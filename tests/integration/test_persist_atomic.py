"""A persist commits data files, DVs, index and flush LSN atomically. A crash (SIGKILL of the
service) after the uploads, after every file of the commit is written but before the pointer swap, or
right after the commit leaves a readable snapshot, and the restart converges with nothing lost or doubled."""

from __future__ import annotations

import os

import psycopg
import pytest

from mooncake_assets.engine.iceberg import make_catalog
from mooncake_assets.engine.service import ServiceError
from mooncake_assets.engine.service.process import service_pid, start_service, stop_service
from mooncake_assets.verify import verify

from ..helpers import make_settings


def _lsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["persist:after_upload", "commit:before_swap", "persist:after_commit"])
def test_crash_during_persist(pg_dsn, state_dir, point, monkeypatch):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    from mooncake_assets.engine.service import ServiceClient

    start_service(s)
    client = ServiceClient(s.socket_path)
    try:
        client.call("create_table", dst="t", src="public.t")
        catalog = make_catalog(s.catalog, s.warehouse_uri)
        before = catalog.load_table("mooncake.t")
        snap_before = before.current_snapshot().snapshot_id
        rows_before = before.scan().to_arrow().num_rows
        stop_service(s)

        monkeypatch.setenv("MOONCAKE_FAULT", point)
        start_service(s)
        client.close()
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE t SET v = -v WHERE id <= 100")
            c.execute("DELETE FROM t WHERE id > 900")
            c.execute("INSERT INTO t SELECT g, g FROM generate_series(2001, 2300) g")
        client.wait_lsn(_lsn(pg_dsn))
        pid = service_pid(s)
        with pytest.raises(ServiceError):
            client.call("persist", table="t")  # the service dies at the fault point
        for _ in range(100):
            try:
                os.waitpid(pid, os.WNOHANG)
                os.kill(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                break
        client.close()

        # the table is readable; before the swap nothing changed, after it the new snapshot is complete
        after = catalog.load_table("mooncake.t")
        rows_after = after.scan().to_arrow().num_rows
        if point == "persist:after_commit":
            assert after.current_snapshot().snapshot_id != snap_before
            assert rows_after == 1000 - 100 + 300
        else:
            assert after.current_snapshot().snapshot_id == snap_before
            assert rows_after == rows_before == 1000

        monkeypatch.delenv("MOONCAKE_FAULT")
        start_service(s)
        client.wait_lsn(_lsn(pg_dsn))
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN 50 AND 60")
        client.wait_lsn(_lsn(pg_dsn))
        results, lsn = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        client.call("persist", table="t")
        results, lsn = verify(s, None, "pyiceberg", client)
        assert all(r.match for r in results), [r.line() for r in results]
        st = client.status()["tables"][0]
        assert st["missing_keys"] == 0
    finally:
        client.close()
        stop_service(s)
