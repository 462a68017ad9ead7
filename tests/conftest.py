"""Shared fixtures: a real throwaway PostgreSQL cluster with wal_level=logical.

The cluster's data directory lives under /var/tmp (the `postgres` user cannot enter root-only
folders such as /root, where a CI clone may live).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.pg import EmbeddedPostgres

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "iceberg"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The vendored Iceberg golden files (``tests/data/iceberg``; origin and license in its README)."""
    return GOLDEN


@pytest.fixture(scope="session")
def pg_cluster():
    """One embedded cluster for the whole session; yields the EmbeddedPostgres."""
    root = Path(tempfile.mkdtemp(prefix="mooncake-test-pg-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "state")
    pg.start()
    yield pg
    pg.destroy()
    import shutil

    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _fresh_database(pg_cluster):
    """A fresh database in the session cluster; yields its DSN, then drops its slots and the database."""
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    dsn = pg_cluster.dsn(name)
    yield dsn
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)).fetchall():
            try:
                c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            except Exception:
                pass
        import time

        for _attempt in range(50):  # a stopping service's walsender may still hold the slot for a moment
            try:
                for (slot,) in c.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall():
                    c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.2)


@pytest.fixture()
def pg_dsn(pg_cluster):
    """A fresh database in the session cluster for one test; yields its DSN."""
    with _fresh_database(pg_cluster) as dsn:
        yield dsn


@pytest.fixture()
def pg_dsn2(pg_cluster):
    """A second fresh database in the session cluster (a test with two sources); yields its DSN."""
    with _fresh_database(pg_cluster) as dsn:
        yield dsn


@pytest.fixture()
def state_dir():
    """A fresh mooncake state directory under /var/tmp."""
    d = Path(tempfile.mkdtemp(prefix="mooncake-test-state-", dir="/var/tmp"))  # 0700, as mooncake makes one
    yield d
    if os.environ.get("MOONCAKE_KEEP_TEST_STATE") != "1":
        import shutil

        shutil.rmtree(d, ignore_errors=True)
