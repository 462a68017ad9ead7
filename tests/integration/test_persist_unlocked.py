"""A persist copies its files to the warehouse without the service lock (the slow part on S3): while a
persist is held inside that copy (``MOONCAKE_FAULT=persist:upload=wait:<flag>``), the replication thread
keeps applying and union reads see new commits; the persist then commits everything applied up to its
end, and PyIceberg matches."""

from __future__ import annotations

import threading
import time

import psycopg

from mooncake_assets.engine.read import UnionReader
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service


def test_apply_and_reads_go_on_while_a_persist_uploads(pg_dsn, state_dir, monkeypatch):
    flag = state_dir / "hold-upload"
    monkeypatch.setenv("MOONCAKE_FAULT", f"persist:upload=wait:{flag}")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pu")
        c.execute("CREATE TABLE pu (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO pu SELECT g, 'v' FROM generate_series(1, 100) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="pu", src="public.pu")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO pu SELECT g, 'staged' FROM generate_series(101, 200) g")
            applied = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(applied, timeout=120)  # the rows are in the buffer (a loaded machine lags)
        client.call("flush", table="pu")  # a staged file for the persist to upload
        flag.touch()
        done = {}

        def persist():
            other = ServiceClient(s.socket_path)  # its own connection to the service
            try:
                done["r"] = other.call("persist", table="pu", timeout=120)
            finally:
                other.close()

        th = threading.Thread(target=persist)
        th.start()
        reached = flag.with_name(flag.name + ".reached")
        for _ in range(2400):  # a hang guard (120 s), not a speed claim
            if reached.exists():
                break
            time.sleep(0.05)
        assert reached.exists(), "the persist never reached its upload"
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # the persist is held inside its upload now
            c.execute("INSERT INTO pu VALUES (201, 'during'), (202, 'during')")
            c.execute("DELETE FROM pu WHERE id = 1")
        rows = UnionReader(client, pg_dsn, wait_timeout=60).read_table("pu")  # barrier: applied, not blocked
        assert th.is_alive() and flag.exists()  # ... while the persist still waits
        ids = set(rows.column("id").to_pylist())
        assert {201, 202} <= ids and 1 not in ids and len(ids) == 201
        flag.unlink()
        th.join(timeout=120)
        assert "r" in done and done["r"]["files_added"] >= 1, done
        results, lsn = verify(s, ["pu"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        client.call("persist", table="pu")
        results, lsn = verify(s, ["pu"], "pyiceberg")
        assert all(r.match for r in results), [r.line() for r in results]
