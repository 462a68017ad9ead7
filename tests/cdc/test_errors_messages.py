"""Every error path has a message that names the table, the column or the LSN.

The paths not covered by the other modules: a table whose replica identity cannot locate rows
(REPLICA IDENTITY NOTHING: refused at create-table; set after mirroring started, it stops only that
table at the LSN of its next change), and a replication slot that was dropped while the service was
down (the changes it held are gone: the mirrors on it stop, naming the slot and the lost LSN range,
instead of streaming on from a new slot as if nothing had happened).
"""

from __future__ import annotations

import json
import re

import pytest

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceError
from mooncake_assets.engine.service.process import start_service, stop_service

from ..helpers import mooncake
from .conftest import mirror_fixture

LSN_RE = r"([0-9A-F]+/[0-9A-F]+)"


@pytest.fixture()
def fresh_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def _wal_now(m) -> int:
    return Lsn.parse(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])


def _slot_confirmed(m) -> int:
    slot = m.client.status()["slot"]
    return Lsn.parse(
        m.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", params=(slot,))[0][0]
    )


def test_replica_identity_nothing_is_refused_at_create_table(mirror):
    """A keyed table with REPLICA IDENTITY NOTHING: its UPDATE/DELETE would carry no key, and once it
    is in a publication Postgres refuses them. create-table refuses it in one line naming the table,
    before publishing anything; with REPLICA IDENTITY DEFAULT it is mirrored. (A table without a key
    gets REPLICA IDENTITY FULL instead, whatever it had.)"""
    m = mirror
    m.sql(
        "CREATE TABLE rin (id int PRIMARY KEY, v text)",
        "ALTER TABLE rin REPLICA IDENTITY NOTHING",
        "INSERT INTO rin VALUES (1, 'a')",
        "CREATE TABLE rin_nk (k int, v text)",
        "ALTER TABLE rin_nk REPLICA IDENTITY NOTHING",
        "INSERT INTO rin_nk VALUES (1, 'a')",
    )
    with pytest.raises(ServiceError) as e:
        m.create("rin")
    msg = str(e.value)
    assert "table public.rin " in msg and "REPLICA IDENTITY NOTHING" in msg and "\n" not in msg, msg
    assert all(t["name"] != "rin" for t in m.client.status()["tables"])
    assert m.sql("SELECT count(*) FROM pg_publication_tables WHERE tablename = 'rin'") == [(0,)]
    m.sql("UPDATE rin SET v = 'b' WHERE id = 1")  # the source's own writes still work
    r = mooncake(m.settings, "create-table", "rin", "public.rin")
    assert r.returncode != 0 and "public.rin" in r.stderr and "REPLICA IDENTITY NOTHING" in r.stderr, r.stderr
    m.sql("ALTER TABLE rin REPLICA IDENTITY DEFAULT")
    m.create("rin")
    m.create("rin_nk")
    assert m.sql("SELECT relreplident FROM pg_class WHERE relname = 'rin_nk'") == [("f",)]
    m.sql("UPDATE rin SET v = 'c' WHERE id = 1", "INSERT INTO rin VALUES (2, 'x')", "UPDATE rin_nk SET v = 'b'")
    m.check("rin", "rin_nk")


