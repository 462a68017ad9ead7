"""Every change shape against a real Postgres, through the real service and verify.

Each test builds its own tables in the module's database and checks the mirror with ``verify``
(union read at one LSN; PyIceberg after a persist), plus explicit assertions where the verify oracle
alone could be fooled (it decodes the source with the same decoder as the mirror).
"""

from __future__ import annotations

import pytest

# incompressible text / bytes well past the TOAST threshold (~2 kB); STORAGE EXTERNAL keeps them out of line
BIG_TEXT = "(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 200) g)"  # 6400 chars
BIG_BYTES = "(SELECT decode(string_agg(md5(random()::text || g), ''), 'hex') FROM generate_series(1, 200) g)"
BIG_JSON = f"jsonb_build_object('k', {BIG_TEXT}, 'n', 1)"


def _toast_table(m, name: str, identity: str):
    m.sql(
        f"CREATE TABLE {name} (id int PRIMARY KEY, small int, big text, doc jsonb, blob bytea, "
        "at timestamptz, day date)",
        f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL",
        f"ALTER TABLE {name} ALTER COLUMN doc SET STORAGE EXTERNAL",
        f"ALTER TABLE {name} ALTER COLUMN blob SET STORAGE EXTERNAL",
        f"ALTER TABLE {name} REPLICA IDENTITY {identity}",
    )


def _insert_toast(m, name: str, ids):
    for i in ids:
        # row 3 of every batch carries infinite timestamps/dates (Python cannot hold them)
        at = "'infinity'" if i % 10 == 3 else "'-infinity'" if i % 10 == 4 else "now()"
        day = "'infinity'" if i % 10 == 3 else "current_date"
        m.sql(f"INSERT INTO {name} VALUES ({i}, 0, {BIG_TEXT}, {BIG_JSON}, {BIG_BYTES}, {at}, {day})")


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_update_with_unchanged_toast(mirror, identity):
    """UPDATEs that leave large text/jsonb/bytea untouched (pgoutput sends them as 'unchanged TOAST'):
    the current row is found in the initial copy's file, in the open buffer, in a sealed in-memory
    batch, in a flushed file and in a persisted Iceberg file; the big values must survive every time."""
    m = mirror
    t = f"toast_{identity.lower()}"
    _toast_table(m, t, identity)
    _insert_toast(m, t, range(1, 5))  # in the initial copy
    m.create(t)
    m.sql(f"UPDATE {t} SET small = small + 1 WHERE id IN (1, 3)")  # current row in the copied file
    _insert_toast(m, t, range(11, 15))
    m.sql(f"UPDATE {t} SET small = small + 1 WHERE id = 11")  # current row in the open buffer
    m.check(t)  # (a read seals the buffer)
    m.sql(f"UPDATE {t} SET small = small + 1 WHERE id IN (12, 13, 14)")  # rows in a sealed batch
    m.txn(
        f"UPDATE {t} SET small = small + 10 WHERE id = 12",  # twice in one transaction
        f"UPDATE {t} SET small = small + 10 WHERE id = 12",
    )
    m.check(t)
    m.call("flush", table=t)
    m.sql(f"UPDATE {t} SET small = small + 1 WHERE id IN (2, 4, 13)")  # rows in a flushed file
    m.check(t, iceberg=True)  # persisted now
    m.sql(f"UPDATE {t} SET small = small + 1 WHERE id IN (1, 3, 11, 14)")  # rows in an Iceberg file
    m.sql(f"UPDATE {t} SET id = id + 100 WHERE id = 2")  # key change, TOAST untouched
    m.check(t, iceberg=True)
    got = m.read(t, "id").select(["id", "big", "doc", "blob"]).to_pydict()
    assert all(b is not None and len(b) == 6400 for b in got["big"]), "a TOAST value was lost"
    assert all(b is not None and len(b) == 3200 for b in got["blob"])
    assert all(d is not None and len(d) > 6400 for d in got["doc"])
    assert m.status(t)["missing_keys"] == 0 and m.status(t)["error"] is None


