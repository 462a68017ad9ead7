"""STORED generated columns are mirrored.

Postgres 15 (the one here) does not publish generated columns, so the service computes them on the
source for the rows of each applied batch; the initial copy reads them like any column. Checked with
a real generated column through INSERT, UPDATE (of the columns it reads and of others, a TOASTed
value left unchanged), DELETE, a table without a primary key (whole-row matching) and a restart of
the service, against Postgres with the union read, PyIceberg and DuckDB's iceberg_scan.
"""

from __future__ import annotations

from mooncake_assets.engine.service.process import kill_service, start_service
from mooncake_assets.verify import verify


def _all_readers(m, *names):
    m.check(*names, iceberg=True)  # union, then persist + PyIceberg
    results, lsn = verify(m.settings, list(names), "duckdb-iceberg", m.client)
    bad = [r.line() for r in results if not r.match]
    assert not bad, f"duckdb-iceberg at LSN {lsn}: {bad}"


def test_stored_generated_columns_through_changes_and_restart(mirror):
    m = mirror
    m.sql(
        "CREATE TABLE gc (id int PRIMARY KEY, a int, b text, big text, "
        "total numeric(10,2) GENERATED ALWAYS AS (a * 1.5) STORED, "
        "label text GENERATED ALWAYS AS (upper(b) || ':' || a::text) STORED, "
        "blen int GENERATED ALWAYS AS (length(big)) STORED)",
        "INSERT INTO gc (id, a, b, big) SELECT g, g, 'b' || g, (SELECT string_agg(md5(random()::text || k || g), '') "
        "FROM generate_series(1, 400) k) FROM generate_series(1, 20) g",  # big: stored out of line (TOAST)
        "CREATE TABLE gn (a int, s text GENERATED ALWAYS AS (a::text || '!') STORED)",  # no key: whole rows
        "INSERT INTO gn (a) SELECT g % 5 FROM generate_series(1, 10) g",
    )
    m.create("gc")
    m.create("gn")
    got = m.read("gc", "id")
    assert got.column_names == ["id", "a", "b", "big", "total", "label", "blen"]
    assert got.column("label").to_pylist()[:2] == ["B1:1", "B2:2"]  # the initial copy
    m.sql(
        "INSERT INTO gc (id, a, b) VALUES (21, 7, 'x'), (22, NULL, 'y')",
        "UPDATE gc SET a = a + 100 WHERE id <= 5",  # a column the expressions read; big unchanged (TOAST)
        "UPDATE gc SET b = 'changed' WHERE id BETWEEN 6 AND 8",
        "UPDATE gc SET big = 'small' WHERE id = 9",  # a column they do not read
        "DELETE FROM gc WHERE id IN (10, 11)",
        "UPDATE gn SET a = a + 10 WHERE a = 1",
        "DELETE FROM gn WHERE a = 2",
    )
    m.txn(
        "INSERT INTO gc (id, a, b) SELECT g, g, 't' FROM generate_series(100, 140) g",
        "UPDATE gc SET a = -a WHERE id BETWEEN 100 AND 110",
        "DELETE FROM gc WHERE id = 120",
    )
    got = m.read("gc", "id").to_pylist()
    by = {r["id"]: r for r in got}
    assert by[1]["label"] == "B1:101" and str(by[1]["total"]) == "151.50" and by[6]["label"] == "CHANGED:6"
    assert by[22]["label"] is None and by[100]["label"] == "T:-100"
    assert by[1]["blen"] == 12800 and by[9]["blen"] == 5 and by[21]["blen"] is None  # big unchanged, then changed
    _all_readers(m, "gc", "gn")

    # a restart: changes made while the service is down are computed when they are replayed
    kill_service(m.settings)
    m.sql(
        "UPDATE gc SET a = 1000 WHERE id = 12",
        "INSERT INTO gc (id, a, b) VALUES (200, 2, 'r')",
        "DELETE FROM gc WHERE id = 13",
        "INSERT INTO gn (a) VALUES (42)",
    )
    start_service(m.settings)
    m.client.close()
    assert m.read("gc", "id").to_pylist()[-1]["label"] == "R:2"
    _all_readers(m, "gc", "gn")
    # a generated column that reads a column left out of the mirror (--exclude-column)
    m.sql(
        "CREATE TABLE gx (id int PRIMARY KEY, secret int, pub int GENERATED ALWAYS AS (secret * 2) STORED)",
        "INSERT INTO gx (id, secret) VALUES (1, 10)",
    )
    m.create("gx", exclude=["secret"])
    m.sql("INSERT INTO gx (id, secret) VALUES (2, 20)", "UPDATE gx SET secret = 11 WHERE id = 1")
    assert m.read("gx", "id").to_pylist() == [{"id": 1, "pub": 22}, {"id": 2, "pub": 40}]
    _all_readers(m, "gx")

    # a schema change of a table with generated columns
    m.sql(
        "ALTER TABLE gc ADD COLUMN z int DEFAULT 5",
        "INSERT INTO gc (id, a, b) VALUES (300, 3, 'z')",
        "UPDATE gc SET a = 4 WHERE id = 300",
    )
    assert m.read("gc", "id").to_pylist()[-1]["label"] == "Z:4"
    _all_readers(m, "gc")
    st = {t["name"]: t for t in m.client.status()["tables"]}
    assert st["gc"]["state"] == "ready" and st["gn"]["state"] == "ready", st


