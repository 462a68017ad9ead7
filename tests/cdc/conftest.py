"""Fixtures for the CDC correctness suite: a database and the real service per module.

Starting the service costs seconds, so a module shares one database, state directory and running
service; each test creates its own tables (unique names) and checks them with ``verify`` (the same
code as ``mooncake verify``): the union read at one LSN, and PyIceberg after a persist.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service


class Mirror:
    """One source database + state dir + running service. ``sql`` runs statements (autocommit)."""

    def __init__(self, settings, client, dsn: str):
        self.settings = settings
        self.client = client
        self.dsn = dsn

    def sql(self, *stmts: str, params=None):
        with psycopg.connect(self.dsn, autocommit=True) as c:
            out = None
            for s in stmts:
                cur = c.execute(s, params) if params is not None else c.execute(s)
                out = cur.fetchall() if cur.description else None
            return out

    def txn(self, *stmts: str):
        """Run statements in ONE transaction."""
        with psycopg.connect(self.dsn) as c:
            for s in stmts:
                c.execute(s)
            c.commit()

    def create(self, dst: str, src: str | None = None, **kw) -> dict:
        return self.client.call("create_table", dst=dst, src=src or f"public.{dst}", **kw)

    def call(self, action: str, **kw) -> dict:
        return self.client.call(action, **kw)

    def status(self, name: str) -> dict:
        return next(t for t in self.client.status()["tables"] if t["name"] == name)

    def check(self, *names: str, iceberg: bool = False) -> str:
        """verify (union read) the named mirrors; with ``iceberg``, persist them and verify PyIceberg too."""
        results, lsn = verify(self.settings, list(names), "union", self.client)
        bad = [r.line() for r in results if not r.match]
        assert not bad, f"union read at LSN {lsn}: {bad}"
        if iceberg:
            for n in names:
                self.call("persist", table=n)
            results, lsn = verify(self.settings, list(names), "pyiceberg", self.client)
            bad = [r.line() for r in results if not r.match]
            assert not bad, f"pyiceberg after persist at LSN {lsn}: {bad}"
        return lsn

    def read(self, name: str, order_by: str | None = None):
        """The union read of one mirror (read-your-writes), as an Arrow table (optionally sorted)."""
        from mooncake_assets.engine.read import UnionReader

        t = UnionReader(self.client, self.dsn).read_table(name)
        return t.sort_by(order_by) if order_by else t


def new_database(pg_cluster) -> str:
    name = "c_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return name


def drop_database(pg_cluster, name: str) -> None:
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)).fetchall():
            try:
                c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except Exception:
                pass
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def new_state_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="mooncake-cdc-", dir="/var/tmp"))  # 0700, as mooncake makes one
    return d


def with_dsn_options(dsn: str, options: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    d = conninfo_to_dict(dsn)
    d["options"] = (d.get("options", "") + " " + options).strip()
    return make_conninfo(**d)


def mirror_fixture(pg_cluster, dsn_options: str | None = None, **settings_kw):
    db = new_database(pg_cluster)
    dsn = pg_cluster.dsn(db)
    if dsn_options:
        dsn = with_dsn_options(dsn, dsn_options)
    state = new_state_dir()
    s = make_settings(state, dsn, **({"maintenance": "dagster"} | settings_kw))
    try:
        with running_service(s) as client:
            yield Mirror(s, client, dsn)
    finally:
        drop_database(pg_cluster, db)
        if os.environ.get("MOONCAKE_KEEP_TEST_STATE") != "1":
            shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def mirror(pg_cluster):
    """A module-wide source database and running service (maintenance driven by the tests)."""
    yield from mirror_fixture(pg_cluster)