def test_primary_key_updates(mirror):
    """A PK change is a delete of the old key plus an insert; twice in one transaction; two keys swapped
    through a temporary key; two keys swapped in one statement under a deferrable key (REPLICA IDENTITY
    FULL, the mirror briefly sees two rows with one key)."""
    m = mirror
    m.sql(
        "CREATE TABLE pk_a (id int PRIMARY KEY, v text)",
        "INSERT INTO pk_a SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "CREATE TABLE pk_d (id int, v text, CONSTRAINT pk_d_pk PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED)",
        "ALTER TABLE pk_d REPLICA IDENTITY FULL",
        "INSERT INTO pk_d SELECT g, 'v' || g FROM generate_series(1, 20) g",
        "CREATE TABLE pk_c (a int, b text, v text, PRIMARY KEY (a, b))",
        "INSERT INTO pk_c SELECT g, 'k' || g, 'v' FROM generate_series(1, 20) g",
    )
    for t in ("pk_a", "pk_d", "pk_c"):
        m.create(t)
    m.sql("UPDATE pk_a SET id = 100 WHERE id = 1")  # copied row
    m.txn("UPDATE pk_a SET id = 200 WHERE id = 2", "UPDATE pk_a SET id = 201 WHERE id = 200")  # twice
    m.txn(
        "UPDATE pk_a SET id = 0 WHERE id = 3",
        "UPDATE pk_a SET id = 3 WHERE id = 4",
        "UPDATE pk_a SET id = 4 WHERE id = 0",
    )  # swap 3 <-> 4
    m.sql("UPDATE pk_d SET id = CASE id WHEN 1 THEN 2 ELSE 1 END WHERE id IN (1, 2)")  # one-statement swap
    m.txn(
        "UPDATE pk_d SET id = 6 WHERE id = 5",
        "UPDATE pk_d SET v = 'both' || v WHERE id = 6",  # two rows keyed 6
        "UPDATE pk_d SET id = 5 WHERE ctid = (SELECT max(ctid) FROM pk_d WHERE id = 6)",
    )
    m.sql("UPDATE pk_c SET b = b || 'x' WHERE a <= 3", "UPDATE pk_c SET a = a + 100 WHERE a BETWEEN 4 AND 6")
    m.check("pk_a", "pk_d", "pk_c")
    for t in ("pk_a", "pk_d", "pk_c"):
        m.call("flush", table=t)
    m.txn(
        "UPDATE pk_a SET id = 0 WHERE id = 100",
        "UPDATE pk_a SET id = 100 WHERE id = 201",
        "UPDATE pk_a SET id = 201 WHERE id = 0",
    )  # swap flushed rows
    m.sql("UPDATE pk_d SET id = CASE id WHEN 7 THEN 8 ELSE 7 END WHERE id IN (7, 8)")
    m.sql("UPDATE pk_d SET id = CASE id WHEN 1 THEN 2 ELSE 1 END WHERE id IN (1, 2)")  # swap back (in file)
    m.sql("UPDATE pk_a SET id = id + 1000")  # every key at once
    m.check("pk_a", "pk_d", "pk_c", iceberg=True)
    assert sorted(m.read("pk_a").column("id").to_pylist()) == [r[0] for r in m.sql("SELECT id FROM pk_a ORDER BY id")]
    for t in ("pk_a", "pk_d", "pk_c"):
        assert m.status(t)["missing_keys"] == 0


