"""The PyIceberg/SQLAlchemy internals ``engine/iceberg/compat.py`` relies on, checked on the installed versions.

Each test names one behaviour relied on; when an upgrade changes it, the test fails here (rather than a
commit writing a table other readers cannot read). Everything runs in-process on a real ``SqlCatalog``
(SQLite in tmp_path); no Postgres.
"""

from __future__ import annotations

import ast
import inspect
import json
import tomllib
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadataUtil, TableMetadataV3, new_table_metadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, RemoveSnapshotRefUpdate, SetSnapshotRefUpdate
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from mooncake_assets.engine import faults
from mooncake_assets.engine.iceberg import IcebergMirrorTable, compat, make_catalog
from mooncake_assets.engine.iceberg.catalog import SwapConflict, split_identifier
from mooncake_assets.engine.iceberg.manifest import (
    ManifestInfo,
    data_file_field,
    manifest_file_first_row_id,
    new_data_file,
    read_manifest_entries,
    read_manifest_list,
    write_manifest,
    write_manifest_list,
)
from mooncake_assets.engine.iceberg.producer import manifest_entry

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture()
def catalog(tmp_path) -> SqlCatalog:
    return make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))


def _v3_metadata(tmp_path):
    schema = compat.iceberg_schema(SCHEMA, 3)
    md = new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, f"file://{tmp_path}/t", {"format-version": "3"}
    )
    return md.model_copy(update={"next_row_id": 0})


# ------------------------------------------------------------------------------------ the version gate


def test_the_pinned_versions_are_inside_the_checked_ranges():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {d.split("[")[0].split("==")[0]: d.split("==")[1] for d in deps if "==" in d}
    for dist, (low, high) in (("pyiceberg", compat.PYICEBERG_RANGE), ("sqlalchemy", compat.SQLALCHEMY_RANGE)):
        assert low <= compat._version_tuple(pins[dist]) < high, (
            f"pyproject pins {dist} {pins[dist]} outside {low}..{high}"
        )
    assert compat.check_versions() == {"pyiceberg": pins["pyiceberg"], "sqlalchemy": pins["sqlalchemy"]}


def test_a_version_outside_the_range_fails_loudly_unless_allowed(monkeypatch):
    versions = {"pyiceberg": "0.13.0rc1", "sqlalchemy": "2.1.9"}
    monkeypatch.delenv(compat.ALLOW_UNCHECKED_ENV, raising=False)
    with pytest.raises(compat.UnsupportedLibraryVersion, match="pyiceberg 0.13.0rc1"):
        compat.check_versions(versions.__getitem__)
    monkeypatch.setenv(compat.ALLOW_UNCHECKED_ENV, "1")
    with pytest.warns(RuntimeWarning, match="test_iceberg_compat"):
        assert compat.check_versions(versions.__getitem__) == versions


def test_only_compat_imports_sqlalchemy_or_pyiceberg_internals():
    """The other modules of the package import neither SQLAlchemy nor the internals listed in compat."""
    internal = {
        "AvroFile",
        "AvroOutputFile",
        "IcebergTables",
        "IcebergBaseModel",
        "update_table_metadata",
        "compute_statistics_plan",
        "data_file_statistics_from_parquet_metadata",
        "parquet_path_to_id_mapping",
    }
    for path in (ROOT / "mooncake_assets/engine/iceberg").glob("*.py"):
        if path.name == "compat.py":
            continue
        source = path.read_text()
        assert "._convert_schema_if_needed" not in source and "._identifier" not in source and "._data" not in source, (
            path
        )
        assert "_table_format_version" not in source, path
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("sqlalchemy"), f"{path.name} imports {node.module}"
                if node.module.startswith("pyiceberg"):
                    assert not internal & {a.name for a in node.names}, (
                        f"{path.name} imports internals of {node.module}"
                    )


# ------------------------------------------------------------------------------------ schemas, metadata


def test_convert_schema_if_needed_is_the_static_arrow_to_iceberg_conversion():
    assert isinstance(inspect.getattr_static(Catalog, "_convert_schema_if_needed"), staticmethod)
    assert list(inspect.signature(Catalog._convert_schema_if_needed).parameters) == ["schema", "format_version"]
    schema = compat.iceberg_schema(SCHEMA, 3)
    assert [(f.name, f.required) for f in schema.fields] == [("id", True), ("name", False)]
    md = new_table_metadata(
        schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///t", {"format-version": "3"}
    )
    assert [f.field_id for f in md.schema().fields] == [1, 2]  # fresh ids, as create relies on


