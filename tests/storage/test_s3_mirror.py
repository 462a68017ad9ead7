"""Mirrors with an s3:// warehouse on moto's S3 server: the differential and restart
workloads, the SQL catalog on Postgres, clear create-table errors, and an endpoint that goes away
mid-run and comes back."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceError
from mooncake_assets.verify import verify
from tests.helpers import make_settings, running_service, wait_until
from tests.integration import test_mirror_converges as skeleton


def _s3_settings(state_dir, dsn, endpoint: str, bucket: str, **kw):
    return make_settings(state_dir, dsn, warehouse=f"s3://{bucket}/wh", s3_endpoint=endpoint, **kw)


def _all_match(settings, client=None, reader="union"):
    results, lsn = verify(settings, None, reader, client)
    bad = [r.line() for r in results if not r.match]
    assert results and not bad, f"{reader} at LSN {lsn}: {bad}"


@pytest.fixture()
def on_s3(monkeypatch, moto_server, s3_bucket):
    """Make the skeleton tests' ``make_settings`` put the warehouse in a fresh bucket on moto.

    Auto persists at least 2 s apart: a persist is a dozen requests to moto (upload, DV and index Puffin,
    manifests, list, metadata) and runs on the replication thread, so a persist every 0.5 s of two
    busy tables leaves too little time to apply changes (the slower the store, the more it shows)."""

    def s3_make_settings(state_dir, dsn, **kw):
        if "persist_interval_s" in kw:
            kw["persist_interval_s"] = max(kw["persist_interval_s"], 2.0)
        return _s3_settings(state_dir, dsn, moto_server.endpoint, s3_bucket, **kw)

    monkeypatch.setattr(skeleton, "make_settings", s3_make_settings)
    return s3_bucket


def _assert_in_bucket(moto_server, bucket, tables):
    keys = moto_server.keys(bucket, "wh/")
    for t in tables:
        mine = [k for k in keys if k.startswith(f"wh/mooncake/{t}/")]
        assert any("/data/" in k and k.endswith(".parquet") for k in mine), (t, mine[:5])
        assert any("/index/" in k and k.endswith(".puffin") for k in mine)
        assert any(k.endswith(".metadata.json") for k in mine)


@pytest.mark.slow
def test_differential_random_workload_on_s3(pg_dsn, state_dir, moto_server, on_s3):
    """tests/integration/test_mirror_converges.py's differential test (union and PyIceberg readers) with the warehouse on S3;
    PyIceberg reads the persisted tables again from S3 once the service is gone."""
    skeleton.test_differential_random_workload(pg_dsn, state_dir)
    s = load_settings(state_dir)
    assert s.warehouse.startswith("s3://")
    _assert_in_bucket(moto_server, on_s3, ["items", "events"])
    _all_match(s, reader="pyiceberg")


@pytest.mark.slow
def test_restart_after_sigkill_converges_on_s3(pg_dsn, state_dir, moto_server, on_s3):
    """The skeleton's SIGKILL/restart test: tables are restored from Iceberg metadata in S3."""
    skeleton.test_restart_after_sigkill_converges(pg_dsn, state_dir)
    _assert_in_bucket(moto_server, on_s3, ["acc", "hist"])


