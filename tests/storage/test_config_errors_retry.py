"""Unit tests of engine/storage: S3 settings resolution, error classification, retries with backoff."""

from __future__ import annotations

import time

import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.storage import (
    AccessDenied,
    Backoff,
    BucketNotFound,
    CatalogUnavailable,
    CredentialsRejected,
    RetryPolicy,
    S3Config,
    StorageUnavailable,
    WarehouseConfigError,
    catalog_properties,
    classify,
    is_retryable,
    parse_s3_uri,
    resolve_s3,
    retry_call,
    storage_hints,
)


def test_parse_s3_uri():
    assert parse_s3_uri("s3://bucket/a/b/") == ("bucket", "a/b")
    assert parse_s3_uri("s3://my.bucket-1") == ("my.bucket-1", "")
    for bad in ("s3://B/x", "s3://ab/x", "file:///tmp/x", "s3:///x"):
        with pytest.raises(WarehouseConfigError):
            parse_s3_uri(bad)


def test_resolve_env_settings_and_hints_in_order():
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:1111",
        "MOONCAKE_S3_ENDPOINT": "http://127.0.0.1:2222",
        "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
    }
    cfg = resolve_s3(env=env)
    assert (cfg.endpoint, cfg.region, cfg.access_key_id, cfg.secret_access_key) == (
        "http://127.0.0.1:2222",
        "eu-west-1",
        "k",
        "s",
    )

    class S:  # settings beat the environment; the service's hints beat both (credentials stay ours)
        s3_endpoint, s3_region, s3_allow_http = "http://127.0.0.1:3333", None, None

    assert resolve_s3(S(), env=env).endpoint == "http://127.0.0.1:3333"
    cfg = resolve_s3(S(), hints={"endpoint": "http://localhost:4444", "region": "x-1"}, env=env)
    assert (cfg.endpoint, cfg.region, cfg.access_key_id) == ("http://localhost:4444", "x-1", "k")
    assert resolve_s3(env={}).region == "us-east-1" and resolve_s3(env={}).endpoint is None


def test_plain_http_needs_allow_http_unless_loopback():
    assert S3Config(endpoint="http://127.0.0.1:9000").validate().http_allowed
    assert S3Config(endpoint="http://[::1]:9000").validate().http_allowed
    with pytest.raises(WarehouseConfigError, match="MOONCAKE_S3_ALLOW_HTTP"):
        resolve_s3(env={"MOONCAKE_S3_ENDPOINT": "http://minio.internal:9000"})
    cfg = resolve_s3(env={"MOONCAKE_S3_ENDPOINT": "http://minio.internal:9000", "MOONCAKE_S3_ALLOW_HTTP": "1"})
    assert cfg.host_port == "minio.internal:9000" and cfg.scheme == "http" and cfg.use_path_style
    with pytest.raises(WarehouseConfigError, match="expected a URL"):
        resolve_s3(env={"MOONCAKE_S3_ENDPOINT": "minio:9000"})
    with pytest.raises(WarehouseConfigError, match="true or false"):
        resolve_s3(env={"MOONCAKE_S3_ALLOW_HTTP": "maybe"})


