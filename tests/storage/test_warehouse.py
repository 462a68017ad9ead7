"""The warehouse on moto's S3 server: clear errors for a missing bucket, rejected credentials and an
unreachable endpoint; reads and writes through PyArrow's S3 filesystem and DuckDB's httpfs."""

from __future__ import annotations

import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mooncake_assets.engine.storage import (
    BucketNotFound,
    CredentialsRejected,
    S3Config,
    StorageUnavailable,
    WarehouseConfigError,
    check_warehouse,
    configure_duckdb_s3,
    resolve_s3,
)

from .conftest import free_port


def test_check_warehouse_accepts_a_writable_bucket_and_leaves_nothing(moto_server, s3_bucket):
    cfg = resolve_s3(hints={"endpoint": moto_server.endpoint})
    check_warehouse(f"s3://{s3_bucket}/wh", cfg)
    assert set(moto_server.keys(s3_bucket)) <= {"wh/"}  # the probe is gone (PyArrow may leave a directory marker)


def test_missing_bucket_is_a_clear_permanent_error(moto_server, s3_env):
    cfg = resolve_s3(hints={"endpoint": moto_server.endpoint})
    with pytest.raises(BucketNotFound) as e:
        check_warehouse("s3://no-such-bucket-here/wh", cfg)
    assert "bucket 'no-such-bucket-here' does not exist" in str(e.value)
    assert moto_server.endpoint in str(e.value) and not e.value.retryable


def test_wrong_credentials_are_a_clear_permanent_error(moto_auth_server, s3_env):
    cfg = S3Config(endpoint=moto_auth_server.endpoint, access_key_id="AKIAWRONG", secret_access_key="wrong")
    with pytest.raises(CredentialsRejected) as e:
        check_warehouse("s3://some-bucket/wh", cfg)
    msg = str(e.value)
    assert (
        "credentials were rejected" in msg and "AWS_ACCESS_KEY_ID" in msg and "InvalidAccessKeyId" in msg
    )  # botocore's code, through s3fs
    assert not e.value.retryable


def test_unreachable_endpoint_is_a_clear_temporary_error(s3_env):
    cfg = S3Config(endpoint=f"http://127.0.0.1:{free_port()}")
    t0 = time.time()
    with pytest.raises(StorageUnavailable) as e:
        check_warehouse("s3://some-bucket/wh", cfg)
    assert "did not answer" in str(e.value) and cfg.endpoint in str(e.value) and e.value.retryable
    assert time.time() - t0 < 30


def test_bad_uri_and_plain_http_refused():
    with pytest.raises(WarehouseConfigError, match="not a valid S3 bucket name"):
        check_warehouse("s3://Bad_Bucket/x", S3Config())
    with pytest.raises(WarehouseConfigError, match="plain HTTP"):
        check_warehouse("s3://bucket/x", S3Config(endpoint="http://minio.example:9000"))


def test_local_warehouse_check(tmp_path):
    check_warehouse(f"file://{tmp_path}/wh")
    assert (tmp_path / "wh").is_dir() and list((tmp_path / "wh").iterdir()) == []


def test_duckdb_reads_s3_parquet_with_positions(moto_server, s3_bucket):
    cfg = resolve_s3(hints={"endpoint": moto_server.endpoint})
    fs = cfg.pyarrow_filesystem()
    pq.write_table(pa.table({"id": list(range(10))}), f"{s3_bucket}/t/a.parquet", filesystem=fs)
    con = duckdb.connect(config={"autoinstall_known_extensions": "false"})
    configure_duckdb_s3(con, cfg)
    configure_duckdb_s3(con, cfg)  # idempotent
    rows = con.execute(
        f"SELECT id, file_row_number FROM read_parquet('s3://{s3_bucket}/t/a.parquet', "
        "file_row_number = true) WHERE id % 4 = 1"
    ).fetchall()
    assert rows == [(1, 1), (5, 5), (9, 9)]