def test_insert_update_delete_same_key(mirror):
    """INSERT then DELETE, INSERT then UPDATE then DELETE of one key inside one transaction and across
    transactions that land in one flush; re-insert of a deleted key."""
    m = mirror
    m.sql("CREATE TABLE iud (id int PRIMARY KEY, v text)", "CREATE TABLE iud_nk (k int, v text)")
    m.create("iud")
    m.create("iud_nk")
    m.txn("INSERT INTO iud VALUES (1, 'a')", "DELETE FROM iud WHERE id = 1")
    m.txn("INSERT INTO iud VALUES (2, 'a')", "UPDATE iud SET v = 'b' WHERE id = 2", "DELETE FROM iud WHERE id = 2")
    m.txn(
        "INSERT INTO iud VALUES (3, 'a')",
        "UPDATE iud SET v = 'b' WHERE id = 3",
        "DELETE FROM iud WHERE id = 3",
        "INSERT INTO iud VALUES (3, 'again')",
    )
    m.sql("INSERT INTO iud VALUES (4, 'a')")
    m.sql("UPDATE iud SET v = 'b' WHERE id = 4")
    m.sql("DELETE FROM iud WHERE id = 4")
    m.sql("INSERT INTO iud VALUES (4, 'c')")
    m.sql("INSERT INTO iud VALUES (5, 'a')")
    m.sql("UPDATE iud SET id = 6 WHERE id = 5")
    m.sql("DELETE FROM iud WHERE id = 6")
    m.txn(
        "INSERT INTO iud_nk VALUES (1, 'd'), (1, 'd')", "DELETE FROM iud_nk WHERE ctid = (SELECT min(ctid) FROM iud_nk)"
    )
    m.txn(
        "INSERT INTO iud_nk VALUES (2, 'e')", "UPDATE iud_nk SET v = 'f' WHERE k = 2", "DELETE FROM iud_nk WHERE k = 2"
    )
    m.call("flush", table="iud")
    m.call("flush", table="iud_nk")
    m.check("iud", "iud_nk")
    m.txn("DELETE FROM iud WHERE id = 4", "INSERT INTO iud VALUES (4, 'd')", "UPDATE iud SET v = 'e' WHERE id = 4")
    m.check("iud", "iud_nk", iceberg=True)
    assert m.read("iud", "id").to_pylist() == [{"id": 3, "v": "again"}, {"id": 4, "v": "e"}]
    assert m.status("iud")["missing_keys"] == 0 and m.status("iud_nk")["missing_keys"] == 0


def test_truncate(mirror):
    """TRUNCATE of one table, of several at once (one message for both), RESTART IDENTITY, inserts
    after a truncate in the same transaction, and truncates of flushed and persisted rows."""
    m = mirror
    m.sql(
        "CREATE TABLE tr_a (id serial PRIMARY KEY, v text)",
        "CREATE TABLE tr_b (k int, v text)",
        "INSERT INTO tr_a (v) SELECT 'x' FROM generate_series(1, 50)",
        "INSERT INTO tr_b SELECT g % 5, 'y' FROM generate_series(1, 50) g",
    )
    m.create("tr_a")
    m.create("tr_b", delete_format="position-deletes")
    m.sql("INSERT INTO tr_a (v) VALUES ('mem')", "INSERT INTO tr_b VALUES (9, 'mem')")
    m.sql("TRUNCATE tr_a")  # copied file + buffer
    m.check("tr_a", "tr_b")
    m.sql("INSERT INTO tr_a (v) SELECT 'z' FROM generate_series(1, 10)")
    m.call("flush", table="tr_a")
    m.call("persist", table="tr_b")
    m.txn(
        "TRUNCATE tr_a, tr_b RESTART IDENTITY",  # several tables at once
        "INSERT INTO tr_a (v) VALUES ('after'), ('after')",
        "INSERT INTO tr_b VALUES (1, 'after')",
    )
    m.check("tr_a", "tr_b", iceberg=True)
    assert m.read("tr_a", "id").column("id").to_pylist() == [1, 2]  # identity restarted
    m.sql("INSERT INTO tr_b VALUES (2, 'p')")
    m.call("persist", table="tr_b")
    m.sql("TRUNCATE tr_b", "INSERT INTO tr_b VALUES (3, 'q')")  # truncate of persisted rows
    m.check("tr_a", "tr_b", iceberg=True)
    assert m.read("tr_b").to_pylist() == [{"k": 3, "v": "q"}]


