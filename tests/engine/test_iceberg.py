"""Tests for mooncake_assets.engine.iceberg: v3 (deletion vectors) and v2 (position deletes) mirrors.

Every table lives in tmp_path (warehouse + SQLite catalog). Readers checked: our own ``state()``,
PyIceberg's scan, DuckDB's iceberg extension (loaded offline from the PyPI packages).
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.manifest import DataFileContent, FileFormat, ManifestContent, ManifestEntryStatus
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import decode_deletion_vector, read_puffin
from mooncake_assets.engine.iceberg import (
    CommitConflict,
    CommitStateUnknown,
    IcebergMirrorTable,
    connect_with_iceberg,
    make_catalog,
)
from mooncake_assets.engine.iceberg import catalog as catalog_mod
from mooncake_assets.engine.iceberg import table as table_mod
from mooncake_assets.engine.iceberg.faults import SimulatedCrash, crash_before_swap
from mooncake_assets.engine.iceberg.manifest import data_file_field, read_manifest_entries, read_manifest_list
from mooncake_assets.engine.iceberg.position_deletes import FILE_PATH_FIELD_ID
from mooncake_assets.engine.storage import duckdb_ext

FORMATS = ["deletion-vectors", "position-deletes"]
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture(scope="module")
def duck():
    con = connect_with_iceberg()
    yield con
    con.close()


@pytest.fixture()
def catalog(tmp_path):
    return make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))


class Files:
    """Writes small Parquet data files (``id`` = the given ints) and uploads them."""

    def __init__(self, table: IcebergMirrorTable, tmp_path):
        self.table, self.dir, self.rows = table, tmp_path / "local", {}
        self.dir.mkdir(exist_ok=True)

    def add(self, name: str, ids: list[int]) -> str:
        path = self.dir / f"{name}.parquet"
        data = pa.table({"id": ids, "name": [f"n{i}" for i in ids]}, schema=self.table.arrow_schema())
        pq.write_table(data, path)
        location = self.table.upload_data_file(str(path))
        self.rows[location] = ids
        return location


def live_ids(rows: dict[str, list[int]], deleted: dict[str, set[int]]) -> list[int]:
    return sorted(i for loc, ids in rows.items() for pos, i in enumerate(ids) if pos not in deleted.get(loc, set()))


def pyiceberg_ids(catalog, identifier="ns.t", snapshot_id=None) -> list[int]:
    scan = catalog.load_table(identifier).scan(snapshot_id=snapshot_id)
    return sorted(scan.to_arrow()["id"].to_pylist())


def duckdb_ids(duck, table: IcebergMirrorTable) -> list[int]:
    return sorted(r[0] for r in duck.sql(f"SELECT id FROM iceberg_scan('{table.metadata_location}')").fetchall())


def live_delete_entries(table: IcebergMirrorTable) -> dict[str, list]:
    """data file location -> live delete entries (read independently of ``state()``)."""
    t = table.refresh().table
    fv = t.format_version
    snapshot = t.metadata.current_snapshot()
    out: dict[str, list] = {}
    for manifest in read_manifest_list(t.io, snapshot.manifest_list, fv):
        for e in read_manifest_entries(t.io, manifest, fv):
            if e.status == ManifestEntryStatus.DELETED or e.data_file.content != DataFileContent.POSITION_DELETES:
                continue
            assert manifest.content == ManifestContent.DELETES
            ref = data_file_field(e.data_file, "referenced_data_file", fv)
            if ref is None:
                ref = e.data_file.lower_bounds[FILE_PATH_FIELD_ID].decode()
                assert e.data_file.upper_bounds[FILE_PATH_FIELD_ID].decode() == ref
            out.setdefault(ref, []).append(e)
    return out


def make_table(catalog, fmt, **kw) -> IcebergMirrorTable:
    return IcebergMirrorTable.create(catalog, "ns.t", SCHEMA, delete_format=fmt, **kw)


# --------------------------------------------------------------------------------------- create


@pytest.mark.parametrize("fmt,version", [("deletion-vectors", 3), ("position-deletes", 2)])
def test_create_sets_format_and_fails_when_exists(catalog, fmt, version):
    t = make_table(catalog, fmt, properties={"owner": "tests"})
    assert t.format_version == version and t.delete_format == fmt
    assert t.location.startswith("file://") and t.location.endswith("/ns/t")
    md = json.loads(t.table.io.new_input(t.metadata_location).open().read())
    assert md["format-version"] == version
    assert md["properties"]["owner"] == "tests" and "schema.name-mapping.default" in md["properties"]
    if version == 3:
        assert md["next-row-id"] == 0
    assert [f["required"] for f in md["schemas"][0]["fields"]] == [True, False]
    with pytest.raises(TableAlreadyExistsError, match="already exists"):
        make_table(catalog, fmt)
    assert IcebergMirrorTable.load(catalog, "ns.t").format_version == version
    assert t.state().snapshot_id is None and t.state().data_files == {}


def test_create_rejects_unknown_delete_format(catalog):
    with pytest.raises(ValueError, match="delete_format"):
        make_table(catalog, "equality-deletes")


def test_make_catalog_paths(tmp_path):
    cat = make_catalog(f"sqlite:///{tmp_path}/sub/dir/c.db", str(tmp_path / "wh"))
    assert cat.properties["warehouse"] == f"file://{tmp_path}/wh"
    assert (tmp_path / "sub" / "dir").is_dir()
    with pytest.raises(ValueError, match="sqlite"):
        make_catalog("mysql://x", str(tmp_path))


# --------------------------------------------------------------------------------------- deletes


@pytest.mark.parametrize("fmt", FORMATS)
def test_three_delete_commits_leave_one_delete_file(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a, b = files.add("a", list(range(100))), files.add("b", list(range(100, 150)))
    s1 = t.commit(add_files=[a, b], summary={"mooncake.flush-lsn": "0/10"})
    s2 = t.commit(deletes={a: BitMap64([1, 2, 3])}, summary={"mooncake.flush-lsn": "0/20"})
    s3 = t.commit(deletes={a: BitMap64([3, 50])})
    s4 = t.commit(deletes={a: [99, 0]})
    assert len({s1, s2, s3, s4}) == 4
    deleted = {a: {0, 1, 2, 3, 50, 99}}

    entries = live_delete_entries(t)
    assert list(entries) == [a] and len(entries[a]) == 1
    (dv,) = entries[a]
    assert dv.data_file.record_count == len(deleted[a])
    # the DV is at least as new as the data file it applies to
    data_seq = t.state().data_files[a].sequence_number
    assert dv.sequence_number >= data_seq and dv.sequence_number == t.state().sequence_number
    if fmt == "deletion-vectors":
        df = dv.data_file
        assert df.file_format == FileFormat.PUFFIN
        offset, size = data_file_field(df, "content_offset", 3), data_file_field(df, "content_size_in_bytes", 3)
        puffin = read_puffin(t.io.new_input(df.file_path).open().read())
        (blob,) = [m for m in puffin.blobs if m.properties["referenced-data-file"] == a]
        assert (blob.offset, blob.length) == (offset, size)
        assert df.file_size_in_bytes == len(t.io.new_input(df.file_path))
        assert set(decode_deletion_vector(puffin.blob_data(blob))) == deleted[a]
    else:
        assert dv.data_file.file_format == FileFormat.PARQUET

    state = t.state()
    assert set(state.data_files[a].deleted) == deleted[a] and len(state.data_files[b].deleted) == 0
    assert state.summary["operation"] == "delete"
    assert state.flush_lsn == "0/20"  # carried over from the last commit that set it
    expected = live_ids(files.rows, deleted)
    assert state.live_rows == len(expected)
    assert pyiceberg_ids(catalog) == expected
    assert duckdb_ids(duck, t) == expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_replace_files_in_one_commit(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a, b = files.add("a", [1, 2, 3, 4]), files.add("b", [5, 6, 7])
    t.commit(add_files=[a, b])
    t.commit(deletes={a: [0, 2], b: [1]})
    compacted = files.add("c", [2, 4, 5, 7])
    sid = t.commit(remove_files=[a, b], add_files=[compacted], operation="replace")
    del files.rows[a], files.rows[b]
    state = t.state()
    assert state.snapshot_id == sid and list(state.data_files) == [compacted]
    assert state.summary["operation"] == "replace"
    assert state.summary["deleted-data-files"] == "2" and state.summary["removed-delete-files"] == "2"
    assert live_delete_entries(t) == {}
    assert pyiceberg_ids(catalog) == duckdb_ids(duck, t) == [2, 4, 5, 7]
    # default operation for a replace that also deletes
    d = files.add("d", [8])
    t.commit(remove_files=[compacted], add_files=[d], deletes={d: [0]})
    assert t.state().summary["operation"] == "overwrite"
    assert pyiceberg_ids(catalog) == duckdb_ids(duck, t) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_index_blob_round_trip(catalog, tmp_path, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2])
    blob = bytes(range(256)) * 10
    t.commit(add_files=[a], index_blob=blob, summary={"mooncake.flush-lsn": "0/16B3748"})
    state = t.state()
    assert state.index_blob == blob
    location = state.summary["mooncake.index-file"]
    assert location.startswith(t.location + "/index/") and location.endswith(".puffin")
    # not a manifest entry: no reader trips on it
    for task in catalog.load_table("ns.t").scan().plan_files():
        assert "/index/" not in task.file.file_path
        assert all("/index/" not in d.file_path for d in task.delete_files)
    # a later commit without an index keeps referencing the same one; a new one replaces it
    t.commit(deletes={a: [0]})
    assert t.state().index_blob == blob and t.state().summary["mooncake.index-file"] == location
    t.commit(index_blob=b"second")
    assert t.state().index_blob == b"second" and t.state().flush_lsn == "0/16B3748"


@pytest.mark.parametrize("fmt", FORMATS)
def test_time_travel_sees_older_rows(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", [10, 11, 12])
    s1 = t.commit(add_files=[a])
    s2 = t.commit(deletes={a: [1]})
    b = files.add("b", [13])
    s3 = t.commit(add_files=[b], deletes={a: [0]})
    assert pyiceberg_ids(catalog, snapshot_id=s1) == [10, 11, 12]
    assert pyiceberg_ids(catalog, snapshot_id=s2) == [10, 12]
    assert pyiceberg_ids(catalog, snapshot_id=s3) == pyiceberg_ids(catalog) == [12, 13]
    assert set(t.state(s2).data_files[a].deleted) == {1}
    assert list(t.state(s1).data_files) == [a]
    with pytest.raises(ValueError, match="no snapshot"):
        t.state(12345)


def test_v3_row_lineage_and_sequence_numbers(catalog, tmp_path):
    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    a, b = files.add("a", list(range(7))), files.add("b", list(range(5)))
    t.commit(add_files=[a, b])
    t.commit(deletes={a: [0]})
    c = files.add("c", list(range(4)))
    t.commit(add_files=[c], remove_files=[b])
    md = json.loads(t.io.new_input(t.metadata_location).open().read())
    assert md["format-version"] == 3
    snaps = md["snapshots"]
    assert [(s["sequence-number"], s["first-row-id"], s["added-rows"]) for s in snaps] == [
        (1, 0, 12),
        (2, 12, 0),
        (3, 12, 4),
    ]
    assert md["next-row-id"] == 16 and md["last-sequence-number"] == 3
    tbl = t.table
    manifests = read_manifest_list(tbl.io, tbl.metadata.current_snapshot().manifest_list, 3)
    for m in manifests:
        if m.content == ManifestContent.DELETES:
            assert m.first_row_id is None
        else:
            assert m.first_row_id is not None
    first_row_ids = {}
    for m in manifests:
        for e in read_manifest_entries(tbl.io, m, 3):
            if e.data_file.content == DataFileContent.DATA:
                first_row_ids[e.data_file.file_path] = (e.status, data_file_field(e.data_file, "first_row_id", 3))
                assert e.sequence_number is not None and e.file_sequence_number is not None
    assert first_row_ids[a][1] == 0 and first_row_ids[b] == (ManifestEntryStatus.DELETED, 7)
    assert first_row_ids[c] == (ManifestEntryStatus.ADDED, 12)
    # the rewritten manifest wrote the inherited first_row_id explicitly (checked with DuckDB's avro reader)
    con = connect_with_iceberg()
    rows = []
    for m in manifests:
        rows += con.sql(
            f"SELECT status, data_file.file_path, data_file.first_row_id, sequence_number FROM read_avro('{m.path}')"
        ).fetchall()
    assert (2, b, 7, 1) in rows and (0, a, 0, 1) in rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_many_commits_merge_manifests(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    t.manifest_merge_threshold = 3
    files = Files(t, tmp_path)
    deleted: dict[str, set[int]] = {}
    locations = []
    for i in range(8):
        locations.append(files.add(f"f{i}", list(range(i * 10, i * 10 + 10))))
        t.commit(add_files=[locations[-1]])
        target = locations[i // 2]
        t.commit(deletes={target: [i]})
        deleted.setdefault(target, set()).add(i)
    tbl = t.refresh().table
    manifests = read_manifest_list(tbl.io, tbl.metadata.current_snapshot().manifest_list, tbl.format_version)
    assert sum(m.content == ManifestContent.DATA for m in manifests) <= 3
    assert sum(m.content == ManifestContent.DELETES for m in manifests) <= 3
    assert {k: len(v) for k, v in live_delete_entries(t).items()} == {k: 1 for k in deleted}
    expected = live_ids(files.rows, deleted)
    assert pyiceberg_ids(catalog) == duckdb_ids(duck, t) == expected
    if fmt == "deletion-vectors":  # row ids stay stable through manifest rewrites: file i starts at 10 * i
        ids = {}
        for m in manifests:
            for e in read_manifest_entries(tbl.io, m, 3):
                if e.data_file.content == DataFileContent.DATA:
                    ids[e.data_file.file_path] = data_file_field(e.data_file, "first_row_id", 3)
        assert ids == {loc: 10 * i for i, loc in enumerate(locations)}


# --------------------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize("fmt", FORMATS)
def test_conflicting_writer_is_retried_and_nothing_lost(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a, b = files.add("a", list(range(10))), files.add("b", list(range(10, 20)))
    t.commit(add_files=[a, b])
    other = IcebergMirrorTable.load(
        make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse")), "ns.t"
    )
    calls = []

    def interfere(_location):
        calls.append(1)
        if len(calls) == 1:  # the other writer commits between our file writes and our swap
            other.commit(deletes={a: [1, 2], b: [0]})

    t.before_swap = interfere
    t.commit(deletes={a: [2, 3]}, summary={"mooncake.flush-lsn": "0/30"})
    assert len(calls) == 2
    state = t.state()
    assert set(state.data_files[a].deleted) == {1, 2, 3} and set(state.data_files[b].deleted) == {0}
    assert {k: len(v) for k, v in live_delete_entries(t).items()} == {a: 1, b: 1}
    assert len(state.summary) and state.flush_lsn == "0/30"
    expected = live_ids(files.rows, {a: {1, 2, 3}, b: {0}})
    assert pyiceberg_ids(catalog) == duckdb_ids(duck, t) == expected
    assert len(catalog.load_table("ns.t").metadata.snapshots) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_conflict_every_time_raises_and_commits_nothing(catalog, tmp_path, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", list(range(10)))
    t.commit(add_files=[a])
    other = IcebergMirrorTable.load(catalog, "ns.t")
    positions = iter(range(10))
    t.before_swap = lambda _loc: other.commit(deletes={a: [next(positions)]})
    t.commit_attempts = 3
    with pytest.raises(CommitConflict) as err:
        t.commit(deletes={a: [9]})
    assert err.value.retryable
    state = t.state()
    assert set(state.data_files[a].deleted) == {0, 1, 2}  # the other writer's three commits, none of ours
    assert len(live_delete_entries(t)[a]) == 1
    t.before_swap = None
    t.commit(deletes={a: [9]})
    assert set(t.state().data_files[a].deleted) == {0, 1, 2, 9}


def test_conflict_that_no_longer_applies_is_permanent(catalog, tmp_path):
    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    a, b = files.add("a", [1, 2]), files.add("b", [3])
    t.commit(add_files=[a, b])
    other = IcebergMirrorTable.load(catalog, "ns.t")
    t.before_swap = lambda _loc: other.commit(remove_files=[a])
    with pytest.raises(CommitConflict, match="not in the table") as err:
        t.commit(deletes={a: [0]})
    assert not err.value.retryable
    t.before_swap = None
    with pytest.raises(CommitConflict, match="already in the table"):
        t.commit(add_files=[b])
    with pytest.raises(ValueError, match="beyond"):
        t.commit(deletes={b: [1]})
    assert pyiceberg_ids(catalog) == [3]


def test_commit_reported_lost_but_done_is_not_duplicated(catalog, tmp_path, monkeypatch):
    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3])
    real = table_mod.commit_metadata
    calls = []

    def swap_then_report_conflict(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise catalog_mod.SwapConflict("lost connection after the swap")
        return result

    monkeypatch.setattr(table_mod, "commit_metadata", swap_then_report_conflict)
    sid = t.commit(add_files=[a])
    assert len(calls) == 1 and t.state().snapshot_id == sid
    assert len(catalog.load_table("ns.t").metadata.snapshots) == 1
    assert pyiceberg_ids(catalog) == [1, 2, 3]


def test_lost_connection_during_swap(catalog, tmp_path, monkeypatch):
    from sqlalchemy.exc import OperationalError

    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    a, b = files.add("a", [1, 2, 3]), files.add("b", [4])
    real = catalog_mod.swap_sql_pointer

    def swap_then_fail(*args):
        real(*args)
        raise OperationalError("COMMIT", {}, Exception("server closed the connection"))

    monkeypatch.setattr(catalog_mod, "swap_sql_pointer", swap_then_fail)
    sid = t.commit(add_files=[a])  # the swap happened: found by its commit id, not an error
    assert t.state().snapshot_id == sid

    def fail_before(*args):
        raise OperationalError("UPDATE", {}, Exception("server closed the connection"))

    monkeypatch.setattr(catalog_mod, "swap_sql_pointer", fail_before)
    with pytest.raises(CommitStateUnknown) as err:
        t.commit(add_files=[b])
    assert err.value.retryable
    monkeypatch.setattr(catalog_mod, "swap_sql_pointer", real)
    assert t.state().snapshot_id == sid and pyiceberg_ids(catalog) == [1, 2, 3]
    t.commit(add_files=[b])
    assert pyiceberg_ids(catalog) == [1, 2, 3, 4]


@pytest.mark.parametrize("fmt", FORMATS)
def test_crash_between_writing_files_and_swap_keeps_previous_snapshot(catalog, tmp_path, duck, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3, 4])
    before = t.commit(add_files=[a], index_blob=b"v1")
    b = files.add("b", [5])
    with crash_before_swap(t) as crashed, pytest.raises(SimulatedCrash):
        t.commit(add_files=[b], deletes={a: [0, 1]}, index_blob=b"v2")
    if fmt == "deletion-vectors":  # v3: our own metadata JSON was written but never swapped in
        assert crashed[0].endswith(".metadata.json") and t.io.new_input(crashed[0]).exists()
    reopened = IcebergMirrorTable.load(catalog, "ns.t")
    state = reopened.state()
    assert state.snapshot_id == before and state.index_blob == b"v1"
    assert list(state.data_files) == [a] and len(state.data_files[a].deleted) == 0
    assert pyiceberg_ids(catalog) == duckdb_ids(duck, reopened) == [1, 2, 3, 4]
    # and the table goes on: the same change commits cleanly afterwards
    reopened.commit(add_files=[b], deletes={a: [0, 1]}, index_blob=b"v2")
    assert pyiceberg_ids(catalog) == [3, 4, 5] and reopened.state().index_blob == b"v2"


# --------------------------------------------------------------------------------------- maintenance


@pytest.mark.parametrize("fmt", FORMATS)
def test_expire_snapshots_reports_and_deletes_unreferenced_files(catalog, tmp_path, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", list(range(6)))
    t.commit(add_files=[a], index_blob=b"i1")
    t.commit(deletes={a: [0]})
    first_dv = t.state().data_files[a].delete_file
    t.commit(deletes={a: [1]}, index_blob=b"i2")
    c = files.add("c", [2, 3, 4, 5])
    t.commit(remove_files=[a], add_files=[c])
    assert t.expire_snapshots(older_than_ms=0) == []  # nothing is that old
    orphans = t.expire_snapshots(older_than_ms=int(time.time() * 1000) + 60_000, retain_last=1, delete_files=True)
    assert a in orphans and first_dv in orphans and c not in orphans
    assert any(o.endswith(".puffin") and "/index/" in o for o in orphans)
    assert all(not t.io.new_input(o).exists() for o in orphans)
    assert len(t.table.metadata.snapshots) == 1
    assert pyiceberg_ids(catalog) == [2, 3, 4, 5] and t.state().index_blob == b"i2"


@pytest.mark.parametrize("fmt", FORMATS)
def test_drop_purges_files(catalog, tmp_path, fmt):
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2])
    t.commit(add_files=[a], index_blob=b"x")
    t.commit(deletes={a: [0]})
    root = tmp_path / "warehouse" / "ns" / "t"
    assert root.exists()
    t.drop(purge=True)
    assert not root.exists()
    with pytest.raises(NoSuchTableError):
        catalog.load_table("ns.t")
    make_table(catalog, fmt)  # the name is free again


def test_data_file_checks(catalog, tmp_path):
    t = make_table(catalog, "deletion-vectors")
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [1], "other": [2]}), bad)
    with pytest.raises(ValueError, match="other"):
        t.upload_data_file(str(bad))
    wrong_id = tmp_path / "wrong.parquet"
    field = pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"7"})
    pq.write_table(pa.table({"id": [1]}, schema=pa.schema([field])), wrong_id)
    with pytest.raises(ValueError, match="field id 7"):
        t.upload_data_file(str(wrong_id))
    plain = tmp_path / "plain.parquet"  # no field ids: resolved through the name mapping
    pq.write_table(pa.table({"id": [4, 5], "name": ["x", None]}), plain)
    location = t.upload_data_file(str(plain))
    with pytest.raises(FileExistsError):
        t.upload_data_file(str(plain))
    t.commit(add_files=[location])
    state = t.state().data_files[location]
    assert (state.record_count, state.lower_bounds["id"], state.upper_bounds["id"]) == (2, 4, 5)
    assert pyiceberg_ids(catalog) == [4, 5]


# --------------------------------------------------------------------------------------- duckdb


def test_connect_with_iceberg_extension_dir(tmp_path, catalog):
    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3])
    t.commit(add_files=[a])
    t.commit(deletes={a: [1]})
    con = connect_with_iceberg(extension_dir=str(tmp_path / "ext"))
    try:
        assert duckdb_ids(con, t) == [1, 3]
        loaded = dict(con.sql("SELECT extension_name, loaded FROM duckdb_extensions()").fetchall())
        assert loaded["iceberg"] and loaded["avro"]
    finally:
        con.close()
    assert any((tmp_path / "ext").rglob("iceberg.duckdb_extension"))


def test_missing_extension_package_is_a_clear_error(monkeypatch):
    with pytest.raises(RuntimeError, match="ships no extension for DuckDB v0.0.1"):
        duckdb_ext.extension_file("iceberg", "v0.0.1")
    real_import = duckdb_ext.importlib.import_module

    def no_package(name, *a, **k):
        if name.startswith("duckdb_extension_"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(duckdb_ext.importlib, "import_module", no_package)
    with pytest.raises(RuntimeError, match="duckdb-extension-avro is not installed"):
        connect_with_iceberg()