def test_v3_metadata_json_passes_pyiceberg_s_guard_and_reads_back(tmp_path):
    md = _v3_metadata(tmp_path)
    assert isinstance(md, TableMetadataV3)
    with pytest.raises(NotImplementedError):  # if this stops raising, PyIceberg writes v3 itself: use its path
        md.model_dump_json()
    raw = compat.metadata_json(md)
    doc = json.loads(raw)
    assert doc["format-version"] == 3 and doc["next-row-id"] == 0 and "current-snapshot-id" not in doc
    assert TableMetadataUtil.parse_raw(raw) == md


def test_apply_updates_maintains_row_lineage_and_the_logs(tmp_path):
    md = _v3_metadata(tmp_path)
    snapshot = Snapshot(
        snapshot_id=7,
        sequence_number=1,
        timestamp_ms=md.last_updated_ms + 1,
        manifest_list="file:///t/snap.avro",
        summary=Summary(operation=Operation.APPEND),
        schema_id=md.current_schema_id,
        first_row_id=0,
        added_rows=5,
    )
    updates = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=7),
    )
    new = compat.apply_updates(md, updates, "file:///t/metadata/00000-x.metadata.json")
    assert new.current_snapshot_id == 7 and new.last_sequence_number == 1
    assert new.next_row_id == 5  # spec "Row Lineage": advanced by the snapshot's added-rows
    assert [e.metadata_file for e in new.metadata_log] == ["file:///t/metadata/00000-x.metadata.json"]
    assert [e.snapshot_id for e in new.snapshot_log] == [7]


def test_apply_updates_sets_and_removes_a_tag_keeping_main(tmp_path):
    """Cut tags (engine/iceberg/cuts.py) are SetSnapshotRefUpdate(type tag) / RemoveSnapshotRefUpdate applied
    through ``apply_updates``: a tag with its max-ref-age-ms, main untouched, removal leaves the snapshot."""
    md = _v3_metadata(tmp_path)
    snapshot = Snapshot(
        snapshot_id=7,
        sequence_number=1,
        timestamp_ms=md.last_updated_ms + 1,
        manifest_list="file:///t/snap.avro",
        summary=Summary(operation=Operation.APPEND),
        schema_id=md.current_schema_id,
        first_row_id=0,
        added_rows=5,
    )
    md = compat.apply_updates(
        md,
        (AddSnapshotUpdate(snapshot=snapshot), SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=7)),
        "file:///t/metadata/00000-x.metadata.json",
    )
    tagged = compat.apply_updates(
        md,
        (SetSnapshotRefUpdate(ref_name="lsn-0-10", type=SnapshotRefType.TAG, snapshot_id=7, max_ref_age_ms=5000),),
        "file:///t/metadata/00001-x.metadata.json",
    )
    ref = tagged.refs["lsn-0-10"]
    assert ref.snapshot_ref_type == SnapshotRefType.TAG and ref.snapshot_id == 7 and ref.max_ref_age_ms == 5000
    assert tagged.current_snapshot_id == 7 and tagged.refs["main"].snapshot_id == 7
    assert json.loads(compat.metadata_json(tagged))["refs"]["lsn-0-10"] == {
        "snapshot-id": 7,
        "type": "tag",
        "max-ref-age-ms": 5000,
    }
    untagged = compat.apply_updates(
        tagged, (RemoveSnapshotRefUpdate(ref_name="lsn-0-10"),), "file:///t/metadata/00002-x.metadata.json"
    )
    assert "lsn-0-10" not in untagged.refs and untagged.snapshot_by_id(7) is not None


def test_pyiceberg_s_public_create_tag_cannot_commit_a_v3_table(catalog, tmp_path):
    """Why IcebergMirrorTable.tag commits through our own swap: ``ManageSnapshots.create_tag`` commits
    through ``catalog.commit_table``, which cannot write v3 metadata in the pinned PyIceberg. When this
    fails, PyIceberg writes v3: the public API could then be used for tags."""
    t = IcebergMirrorTable.create(catalog, "ns.t", SCHEMA)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1], "name": ["a"]}, schema=t.arrow_schema()), path)
    snap = t.commit(add_files=[t.upload_data_file(str(path))])
    with pytest.raises(Exception):
        catalog.load_table("ns.t").manage_snapshots().create_tag(snap, "lsn-0-1").commit()
    assert "lsn-0-1" not in catalog.load_table("ns.t").metadata.refs


