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


def _held_persist(s, table: str, flag):
    """Start ``persist`` of ``table`` in a thread with its own connection to the service (``flag``
    created first, so the armed fault point holds it) and wait until it is held there; returns the
    thread and the dict its result lands in (``"r"``)."""
    flag.touch()
    done: dict = {}

    def persist():
        other = ServiceClient(s.socket_path)
        try:
            done["r"] = other.call("persist", table=table, timeout=120)
        finally:
            other.close()

    th = threading.Thread(target=persist)
    th.start()
    reached = flag.with_name(flag.name + ".reached")
    for _ in range(2400):  # a hang guard (120 s), not a speed claim
        if reached.exists():
            break
        time.sleep(0.05)
    assert reached.exists(), f"the persist of {table} never reached its fault point"
    return th, done


def _held_setup(pg_dsn, state_dir, monkeypatch, point: str, table: str, rows: int, **settings):
    """Arm ``MOONCAKE_FAULT=persist:<point>=wait:<flag>`` (a persist holds there while the flag file
    exists), create ``table`` (id int PRIMARY KEY, v text) with ids 1..``rows`` ('copied') in Postgres,
    and return (the flag path, settings in ``maintenance: dagster`` with ``settings`` on top)."""
    flag = state_dir / f"hold-{point}"
    monkeypatch.setenv("MOONCAKE_FAULT", f"persist:{point}=wait:{flag}")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"DROP TABLE IF EXISTS {table}")
        c.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
        c.execute(f"INSERT INTO {table} SELECT g, 'copied' FROM generate_series(1, {rows}) g")
    return flag, make_settings(state_dir, pg_dsn, maintenance="dagster", **settings)


def test_apply_and_reads_go_on_while_a_persist_uploads(pg_dsn, state_dir, monkeypatch):
    flag, s = _held_setup(pg_dsn, state_dir, monkeypatch, "upload", "pu", 100)
    with running_service(s) as client:
        client.call("create_table", dst="pu", src="public.pu")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO pu SELECT g, 'staged' FROM generate_series(101, 200) g")
            applied = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(applied, timeout=120)  # the rows are in the buffer (a loaded machine lags)
        client.call("flush", table="pu")  # a staged file for the persist to upload
        th, done = _held_persist(s, "pu", flag)
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


def test_apply_goes_on_while_a_persist_writes_the_buffer(pg_dsn, state_dir, monkeypatch):
    """A persist writes the buffered rows to Parquet without the service lock: held right after it took
    them (``MOONCAKE_FAULT=persist:write=wait:<flag>``), updates and deletes of those very rows, a new
    insert and a key change are applied and read meanwhile; once the write ends, the rows changed meanwhile
    are deletes of the new file at their commits, and the union read and PyIceberg match Postgres."""
    flag, s = _held_setup(pg_dsn, state_dir, monkeypatch, "write", "pw", 50)
    with running_service(s) as client:
        client.call("create_table", dst="pw", src="public.pw")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO pw SELECT g, 'buffered' FROM generate_series(51, 150) g")
            c.execute("DELETE FROM pw WHERE id IN (60, 61)")  # deleted before the persist takes the buffer
            applied = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(applied, timeout=120)
        th, done = _held_persist(s, "pw", flag)
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # the rows taken by the persist change now
            c.execute("UPDATE pw SET v = 'changed during the write' WHERE id BETWEEN 70 AND 79")
            c.execute("DELETE FROM pw WHERE id IN (51, 100, 150, 3)")
            c.execute("UPDATE pw SET id = id + 1000 WHERE id = 90")
            c.execute("INSERT INTO pw VALUES (500, 'during')")
        rows = UnionReader(client, pg_dsn, wait_timeout=60).read_table("pw")  # applied, not blocked
        assert th.is_alive() and flag.exists()
        ids = set(rows.column("id").to_pylist())
        assert {500, 1090} <= ids and not ids & {3, 51, 60, 61, 90, 100, 150} and len(ids) == 145
        flag.unlink()
        th.join(timeout=120)
        assert "r" in done and done["r"]["rows"] >= 98, done
        results, lsn = verify(s, ["pw"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        client.call("persist", table="pw")
        results, lsn = verify(s, ["pw"], "pyiceberg")
        assert all(r.match for r in results), [r.line() for r in results]
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # and the table goes on as usual after it
            c.execute("DELETE FROM pw WHERE id BETWEEN 70 AND 72")
            c.execute("UPDATE pw SET v = 'after' WHERE id = 80")
        results, lsn = verify(s, ["pw"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]


def test_the_scheduler_leaves_the_rows_a_persist_is_writing_to_it(pg_dsn, state_dir, monkeypatch):
    """The scheduler flushes a buffer past ``flush_rows`` under the lock; rows a persist has taken and
    is writing without the lock do not count (``MemSlice.flushable``): with 40 rows taken and 30 new
    ones (70 buffered, ``flush_rows`` 50), ticks leave the buffer to the persist instead of flushing it
    under the lock and throwing the persist's write away. The 30 rows that arrived during the write are
    more than ``flush_rows`` / 20, so the persist writes them in a second round without the lock
    (nothing is left for the commit's locked flush). Once the persist ends, the mirror matches."""
    flag, s = _held_setup(pg_dsn, state_dir, monkeypatch, "write", "pf", 10, flush_rows=50)
    with running_service(s) as client:
        client.call("create_table", dst="pf", src="public.pf")

        def status() -> dict:
            return {t["name"]: t for t in client.status()["tables"]}["pf"]

        def applied() -> None:
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                client.wait_lsn(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0], timeout=120)

        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO pf SELECT g, 'taken' FROM generate_series(11, 50) g")
        applied()
        files = status()["data_files"]
        th, done = _held_persist(s, "pf", flag)  # it took the 40 buffered rows
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO pf SELECT g, 'new' FROM generate_series(51, 80) g")
        applied()
        time.sleep(1.5)  # three scheduling rounds (one each 0.5 s)
        st = status()
        assert th.is_alive() and st["buffer_rows"] == 70 and st["data_files"] == files, st
        flag.unlink()
        th.join(timeout=120)
        assert "r" in done and done["r"]["rows"] == 70 and done["r"]["rows_flushed"] == 0, done
        assert status()["data_files"] == files + 2 and status()["buffer_rows"] == 0
        results, lsn = verify(s, ["pf"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        results, lsn = verify(s, ["pf"], "pyiceberg")
        assert all(r.match for r in results), [r.line() for r in results]
