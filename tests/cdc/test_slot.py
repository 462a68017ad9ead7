"""Slot hygiene.

An idle mirror must not hold WAL back while its source database writes elsewhere: with nothing in
flight and nothing dirty, the service confirms the keepalive's WAL end, so the slot's
``confirmed_flush_lsn`` keeps up with ``pg_current_wal_lsn()``. The acceptance test is the issue's:
a stable mirror idle for 60 s while another (unmirrored) table in the same database takes a steady
stream of writes (tens of MB of WAL); the retained WAL, sampled every couple of seconds, stays
bounded by what a few seconds of writes produce, never by everything written since the mirror went
idle, and is (almost) nothing once the writes stop.
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
    return c.execute(
        "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, pg_current_wal_lsn() - confirmed_flush_lsn "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    ).fetchone()


IDLE_WINDOW_S = 60.0  # the window
BATCH_EVERY_S = 0.5  # one INSERT batch into the unmirrored table every half second ...
BATCH_SQL = "INSERT INTO elsewhere (pad) SELECT repeat('w', 400) FROM generate_series(1, 800)"  # ... ~0.4 MB of WAL
SAMPLE_EVERY_S = 2.0
MAX_RETAINED = 8 << 20  # retained WAL allowed at any sample: ~10-20 s of this workload's writes
MIN_WRITTEN = 3 * MAX_RETAINED  # so an implementation that never confirms while idle ends far above the bound


@pytest.mark.slow
def test_idle_mirror_confirms_keepalive_wal_end(fresh_mirror):
    """60 s idle mirror, steady writes elsewhere: retained WAL (pg_current_wal_lsn() - the slot's
    confirmed_flush_lsn) stays below MAX_RETAINED at every sample although > 3x that is written, and
    drops to < 64 kB once the writes stop. A service that did not confirm keepalive WAL ends while
    idle would retain everything written (>= MIN_WRITTEN) by the end of the window."""
    m = fresh_mirror
    m.sql(
        "CREATE TABLE mirrored (id int PRIMARY KEY, v text)",
        "INSERT INTO mirrored VALUES (1, 'a')",
        "CREATE TABLE elsewhere (id serial PRIMARY KEY, pad text)",
    )
    m.create("mirrored")  # copied and persisted: nothing dirty, nothing in flight
    slot = m.client.status()["slot"]
    samples: list[tuple[float, int, int]] = []  # (seconds into the window, WAL written so far, retained WAL)
    batches = 0
    with psycopg.connect(m.dsn, autocommit=True) as c:
        start = int(_lag(c, slot)[0])
        t0 = time.monotonic()
        next_batch = next_sample = t0
        while (now := time.monotonic()) - t0 < IDLE_WINDOW_S:
            if now >= next_batch:
                c.execute(BATCH_SQL)
                batches += 1
                next_batch = max(next_batch + BATCH_EVERY_S, time.monotonic())  # no catch-up bursts
            if now >= next_sample:
                pos, lag = _lag(c, slot)
                samples.append((round(now - t0, 1), int(pos) - start, int(lag)))
                next_sample = max(next_sample + SAMPLE_EVERY_S, time.monotonic())
            time.sleep(max(0.0, min(next_batch, next_sample) - time.monotonic()))
        pos, lag = _lag(c, slot)
        samples.append((round(time.monotonic() - t0, 1), int(pos) - start, int(lag)))
        written = int(pos) - start
        deadline = time.monotonic() + 20  # quiet: a status round soon confirms the end (polled: load varies)
        while True:
            time.sleep(0.5)
            end_pos, end_lag = _lag(c, slot)
            if int(end_lag) < 64 << 10 or time.monotonic() > deadline:
                break
    assert written >= MIN_WRITTEN, f"the workload wrote only {written} bytes of WAL in {batches} batches"
    assert len(samples) >= 20, samples
    worst = max(samples, key=lambda s: s[2])
    assert worst[2] < MAX_RETAINED, (
        f"the idle mirror's slot retained {worst[2]} bytes of WAL at t={worst[0]}s "
        f"(bound {MAX_RETAINED}; {written} written in the window); samples (t, written, retained): {samples}"
    )
    assert int(end_lag) < 64 << 10, f"idle slot still {end_lag} bytes behind pg_current_wal_lsn() after the writes"
    st = m.status("mirrored")
    assert st["error"] is None and st["state"] == "ready", st
    m.check("mirrored")


def test_drop_table_leaves_publication_and_drops_slot_with_the_last(fresh_mirror):
    m = fresh_mirror
    m.sql(
        "CREATE TABLE d1 (id int PRIMARY KEY)",
        "CREATE TABLE d2 (id int PRIMARY KEY)",
        "INSERT INTO d1 VALUES (1)",
        "INSERT INTO d2 VALUES (1)",
    )
    m.create("d1")
    m.create("d2")
    st = m.client.status()
    slot, pub = st["slot"], st["publication"]
    assert m.sql("SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", params=(pub,)) == [
        ("d1",),
        ("d2",),
    ]
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