def test_a_table_object_at_new_metadata_keeps_identifier_and_io(catalog, tmp_path):
    params = inspect.signature(Table.__init__).parameters
    assert {"identifier", "metadata", "metadata_location", "io", "catalog"} <= set(params)
    t = IcebergMirrorTable.create(catalog, "ns.t", SCHEMA)
    loaded = catalog.load_table("ns.t")
    moved = compat.table_at(loaded, loaded.metadata, "file:///elsewhere.metadata.json", catalog)
    assert moved.name() == loaded.name() == ("ns", "t") and moved.io is loaded.io
    assert moved.metadata_location == "file:///elsewhere.metadata.json" and moved.metadata == t.table.metadata


# ------------------------------------------------------------------------------------ the SQL catalog swap


def test_sql_catalog_row_and_engine_are_what_the_swap_updates(catalog):
    assert compat.is_sql_catalog(catalog) and not compat.is_rest_catalog(catalog)
    assert isinstance(catalog.engine, Engine) and catalog.engine.dialect.supports_sane_rowcount
    assert {"catalog_name", "table_namespace", "table_name", "metadata_location", "previous_metadata_location"} <= set(
        IcebergTables.__table__.columns.keys()
    )
    assert issubclass(OperationalError, compat.SQL_CATALOG_ERRORS)


def test_swap_sql_pointer_is_a_compare_and_swap(catalog):
    t = IcebergMirrorTable.create(catalog, "ns.t", SCHEMA)
    base = t.metadata_location
    new = base.replace(".metadata.json", f"-{uuid.uuid4().hex[:6]}.metadata.json")
    with t.io.new_output(new).create() as out:  # a copy: load_table must be able to read the new pointer
        out.write(t.io.new_input(base).open().read())
    namespace, name = split_identifier("ns.t")
    assert compat.swap_sql_pointer(catalog, namespace, name, base, new) is True
    assert catalog.load_table("ns.t").metadata_location == new
    assert compat.swap_sql_pointer(catalog, namespace, name, base, base) is False  # stale base: nothing changes
    assert compat.swap_sql_pointer(catalog, namespace, "missing", new, base) is False
    assert catalog.load_table("ns.t").metadata_location == new
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(catalog.engine) as session:
        row = session.execute(select(IcebergTables).where(IcebergTables.table_name == "t")).scalar_one()
        assert (row.metadata_location, row.previous_metadata_location) == (new, base)


# ------------------------------------------------------------------------------------ manifests


def test_v3_records_keep_pyiceberg_s_positional_layout():
    df3 = [(f.field_id, f.name) for f in compat.DATA_FILE_TYPE[3].fields]
    assert df3[-4:] == [
        (142, "first_row_id"),
        (143, "referenced_data_file"),
        (144, "content_offset"),
        (145, "content_size_in_bytes"),
    ]
    assert [(f.field_id, f.name) for f in compat.DATA_FILE_TYPE[2].fields] == df3[:-4]
    ml3 = [(f.field_id, f.name) for f in compat.MANIFEST_LIST_FILE_SCHEMAS[3].fields]
    assert ml3[-1] == (520, "first_row_id")
    assert [(f.field_id, f.name) for f in compat.MANIFEST_LIST_FILE_SCHEMAS[2].fields] == ml3[:-1]
    assert "from_args" in vars(DataFile) and "_table_format_version" in inspect.signature(DataFile.from_args).parameters
    dv = new_data_file(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path="file:///d.puffin",
        file_format=FileFormat.PUFFIN,
        record_count=2,
        file_size_in_bytes=10,
        referenced_data_file="file:///a.parquet",
        content_offset=4,
        content_size_in_bytes=6,
    )
    assert len(dv) == len(df3) and data_file_field(dv, "referenced_data_file", 3) == "file:///a.parquet"
    assert data_file_field(dv, "content_offset", 3) == 4 and data_file_field(dv, "content_size_in_bytes", 3) == 6
    assert (
        len(
            new_data_file(
                2,
                content=DataFileContent.DATA,
                file_path="x",
                file_format=FileFormat.PARQUET,
                record_count=1,
                file_size_in_bytes=1,
            )
        )
        == len(df3) - 4
    )
    entry = compat.record(
        ManifestEntry, 3, status=1, snapshot_id=None, sequence_number=None, file_sequence_number=None, data_file=dv
    )
    assert entry.data_file is dv and entry.snapshot_id is None


