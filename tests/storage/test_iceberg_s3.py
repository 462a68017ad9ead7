"""The Iceberg writer's DV / position-delete tests (tests/engine/test_iceberg.py) on an s3:// warehouse.

The test functions are imported from there and run here with this module's ``catalog`` (SQLite catalog,
warehouse in a fresh prefix of a moto bucket) and ``duck`` (the iceberg extension plus httpfs with an S3
secret): data files, Puffin DVs, index blobs, manifests and metadata all live in S3.
"""

from __future__ import annotations

import uuid

import pytest

from mooncake_assets.engine.iceberg import connect_with_iceberg, make_catalog
from mooncake_assets.engine.storage import configure_duckdb_s3, resolve_s3
from tests.engine.test_iceberg import (  # noqa: F401  (collected here with the fixtures below)
    test_crash_between_writing_files_and_swap_keeps_previous_snapshot,
    test_expire_snapshots_reports_and_deletes_unreferenced_files,
    test_index_blob_round_trip,
    test_replace_files_in_one_commit,
    test_three_delete_commits_leave_one_delete_file,
    test_time_travel_sees_older_rows,
)


@pytest.fixture()
def s3_cfg(moto_server, s3_env):
    return resolve_s3(hints={"endpoint": moto_server.endpoint})


@pytest.fixture()
def catalog(tmp_path, s3_bucket, s3_cfg):
    warehouse = f"s3://{s3_bucket}/{uuid.uuid4().hex[:8]}"
    return make_catalog(f"sqlite:///{tmp_path}/catalog.db", warehouse, **s3_cfg.fileio_properties())


@pytest.fixture()
def duck(s3_cfg):
    con = connect_with_iceberg()
    configure_duckdb_s3(con, s3_cfg)
    yield con
    con.close()


def test_everything_is_in_the_bucket(catalog, tmp_path, moto_server, s3_bucket):
    """Data files, the DV Puffin, the index Puffin, manifests and metadata JSON are objects in S3."""
    from tests.engine.test_iceberg import Files, make_table

    t = make_table(catalog, "deletion-vectors")
    assert t.location.startswith(f"s3://{s3_bucket}/")
    from pyiceberg.io.fsspec import FsspecFileIO
    from s3fs import S3FileSystem

    assert isinstance(t.io, FsspecFileIO) and isinstance(t.io.get_fs("s3"), S3FileSystem)  # through s3fs
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3])
    t.commit(add_files=[a], index_blob=b"idx")
    t.commit(deletes={a: [1]})
    keys = moto_server.keys(s3_bucket)
    assert any(k.endswith("/data/a.parquet") for k in keys)
    assert any("/data/" in k and k.endswith("-deletes.puffin") for k in keys)
    assert any("/index/" in k and k.endswith(".puffin") for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys) and any(k.endswith(".avro") for k in keys)
    assert set(t.state().data_files[a].deleted) == {1}


def test_a_compaction_rewrite_in_the_child_process_reads_its_inputs_from_s3(tmp_path, s3_bucket, s3_cfg, moto_server):
    """``maintenance: auto`` rewrites in a child process (engine/compaction/worker.py): the table's FileIO
    (``MooncakeFileIO`` with the store's properties) crosses to it pickled, and the child opens the
    ``s3://`` inputs with it; the rows and the position map come back."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyroaring import BitMap64

    from mooncake_assets.engine.compaction import RewriteInput
    from mooncake_assets.engine.compaction.worker import compact_in_child
    from mooncake_assets.engine.storage.fileio import MooncakeFileIO

    schema = pa.schema([pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})])
    local = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}, schema=schema), local)
    moto_server.client().upload_file(str(local), s3_bucket, "in/in.parquet")
    io = MooncakeFileIO(s3_cfg.fileio_properties())
    uri = f"s3://{s3_bucket}/in/in.parquet"
    inp = [RewriteInput("in.parquet", uri, 1000, BitMap64(range(0, 1000, 2)), local.stat().st_size)]
    res = compact_in_child(inp, tmp_path / "out", schema, 1 << 20, nice=5, io=io).rewrite
    assert res.rows_out == 500 and pq.read_table(res.outputs[0].path).column("id").to_pylist() == list(
        range(1, 1000, 2)
    )
    fi, fr = res.position_map.map_rows("in.parquet", np.array([1, 2, 999]))
    assert fi.tolist() == [0, -1, 0] and int(fr[0]) == 0 and int(fr[2]) == 499