def test_table_without_key_with_duplicates(mirror):
    """No primary key: REPLICA IDENTITY FULL is set, the whole row is the key, duplicates are kept and a
    DELETE/UPDATE removes exactly one of them, in memory and in files; NULLs and NaN in the row."""
    m = mirror
    m.sql(
        "CREATE TABLE dup (k int, v text, f float8)",
        "INSERT INTO dup VALUES (1, 'a', 1.5), (1, 'a', 1.5), (1, 'a', 1.5), (2, NULL, 'NaN'), (2, NULL, 'NaN')",
    )
    m.create("dup")
    assert m.sql("SELECT relreplident FROM pg_class WHERE relname = 'dup'") == [("f",)]
    m.sql("DELETE FROM dup WHERE ctid = (SELECT min(ctid) FROM dup WHERE k = 1)")  # one of three (file)
    m.sql("UPDATE dup SET v = 'b' WHERE ctid = (SELECT min(ctid) FROM dup WHERE k = 2)")  # NULL/NaN row
    m.sql("INSERT INTO dup VALUES (3, 'c', 0), (3, 'c', 0)")
    m.sql("DELETE FROM dup WHERE ctid = (SELECT min(ctid) FROM dup WHERE k = 3)")  # one of two (memory)
    m.check("dup")
    m.call("flush", table="dup")
    m.sql("UPDATE dup SET f = 2.5 WHERE ctid = (SELECT min(ctid) FROM dup WHERE k = 1)")
    m.sql("DELETE FROM dup WHERE k = 3")
    m.check("dup", iceberg=True)
    assert m.status("dup")["missing_keys"] == 0


def test_replica_identity_using_index(mirror):
    """REPLICA IDENTITY USING INDEX: the old tuple carries the index columns (not the primary key), so
    the mirror keys rows by them; with and without a primary key beside it."""
    m = mirror
    m.sql(
        "CREATE TABLE ri (id int PRIMARY KEY, a int NOT NULL, b text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri_ab ON ri (a, b)",
        "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_ab",
        "INSERT INTO ri SELECT g, g, 'b' || g, 'v' FROM generate_series(1, 20) g",
        "CREATE TABLE ri2 (a int NOT NULL, b text NOT NULL, v text)",
        "CREATE UNIQUE INDEX ri2_ab ON ri2 (a, b)",
        "ALTER TABLE ri2 REPLICA IDENTITY USING INDEX ri2_ab",
        "INSERT INTO ri2 SELECT g, 'b' || g, 'v' FROM generate_series(1, 20) g",
    )
    r = m.create("ri")
    assert r["key"] == ["a", "b"] and r["replica_identity"] == "i"
    m.create("ri2")
    for t in ("ri", "ri2"):
        m.sql(
            f"UPDATE {t} SET v = 'w' WHERE a <= 5",
            f"UPDATE {t} SET a = a + 100 WHERE a BETWEEN 6 AND 8",
            f"DELETE FROM {t} WHERE a BETWEEN 9 AND 10",
            f"INSERT INTO {t} (a, b, v) VALUES (9, 'b9', 'new')"
            if t == "ri2"
            else "INSERT INTO ri VALUES (99, 9, 'b9', 'new')",
        )
    m.sql("UPDATE ri SET id = id + 1000 WHERE a = 1")  # PK change, identity unchanged
    m.check("ri", "ri2")
    m.call("flush", table="ri")
    m.sql("UPDATE ri SET b = b || 'x' WHERE a <= 3", "DELETE FROM ri WHERE a = 4")
    m.check("ri", "ri2", iceberg=True)
    assert m.status("ri")["missing_keys"] == 0 and m.status("ri2")["missing_keys"] == 0


