"""The Iceberg writer with its SQL catalog in a real Postgres (pyiceberg's SqlCatalog): commits and commit conflicts."""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import TableAlreadyExistsError

from mooncake_assets.engine.iceberg import IcebergMirrorTable, connect_with_iceberg, make_catalog
from tests.engine.test_iceberg import (  # the writer tests' helpers
    FORMATS,
    SCHEMA,
    Files,
    duckdb_ids,
    live_delete_entries,
    pyiceberg_ids,
)


@pytest.fixture(scope="module")
def duck():
    """A DuckDB connection with the iceberg extension (reads the table back)."""
    con = connect_with_iceberg()
    yield con
    con.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_postgres_catalog_commits_and_conflicts(pg_dsn, tmp_path, duck, fmt):
    def pg_catalog():
        return make_catalog(pg_dsn, str(tmp_path / "warehouse"))

    t = IcebergMirrorTable.create(pg_catalog(), "ns.t", SCHEMA, delete_format=fmt)
    files = Files(t, tmp_path)
    a = files.add("a", list(range(8)))
    t.commit(add_files=[a])
    other = IcebergMirrorTable.load(pg_catalog(), "ns.t")
    once = []

    def interfere(_location):
        if not once:
            once.append(1)
            other.commit(deletes={a: [0]})

    t.before_swap = interfere
    t.commit(deletes={a: [1]})
    state = IcebergMirrorTable.load(pg_catalog(), "ns.t").state()
    assert set(state.data_files[a].deleted) == {0, 1} and len(live_delete_entries(t)[a]) == 1
    assert pyiceberg_ids(pg_catalog()) == duckdb_ids(duck, t) == list(range(2, 8))
    with pytest.raises(TableAlreadyExistsError):
        IcebergMirrorTable.create(pg_catalog(), "ns.t", SCHEMA, delete_format=fmt)
