"""Schema changes mid-stream.

ADD COLUMN (with and without default), DROP COLUMN, RENAME COLUMN and type widening become Iceberg
schema evolution at the exact LSN: the union read, PyIceberg and DuckDB's iceberg_scan match the
source afterwards, with rows that were persisted, staged, sealed and still open in the buffer when
the change arrived; the Iceberg snapshot before the change keeps the old schema. A change that
cannot be mirrored stops only its table with an error naming table, column and LSN, holds the slot,
and a fix resumes it with nothing lost.
"""

from __future__ import annotations

import json

import pytest

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service.process import kill_service, start_service, stop_service
from mooncake_assets.verify import verify

from ..helpers import mooncake
from .conftest import mirror_fixture


def _lsn_now(m) -> int:
    return Lsn.parse(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])


def _slot_confirmed(m) -> int:
    slot = m.client.status()["slot"]
    return Lsn.parse(
        m.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", params=(slot,))[0][0]
    )


def _check_all_readers(m, *names):
    """union read, then persist and PyIceberg, then DuckDB's iceberg_scan: all equal to the source."""
    m.check(*names, iceberg=True)
    results, lsn = verify(m.settings, list(names), "duckdb-iceberg", m.client)
    bad = [r.line() for r in results if not r.match]
    assert not bad, f"duckdb-iceberg at LSN {lsn}: {bad}"


def _iceberg_table(m, name):
    from mooncake_assets.engine.iceberg import make_catalog

    return make_catalog(m.settings.catalog, m.settings.warehouse_uri).load_table(f"mooncake.{name}")


def _rows_everywhere(m, t):
    """Rows in every place a schema change must convert: persisted (with a DV), staged by a flush,
    sealed in the buffer, and open in the buffer."""
    m.sql(
        f"CREATE TABLE {t} (id int PRIMARY KEY, a int, b varchar(5), n numeric(6,2), f real)",
        f"INSERT INTO {t} SELECT g, g, 'b' || g % 10, g / 4.0, g / 2.0 FROM generate_series(1, 40) g",
    )
    m.create(t)
    m.sql(f"UPDATE {t} SET a = -a WHERE id <= 3", f"DELETE FROM {t} WHERE id = 4")
    m.call("persist", table=t)  # a DV on the copied file
    m.sql(f"INSERT INTO {t} SELECT g, g, 'f', 1.5, 2.5 FROM generate_series(41, 60) g", f"DELETE FROM {t} WHERE id = 5")
    m.call("flush", table=t)  # a staged file + a pending delete
    m.sql(
        f"INSERT INTO {t} SELECT g, g, 'm', 2.5, 3.5 FROM generate_series(61, 80) g",
        f"UPDATE {t} SET b = 'u' WHERE id IN (6, 45, 62)",
    )  # buffered rows
    m.check(t)