def test_v3_fields_survive_an_avro_round_trip(catalog, tmp_path):
    t = IcebergMirrorTable.create(catalog, "ns.t", SCHEMA)
    md, io = t.table.metadata, t.io
    dv = new_data_file(
        3,
        content=DataFileContent.POSITION_DELETES,
        file_path=f"{t.location}/data/d.puffin",
        file_format=FileFormat.PUFFIN,
        record_count=2,
        file_size_in_bytes=10,
        referenced_data_file=f"{t.location}/data/a.parquet",
        content_offset=4,
        content_size_in_bytes=6,
    )
    manifest = write_manifest(
        io,
        f"{t.location}/metadata/m.avro",
        format_version=3,
        schema=md.schema(),
        spec=md.spec(),
        content=ManifestContent.DELETES,
        snapshot_id=9,
        sequence_number=1,
        entries=[manifest_entry(3, 1, 9, None, None, dv)],
    )
    data = new_data_file(
        3,
        content=DataFileContent.DATA,
        file_path=f"{t.location}/data/a.parquet",
        file_format=FileFormat.PARQUET,
        record_count=5,
        file_size_in_bytes=100,
    )
    data_manifest = write_manifest(
        io,
        f"{t.location}/metadata/d.avro",
        format_version=3,
        schema=md.schema(),
        spec=md.spec(),
        content=ManifestContent.DATA,
        snapshot_id=9,
        sequence_number=1,
        entries=[manifest_entry(3, 1, 9, None, None, data)],
    )
    added = write_manifest_list(
        io,
        f"{t.location}/metadata/snap.avro",
        format_version=3,
        snapshot_id=9,
        parent_snapshot_id=None,
        sequence_number=1,
        first_row_id=10,
        manifests=[(data_manifest, 5), (manifest, 0)],
    )
    assert added == 5
    listed = read_manifest_list(io, f"{t.location}/metadata/snap.avro", 3)
    assert [m.first_row_id for m in listed] == [10, None]
    assert isinstance(listed[0].record, ManifestFile) and manifest_file_first_row_id(listed[0].record, 3) == 10
    (read_dv,) = read_manifest_entries(io, ManifestInfo(listed[1].record, None), 3)
    assert data_file_field(read_dv.data_file, "referenced_data_file", 3) == f"{t.location}/data/a.parquet"
    assert (
        data_file_field(read_dv.data_file, "content_offset", 3),
        data_file_field(read_dv.data_file, "content_size_in_bytes", 3),
    ) == (4, 6)
    assert read_dv.snapshot_id == 9 and read_dv.sequence_number == 1  # inherited from the manifest
    (read_data,) = read_manifest_entries(io, listed[0], 3)
    assert data_file_field(read_data.data_file, "first_row_id", 3) == 10  # spec "First Row ID Inheritance"


def test_parquet_statistics_come_from_the_footer_by_field_id(tmp_path):
    md = _v3_metadata(tmp_path)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [3, 1, 2], "name": ["b", None, "a"]}), path)
    assert compat.parquet_column_ids(md.schema()) == {"id": 1, "name": 2}
    stats = compat.parquet_statistics(pq.read_metadata(path), md.schema(), {})
    assert stats["record_count"] == 3 and stats["null_value_counts"] == {1: 0, 2: 1}
    assert set(stats["lower_bounds"]) == {1, 2} and stats["lower_bounds"][1] == (1).to_bytes(8, "little")


# ------------------------------------------------------------------------------------ FileIO hooks


def test_fsspec_fileio_hooks_overridden_by_the_storage_fileio():
    """``storage/fileio.py`` overrides these private hooks of ``FsspecFileIO``."""
    assert list(inspect.signature(FsspecFileIO._get_fs).parameters) == ["self", "scheme", "hostname"]
    assert list(inspect.signature(FsspecFileIO._get_fs_from_uri).parameters) == ["self", "uri", "location"]
    io = FsspecFileIO({})
    fs = io._get_fs_from_uri(urlparse("file:///tmp/x"), "file:///tmp/x")
    assert fs.protocol[0] == "file" or "file" in fs.protocol


# ------------------------------------------------------------------------------------ the fault seam


def test_faults_depends_on_no_other_module_and_raises_the_registered_conflict(tmp_path, monkeypatch):
    tree = ast.parse((ROOT / "mooncake_assets/engine/faults.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert not any(m and (m.startswith("mooncake_assets") or m.startswith(".")) for m in imported)
    assert all(n.level == 0 for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    path = tmp_path / "faults.json"
    faults.set_faults(path, commit_conflicts=1)
    monkeypatch.setenv("MOONCAKE_FAULTS", str(path))
    faults.fault("persist:after_upload")  # not a registered point: the file is not consumed
    assert json.loads(path.read_text())["commit_conflicts"] == 1
    with pytest.raises(SwapConflict, match="injected"):  # registered by the Iceberg catalog
        faults.fault("commit:before_swap")
    assert json.loads(path.read_text()) == {"commit_conflicts": 0, "conflicts_injected": 1}
    faults.fault("commit:before_swap")  # disarmed
