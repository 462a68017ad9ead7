"""A malformed pgoutput message on its way into the decoder (issue 14), with the real service and a real
Postgres, both decoders. The fault (``MOONCAKE_FAULTS`` file, ``corrupt_relation``, engine/faults.py)
cuts every Insert/Update/Delete of one relation right after its OID before the decoder parses it
(the compiled decoder cuts its view of libpq's buffer; the reference the payload).

- One relation's message malformed: only that table stops, with one line naming table, relation, the
  XLogData and commit LSNs; the other table of the same transactions equals Postgres and keeps
  streaming; the slot is held below the failed commit; after the fault is gone a restart
  (what the error says) reads the transactions again and the table equals Postgres: nothing lost.
- A message no table can be named for (cut inside its OID): the stream fails, and ``status`` /
  ``list-tables`` show the stream error with every table ``retrying``, none ``ready``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from mooncake_assets.engine.faults import set_faults
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service.process import start_service, stop_service

from ..helpers import make_settings, mooncake, running_service, wait_until
from .conftest import Mirror, drop_database, new_database, new_state_dir


def _slot_confirmed(m: Mirror) -> int:
    slot = m.client.status()["slot"]
    return Lsn.parse(
        m.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", params=(slot,))[0][0]
    )


@pytest.fixture(params=["native", "python"])
def faulty_mirror(request, pg_cluster, monkeypatch):
    db = new_database(pg_cluster)
    dsn = pg_cluster.dsn(db)
    state = new_state_dir()
    faults = state / "faults.json"
    set_faults(faults)
    monkeypatch.setenv("MOONCAKE_FAULTS", str(faults))
    s = make_settings(state, dsn, maintenance="dagster", decoder=request.param)
    try:
        with running_service(s) as client:
            m = Mirror(s, client, dsn)
            m.sql(
                "CREATE TABLE good (id int PRIMARY KEY, v text)",
                "CREATE TABLE bad (id int PRIMARY KEY, v text)",
                "INSERT INTO good SELECT g, 'a' FROM generate_series(1, 100) g",
                "INSERT INTO bad SELECT g, 'a' FROM generate_series(1, 100) g",
            )
            m.create("good")
            m.create("bad")
            yield m, faults, s
    finally:
        drop_database(pg_cluster, db)
        if os.environ.get("MOONCAKE_KEEP_TEST_STATE") != "1":
            shutil.rmtree(state, ignore_errors=True)


def _fault_taken(m: Mirror) -> None:
    """Return once the stream loop has read the faults file as it is now: it reads the file at the top
    of every iteration, before its read, so once a change written after the file was set is applied,
    every later read (the writes that follow this call) comes after such a check. (A fixed sleep was
    not enough on a loaded machine: an iteration can take longer.)"""
    m.sql("INSERT INTO good VALUES (-1, 'heartbeat') ON CONFLICT (id) DO UPDATE SET v = good.v || '.'")
    m.client.wait_lsn(m.sql("SELECT pg_current_wal_lsn()::text")[0][0], timeout=120)


def _writes(m: Mirror, i: int) -> None:
    """Both tables changed in the same transaction (insert, update, delete)."""
    m.txn(
        f"INSERT INTO good SELECT g, 'n{i}' FROM generate_series({1000 * i}, {1000 * i + 20}) g",
        f"INSERT INTO bad SELECT g, 'n{i}' FROM generate_series({1000 * i}, {1000 * i + 20}) g",
        f"UPDATE bad SET v = 'u{i}' WHERE id % 7 = {i % 7}",
        f"UPDATE good SET v = 'u{i}' WHERE id % 7 = {i % 7}",
        f"DELETE FROM bad WHERE id = {i}",
        f"DELETE FROM good WHERE id = {i}",
    )


def test_a_malformed_message_stops_only_its_table_and_loses_nothing(faulty_mirror):
    m, faults, s = faulty_mirror
    m.check("good", "bad")
    for n in ("good", "bad"):
        m.call("persist", table=n)
    flush = Lsn.parse(m.status("bad")["flush_lsn"])
    oid = m.sql("SELECT 'public.bad'::regclass::oid")[0][0]
    set_faults(faults, corrupt_relation=oid)
    _fault_taken(m)
    _writes(m, 1)
    st = wait_until(lambda: (x := m.status("bad"))["state"] == "error" and x, what="the bad table to stop")
    err = st["error"]
    commit = Lsn.parse(err.split("committed at LSN ")[1].split(":")[0])
    assert err.startswith("table bad: malformed ") and f"message of relation {oid} (public.bad) at LSN " in err, err
    assert "XLogData at LSN" in err and f"flush LSN {Lsn(flush)}" in err and "restart the service" in err, err
    assert "\n" not in err and commit > flush
    assert Lsn.parse(st["applied_lsn"]) <= commit  # below the failed commit: a restart reads it again
    # the other table of the same transactions goes on
    m.check("good")
    _writes(m, 2)
    _writes(m, 3)
    m.check("good", iceberg=True)
    full = m.client.status()
    assert full["stream_error"] is None and m.status("good")["state"] == "ready", full
    assert m.status("bad")["state"] == "error"
    # the stopped table holds the slot below the failed commit, so a restart is sent it again (the slot
    # may stand past the table's flush LSN: while every table was clean it followed the idle stream)
    assert _slot_confirmed(m) <= commit
    out = " ".join(mooncake(s, "status", check=True).stdout.split())
    assert "bad: error" in out and "good: ready" in out, out
    doc = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)
    states = {t["name"]: (t["state"], t.get("error")) for t in doc["tables"]}
    assert states["bad"] == ("error", err) and states["good"][0] == "ready", states
    # the fault gone, a restart (what the error says) reads the transactions again from the flush LSN
    set_faults(faults)
    stop_service(s)
    start_service(s)
    m.client.close()
    wait_until(lambda: m.status("bad")["state"] == "ready", what="the bad table to come back")
    m.check("good", "bad", iceberg=True)
    assert m.status("bad")["missing_keys"] == 0


def test_a_message_no_table_can_be_named_for_fails_the_stream_visibly(faulty_mirror):
    m, faults, s = faulty_mirror
    m.check("good", "bad")
    oid = m.sql("SELECT 'public.bad'::regclass::oid")[0][0]
    set_faults(faults, corrupt_relation=oid, corrupt_short=True)
    _fault_taken(m)
    _writes(m, 1)
    st = wait_until(lambda: (x := m.client.status())["stream_error"] and x, what="the stream error")
    assert "truncated" in st["stream_error"] and "at LSN" in st["stream_error"], st["stream_error"]
    # no table looks healthy while the stream fails (it reconnects and fails again on the same message)
    for _ in range(5):
        st = m.client.status()
        assert st["stream_error"], st
        assert {t["name"]: t["state"] for t in st["tables"]} == {"good": "retrying", "bad": "retrying"}, st
        assert all("replication stream failing" in t["error"] for t in st["tables"])
    out = " ".join(mooncake(s, "status", check=True).stdout.split())
    assert "stream error: " in out and "good: retrying" in out and "bad: retrying" in out, out
    lt = " ".join(mooncake(s, "list-tables", check=True).stdout.split())
    assert "retrying" in lt and "ready" not in lt and "replication stream failing" in lt, lt
    # the fault gone, the stream reads the same transactions again: both tables equal Postgres
    set_faults(faults)
    wait_until(lambda: m.client.status()["stream_error"] is None, timeout=60, what="the stream to recover")
    m.check("good", "bad")
    assert {t["state"] for t in m.client.status()["tables"]} == {"ready"}