FOLLOWED = [
    (
        "add",
        ["ALTER TABLE {t} ADD COLUMN note text"],
        ["INSERT INTO {t} VALUES (100, 1, 'x', 1, 1, 'new')", "UPDATE {t} SET note = 'set' WHERE id IN (1, 42, 63)"],
        lambda cols: "note" in cols,
    ),
    (
        "add_default",
        [
            "ALTER TABLE {t} ADD COLUMN flag boolean NOT NULL DEFAULT true",
            "ALTER TABLE {t} ADD COLUMN label text DEFAULT 'it''s {{x}}'",
        ],
        [
            "INSERT INTO {t} (id, a, b, n, f, flag) VALUES (100, 1, 'x', 1, 1, false)",
            "UPDATE {t} SET a = 7 WHERE id = 44",
        ],
        lambda cols: "flag" in cols and "label" in cols,
    ),
    (
        "drop",
        ["ALTER TABLE {t} DROP COLUMN b"],
        ["UPDATE {t} SET a = a + 1 WHERE id IN (1, 43, 64)"],
        lambda cols: "b" not in cols,
    ),
    (
        "rename",
        ["ALTER TABLE {t} RENAME COLUMN a TO amount"],
        ["DELETE FROM {t} WHERE id = 2", "UPDATE {t} SET amount = 0 WHERE id IN (8, 46, 65)"],
        lambda cols: "amount" in cols and "a" not in cols,
    ),
    (
        "widen_int",
        ["ALTER TABLE {t} ALTER COLUMN a TYPE bigint"],
        ["INSERT INTO {t} VALUES (100, 5000000000, 'x', 1, 1)", "UPDATE {t} SET a = a * 3 WHERE id IN (9, 47, 66)"],
        lambda cols: True,
    ),
    (
        "widen_text",
        ["ALTER TABLE {t} ALTER COLUMN b TYPE text"],
        ["INSERT INTO {t} VALUES (100, 1, 'longer than 5', 1, 1)"],
        lambda cols: True,
    ),
    (
        "widen_numeric_real",
        ["ALTER TABLE {t} ALTER COLUMN n TYPE numeric(12,2)", "ALTER TABLE {t} ALTER COLUMN f TYPE float8"],
        ["INSERT INTO {t} VALUES (100, 1, 'x', 1234567890.12, 1e300)"],
        lambda cols: True,
    ),
    (
        "drop_then_add_same_name",
        ["ALTER TABLE {t} DROP COLUMN b", "ALTER TABLE {t} ADD COLUMN b varchar(5)"],
        ["INSERT INTO {t} VALUES (100, 1, 1, 1, 'nb')"],
        lambda cols: cols[-1] == "b",
    ),
]


@pytest.mark.parametrize("kind, ddl, dml, cols_ok", FOLLOWED, ids=[c[0] for c in FOLLOWED])
def test_schema_change_becomes_iceberg_schema_evolution(mirror, kind, ddl, dml, cols_ok):
    m = mirror
    t = f"se_{kind}"
    _rows_everywhere(m, t)
    before_snapshot = _iceberg_table(m, t).current_snapshot().snapshot_id
    before_cols = [f.name for f in _iceberg_table(m, t).schema().fields]
    m.sql(*[d.format(t=t) for d in ddl])
    at = _lsn_now(m)
    m.sql(*[d.format(t=t) for d in dml])
    cols = m.read(t).column_names
    assert cols_ok(cols), cols
    assert m.status(t)["state"] == "ready", m.status(t)
    assert "schema change at LSN" in (m.status(t)["last_schema_change"] or ""), m.status(t)
    m.check(t)  # union read, before the change is persisted
    m.sql(
        f"INSERT INTO {t} SELECT g, 1, 1, 1 FROM generate_series(200, 210) g"
        if kind == "drop"
        else f"UPDATE {t} SET id = id + 1000 WHERE id IN (10, 48, 67)"
    )
    _check_all_readers(m, t)  # + PyIceberg and DuckDB's iceberg_scan
    m.call("compact", table=t, full=True)  # files of several layouts rewritten as one
    _check_all_readers(m, t)
    ice = _iceberg_table(m, t)
    assert [f.name for f in ice.schema().fields] == m.read(t).column_names
    # the snapshot before the change keeps the old schema (time travel reads it the old way)
    old = ice.scan(snapshot_id=before_snapshot).to_arrow()
    assert old.column_names == before_cols
    props = json.loads(ice.metadata.properties["mooncake.columns"])
    assert [c["name"] for c in props["columns"]] == m.read(t).column_names
    flush = Lsn.parse(ice.current_snapshot().summary["mooncake.flush-lsn"])
    assert flush > at


def test_added_default_reads_for_older_rows(mirror):
    m = mirror
    m.sql(
        "CREATE TABLE se_def (id int PRIMARY KEY, v text)",
        "INSERT INTO se_def SELECT g, 'v' FROM generate_series(1, 5) g",
    )
    m.create("se_def")
    m.sql(
        "ALTER TABLE se_def ADD COLUMN d date DEFAULT '2024-02-29', ADD COLUMN amt numeric(8,2) DEFAULT 12.5, "
        "ADD COLUMN k int DEFAULT 7",
        "INSERT INTO se_def VALUES (6, 'w', NULL, NULL, NULL)",
    )
    got = {r["id"]: r for r in m.read("se_def").to_pylist()}
    import datetime
    from decimal import Decimal

    assert got[1]["d"] == datetime.date(2024, 2, 29) and got[1]["amt"] == Decimal("12.50") and got[1]["k"] == 7
    assert got[6]["d"] is None and got[6]["k"] is None
    _check_all_readers(m, "se_def")
    f = _iceberg_table(m, "se_def").schema().find_field("k")
    assert f.initial_default == 7 and not f.required


