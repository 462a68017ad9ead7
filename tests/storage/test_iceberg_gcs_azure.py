"""The Iceberg writer's tests (tests/engine/test_iceberg.py) with the warehouse on the GCS emulator and
on Azurite, as test_iceberg_s3.py does for S3: data files, Puffin DVs, index blobs, manifests
and metadata all written through PyIceberg's FsspecFileIO (gcsfs, adlfs) and read back by PyIceberg
and DuckDB's iceberg extension (through the registered fsspec filesystem). Plus orphan listing."""

from __future__ import annotations

import time
import uuid

import pytest

from mooncake_assets.engine.iceberg import connect_with_iceberg, make_catalog
from mooncake_assets.engine.storage import configure_duckdb_store, resolve_store
from tests.engine.test_iceberg import (  # noqa: F401  (collected here with the fixtures below)
    test_expire_snapshots_reports_and_deletes_unreferenced_files,
)
from tests.storage.conftest import azurite_connection_string, new_name


@pytest.fixture(params=("gcs", "azure"))
def warehouse(request, store_env):
    if request.param == "gcs":
        em = request.getfixturevalue("gcs_emulator")
        store_env.setenv("STORAGE_EMULATOR_HOST", em.endpoint)
        store_env.setenv("GOOGLE_CLOUD_PROJECT", "mooncake-test")
        bucket = new_name()
        uri = f"gs://{bucket}/{uuid.uuid4().hex[:8]}"
    else:
        em = request.getfixturevalue("azurite")
        store_env.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(em.port))
        bucket = new_name()
        uri = f"abfs://{bucket}/{uuid.uuid4().hex[:8]}"
    cfg = resolve_store(uri)
    cfg.filesystem().mkdir(bucket)
    return uri, cfg


@pytest.fixture()
def catalog(tmp_path, warehouse):
    uri, cfg = warehouse
    return make_catalog(f"sqlite:///{tmp_path}/catalog.db", uri)  # FileIO properties from the environment


@pytest.fixture()
def duck(warehouse):
    con = connect_with_iceberg()
    configure_duckdb_store(con, warehouse[1])
    yield con
    con.close()


def test_files_are_in_the_store_and_orphans_are_found(catalog, tmp_path, warehouse, duck):
    """Every file kind lands in the store; DuckDB's iceberg_scan reads the table there; the orphan listing
    (compaction's cleanup) returns a stray file under data/ and none that the metadata references."""
    from mooncake_assets.engine.compaction.runner import find_orphans
    from tests.engine.test_iceberg import Files, make_table

    uri, cfg = warehouse
    t = make_table(catalog, "deletion-vectors")
    assert t.location.startswith(uri)
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3])
    t.commit(add_files=[a], index_blob=b"idx")
    t.commit(deletes={a: [1]})
    fs = cfg.filesystem()
    keys = fs.find(uri.split("://", 1)[1].split("/", 1)[0])
    assert any(k.endswith("/data/a.parquet") for k in keys)
    assert any(k.endswith("-deletes.puffin") for k in keys) and any("/index/" in k for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys) and any(k.endswith(".avro") for k in keys)
    ids = sorted(r[0] for r in duck.execute(f"SELECT id FROM iceberg_scan('{t.table.metadata_location}')").fetchall())
    assert ids == [1, 3]
    stray = f"{t.location}/data/stray.parquet"
    with t.io.new_output(stray).create() as out:
        out.write(b"not referenced")
    time.sleep(0.01)
    orphans = find_orphans(t)
    assert orphans == [stray], orphans