def test_generated_columns_through_drop_and_rename(mirror):
    """DDL that removes or renames what a generated column reads: ``DROP COLUMN a CASCADE`` (which
    drops ``g = a * 2`` too), ``DROP COLUMN g``, ``RENAME COLUMN a TO c`` (the expression now reads
    ``c``); a generated column calling a function of the public schema (its expression is read in a
    session whose search_path is pg_catalog: it must come out qualified). Before, the first left the
    stream resending the same batch forever (every table stalled) and the second put ``g`` back."""
    m = mirror
    m.sql(
        "CREATE FUNCTION public.gd_twice(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 * 2'",
        "CREATE TABLE gd1 (id int PRIMARY KEY, a int, b text, g int GENERATED ALWAYS AS (a * 2) STORED, "
        "h int GENERATED ALWAYS AS (gd_twice(id)) STORED)",
        "CREATE TABLE gd2 (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED, b text)",
        "CREATE TABLE gd3 (id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a + 1) STORED)",
        "CREATE TABLE gd_plain (id int PRIMARY KEY, v text)",
        "INSERT INTO gd1 (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 5) g",
        "INSERT INTO gd2 (id, a, b) SELECT g, g, 'b' || g FROM generate_series(1, 5) g",
        "INSERT INTO gd3 (id, a) SELECT g, g FROM generate_series(1, 5) g",
        "INSERT INTO gd_plain SELECT g, 'v' || g FROM generate_series(1, 5) g",
    )
    for t in ("gd1", "gd2", "gd3", "gd_plain"):
        m.create(t)
    m.sql("INSERT INTO gd1 (id, a, b) VALUES (6, 6, 'x')", "UPDATE gd1 SET a = 10 WHERE id = 1")
    assert m.read("gd1", "id").to_pylist()[0] == {"id": 1, "a": 10, "b": "b1", "g": 20, "h": 2}

    m.sql(
        "ALTER TABLE gd1 DROP COLUMN a CASCADE",
        "INSERT INTO gd1 (id, b) VALUES (7, 'y')",
        "UPDATE gd1 SET b = 'z' WHERE id = 2",
        "DELETE FROM gd1 WHERE id = 3",
        "ALTER TABLE gd2 DROP COLUMN g",
        "INSERT INTO gd2 (id, a, b) VALUES (7, 7, 'y')",
        "UPDATE gd2 SET a = 20 WHERE id = 2",
        "ALTER TABLE gd3 RENAME COLUMN a TO c",
        "INSERT INTO gd3 (id, c) VALUES (7, 70)",
        "UPDATE gd3 SET c = 30 WHERE id = 3",
        "INSERT INTO gd_plain VALUES (7, 'after')",
    )
    m.txn("ALTER TABLE gd2 ADD COLUMN z int DEFAULT 9", "INSERT INTO gd2 (id, a, b) VALUES (8, 8, 'w')")  # one txn
    assert m.read("gd_plain", "id").to_pylist()[-1] == {"id": 7, "v": "after"}  # the stream goes on
    g1 = m.read("gd1", "id")
    assert g1.column_names == ["id", "b", "h"]
    assert g1.to_pylist()[-1] == {"id": 7, "b": "y", "h": 14}
    g2 = m.read("gd2", "id")
    assert g2.column_names == ["id", "a", "b", "z"]  # g stays dropped
    assert g2.to_pylist()[1] == {"id": 2, "a": 20, "b": "b2", "z": 9}
    g3 = m.read("gd3", "id").to_pylist()
    assert g3[2] == {"id": 3, "c": 30, "g": 31} and g3[-1] == {"id": 7, "c": 70, "g": 71}
    st = {t["name"]: t for t in m.client.status()["tables"]}
    assert all(st[t]["state"] == "ready" for t in ("gd1", "gd2", "gd3", "gd_plain")), st
    m.check("gd1", "gd2", "gd3", "gd_plain", iceberg=True)
