"""In the apply path: deletes find rows in persisted files through IndexBlocks restored from
the Iceberg table after a restart (no data file is read), and hashed keys are re-checked."""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service


def _table(client, name):
    return {t["name"]: t for t in client.status()["tables"]}[name]


def test_delete_after_restart_uses_restored_index_blocks(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id bigint PRIMARY KEY, v text)")
        c.execute("INSERT INTO acc SELECT g, 'v' || g FROM generate_series(1, 5000) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="acc", src="public.acc")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO acc SELECT g, 'w' || g FROM generate_series(5001, 6000) g")
        client.wait_lsn(_lsn(pg_dsn))
        client.call("persist", table="acc")
        blocks = _table(client, "acc")["index_blocks"]
        assert blocks >= 2
    # the service is stopped; hide every data file so only the index can locate rows
    data = [p for p in (state_dir / "warehouse").rglob("*.parquet") if "/data/" in str(p)]
    assert data
    hidden = state_dir / "hidden"
    hidden.mkdir()
    for i, p in enumerate(data):
        os.rename(p, hidden / f"{i}.parquet")
    try:
        with running_service(s) as client:
            assert _table(client, "acc")["index_blocks"] == blocks  # restored from the Puffin index blob
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute("DELETE FROM acc WHERE id IN (17, 5500)")
            client.wait_lsn(_lsn(pg_dsn))
            st = _table(client, "acc")
            assert st["missing_keys"] == 0
            assert st["pending_deletes"] == 2  # positions found through the restored blocks
    finally:
        for i, p in enumerate(data):
            os.rename(hidden / f"{i}.parquet", p)
    with running_service(s) as client:
        results, lsn = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]


def test_hashed_keys_are_rechecked(pg_dsn, state_dir):
    """Text keys and whole-row keys (duplicates, NULL, NaN) delete exactly the matching row."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE tk (k text PRIMARY KEY, n int)")
        c.execute("INSERT INTO tk SELECT 'key-' || g, g FROM generate_series(1, 300) g")
        c.execute("CREATE TABLE dup (a text, f float8, n int)")
        c.execute(
            "INSERT INTO dup VALUES ('x', 'NaN', 1), ('x', 'NaN', 1), (NULL, 1.5, 2), (NULL, 1.5, 2), ('y', 0, 3)"
        )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="tk", src="public.tk")
        client.call("create_table", dst="dup", src="public.dup")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE tk SET n = -n WHERE k IN ('key-5', 'key-250')")
            c.execute("DELETE FROM dup WHERE ctid = (SELECT ctid FROM dup WHERE a = 'x' LIMIT 1)")
            c.execute("DELETE FROM dup WHERE ctid = (SELECT ctid FROM dup WHERE a IS NULL LIMIT 1)")
            c.execute("INSERT INTO dup VALUES ('z', 'NaN', 4)")
        client.wait_lsn(_lsn(pg_dsn))
        client.call("flush", table="dup")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM dup WHERE a = 'z'")  # found in a flushed file, re-checked there
            c.execute("UPDATE tk SET n = 0 WHERE k = 'key-5'")
        client.wait_lsn(_lsn(pg_dsn))
        for t in ("tk", "dup"):
            assert _table(client, t)["missing_keys"] == 0
        results, lsn = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]


def _lsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


@pytest.mark.parametrize("compact", [False, True])
def test_a_restart_reindexes_the_files_persisted_after_the_last_index_save(pg_dsn, state_dir, compact):
    """The service's own persists save the FileIndex only once a minute (``INDEX_SAVE_INTERVAL_S``):
    the others carry the saved index over. After a restart the data files it does not cover get
    IndexBlocks from their key columns, so updates and deletes still find their rows (also when a
    compaction replaced the files in between)."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE late (id bigint PRIMARY KEY, v text)")
        c.execute("INSERT INTO late SELECT g, 'copied' FROM generate_series(1, 1000) g")
    s = make_settings(state_dir, pg_dsn, maintenance="auto", persist_interval_s=0.2)
    with running_service(s) as client:
        client.call("create_table", dst="late", src="public.late")
        saved = _index_file(s)
        for lo in (1001, 2001):  # two persists of the service's own, each its own data file
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute(f"INSERT INTO late SELECT g, 'streamed' FROM generate_series({lo}, {lo + 999}) g")
                lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            _wait_persisted(client, lsn)
        assert _index_file(s) == saved  # carried over, not saved again
        if compact:  # so does one of the service's own compactions (save_index=False): its output is in no saved block
            r = client.call(
                "compact", table="late", full=True, expire=False, persist_first=False, save_index=False, timeout=120
            )
            assert r["compacted"] and _index_file(s) == saved, r
        files = _table(client, "late")["data_files"]
        assert files >= (1 if compact else 3)
    with running_service(s) as client:
        st = _table(client, "late")
        assert st["data_files"] == files and st["index_blocks"] >= files and not st.get("error")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM late WHERE id IN (17, 1500, 2999)")
            c.execute("UPDATE late SET v = 'changed' WHERE id IN (5, 1005, 2005)")
        client.wait_lsn(_lsn(pg_dsn))
        st = _table(client, "late")
        assert st["missing_keys"] == 0 and st["pending_deletes"] == 6, st
        results, lsn = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]


def _index_file(s) -> str:
    from mooncake_assets.engine.iceberg import SUMMARY_INDEX_FILE, IcebergMirrorTable, make_catalog
    from mooncake_assets.engine.storage import catalog_properties

    ice = IcebergMirrorTable.load(make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s)), "mooncake.late")
    return ice.state().summary[SUMMARY_INDEX_FILE]


def _wait_persisted(client, lsn: str) -> None:
    from mooncake_assets.engine.lsn import Lsn

    for _ in range(600):  # a hang guard (60 s), not a speed claim
        st = _table(client, "late")
        if Lsn.parse(st["flush_lsn"]) >= Lsn.parse(lsn) and st["buffer_rows"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"not persisted up to {lsn}: {st}")
