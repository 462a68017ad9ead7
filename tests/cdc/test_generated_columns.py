"""Issue 13 item 8: STORED generated columns are mirrored.

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
    m.sql("CREATE TABLE gc (id int PRIMARY KEY, a int, b text, big text, "
          "total numeric(10,2) GENERATED ALWAYS AS (a * 1.5) STORED, "
          "label text GENERATED ALWAYS AS (upper(b) || ':' || a::text) STORED, "
          "blen int GENERATED ALWAYS AS (length(big)) STORED)",
          "INSERT INTO gc (id, a, b, big) SELECT g, g, 'b' || g, (SELECT string_agg(md5(random()::text || k || g), '') "
          "FROM generate_series(1, 400) k) FROM generate_series(1, 20) g",   # big: stored out of line (TOAST)
          "CREATE TABLE gn (a int, s text GENERATED ALWAYS AS (a::text || '!') STORED)",   # no key: whole rows
          "INSERT INTO gn (a) SELECT g % 5 FROM generate_series(1, 10) g")
    m.create("gc")
    m.create("gn")
    got = m.read("gc", "id")
    assert got.column_names == ["id", "a", "b", "big", "total", "label", "blen"]
    assert got.column("label").to_pylist()[:2] == ["B1:1", "B2:2"]   # the initial copy
    m.sql("INSERT INTO gc (id, a, b) VALUES (21, 7, 'x'), (22, NULL, 'y')",
          "UPDATE gc SET a = a + 100 WHERE id <= 5",             # a column the expressions read; big unchanged (TOAST)
          "UPDATE gc SET b = 'changed' WHERE id BETWEEN 6 AND 8",
          "UPDATE gc SET big = 'small' WHERE id = 9",            # a column they do not read
          "DELETE FROM gc WHERE id IN (10, 11)",
          "UPDATE gn SET a = a + 10 WHERE a = 1", "DELETE FROM gn WHERE a = 2")
    m.txn("INSERT INTO gc (id, a, b) SELECT g, g, 't' FROM generate_series(100, 140) g",
          "UPDATE gc SET a = -a WHERE id BETWEEN 100 AND 110", "DELETE FROM gc WHERE id = 120")
    got = m.read("gc", "id").to_pylist()
    by = {r["id"]: r for r in got}
    assert by[1]["label"] == "B1:101" and str(by[1]["total"]) == "151.50" and by[6]["label"] == "CHANGED:6"
    assert by[22]["label"] is None and by[100]["label"] == "T:-100"
    assert by[1]["blen"] == 12800 and by[9]["blen"] == 5 and by[21]["blen"] is None  # big unchanged, then changed
    _all_readers(m, "gc", "gn")

    # a restart: changes made while the service is down are computed when they are replayed
    kill_service(m.settings)
    m.sql("UPDATE gc SET a = 1000 WHERE id = 12", "INSERT INTO gc (id, a, b) VALUES (200, 2, 'r')",
          "DELETE FROM gc WHERE id = 13", "INSERT INTO gn (a) VALUES (42)")
    start_service(m.settings)
    m.client.close()
    assert m.read("gc", "id").to_pylist()[-1]["label"] == "R:2"
    _all_readers(m, "gc", "gn")
    # a generated column that reads a column left out of the mirror (--exclude-column)
    m.sql("CREATE TABLE gx (id int PRIMARY KEY, secret int, pub int GENERATED ALWAYS AS (secret * 2) STORED)",
          "INSERT INTO gx (id, secret) VALUES (1, 10)")
    m.create("gx", exclude=["secret"])
    m.sql("INSERT INTO gx (id, secret) VALUES (2, 20)", "UPDATE gx SET secret = 11 WHERE id = 1")
    assert m.read("gx", "id").to_pylist() == [{"id": 1, "pub": 22}, {"id": 2, "pub": 40}]
    _all_readers(m, "gx")

    # a schema change of a table with generated columns
    m.sql("ALTER TABLE gc ADD COLUMN z int DEFAULT 5", "INSERT INTO gc (id, a, b) VALUES (300, 3, 'z')",
          "UPDATE gc SET a = 4 WHERE id = 300")
    assert m.read("gc", "id").to_pylist()[-1]["label"] == "Z:4"
    _all_readers(m, "gc")
    st = {t["name"]: t for t in m.client.status()["tables"]}
    assert st["gc"]["state"] == "ready" and st["gn"]["state"] == "ready", st
