"""The bench's Flink-style Iceberg v2 table (mooncake_assets/bench/flink_v2.py), read back by DuckDB's
iceberg_scan (the reader the union-read bench times on it) and by the engine's manifest reader: equality
deletes drop the older versions of a key, never the commit's own new version (Iceberg spec "Scan
Planning": a delete applies to data files with a strictly lower data sequence number)."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.schema import Schema
from pyiceberg.types import IntegerType, NestedField

from mooncake_assets.bench.flink_v2 import FlinkUpsertTable
from mooncake_assets.bench.union_read import _equality_model_sql
from mooncake_assets.engine.iceberg.catalog import make_catalog
from mooncake_assets.engine.iceberg.manifest import read_manifest_entries, read_manifest_list
from mooncake_assets.engine.storage.duckdb_ext import connect_with_iceberg


def _rows(aids, v):
    return pa.table({"aid": pa.array(aids, pa.int32()), "v": pa.array([v] * len(aids), pa.int32())})


def test_flink_style_v2_table_reads_as_upserts_in_duckdb_and_in_the_model(tmp_path):
    catalog = make_catalog(f"sqlite:///{tmp_path / 'c.db'}", f"file://{tmp_path / 'wh'}")
    schema = Schema(
        NestedField(1, "aid", IntegerType(), required=True),
        NestedField(2, "v", IntegerType(), required=False),
        identifier_field_ids=[1],
    )
    t = FlinkUpsertTable(catalog, "bench.t", schema, tmp_path / "files")
    t.append([t.write_data_file(_rows(list(range(1, 11)), 0))])
    t.upsert(_rows([2, 3], 1))
    t.upsert(_rows([3, 11], 2))  # 3 again (deletes the version of the previous commit) and a new key

    expected = [(1, 0), (2, 1), (3, 2), *[(k, 0) for k in range(4, 11)], (11, 2)]
    con = connect_with_iceberg()
    got = con.execute(f"SELECT aid, v FROM iceberg_scan('{t.metadata_location}') ORDER BY aid").fetchall()
    assert got == expected
    model = con.execute(f"SELECT aid, v FROM ({_equality_model_sql(t)}) ORDER BY aid").fetchall()
    assert model == expected

    # the metadata: per upsert one data manifest and one delete manifest whose entry is an equality
    # delete on field 1 with the commit's sequence number; the copy at sequence number 1
    md = t.table.metadata
    manifests = read_manifest_list(t.table.io, md.current_snapshot().manifest_list, 2)
    assert sorted(m.content for m in manifests) == [ManifestContent.DATA] * 3 + [ManifestContent.DELETES] * 2
    deletes = [
        e for m in manifests if m.content == ManifestContent.DELETES for e in read_manifest_entries(t.table.io, m, 2)
    ]
    assert [e.data_file.content for e in deletes] == [DataFileContent.EQUALITY_DELETES] * 2
    assert all(e.data_file.equality_ids == [1] for e in deletes)
    assert sorted(e.sequence_number for e in deletes) == [2, 3] == [c.sequence_number for c in t.commits[1:]]
    assert t.commits[0].sequence_number == 1
    assert t.stats.commits == 3 and t.stats.equality_delete_files == 2 and t.stats.equality_delete_rows == 4
    summary = md.current_snapshot().summary
    assert summary.operation.value == "overwrite" and summary["total-equality-deletes"] == "4"
    assert summary["total-records"] == "14"