def test_partitioned_tables(mirror):
    """A partitioned root is copied and streamed through the root (publish_via_partition_root);
    rows move between partitions; a partition created after mirroring starts arrives; a keyless
    partitioned root gets REPLICA IDENTITY FULL on its partitions; a partition itself is refused with
    a message naming the root."""
    m = mirror
    m.sql(
        "CREATE TABLE pt (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
        "CREATE TABLE pt_eu PARTITION OF pt FOR VALUES IN ('eu')",
        "CREATE TABLE pt_us PARTITION OF pt FOR VALUES IN ('us')",
        "INSERT INTO pt SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v' FROM generate_series(1, 40) g",
        "CREATE TABLE pn (k int, v text) PARTITION BY RANGE (k)",
        "CREATE TABLE pn_1 PARTITION OF pn FOR VALUES FROM (0) TO (100)",
        "INSERT INTO pn SELECT g % 10, 'x' FROM generate_series(1, 30) g",
    )
    r = m.create("pt")
    assert r["rows"] == 40
    m.create("pn")
    assert m.sql("SELECT relname, relreplident FROM pg_class WHERE relname IN ('pn', 'pn_1') ORDER BY 1") == [
        ("pn", "f"),
        ("pn_1", "f"),
    ]
    err = None
    try:
        m.create("pt_eu_mirror", "public.pt_eu")
    except Exception as e:  # ServiceError
        err = str(e)
    assert err and "pt_eu" in err and "partition of pt" in err, err
    m.sql(
        "UPDATE pt SET region = 'eu' WHERE id IN (1, 3)",  # moves rows across partitions
        "UPDATE pt SET v = 'w' WHERE id <= 10",
        "DELETE FROM pt WHERE id BETWEEN 11 AND 14",
    )
    m.sql(
        "CREATE TABLE pt_ap PARTITION OF pt FOR VALUES IN ('ap')",  # created after mirroring started
        "INSERT INTO pt SELECT g, 'ap', 'new' FROM generate_series(100, 120) g",
        "UPDATE pt SET region = 'ap' WHERE id = 2",
    )
    m.sql("DELETE FROM pn WHERE ctid = (SELECT min(ctid) FROM pn_1 WHERE k = 1)", "UPDATE pn SET v = 'y' WHERE k = 2")
    m.check("pt", "pn")
    m.call("flush", table="pt")
    m.sql("UPDATE pt SET v = 'z' WHERE region = 'ap'", "DELETE FROM pt WHERE id = 100")
    m.sql("TRUNCATE pn", "INSERT INTO pn VALUES (5, 'after')")
    m.check("pt", "pn", iceberg=True)
    assert m.status("pt")["missing_keys"] == 0


def test_generated_and_default_columns(mirror):
    """STORED generated columns are mirrored (PG 15's pgoutput does not send them: the service computes
    them; tests/cdc/test_generated_columns.py); columns with defaults (constants,
    sequences, now()) arrive with their values."""
    m = mirror
    m.sql(
        "CREATE TABLE gen (id serial PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED, "
        "d text DEFAULT 'dflt', at timestamptz DEFAULT now(), n numeric(8,2) DEFAULT 1.5)",
        "INSERT INTO gen (a) VALUES (1), (2)",
    )
    m.create("gen")
    m.sql(
        "INSERT INTO gen (a) VALUES (3)",
        "INSERT INTO gen (a, d) VALUES (4, NULL)",
        "UPDATE gen SET a = 10 WHERE id = 1",
    )
    m.check("gen", iceberg=True)
    got = m.read("gen", "id")
    assert got.column_names == ["id", "a", "twice", "d", "at", "n"]
    assert got.column("twice").to_pylist() == [20, 4, 6, 8]
    assert got.column("d").to_pylist() == ["dflt", "dflt", "dflt", None]
    assert [str(x) for x in got.column("n").to_pylist()] == ["1.50"] * 4