def test_postgres_sql_catalog_in_a_schema_of_the_source(pg_dsn, state_dir, moto_server, s3_bucket):
    """Catalog: the SQL catalog on Postgres (schema ``mooncake_catalog`` of the source database) with the
    warehouse on S3; survives a restart of the service; PyIceberg reads the same tables."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA mooncake_catalog")
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300) g")
    catalog = f"{pg_dsn}?options=-csearch_path%3Dmooncake_catalog"
    s = _s3_settings(state_dir, pg_dsn, moto_server.endpoint, s3_bucket, catalog_uri=catalog, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="t", src="public.t")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE t SET v = 'u' WHERE id % 7 = 0")
            c.execute("DELETE FROM t WHERE id % 11 = 0")
            c.execute("INSERT INTO t SELECT g, 'n' FROM generate_series(301, 350) g")
        _all_match(s, client)
        client.call("persist", table="t")
        _all_match(s, client, reader="pyiceberg")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT table_namespace, table_name, metadata_location FROM mooncake_catalog.iceberg_tables"
        ).fetchall()
        assert [(ns, name) for ns, name, _ in rows] == [("mooncake", "t")]
        assert rows[0][2].startswith(f"s3://{s3_bucket}/wh/mooncake/t/metadata/")
        assert (
            c.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' "
                "AND table_name = 'iceberg_tables'"
            ).fetchone()[0]
            == 0
        )
    with running_service(s) as client:  # restored from the Postgres catalog + S3
        # the service answers pings before its tables are restored and the stream runs: wait for that
        wait_until(lambda: client.status()["streaming"], 30, "the restarted service to stream")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM t WHERE id < 50")
        _all_match(s, client)
        client.call("persist", table="t")
        _all_match(s, client, reader="pyiceberg")


def test_create_table_with_a_missing_bucket_is_one_clear_line(pg_dsn, state_dir, moto_server, s3_env):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
    s = _s3_settings(state_dir, pg_dsn, moto_server.endpoint, "no-such-bucket-mc")
    with running_service(s) as client:
        with pytest.raises(ServiceError) as e:
            client.call("create_table", dst="t", src="public.t")
        msg = str(e.value)
        assert "bucket 'no-such-bucket-mc' does not exist" in msg and moto_server.endpoint in msg
        assert len(msg.strip().splitlines()) == 1, msg
        assert client.status()["tables"] == []
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pg_publication_tables").fetchone()[0] == 0


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
    return Lsn.parse(row[0]) if row and row[0] else 0


def test_endpoint_goes_away_and_comes_back(pg_dsn, state_dir, moto_server, s3_bucket, s3_proxy):
    """The S3 endpoint disappears mid-run (connections refused and reset) and comes back on the same
    address: the service reports the fault per table, keeps applying changes into the buffer and local
    staging, never confirms the slot past what is durable, and converges once the endpoint is back."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL)")
        c.execute("INSERT INTO acc SELECT g, 0 FROM generate_series(1, 1000) g")
    s = _s3_settings(
        state_dir, pg_dsn, s3_proxy.endpoint, s3_bucket, maintenance="auto", persist_interval_s=0.3, flush_rows=200
    )
    stop = threading.Event()

    def workload():
        rng = random.Random(9)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            n = 10_000
            while not stop.is_set():
                with c.transaction():
                    c.execute("UPDATE acc SET bal = bal + 1 WHERE id = %s", (rng.randint(1, 1000),))
                    c.execute("INSERT INTO acc VALUES (%s, 1)", (n,))
                    if rng.random() < 0.2:
                        c.execute("DELETE FROM acc WHERE id = %s", (rng.randint(1, 1000),))
                n += 1
                time.sleep(0.002)

    def table():
        return {t["name"]: t for t in client.status()["tables"]}["acc"]

    with running_service(s) as client:
        client.call("create_table", dst="acc", src="public.acc")
        slot = client.status()["slot"]
        th = threading.Thread(target=workload)
        th.start()
        try:
            wait_until(lambda: table()["flush_lsn"] != "0/0" and table()["state"] == "ready", 20, "a first persist")
            s3_proxy.stop()  # --------------------------------------------------------- endpoint gone
            down = wait_until(lambda: table() if table()["state"] == "retrying" else None, 30, "the fault to show")
            assert "persist of acc" in down["error"] and "did not answer" in down["error"], down
            assert s3_proxy.endpoint in down["error"] and "temporary" in down["error"]
            with pytest.raises(ServiceError) as e:  # an explicit persist says the same, in one line
                client.call("persist", table="acc")
            assert "did not answer" in str(e.value) and "stay in the buffer" in str(e.value)
            flush_down = Lsn.parse(down["flush_lsn"])
            # The slot may already stand past the flush LSN: while the table was clean (all persisted) the
            # service rightly confirmed the WAL end of keepalives. From the outage on the table is dirty, so
            # the slot must not move: nothing is confirmed past where it stood then.
            held = max(flush_down, _slot_confirmed(pg_dsn, slot))
            time.sleep(2.0)  # the workload goes on while the endpoint is away
            during = table()
            assert during["state"] == "retrying" and Lsn.parse(during["flush_lsn"]) == flush_down
            assert Lsn.parse(during["applied_lsn"]) > flush_down  # changes are still applied...
            assert during["buffer_rows"] + during["pending_deletes"] > 0 or during["data_files"] > down["data_files"]
            assert _slot_confirmed(pg_dsn, slot) <= held  # ...and the slot keeps them
            assert table()["missing_keys"] == 0
        finally:
            stop.set()
            th.join()
        s3_proxy.start()  # ------------------------------------------------------------ endpoint back
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            end = Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        wait_until(
            lambda: table()["state"] == "ready" and Lsn.parse(table()["flush_lsn"]) >= end,
            90,
            "the persist to succeed after the endpoint came back",
        )
        assert table()["error"] is None
        _all_match(s, client)
        _all_match(s, client, reader="pyiceberg")
        wait_until(lambda: _slot_confirmed(pg_dsn, slot) >= end, 20, "the slot to be confirmed again")
