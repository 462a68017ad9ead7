"""Issue 7 part 2: slot hygiene.

An idle mirror must not hold WAL back while its source database writes elsewhere: with nothing in
flight and nothing dirty, the service confirms the keepalive's WAL end, so the slot's
``confirmed_flush_lsn`` keeps up with ``pg_current_wal_lsn()``. The issue asks for 60 s of idleness;
the test watches 8 s of steady writes to an unmirrored table (~30 status rounds of the service,
which confirms once a second), which shows the same thing: the retained WAL stays bounded by what
was written in the last few seconds, not by everything written since the mirror went idle.
"""
from __future__ import annotations

import time

import psycopg
import pytest

from .conftest import mirror_fixture


@pytest.fixture()
def fresh_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def _lag(c, slot: str) -> tuple[int, int]:
    """(pg_current_wal_lsn(), bytes between it and the slot's confirmed_flush_lsn)."""
    return c.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn() - confirmed_flush_lsn "
                     "FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()


def test_idle_mirror_confirms_keepalive_wal_end(fresh_mirror):
    m = fresh_mirror
    m.sql("CREATE TABLE mirrored (id int PRIMARY KEY, v text)", "INSERT INTO mirrored VALUES (1, 'a')",
          "CREATE TABLE elsewhere (id serial PRIMARY KEY, pad text)")
    m.create("mirrored")                         # copied and persisted: nothing dirty, nothing in flight
    slot = m.client.status()["slot"]
    lags = []
    with psycopg.connect(m.dsn, autocommit=True) as c:
        start = int(_lag(c, slot)[0])
        t_end = time.time() + 8
        while time.time() < t_end:
            c.execute("INSERT INTO elsewhere (pad) SELECT repeat('w', 500) FROM generate_series(1, 200)")
            time.sleep(0.02)
            lags.append(_lag(c, slot))
        written = int(lags[-1][0]) - start
        deadline = time.time() + 20              # quiet: a status round soon confirms the end (polled: load varies)
        while True:
            time.sleep(0.5)
            end_pos, end_lag = _lag(c, slot)
            if int(end_lag) < 64 << 10 or time.time() > deadline:
                break
    assert written > 20 << 20, f"the workload wrote only {written} bytes of WAL"
    second_half = [int(lag) for _, lag in lags[len(lags) // 2:]]
    # while WAL grows by ~20+ MB the slot trails by at most what a few seconds write, never all of it
    assert max(second_half) < written / 3, (max(second_half), written)
    assert int(end_lag) < 64 << 10, f"idle slot still {end_lag} bytes behind pg_current_wal_lsn()"
    st = m.status("mirrored")
    assert st["error"] is None
    m.check("mirrored")


def test_drop_table_leaves_publication_and_drops_slot_with_the_last(fresh_mirror):
    m = fresh_mirror
    m.sql("CREATE TABLE d1 (id int PRIMARY KEY)", "CREATE TABLE d2 (id int PRIMARY KEY)",
          "INSERT INTO d1 VALUES (1)", "INSERT INTO d2 VALUES (1)")
    m.create("d1")
    m.create("d2")
    st = m.client.status()
    slot, pub = st["slot"], st["publication"]
    assert m.sql("SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", params=(pub,)) == \
        [("d1",), ("d2",)]
    r = m.call("drop_table", table="d1")
    assert r == {"dropped": "d1", "slot_dropped": False}
    assert m.sql("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", params=(pub,)) == [("d2",)]
    assert m.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)) == [(1,)]
    m.sql("INSERT INTO d2 VALUES (2)", "INSERT INTO d1 VALUES (2)")
    m.check("d2")
    r = m.call("drop_table", table="d2")
    assert r == {"dropped": "d2", "slot_dropped": True}
    assert m.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)) == [(0,)]
    assert m.sql("SELECT count(*) FROM pg_publication WHERE pubname = %s", params=(pub,)) == [(0,)]
    assert m.client.status()["tables"] == []
    # mirroring again afterwards makes a new slot and publication and streams
    m.create("d1")
    m.sql("INSERT INTO d1 VALUES (3)")
    m.check("d1")
    assert m.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", params=(slot,)) == [(1,)]
