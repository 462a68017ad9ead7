"""The walking skeleton end to end against a real Postgres, real Iceberg files and DuckDB."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from mooncake_assets.engine.service.process import kill_service, start_service
from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake, running_service

SETUP = """
CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(12,2), note text,
                    at timestamptz, day date, f float8, flag bool, blob bytea, doc jsonb, u uuid, big numeric);
CREATE TABLE events (k int, payload text);
"""


def _all_match(settings, client, reader="union", names=None):
    results, lsn = verify(settings, names, reader, client)
    bad = [r.line() for r in results if not r.match]
    assert not bad, f"at LSN {lsn}: {bad}"
    return lsn


def _random_txn(c, rng: random.Random, ids: set, next_id: list):
    ops = rng.randint(1, 6)
    with c.transaction():
        for _ in range(ops):
            r = rng.random()
            if r < 0.35 or not ids:
                i = next_id[0]
                next_id[0] += 1
                c.execute(
                    "INSERT INTO items VALUES (%s, %s, %s, %s, %s, now(), current_date, %s, %s, %s, %s, gen_random_uuid(), %s)",
                    (
                        i,
                        f"n{i}",
                        rng.randint(0, 100),
                        rng.randint(0, 10**6) / 100,
                        "x" * rng.randint(0, 50),
                        rng.choice([1.5, float("nan"), float("inf"), -0.0]),
                        rng.random() < 0.5,
                        bytes([rng.randint(0, 255) for _ in range(4)]),
                        '{"a": [1, 2]}',
                        str(10**30 + i),
                    ),
                )
                ids.add(i)
                if rng.random() < 0.1:  # delete of a row inserted in the same transaction
                    c.execute("DELETE FROM items WHERE id = %s", (i,))
                    ids.discard(i)
            elif r < 0.6:
                i = rng.choice(sorted(ids))
                c.execute("UPDATE items SET qty = qty + 1, note = %s WHERE id = %s", (f"u{rng.random()}", i))
            elif r < 0.7:  # primary-key update
                i = rng.choice(sorted(ids))
                j = next_id[0]
                next_id[0] += 1
                c.execute("UPDATE items SET id = %s WHERE id = %s", (j, i))
                ids.discard(i)
                ids.add(j)
            elif r < 0.85:
                i = rng.choice(sorted(ids))
                c.execute("DELETE FROM items WHERE id = %s", (i,))
                ids.discard(i)
            elif r < 0.95:
                k = rng.randint(0, 20)
                c.execute("INSERT INTO events VALUES (%s, %s), (%s, %s)", (k, f"p{k}", k, f"p{k}"))  # duplicates
            else:
                k = rng.randint(0, 20)
                c.execute("DELETE FROM events WHERE ctid = (SELECT ctid FROM events WHERE k = %s LIMIT 1)", (k,))


@pytest.mark.slow
def test_differential_random_workload(pg_dsn, state_dir):
    """Randomized INSERT/UPDATE/DELETE (PK updates, same-txn deletes, TRUNCATE) with flushes and persists
    interleaved; the union read equals Postgres at the same LSN; PyIceberg equals it after a persist."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SETUP)
        c.execute(
            "INSERT INTO items SELECT g, 'seed', g, g, NULL, now(), current_date, g, true, NULL, NULL, NULL, NULL "
            "FROM generate_series(1, 500) g"
        )
        c.execute("INSERT INTO events SELECT g % 7, 'seed' FROM generate_series(1, 200) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    rng = random.Random(20261129)
    with running_service(s) as client:
        client.call("create_table", dst="items", src="public.items")
        client.call("create_table", dst="events", src="public.events", delete_format="position-deletes")
        _all_match(s, client)
        ids, next_id = set(range(1, 501)), [10_000]
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            for step in range(60):
                _random_txn(c, rng, ids, next_id)
                if rng.random() < 0.25:
                    op = rng.choice(["flush", "persist", "persist", "compact"])
                    kw = {"full": True} if op == "compact" else {}
                    client.call(op, table=rng.choice(["items", "events"]), **kw)
                if step % 15 == 14:
                    _all_match(s, client)
            c.execute("TRUNCATE events")
            c.execute("INSERT INTO events VALUES (1, 'after truncate'), (1, 'after truncate')")
            for _step in range(20):
                _random_txn(c, rng, ids, next_id)
        _all_match(s, client)
        for t in ("items", "events"):
            client.call("persist", table=t)
        _all_match(s, client)
        _all_match(s, client, reader="pyiceberg")
        _all_match(s, client, reader="duckdb-iceberg")  # items: v3 DVs in Puffin; events: v2 position deletes
        st = {t["name"]: t for t in client.status()["tables"]}
        assert st["items"]["missing_keys"] == 0 and st["events"]["missing_keys"] == 0


@pytest.mark.slow
def test_restart_after_sigkill_converges(pg_dsn, state_dir):
    """SIGKILL the service mid-workload, start it again: nothing lost, nothing doubled."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL)")
        c.execute("INSERT INTO acc SELECT g, 0 FROM generate_series(1, 2000) g")
        c.execute("CREATE TABLE hist (id int, delta int)")
    s = make_settings(state_dir, pg_dsn, maintenance="auto", persist_interval_s=0.5)
    stop = threading.Event()

    def workload():
        rng = random.Random(7)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            while not stop.is_set():
                with c.transaction():
                    i, d = rng.randint(1, 2000), rng.randint(-5, 5)
                    c.execute("UPDATE acc SET bal = bal + %s WHERE id = %s", (d, i))
                    c.execute("INSERT INTO hist VALUES (%s, %s)", (i, d))
                    if rng.random() < 0.05:
                        c.execute("DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist LIMIT 1)")

    with running_service(s) as client:
        client.call("create_table", dst="acc", src="public.acc")
        client.call("create_table", dst="hist", src="public.hist")
        th = threading.Thread(target=workload)
        th.start()
        try:
            for _ in range(2):
                time.sleep(2.0)
                kill_service(s)
                time.sleep(0.5)
                start_service(s)
                client.close()
            time.sleep(1.0)
        finally:
            stop.set()
            th.join()
        _all_match(s, client)
        for t in ("acc", "hist"):
            client.call("persist", table=t)
        _all_match(s, client, reader="pyiceberg")
        st = {t["name"]: t for t in client.status()["tables"]}
        assert st["acc"]["missing_keys"] == 0, st


def test_bad_input_one_line_errors(pg_dsn, state_dir):
    """Missing table, unsupported type, wrong DSN: one-line errors, nothing half-created."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE docs (id int PRIMARY KEY, body regproc)")
    s = make_settings(state_dir, pg_dsn)
    try:
        r = mooncake(s, "create-table", "nope", "public.does_not_exist")
        assert r.returncode != 0
        assert "does_not_exist" in r.stderr and "does not exist" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = mooncake(s, "create-table", "docs", "public.docs")
        assert r.returncode != 0
        assert "docs" in r.stderr and "body" in r.stderr and "regproc" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        lt = mooncake(s, "list-tables", "--json", check=True)
        assert '"tables": []' in lt.stdout
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_publication_tables").fetchone()[0] == 0
    finally:
        mooncake(s, "stop")
    bad = make_settings(state_dir / "bad", "postgresql://nobody@127.0.0.1:1/nowhere")
    try:
        r = mooncake(bad, "create-table", "x", "public.x")
        assert r.returncode != 0
        assert "cannot connect to Postgres" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        mooncake(bad, "stop")