def test_fileio_properties_and_hints_carry_no_secret_in_hints(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("MOONCAKE_S3_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    s = load_settings(tmp_path, warehouse="s3://bucket/wh", s3_endpoint="http://127.0.0.1:9000")
    props = catalog_properties(s)
    assert props["s3.endpoint"] == "http://127.0.0.1:9000" and props["s3.region"] == "us-east-1"
    assert props["s3.access-key-id"] == "key" and props["s3.secret-access-key"] == "secret"
    hints = storage_hints(s)
    assert hints["endpoint"] == "http://127.0.0.1:9000" and hints["warehouse"] == "s3://bucket/wh"
    assert "secret" not in repr(hints) and "key" not in {str(v) for v in hints.values()}
    s.save()  # the endpoint is saved for the background service, the credentials are not
    text = (tmp_path / "settings.json").read_text()
    assert "127.0.0.1:9000" in text and "secret" not in text
    assert load_settings(tmp_path).s3_endpoint == "http://127.0.0.1:9000"
    local = load_settings(tmp_path / "other")
    assert catalog_properties(local) == {} and storage_hints(local) is None


@pytest.mark.parametrize(
    "message,cls",
    [
        (
            "When getting information for bucket 'b': AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 7, "
            "Could not connect to server",
            StorageUnavailable,
        ),
        (
            "When initiating multiple part upload for key 'x' in bucket 'b': AWS Error NO_SUCH_BUCKET during "
            "CreateMultipartUpload operation: The specified bucket does not exist",
            BucketNotFound,
        ),
        (
            "AWS Error INVALID_ACCESS_KEY_ID during PutObject operation: The AWS Access Key Id you provided does not exist",
            CredentialsRejected,
        ),
        ("AWS Error SIGNATURE_DOES_NOT_MATCH during GetObject operation", CredentialsRejected),
        (
            "When getting information for bucket 'b': AWS Error ACCESS_DENIED during HeadBucket operation: No response body.",
            AccessDenied,
        ),
        ("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate.", StorageUnavailable),
        ("AWS Error UNKNOWN (HTTP status 503) during GetObject operation", StorageUnavailable),
        ("IO Error: Could not connect to server error for HTTP HEAD to 'http://127.0.0.1:1/b/x'", StorageUnavailable),
    ],
)
def test_classify_pyarrow_and_duckdb_messages(message, cls):
    err = classify(OSError(message), endpoint="http://127.0.0.1:1", what="upload")
    assert type(err) is cls
    assert err.retryable == (cls is StorageUnavailable)
    assert str(err).startswith("upload at http://127.0.0.1:1: ") and message.splitlines()[0] in str(err)


def test_classify_chains_and_non_storage_errors():
    try:
        try:
            raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation")
        except OSError as e:
            raise RuntimeError("commit failed") from e
    except RuntimeError as wrapped:
        assert isinstance(classify(wrapped), StorageUnavailable) and is_retryable(wrapped)
    assert classify(ValueError("bad positions")) is None and not is_retryable(ValueError("x"))
    assert classify(FileExistsError("s3://b/x exists")) is None

    class OperationalError(Exception):
        pass

    OperationalError.__module__ = "sqlalchemy.exc"
    assert isinstance(classify(OperationalError("connection refused")), CatalogUnavailable)


def test_retry_call_retries_temporary_errors_only():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation")
        return "ok"

    policy = RetryPolicy(initial_s=0.1, multiplier=2, max_delay_s=1, max_attempts=5, jitter=0)
    assert retry_call(flaky, policy, sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and sleeps == [0.1, 0.2]

    def missing():
        calls.append(1)
        raise OSError("AWS Error NO_SUCH_BUCKET during PutObject operation")

    calls.clear()
    with pytest.raises(BucketNotFound):
        retry_call(missing, policy, sleep=sleeps.append, what="put")
    assert len(calls) == 1

    def down():
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation")

    sleeps.clear()
    with pytest.raises(StorageUnavailable):
        retry_call(down, RetryPolicy(initial_s=0.1, max_delay_s=0.4, max_attempts=4, jitter=0), sleep=sleeps.append)
    assert sleeps == [0.1, 0.2, 0.4]


def test_backoff_grows_caps_and_describes():
    now = [100.0]
    b = Backoff(
        policy=RetryPolicy(initial_s=1, multiplier=2, max_delay_s=4, max_attempts=None, jitter=0), clock=lambda: now[0]
    )
    assert b.due()
    err = b.failed(OSError("AWS Error NETWORK_CONNECTION during PutObject operation"))
    assert isinstance(err, StorageUnavailable) and not b.due() and b.next_at == 101.0
    b.failed(OSError("AWS Error NETWORK_CONNECTION"))
    assert b.next_at == 102.0
    for _ in range(5):
        b.failed(OSError("AWS Error NETWORK_CONNECTION"))
    assert b.next_at == 104.0 and b.failures == 7
    assert "temporary; failed 7x" in b.describe()
    b.failed(OSError("AWS Error NO_SUCH_BUCKET during PutObject operation"))
    assert not b.retryable and "permanent" in b.describe() and b.next_at == 104.0
    now[0] = 104.0
    assert b.due()
    with pytest.raises(ValueError):
        RetryPolicy(initial_s=0)
    service = Backoff()  # the service's policy: float growth, capped at 30 s, no overflow after many failures
    for _ in range(2000):
        service.failed(OSError("AWS Error NETWORK_CONNECTION"))
    assert 15.0 <= service.next_at - time.monotonic() <= 30.0
    service.failed(OSError("AWS Error ACCESS_DENIED during PutObject operation"))
    assert not service.retryable and 15.0 <= service.next_at - time.monotonic() <= 30.0