def test_schema_change_survives_a_kill_before_and_after_persist(fresh_mirror):
    """The change is applied in memory, the service is SIGKILLed before it was persisted: the restart
    rebuilds the old schema from Iceberg and meets the change again at its LSN. Then again after a
    persist: the restart takes the new columns from the Iceberg table property."""
    m = fresh_mirror
    _rows_everywhere(m, "se_kill")
    m.sql(
        "ALTER TABLE se_kill ADD COLUMN extra int DEFAULT 3",
        "ALTER TABLE se_kill RENAME COLUMN a TO aa",
        "UPDATE se_kill SET extra = 9 WHERE id IN (1, 50, 70)",
    )
    m.check("se_kill")

    def kill_and_restart():
        kill_service(m.settings)
        start_service(m.settings)
        m.client.close()

    kill_and_restart()
    m.sql("DELETE FROM se_kill WHERE id = 71")
    m.check("se_kill")
    _check_all_readers(m, "se_kill")
    m.sql("ALTER TABLE se_kill DROP COLUMN b", "INSERT INTO se_kill VALUES (500, 5, 5, 5, 5)")
    m.call("persist", table="se_kill")
    kill_and_restart()
    m.sql("UPDATE se_kill SET aa = 1 WHERE id = 500")
    _check_all_readers(m, "se_kill")
    assert m.status("se_kill")["missing_keys"] == 0


