"""Warehouses on GCS (``gcp-storage-emulator``) and Azure Blob (Azurite), both on loopback and started by
the fixtures: warehouse checks with one-line classified errors, a mirror with persist,
compaction and a restart verified by the union reader, PyIceberg and DuckDB's iceberg extension, and an
emulator that goes away mid-run and comes back.

What the emulators cannot show: gcp-storage-emulator accepts any credentials (anonymous access), so
rejected GCS credentials are not tested against a server; only a missing credentials file is."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceError
from mooncake_assets.engine.storage import (
    BucketNotFound,
    CredentialsRejected,
    StorageUnavailable,
    WarehouseConfigError,
    check_warehouse,
    resolve_store,
)
from mooncake_assets.verify import verify
from tests.helpers import make_settings, running_service, wait_until
from tests.storage.conftest import TcpProxy, azurite_connection_string, free_port, new_name

STORES = ("gcs", "azure")


def _point_at(kind: str, monkeypatch, port: int) -> None:
    """The environment a user of that store sets (inherited by the service and the readers)."""
    if kind == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "mooncake-test")
    else:
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(port))


def _uri(kind: str, bucket: str, prefix: str = "wh") -> str:
    return f"gs://{bucket}/{prefix}" if kind == "gcs" else f"abfs://{bucket}/{prefix}"


def _make_bucket(kind: str) -> str:
    name = new_name()
    fs = resolve_store(_uri(kind, name)).filesystem()
    fs.mkdir(name)
    return name


@pytest.fixture(params=STORES)
def store(request, store_env):
    """(kind, emulator) for each store, the environment pointing at the emulator."""
    em = request.getfixturevalue("gcs_emulator" if request.param == "gcs" else "azurite")
    _point_at(request.param, store_env, em.port)
    return request.param, em


def _keys(kind: str, bucket: str) -> list[str]:
    fs = resolve_store(_uri(kind, bucket)).filesystem()
    return fs.find(bucket)


def _all_match(settings, client=None, reader="union"):
    results, lsn = verify(settings, None, reader, client)
    bad = [r.line() for r in results if not r.match]
    assert results and not bad, f"{reader} at LSN {lsn}: {bad}"


def test_check_warehouse_and_classified_errors(store, store_env):
    """A writable bucket/container passes and keeps nothing; a missing one, rejected credentials (Azure)
    and a dead endpoint are one line naming the warehouse and the endpoint, permanent or temporary."""
    kind, em = store
    bucket = _make_bucket(kind)
    check_warehouse(_uri(kind, bucket))
    assert _keys(kind, bucket) == []  # the probe object is gone
    with pytest.raises(BucketNotFound) as e:
        check_warehouse(_uri(kind, "no-such-bucket-mc"))
    msg = str(e.value)
    assert "'no-such-bucket-mc' does not exist" in msg and em.endpoint in msg and "\n" not in msg
    assert not e.value.retryable
    if kind == "azure":
        store_env.setenv(
            "AZURE_STORAGE_CONNECTION_STRING",
            azurite_connection_string(em.port, key="d3Jvbmcta2V5LW5vdC1henVyaXRl" * 3),
        )
        with pytest.raises(CredentialsRejected) as e:
            check_warehouse(_uri(kind, bucket))
        assert "credentials were rejected" in str(e.value) and "AZURE_STORAGE" in str(e.value)
        assert "\n" not in str(e.value) and not e.value.retryable
    else:
        store_env.setenv("MOONCAKE_GCS_TOKEN", "/nonexistent/service-account.json")
        with pytest.raises(WarehouseConfigError, match="GCS credentials file /nonexistent/service-account.json"):
            check_warehouse(_uri(kind, bucket))
        store_env.delenv("MOONCAKE_GCS_TOKEN")


def test_dead_endpoint_is_a_temporary_error(store, store_env):
    """Nothing listens on the endpoint: a temporary one-line error naming it, at once (a TCP connect
    first, not after the client library's own retries: gcsfs ~30 s, the Azure SDK ~70 s)."""
    kind, em = store
    bucket = _make_bucket(kind)
    dead = free_port()
    _point_at(kind, store_env, dead)
    with pytest.raises(StorageUnavailable) as e:
        check_warehouse(_uri(kind, bucket))
    assert f"127.0.0.1:{dead}" in str(e.value) and "did not answer" in str(e.value)
    assert "\n" not in str(e.value) and e.value.retryable
    # the connect probe answered (a plain refused socket), not the library after its retries
    assert type(e.value.__cause__) is ConnectionRefusedError, repr(e.value.__cause__)


def test_secrets_stay_out_of_settings_hints_and_reprs(store, state_dir, pg_dsn):
    kind, em = store
    s = make_settings(state_dir, pg_dsn, warehouse=_uri(kind, "some-bucket"))
    from mooncake_assets.engine.storage import catalog_properties, storage_hints

    hints = storage_hints(s)
    assert hints["kind"] == kind and hints["endpoint"].startswith("http://127.0.0.1:")
    cfg = resolve_store(s.warehouse_uri)
    secret = "Eby8vdM02xNOcq" if kind == "azure" else None
    if secret:
        assert secret in str(catalog_properties(s))  # the FileIO gets the credentials, in memory...
        assert secret not in repr(cfg) and secret not in str(hints)  # ...nothing else shows them
        assert secret not in s.settings_file.read_text()


@pytest.mark.slow
def test_mirror_persist_compact_restart_and_three_readers(store, pg_dsn, state_dir):
    """A demo-like run on each store: create-table, changes, persists, a full compaction, a restart of the
    service (tables restored from the Iceberg metadata in the store), more changes; the union reader,
    PyIceberg and DuckDB's iceberg extension all equal Postgres."""
    kind, em = store
    bucket = _make_bucket(kind)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL, note text)")
        c.execute("INSERT INTO acc SELECT g, 0, 'n' || g FROM generate_series(1, 2000) g")
    s = make_settings(state_dir, pg_dsn, warehouse=_uri(kind, bucket), maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="acc", src="public.acc")
        for i in range(3):
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute("UPDATE acc SET bal = bal + 1 WHERE id %% 5 = %s", (i,))
                c.execute("DELETE FROM acc WHERE id %% 97 = %s", (i,))
                c.execute(
                    "INSERT INTO acc SELECT g, %s, 'x' FROM generate_series(%s::int, %s::int) g",
                    (i, 3000 + i * 10, 3009 + i * 10),
                )
            _all_match(s, client)
            client.call("persist", table="acc")
        full = client.call("compact", table="acc", full=True)
        assert full["compacted"], full
        _all_match(s, client)
    keys = _keys(kind, bucket)
    assert any("/wh/mooncake/acc/data/" in k and k.endswith(".parquet") for k in keys), keys[:5]
    assert any(k.endswith(".metadata.json") for k in keys) and any(k.endswith(".puffin") for k in keys)
    with running_service(s) as client:  # restored from the store
        wait_until(lambda: client.status()["streaming"], 60, "the restarted service to stream")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM acc WHERE id < 100")
            c.execute("UPDATE acc SET note = 'after restart' WHERE id BETWEEN 500 AND 600")
        _all_match(s, client)
        client.call("persist", table="acc")
        _all_match(s, client)
        _all_match(s, client, reader="pyiceberg")
        _all_match(s, client, reader="duckdb-iceberg")


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return Lsn.parse(row[0]) if row and row[0] else 0


