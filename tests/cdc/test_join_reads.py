"""Joins of two mirrors equal Postgres in every union-read mode, in memory and after a persist, once both
tables have had updates and deletes (files with deletion vectors and in-memory rows are then registered
as Arrow tables, into whose scan DuckDB may push a join's bloom filter)."""

from __future__ import annotations

import pytest

from mooncake_assets.engine.read import UnionReader

from .conftest import mirror_fixture

QUERIES = [
    "SELECT count(*) AS n FROM jb JOIN ja ON ja.id = jb.a_id",
    "SELECT count(*) AS n FROM ja JOIN jb ON ja.id = jb.a_id",
    "SELECT ja.name, sum(jb.amount) AS s FROM jb JOIN ja ON ja.id = jb.a_id GROUP BY ja.name ORDER BY ja.name",
    "SELECT jb.id, ja.name FROM jb JOIN ja ON ja.id = jb.a_id WHERE jb.amount > 10 ORDER BY jb.id",
]


@pytest.fixture()
def m(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def _rows(t) -> list[tuple]:
    cols = [t.column(i).to_pylist() for i in range(t.num_columns)]
    return [tuple(float(v) if hasattr(v, "as_tuple") else v for v in r) for r in zip(*cols)]


def test_joins_of_two_mirrors_with_deletes_equal_postgres(m):
    m.sql(
        "CREATE TABLE ja (id int PRIMARY KEY, name text)",
        "CREATE TABLE jb (id int PRIMARY KEY, a_id int, amount numeric(10, 2))",
        "INSERT INTO ja SELECT g, 'n' || g FROM generate_series(1, 10) g",
        "INSERT INTO jb SELECT g, 1 + g % 10, g * 1.5 FROM generate_series(1, 20) g",
    )
    m.create("ja")
    m.create("jb")
    m.sql("UPDATE ja SET name = 'x' WHERE id = 2", "DELETE FROM jb WHERE id = 3")
    for step in ("in memory", "persisted, then more changes"):
        if step != "in memory":
            m.call("persist", table="ja")
            m.call("persist", table="jb")
            m.sql("UPDATE ja SET name = 'y' WHERE id = 4", "DELETE FROM jb WHERE id IN (5, 6)")
        for mode in ("auto", "arrow", "lazy"):
            r = UnionReader(m.client, m.dsn, mode=mode)
            try:
                for q in QUERIES:
                    want = [tuple(float(v) if hasattr(v, "as_tuple") else v for v in row) for row in m.sql(q)]
                    assert _rows(r.query(q)) == want, (step, mode, q)
            finally:
                r.close()