def test_replica_identity_nothing_after_mirroring_stops_only_that_table(mirror):
    """REPLICA IDENTITY NOTHING set on mirrored tables (keyed, and keyless = FULL): each stops at the
    next change, with an error naming the table and that change's LSN, and holds the slot at its flush
    LSN; a third table goes on."""
    m = mirror
    m.sql(
        "CREATE TABLE rik (id int PRIMARY KEY, v text)",
        "CREATE TABLE rif (k int, v text)",
        "CREATE TABLE ri_ok (id int PRIMARY KEY)",
        "INSERT INTO rik VALUES (1, 'a')",
        "INSERT INTO rif VALUES (1, 'a')",
    )
    for t in ("rik", "rif", "ri_ok"):
        m.create(t)
    m.sql("ALTER TABLE rik REPLICA IDENTITY NOTHING", "ALTER TABLE rif REPLICA IDENTITY NOTHING")
    before = _wal_now(m)
    m.sql("INSERT INTO rik VALUES (2, 'b')", "INSERT INTO rif VALUES (2, 'b')")
    after = _wal_now(m)
    m.sql("INSERT INTO ri_ok VALUES (1)")
    m.check("ri_ok")
    for t, what in (
        ("rik", "its replica identity key became (nothing) but the mirror locates rows by (id)"),
        ("rif", "its replica identity changed from FULL to NOTHING"),
    ):
        st = m.status(t)
        assert st["state"] == "error", st
        err = st["error"]
        assert f"table {t} (source public.{t})" in err and what in err, err
        at = Lsn.parse(re.search(f"at LSN {LSN_RE}", err).group(1))
        assert before <= at < after, (err, before, after)
        with pytest.raises(ServiceError, match=f"table {t} is stopped by an error"):
            m.call("persist", table=t)
    assert _slot_confirmed(m) <= min(Lsn.parse(m.status(t)["flush_lsn"]) for t in ("rik", "rif"))
    lt = json.loads(mooncake(m.settings, "list-tables", "--json", check=True).stdout)
    assert {t["name"]: t["state"] for t in lt["tables"] if t["name"] in ("rik", "rif", "ri_ok")} == {
        "rik": "error",
        "rif": "error",
        "ri_ok": "ready",
    }


def test_slot_dropped_while_the_service_was_down_stops_its_mirrors(fresh_mirror):
    """The slot is dropped while the service is stopped (an operator, or max_slot_wal_keep_size), and
    rows change meanwhile: those changes are gone. On start the service makes a new slot but stops the
    mirror with an error naming the table, the slot, its flush LSN and the new slot's start LSN (not a
    silent mismatch); the error survives another restart; drop-table + create-table recovers."""
    m = fresh_mirror
    m.sql("CREATE TABLE sg (id int PRIMARY KEY, v text)", "INSERT INTO sg SELECT g, 'a' FROM generate_series(1, 10) g")
    m.create("sg")
    m.sql("UPDATE sg SET v = 'b' WHERE id <= 3")
    m.call("persist", table="sg")
    slot = m.client.status()["slot"]
    flush = m.status("sg")["flush_lsn"]
    stop_service(m.settings)
    m.sql("UPDATE sg SET v = 'lost' WHERE id > 5", "DELETE FROM sg WHERE id = 1")
    m.sql("SELECT pg_drop_replication_slot(%s)", params=(slot,))
    dropped_at = _wal_now(m)
    start_service(m.settings)
    m.client.close()
    m.sql("INSERT INTO sg VALUES (100, 'new')")
    for restart in (False, True):
        if restart:
            stop_service(m.settings)
            start_service(m.settings)
            m.client.close()
        st = m.status("sg")
        assert st["state"] == "error" and st["flush_lsn"] == flush, st
        err = st["error"]
        assert f"table sg: replication slot {slot} was gone" in err, err
        assert f"after its flush LSN {flush} up to LSN " in err and "are lost" in err and "re-create" in err, err
        new_start = Lsn.parse(re.search(f"up to LSN {LSN_RE}", err).group(1))
        assert new_start >= dropped_at, (err, dropped_at)
    r = mooncake(m.settings, "persist", "sg")
    assert r.returncode != 0 and "table sg is stopped by an error" in r.stderr and slot in r.stderr, r.stderr
    r = mooncake(m.settings, "verify", "sg")
    assert r.returncode != 0 and "MISMATCH" in r.stdout, r.stdout  # the lost changes, visibly
    mooncake(m.settings, "drop-table", "sg", check=True)
    mooncake(m.settings, "create-table", "sg", "public.sg", check=True)
    m.sql("UPDATE sg SET v = 'after' WHERE id = 2")
    m.check("sg", iceberg=True)
    assert m.status("sg")["state"] == "ready"