@pytest.mark.slow
def test_emulator_goes_away_and_comes_back(store, store_env, pg_dsn, state_dir):
    """The store's endpoint disappears mid-run (a loopback proxy in front of the emulator stops): the
    table is ``retrying`` with a one-line temporary error naming the endpoint, changes are still applied,
    the slot is never confirmed past the flush LSN; once the endpoint is back the table converges."""
    kind, em = store
    bucket = _make_bucket(kind)
    proxy = TcpProxy(em.port)
    proxy.start()
    _point_at(kind, store_env, proxy.port)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL)")
        c.execute("INSERT INTO acc SELECT g, 0 FROM generate_series(1, 500) g")
    s = make_settings(
        state_dir, pg_dsn, warehouse=_uri(kind, bucket), maintenance="auto", persist_interval_s=1.0, flush_rows=200
    )
    stop = threading.Event()

    def workload():
        rng = random.Random(25)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            n = 10_000
            while not stop.is_set():
                with c.transaction():
                    c.execute("UPDATE acc SET bal = bal + 1 WHERE id = %s", (rng.randint(1, 500),))
                    c.execute("INSERT INTO acc VALUES (%s, 1)", (n,))
                n += 1
                time.sleep(0.005)

    def table():
        return {t["name"]: t for t in client.status()["tables"]}["acc"]

    try:
        with running_service(s) as client:
            client.call("create_table", dst="acc", src="public.acc")
            slot = client.status()["slot"]
            th = threading.Thread(target=workload)
            th.start()
            try:
                wait_until(lambda: table()["flush_lsn"] != "0/0" and table()["state"] == "ready", 60, "a first persist")
                proxy.stop()  # ----------------------------------------------------- endpoint gone
                # gcsfs retries a refused connection 6 times (~30 s) before a persist fails
                down = wait_until(lambda: table() if table()["state"] == "retrying" else None, 120, "the fault")
                assert "persist of acc" in down["error"] and "temporary" in down["error"], down
                assert f"127.0.0.1:{proxy.port}" in down["error"] and "\n" not in down["error"]
                flush_down = Lsn.parse(down["flush_lsn"])
                # The slot may already stand past the flush LSN: while the table was clean (all persisted) the
                # service rightly confirmed the WAL end of keepalives. From the outage on the table is dirty, so
                # the slot must not move: nothing is confirmed past where it stood then.
                held = max(flush_down, _slot_confirmed(pg_dsn, slot))
                time.sleep(1.0)
                during = table()
                assert during["state"] == "retrying" and Lsn.parse(during["flush_lsn"]) == flush_down
                assert Lsn.parse(during["applied_lsn"]) > flush_down
                assert _slot_confirmed(pg_dsn, slot) <= held
            finally:
                stop.set()
                th.join()
            proxy.start()  # ------------------------------------------------------ endpoint back
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                end = Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
            wait_until(
                lambda: table()["state"] == "ready" and Lsn.parse(table()["flush_lsn"]) >= end,
                180,
                "the persist to succeed after the endpoint came back",
            )
            assert table()["error"] is None
            _all_match(s, client)
            _all_match(s, client, reader="pyiceberg")
            wait_until(lambda: _slot_confirmed(pg_dsn, slot) >= end, 30, "the slot to be confirmed again")
    finally:
        proxy.stop()


