"""Data files that store row lineage (Iceberg spec "Row Lineage", "Reserved Field IDs"), without
Postgres: a file with ``_row_id`` / ``_last_updated_sequence_number`` columns (what compaction writes) is
accepted by ``upload_data_file``, kept out of the column metrics, and read back by PyIceberg (table
columns only) and DuckDB's iceberg extension (whose ``_row_id`` / ``_last_updated_sequence_number``
virtual columns prefer the stored value and inherit a NULL); ``row_lineage`` gives what files inherit.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mooncake_assets.engine.iceberg import IcebergMirrorTable, connect_with_iceberg, make_catalog
from mooncake_assets.engine.iceberg.lineage import (
    LINEAGE_FIELD_IDS,
    FileLineage,
    has_lineage,
    is_lineage_field,
    with_lineage,
)
from mooncake_assets.engine.iceberg.manifest import read_manifest_entries, read_manifest_list

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture()
def table(tmp_path):
    catalog = make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))
    return IcebergMirrorTable.create(catalog, "ns.t", SCHEMA, delete_format="deletion-vectors")


def _upload(table, path, data: dict, lineage: bool = False) -> str:
    schema = with_lineage(table.arrow_schema()) if lineage else table.arrow_schema()
    pq.write_table(pa.table(data, schema=schema), path)
    return table.upload_data_file(str(path))


def test_lineage_fields_carry_the_reserved_ids():
    s = with_lineage(SCHEMA)
    assert s.names == ["id", "name", "_row_id", "_last_updated_sequence_number"]
    assert [int(f.metadata[b"PARQUET:field_id"]) for f in list(s)[2:]] == [2147483540, 2147483539]
    assert LINEAGE_FIELD_IDS == {2147483540, 2147483539}
    assert [is_lineage_field(f) for f in s] == [False, False, True, True]
    assert has_lineage(s) and not has_lineage(SCHEMA)


def test_stored_lineage_is_read_back_and_kept_out_of_metrics(table, tmp_path):
    a = _upload(table, tmp_path / "a.parquet", {"id": [1, 2, 3], "name": ["a", "b", "c"]})
    table.commit(add_files=[a])
    b = _upload(
        table,
        tmp_path / "b.parquet",
        {"id": [4, 5], "name": ["d", "e"], "_row_id": [100, 101], "_last_updated_sequence_number": [7, None]},
        lineage=True,
    )
    table.commit(add_files=[b], deletes={a: [0]})
    assert table.row_lineage([a, b]) == {a: FileLineage(0, 1), b: FileLineage(3, 2)}
    with pytest.raises(ValueError, match="not in the current snapshot"):
        table.row_lineage(["file:///nowhere.parquet"])
    # the manifest entry of b has metrics for the table's columns only
    t = table.table
    for m in read_manifest_list(t.io, t.metadata.current_snapshot().manifest_list, 3):
        for e in read_manifest_entries(t.io, m, 3):
            if e.data_file.file_path == b:
                for metric in ("column_sizes", "value_counts", "null_value_counts", "lower_bounds", "upper_bounds"):
                    assert set(getattr(e.data_file, metric) or {}) <= {1, 2}, metric
    # PyIceberg 0.12: the table's columns, no row lineage read
    scanned = t.scan().to_arrow()
    assert scanned.column_names == ["id", "name"] and sorted(scanned.column("id").to_pylist()) == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="_row_id"):
        t.scan(selected_fields=("id", "_row_id")).to_arrow()
    # DuckDB's iceberg extension: SELECT * has the table's columns; the lineage virtual columns prefer
    # the stored value and inherit a NULL (first_row_id + position, the data sequence number)
    con = connect_with_iceberg()
    try:
        loc = table.metadata_location
        cur = con.execute("SELECT * FROM iceberg_scan(?)", [loc])
        assert [d[0] for d in cur.description] == ["id", "name"]
        got = con.execute(
            "SELECT id, _row_id, _last_updated_sequence_number FROM iceberg_scan(?) ORDER BY id", [loc]
        ).fetchall()
        assert got == [(2, 1, 1), (3, 2, 1), (4, 100, 7), (5, 101, 2)]
        # a read_parquet over files with and without the columns, naming the table's columns (as the
        # union read does), reads both in either order
        paths = [a[len("file://") :], b[len("file://") :]]
        for order in (paths, paths[::-1]):
            rows = con.execute("SELECT id, name FROM read_parquet(?)", [order]).fetchall()
            assert sorted(rows) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
    finally:
        con.close()


def test_v2_tables_have_no_lineage(tmp_path):
    catalog = make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))
    t = IcebergMirrorTable.create(catalog, "ns.t", SCHEMA, delete_format="position-deletes")
    a = _upload(t, tmp_path / "a.parquet", {"id": [1], "name": ["a"]})
    t.commit(add_files=[a])
    assert t.row_lineage([a]) == {}