def test_keyless_table_follows_add_and_rename(mirror):
    m = mirror
    m.sql("CREATE TABLE se_nokey (a int, b text)", "INSERT INTO se_nokey VALUES (1, 'x'), (1, 'x'), (2, 'y')")
    m.create("se_nokey")
    m.sql("ALTER TABLE se_nokey ADD COLUMN c int", "INSERT INTO se_nokey VALUES (1, 'x', 5), (1, 'x', 6)")
    m.sql("DELETE FROM se_nokey WHERE c = 6", "UPDATE se_nokey SET b = 'z' WHERE c IS NULL AND a = 2")
    m.sql(
        "ALTER TABLE se_nokey RENAME COLUMN b TO bb",
        "DELETE FROM se_nokey WHERE ctid = (SELECT min(ctid) FROM se_nokey WHERE a = 1 AND c IS NULL)",
    )
    _check_all_readers(m, "se_nokey")
    assert m.status("se_nokey")["missing_keys"] == 0
    m.sql("ALTER TABLE se_nokey DROP COLUMN c", "INSERT INTO se_nokey VALUES (3, 'q')")
    m.client.wait_lsn(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    err = m.status("se_nokey")["error"] or ""
    assert "table se_nokey" in err and "column c was dropped from a table without a primary key" in err, err
    assert "LSN " in err


STOPPED = [
    (
        "int_to_text",
        "ALTER TABLE {t} ALTER COLUMN a TYPE text",
        "INSERT INTO {t} VALUES (100, 'one', 'x')",
        "column a changed type from integer to text",
    ),
    (
        "narrow",
        "ALTER TABLE {t} ALTER COLUMN a TYPE smallint",
        "INSERT INTO {t} VALUES (100, 1, 'x')",
        "column a changed type from integer to smallint",
    ),
    (
        "unmappable_add",
        "ALTER TABLE {t} ADD COLUMN doc regproc",
        "INSERT INTO {t} VALUES (100, 1, 'x', 'now')",
        "column doc was added with a type that cannot be mirrored",
    ),
]


@pytest.mark.parametrize("kind, ddl, dml, expect", STOPPED, ids=[c[0] for c in STOPPED])
def test_unfollowable_change_stops_only_its_table(mirror, kind, ddl, dml, expect):
    m = mirror
    t, other = f"sc_{kind}", f"sc_{kind}_other"
    m.sql(
        f"CREATE TABLE {t} (id int PRIMARY KEY, a int, b varchar(5))",
        f"INSERT INTO {t} SELECT g, g, 'b' FROM generate_series(1, 10) g",
        f"CREATE TABLE {other} (id int PRIMARY KEY)",
    )
    m.create(t)
    m.create(other)
    m.sql(f"INSERT INTO {t} VALUES (50, 50, 'mem')")  # in memory when the change arrives
    m.sql(ddl.format(t=t))
    before = _lsn_now(m)
    m.sql(dml.format(t=t))
    after = _lsn_now(m)
    m.sql(f"INSERT INTO {other} VALUES (1)", f"INSERT INTO {t} (id) VALUES (200)")
    m.check(other)  # the other table goes on
    st = m.status(t)
    assert st["state"] == "error", st
    err = st["error"]
    assert f"table {t}" in err and expect in err, err
    at = Lsn.parse(err.split("schema change at LSN ")[1].split(":")[0])
    assert before <= at < after, (hex(before), hex(at), hex(after))
    # held: the slot is never confirmed past the change that stopped the table, so Postgres resends it
    assert _slot_confirmed(m) <= at
    assert "\n" not in err
    if kind == "unmappable_add":  # the remedy offered is one that works
        assert "drop column doc on the source and restart the service" in err, err
    else:
        assert "restart the service" not in err and "re-create the mirror" in err, err
    if kind == "int_to_text":  # the command line shows it too
        lt = json.loads(mooncake(m.settings, "list-tables", "--json", check=True).stdout)
        row = next(x for x in lt["tables"] if x["name"] == t)
        assert row["state"] == "error" and row["error"] == err
        human = mooncake(m.settings, "list-tables", check=True).stdout
        assert f"{t}: table {t}" in " ".join(human.split()), human
        q = mooncake(m.settings, "query", f"SELECT count(*) AS n FROM {t}", "--format", "json", check=True)
        assert f"{t} is stopped" in " ".join(q.stderr.split()), q.stderr  # stale rows are not silent
        v = mooncake(m.settings, "verify", t)
        assert v.returncode != 0 and "the mirror is stopped" in v.stdout + v.stderr, v.stdout + v.stderr


def test_recreating_the_mirror_resumes_with_nothing_lost(mirror):
    m = mirror
    m.sql(
        "CREATE TABLE sc_fix (id int PRIMARY KEY, a int)",
        "INSERT INTO sc_fix SELECT g, g FROM generate_series(1, 20) g",
    )
    m.create("sc_fix")
    m.sql("ALTER TABLE sc_fix ALTER COLUMN a TYPE text", "UPDATE sc_fix SET a = 'neg' || a WHERE id <= 5")
    m.client.wait_lsn(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    assert m.status("sc_fix")["state"] == "error"
    m.sql("INSERT INTO sc_fix VALUES (21, 'x')")
    m.call("drop_table", table="sc_fix")
    m.create("sc_fix")
    m.sql("UPDATE sc_fix SET a = 'after' WHERE id > 15")
    m.check("sc_fix", iceberg=True)


@pytest.fixture()
def fresh_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def test_undoing_an_added_column_and_restarting_resumes(fresh_mirror):
    """An added column of a type that cannot be mirrored stops the table; dropping the column on the
    source and restarting the service replays from the table's flush LSN, leaving the dropped column
    out: every change made while it was stopped arrives, none twice."""
    m = fresh_mirror
    m.sql(
        "CREATE TABLE sc_undo (id int PRIMARY KEY, v text)",
        "INSERT INTO sc_undo SELECT g, 'a' FROM generate_series(1, 30) g",
        "CREATE TABLE sc_keep (id int PRIMARY KEY)",
    )
    m.create("sc_undo")
    m.create("sc_keep")
    m.sql("INSERT INTO sc_undo VALUES (31, 'before')", "UPDATE sc_undo SET v = 'b' WHERE id <= 3")
    m.call("persist", table="sc_undo")
    m.sql("INSERT INTO sc_undo VALUES (32, 'unpersisted')")
    m.sql("ALTER TABLE sc_undo ADD COLUMN doc regproc")
    m.sql(
        "INSERT INTO sc_undo VALUES (33, 'with doc', 'now')",
        "UPDATE sc_undo SET v = 'c' WHERE id BETWEEN 4 AND 6",
        "DELETE FROM sc_undo WHERE id = 7",
        "INSERT INTO sc_keep VALUES (1)",
    )
    m.check("sc_keep")
    st = m.status("sc_undo")
    assert st["state"] == "error" and "column doc was added with a type that cannot be mirrored" in st["error"], st
    stop_service(m.settings)  # a restart before the fix: the service
    start_service(m.settings)  # starts, the table stops again, same LSN
    m.client.close()
    m.check("sc_keep")
    st2 = m.status("sc_undo")
    at = lambda e: e.split("schema change at LSN ")[1].split(":")[0]
    assert st2["state"] == "error" and at(st2["error"]) == at(st["error"]), (st, st2)
    m.sql("ALTER TABLE sc_undo DROP COLUMN doc")  # the fix
    m.sql("INSERT INTO sc_undo VALUES (34, 'after fix')", "INSERT INTO sc_keep VALUES (2)")
    stop_service(m.settings)
    start_service(m.settings)
    m.client.close()
    m.check("sc_undo", "sc_keep", iceberg=True)
    assert m.status("sc_undo")["state"] == "ready" and m.status("sc_undo")["missing_keys"] == 0
    m.sql("ALTER TABLE sc_undo ADD COLUMN late int", "INSERT INTO sc_undo VALUES (35, 'late', 1)")  # followed
    _check_all_readers(m, "sc_undo")


def test_several_changes_with_kills_on_a_wide_table(fresh_mirror):
    """Changes of several kinds one after another on a table with TOAST text, arrays, infinity
    timestamps and numerics, with flushes, persists and SIGKILLs in between (a chaos run's shape)."""
    m = fresh_mirror
    t = "se_wide"
    m.sql(
        f"CREATE TABLE {t} (id int PRIMARY KEY, grp int, name text, big text, amount numeric(12,2), "
        "at timestamptz, tags text[])",
        f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL",
        f"INSERT INTO {t} SELECT g, g % 7, 'n' || g, CASE WHEN g % 5 = 0 THEN repeat(md5(g::text), 200) END, "
        "g * 1.25, now(), ARRAY['a', 'b' || g] FROM generate_series(1, 200) g",
    )
    m.create(t)

    def restart():
        kill_service(m.settings)
        start_service(m.settings)
        m.client.close()

    ins = (
        f"INSERT INTO {t} SELECT g, g % 7, 'i' || g, NULL, (g % 1000) / 8.0, 'infinity', "
        "ARRAY['x', NULL, 'y' || g] FROM generate_series({a}, {b}) g"
    )
    m.sql(f"ALTER TABLE {t} ADD COLUMN x3 text DEFAULT 'd'", ins.format(a=300, b=303))
    restart()
    m.sql(f"UPDATE {t} SET x3 = 'u' WHERE id % 7 = 6", f"UPDATE {t} SET grp = grp + 1 WHERE id IN (1, 2, 301)")
    m.check(t)
    m.call("flush", table=t)
    m.sql(f"ALTER TABLE {t} ADD COLUMN x7 text", ins.format(a=400, b=408))
    m.check(t)
    m.call("persist", table=t)
    restart()
    m.sql(f"ALTER TABLE {t} ALTER COLUMN grp TYPE bigint", ins.format(a=500, b=510))
    m.check(t)
    m.sql(f"ALTER TABLE {t} RENAME COLUMN x3 TO y9", ins.format(a=600, b=601))
    m.check(t)
    restart()
    m.sql(f"UPDATE {t} SET y9 = 'v' WHERE id % 5 = 1")
    _check_all_readers(m, t)
    m.call("compact", table=t, full=True)
    _check_all_readers(m, t)


@pytest.fixture()
def streaming_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster, dsn_options="-c logical_decoding_work_mem=64kB")


def test_change_inside_a_transaction_and_a_streamed_one(streaming_mirror):
    """Rows written before and after an ALTER in ONE transaction (the tuples have two shapes under one
    commit LSN), and the same inside a transaction large enough to be streamed before commit."""
    import time

    m = streaming_mirror
    m.sql(
        "CREATE TABLE se_txn (id int PRIMARY KEY, v text)",
        "INSERT INTO se_txn SELECT g, 'v' FROM generate_series(1, 10) g",
    )
    m.create("se_txn")
    m.txn(
        "INSERT INTO se_txn VALUES (11, 'before')",
        "UPDATE se_txn SET v = 'u1' WHERE id = 1",
        "ALTER TABLE se_txn ADD COLUMN c int DEFAULT 5",
        "INSERT INTO se_txn VALUES (12, 'after', 6)",
        "UPDATE se_txn SET c = 7 WHERE id IN (2, 11)",
        "ALTER TABLE se_txn RENAME COLUMN v TO w",
        "DELETE FROM se_txn WHERE id = 3",
    )
    m.check("se_txn")
    m.txn(
        "INSERT INTO se_txn SELECT g, repeat('x', 200), g FROM generate_series(100, 3000) g",  # > 64kB: streamed
        "ALTER TABLE se_txn ADD COLUMN d text DEFAULT 'dd'",
        "ALTER TABLE se_txn ADD COLUMN flag boolean DEFAULT true",
        "ALTER TABLE se_txn ADD COLUMN amt numeric(6,2) DEFAULT 1.5",
        "ALTER TABLE se_txn ALTER COLUMN c TYPE bigint",
        "INSERT INTO se_txn SELECT g, 'y', g::bigint * 1000000000, 'e', false, 2 FROM generate_series(3001, 5000) g",
        "UPDATE se_txn SET d = 'upd' WHERE id % 10 = 0",
    )
    _check_all_readers(m, "se_txn")
    slot = m.client.status()["slot"]
    for _ in range(50):  # the statistics are reported asynchronously
        streamed = m.sql("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", params=(slot,))
        if streamed and streamed[0][0] > 0:
            break
        time.sleep(0.2)
    assert streamed and streamed[0][0] > 0, "the large transaction was not streamed"


def test_a_column_added_flushed_and_dropped_before_a_persist(mirror):
    """A file flushed under an intermediate schema (x5 added, then dropped before any persist) is
    committed with that schema version in the table's history, so its field ids are known."""
    m = mirror
    m.sql(
        "CREATE TABLE se_mid (id int PRIMARY KEY, v int)", "INSERT INTO se_mid SELECT g, g FROM generate_series(1, 5) g"
    )
    m.create("se_mid")
    m.sql("ALTER TABLE se_mid ADD COLUMN x5 numeric(8,2)", "INSERT INTO se_mid VALUES (6, 6, 1.5)")
    m.call("flush", table="se_mid")
    m.sql(
        "ALTER TABLE se_mid DROP COLUMN x5",
        "INSERT INTO se_mid VALUES (7, 7)",
        "UPDATE se_mid SET v = -v WHERE id IN (1, 6)",
    )
    _check_all_readers(m, "se_mid")
    ice = _iceberg_table(m, "se_mid")
    assert len(ice.metadata.schemas) == 3 and [f.name for f in ice.schema().fields] == ["id", "v"]


def test_position_delete_tables_evolve_too_but_not_with_defaults(mirror):
    """Format v2 (position-deletes): ADD (no default), RENAME, widening and DROP become schema evolution
    like on v3; ADD COLUMN … DEFAULT stops the table (Iceberg v2 has no initial-default)."""
    m = mirror
    m.sql(
        "CREATE TABLE se_v2 (id int PRIMARY KEY, a int, b text)",
        "INSERT INTO se_v2 SELECT g, g, 'b' FROM generate_series(1, 30) g",
    )
    m.create("se_v2", delete_format="position-deletes")
    m.sql("DELETE FROM se_v2 WHERE id < 4")
    m.call("persist", table="se_v2")
    m.sql(
        "ALTER TABLE se_v2 ADD COLUMN c int",
        "ALTER TABLE se_v2 RENAME COLUMN b TO bb",
        "ALTER TABLE se_v2 ALTER COLUMN a TYPE bigint",
        "INSERT INTO se_v2 VALUES (40, 4000000000, 'n', 4)",
        "UPDATE se_v2 SET c = 1 WHERE id < 10",
    )
    m.sql("ALTER TABLE se_v2 DROP COLUMN c", "DELETE FROM se_v2 WHERE id = 5")
    _check_all_readers(m, "se_v2")
    assert _iceberg_table(m, "se_v2").format_version == 2
    m.sql("ALTER TABLE se_v2 ADD COLUMN d int DEFAULT 3", "INSERT INTO se_v2 VALUES (41, 1, 'x', 4)")
    m.client.wait_lsn(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    err = m.status("se_v2")["error"] or ""
    assert "table se_v2" in err and "column d was added with a default" in err and "format v2" in err, err


def test_prisma_enum_migration_then_restart(fresh_mirror):
    """Prisma's enum migration (a new enum, the column retyped to it, the old enum dropped, the new one
    renamed) made while the service is down: the restart reads the column, whose saved type no longer
    exists, as its current enum (both are strings in the mirror); every mirror starts and follows. A
    column moved to a type that is not a string, its enum dropped too, stops only its table, which
    drop-table then drops."""
    m = fresh_mirror
    m.sql(
        """CREATE TYPE "Role" AS ENUM ('USER', 'ADMIN')""",
        """CREATE TABLE pm_users (id int PRIMARY KEY, role "Role" NOT NULL DEFAULT 'USER')""",
        "INSERT INTO pm_users VALUES (1, 'USER'), (2, 'ADMIN')",
        "CREATE TABLE pm_other (id int PRIMARY KEY)",
        "CREATE TYPE pm_level AS ENUM ('low', 'high')",
        "CREATE TABLE pm_ints (id int PRIMARY KEY, level pm_level)",
        "INSERT INTO pm_ints VALUES (1, 'high')",
    )
    m.create("pm_users")
    m.create("pm_other")
    m.create("pm_ints")
    m.sql("INSERT INTO pm_users VALUES (3, 'ADMIN')")  # in the buffer, not persisted: replayed
    stop_service(m.settings)
    m.txn(
        """CREATE TYPE "Role_new" AS ENUM ('USER', 'ADMIN', 'OWNER')""",
        "ALTER TABLE pm_users ALTER COLUMN role DROP DEFAULT",
        """ALTER TABLE pm_users ALTER COLUMN role TYPE "Role_new" USING (role::text::"Role_new")""",
        """ALTER TYPE "Role" RENAME TO "Role_old\"""",
        """ALTER TYPE "Role_new" RENAME TO "Role\"""",
        """DROP TYPE "Role_old\"""",
        "ALTER TABLE pm_users ALTER COLUMN role SET DEFAULT 'USER'",
    )
    m.sql("INSERT INTO pm_users VALUES (4, 'OWNER')", "UPDATE pm_users SET role = 'OWNER' WHERE id = 1")
    m.sql("INSERT INTO pm_other VALUES (1)")
    # an enum column moved to int, its enum dropped: no string to read it as, so that table stops alone
    m.sql(
        "ALTER TABLE pm_ints ALTER COLUMN level TYPE int USING (level = 'high')::int",
        "DROP TYPE pm_level",
    )
    start_service(m.settings)
    m.client.close()
    assert m.status("pm_users")["state"] == "ready", m.status("pm_users")
    st = m.status("pm_ints")
    assert st["state"] == "error" and "table public.pm_ints: mirrored column level" in st["error"], st
    assert " at LSN " in st["error"] and len(st["error"].splitlines()) == 1, st
    m.call("drop_table", table="pm_ints")
    m.sql("INSERT INTO pm_users VALUES (5, 'OWNER')", "INSERT INTO pm_other VALUES (2)")
    m.check("pm_users", "pm_other", iceberg=True)