def test_create_table_with_a_missing_container_is_one_line(store, pg_dsn, state_dir):
    kind, em = store
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
    s = make_settings(state_dir, pg_dsn, warehouse=_uri(kind, "no-such-bucket-mc"))
    with running_service(s) as client:
        with pytest.raises(ServiceError) as e:
            client.call("create_table", dst="t", src="public.t")
        msg = str(e.value)
        assert "'no-such-bucket-mc' does not exist" in msg and em.endpoint in msg
        assert len(msg.strip().splitlines()) == 1, msg
        assert client.status()["tables"] == []
    assert load_settings(state_dir).warehouse.startswith(("gs://", "abfs://"))


def test_uris_settings_and_error_classes_of_gcs_and_azure(store_env):
    """URI forms and validation; environment precedence; what gcsfs/adlfs raise is classified."""
    from mooncake_assets.engine.storage import AccessDenied, classify, store_kind
    from mooncake_assets.engine.storage.stores import parse_azure_uri, resolve_azure, resolve_gcs

    assert [store_kind(u) for u in ("gs://b1b/x", "abfs://c1c/x", "az://c1c", "s3://b1b", "/tmp/x", "file:///x")] == [
        "gcs",
        "azure",
        "azure",
        "s3",
        "file",
        "file",
    ]
    with pytest.raises(WarehouseConfigError, match="expected file://, s3://, gs://, abfs://"):
        store_kind("hdfs://x/y")
    assert parse_azure_uri("abfss://cont@acct.dfs.core.windows.net/a/b/") == ("cont", "acct", "a/b")
    with pytest.raises(WarehouseConfigError, match="not a valid Azure container name"):
        parse_azure_uri("abfs://Bad_Container/x")
    with pytest.raises(WarehouseConfigError, match="no storage account"):
        resolve_azure("abfs://cont/x")
    az = resolve_azure("abfss://cont@acct.dfs.core.windows.net/x", env={"AZURE_STORAGE_ACCOUNT_KEY": "k3y"})
    assert az.account == "acct" and az.describe() == "https://acct.blob.core.windows.net" and "k3y" not in repr(az)
    g = resolve_gcs(env={"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"})
    assert g.endpoint == "http://127.0.0.1:4443" and g.token == "anon"  # an emulator: anonymous
    assert resolve_gcs(env={}).token == "google_default"  # Google: application-default credentials
    with pytest.raises(WarehouseConfigError, match="plain HTTP"):
        resolve_gcs(env={"MOONCAKE_GCS_ENDPOINT": "http://gcs.example:4443"})

    import aiohttp
    from azure.core.exceptions import HttpResponseError, ServiceRequestError
    from gcsfs.retry import HttpError

    assert isinstance(classify(HttpError({"code": 401, "message": "Invalid Credentials"})), CredentialsRejected)
    assert isinstance(classify(HttpError({"code": 503, "message": "backend"})), StorageUnavailable)
    assert isinstance(classify(OSError("Forbidden: b/o\nno access")), AccessDenied)
    assert isinstance(classify(ServiceRequestError("Connection refused")), StorageUnavailable)
    e = HttpResponseError("The specified container does not exist.")
    e.error_code = "ContainerNotFound"
    assert isinstance(classify(e), BucketNotFound)
    key = aiohttp.client_reqrep.ConnectionKey("127.0.0.1", 9, False, True, None, None, None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connect call failed"))
    err = classify(refused, endpoint="http://127.0.0.1:9", what="persist of t")
    assert isinstance(err, StorageUnavailable) and err.retryable and "persist of t at http://127.0.0.1:9" in str(err)


@pytest.mark.slow
def test_the_mooncake_command_with_a_gs_or_abfs_warehouse(store, pg_dsn, state_dir):
    """The README's commands: `mooncake --warehouse gs://…|abfs://… start`, create-table, persist, verify
    with each reader, stop; credentials only in the environment, never in settings.json."""
    from tests.helpers import mooncake

    kind, em = store
    bucket = _make_bucket(kind)
    uri = _uri(kind, bucket)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 200) g")
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "--warehouse", uri, "start", check=True)
        mooncake(s, "create-table", "t", "public.t", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM t WHERE id % 3 = 0")
        mooncake(s, "persist", "t", check=True)
        for reader in ("union", "pyiceberg", "duckdb-iceberg"):
            out = mooncake(s, "verify", "--reader", reader, check=True).stdout
            assert "verified: 1/1 tables match" in out, (reader, out)
    finally:
        mooncake(s, "stop")
    saved = s.settings_file.read_text()
    assert uri in saved and "AccountKey" not in saved and "Eby8vdM02" not in saved
    assert any(k.endswith(".metadata.json") for k in _keys(kind, bucket))
