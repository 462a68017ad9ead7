"""The phases of ``SnapshotProducer`` one by one, in-process (SQLite catalog and warehouse in tmp_path)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.table.snapshots import Operation
from pyroaring import BitMap64

from mooncake_assets.engine.iceberg import CommitConflict, IcebergMirrorTable, make_catalog
from mooncake_assets.engine.iceberg.producer import CommitRequest, SnapshotProducer
from mooncake_assets.engine.iceberg.snapshots import SnapshotReader

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture()
def table(tmp_path) -> IcebergMirrorTable:
    catalog = make_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "warehouse"))
    return IcebergMirrorTable.create(catalog, "ns.t", SCHEMA)


def upload(table: IcebergMirrorTable, tmp_path, name: str, ids: list[int]) -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.table({"id": ids, "name": [str(i) for i in ids]}, schema=table.arrow_schema()), path)
    return table.upload_data_file(str(path))


def request(**kw) -> CommitRequest:
    args = dict(
        add_files=(),
        deletes=None,
        remove_files=(),
        index_blob=None,
        summary=None,
        operation=None,
        schema=None,
        properties=None,
    )
    return CommitRequest.of(**{**args, **kw})


def producer(table: IcebergMirrorTable, req: CommitRequest, new_files=None) -> SnapshotProducer:
    table.refresh()
    return SnapshotProducer(
        table.table, SnapshotReader(table.identifier), req, new_files or {}, attempt=1, manifest_merge_threshold=32
    )


def test_validate_rejects_requests_that_no_longer_fit_the_base(table, tmp_path):
    a = upload(table, tmp_path, "a", [1, 2, 3])
    table.commit(add_files=[a])
    with pytest.raises(CommitConflict, match="already in the table") as err:
        producer(table, request(add_files=[a])).validate()
    assert not err.value.retryable
    with pytest.raises(CommitConflict, match="not in the table"):
        producer(table, request(remove_files=["file:///gone.parquet"])).validate()
    with pytest.raises(ValueError, match="beyond"):
        producer(table, request(deletes={a: [3]})).validate()
    producer(table, request(deletes={a: [2]})).validate()


def test_merge_deletes_keeps_one_dv_per_data_file(table, tmp_path):
    a, b = upload(table, tmp_path, "a", [1, 2, 3, 4]), upload(table, tmp_path, "b", [5, 6])
    table.commit(add_files=[a, b], deletes={a: [0], b: [1]})
    p = producer(table, request(deletes={a: [0, 2], b: [1]}))
    plan = p.merge_deletes()
    assert plan.new_sets == {a: BitMap64([0, 2])}  # b's set did not grow: its DV stays
    (old,) = plan.dropped.values()
    assert old.entry.data_file.file_path == table.state().data_files[a].delete_file
    p = producer(table, request(remove_files=[b]))
    plan = p.merge_deletes()
    assert plan.new_sets == {} and [d.entry.data_file.file_path for d in plan.dropped.values()] == [
        table.state().data_files[b].delete_file
    ]


def test_produce_writes_files_the_swap_did_not_take_and_discard_removes_them(table, tmp_path):
    a = upload(table, tmp_path, "a", [1, 2, 3])
    table.commit(add_files=[a])
    p = producer(table, request(deletes={a: [1]}, index_blob=b"idx"))
    produced = p.produce()
    assert produced.snapshot_id == p.snapshot_id and len(produced.requirements) == 3
    kinds = sorted(loc.rsplit("/", 2)[-2] + ("/puffin" if loc.endswith(".puffin") else "") for loc in p.written)
    # the DV, the index, the new delete manifest, the manifest list (the data manifest is carried as it is)
    assert kinds == ["data/puffin", "index/puffin", "metadata", "metadata"]
    assert all(table.io.new_input(loc).exists() for loc in p.written)
    assert table.state().data_files[a].deleted == BitMap64()  # nothing swapped in
    p.discard()
    assert not any(table.io.new_input(loc).exists() for loc in p.written)


def test_summary_and_row_lineage_of_committed_snapshots(table, tmp_path):
    a, b = upload(table, tmp_path, "a", [1, 2, 3]), upload(table, tmp_path, "b", [4, 5])
    s1 = table.commit(add_files=[a])
    s2 = table.commit(add_files=[b], deletes={a: [0]})
    md = table.refresh().table.metadata
    first, second = md.snapshot_by_id(s1), md.snapshot_by_id(s2)
    assert (first.first_row_id, first.added_rows) == (0, 3)
    assert (second.first_row_id, second.added_rows) == (3, 2) and md.next_row_id == 5
    assert first.summary.operation == Operation.APPEND and second.summary.operation == Operation.OVERWRITE
    props = second.summary.additional_properties
    assert props["added-data-files"] == "1" and props["added-dvs"] == "1" and props["total-records"] == "5"
    assert props["total-position-deletes"] == "1" and props["engine-name"] == "mooncake-assets"


def test_the_reader_parses_each_manifest_list_once_and_reads_every_snapshot_as_it_is(table, tmp_path, monkeypatch):
    """A manifest list is immutable (spec "Manifest Lists"): the reader keeps it parsed by path, so a
    second read of a snapshot reads no manifest list again, and each new snapshot's list is read once."""
    from mooncake_assets.engine.iceberg import snapshots

    parsed: list[str] = []
    real = snapshots.read_manifest_list

    def counting(io, location, fv):
        parsed.append(location)
        return real(io, location, fv)

    monkeypatch.setattr(snapshots, "read_manifest_list", counting)
    a = upload(table, tmp_path, "a", [1, 2, 3])
    table.commit(add_files=[a])
    first = table.state(index=False)
    b = upload(table, tmp_path, "b", [4, 5])
    table.commit(add_files=[b], deletes={a: [1]})
    second = table.state(index=False)
    again = table.state(first.snapshot_id, index=False)
    assert sorted(p.rsplit("/", 1)[-1] for p in first.data_files) == ["a.parquet"]
    assert sorted(p.rsplit("/", 1)[-1] for p in second.data_files) == ["a.parquet", "b.parquet"]
    assert again.data_files.keys() == first.data_files.keys()
    assert second.data_files[a].live_rows == 2 and again.data_files[a].live_rows == 3
    assert len(parsed) == len(set(parsed)) >= 2  # every list once: the third read parsed none
    before = len(parsed)
    table.state(index=False)
    table.state(first.snapshot_id, index=False)
    assert len(parsed) == before
