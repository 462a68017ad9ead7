"""Large transactions streamed before they commit (protocol v2, ``streaming 'on'``).

The source DSN carries ``-c logical_decoding_work_mem=64kB`` (the walsender takes its options), so
any transaction past 64 kB of changes is streamed in chunks, interleaved with other transactions,
before its commit or abort is known. Only committed work may appear: subtransactions rolled back to
a savepoint (nested ones too) are dropped, a top-level abort drops everything.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from .conftest import mirror_fixture


@pytest.fixture(scope="module")
def streaming_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster, dsn_options="-c logical_decoding_work_mem=64kB")


def _slot_stream_stats(m) -> tuple[int, int]:
    slot = m.client.status()["slot"]
    row = m.sql("SELECT stream_txns, stream_count FROM pg_stat_replication_slots WHERE slot_name = %s", params=(slot,))
    return tuple(row[0]) if row else (0, 0)


def test_streamed_transactions_with_savepoints_and_aborts(streaming_mirror):
    m = streaming_mirror
    m.sql(
        "CREATE TABLE big (id int PRIMARY KEY, v text, n int)",
        "CREATE TABLE side (id serial PRIMARY KEY, note text)",
        "CREATE TABLE bag (k int, v text)",
        "INSERT INTO big SELECT g, 'seed', 0 FROM generate_series(1, 1000) g",
    )
    m.create("big")
    m.create("side")
    m.create("bag")
    pad = "repeat('x', 200)"
    stop = threading.Event()

    def interleave():  # small committed transactions while the big ones are open
        with psycopg.connect(m.dsn, autocommit=True) as c:
            i = 0
            while not stop.is_set():
                c.execute("INSERT INTO side (note) VALUES ('small')")
                c.execute("UPDATE big SET n = n + 1 WHERE id = %s", (1 + i % 50,))
                i += 1
                time.sleep(0.005)

    th = threading.Thread(target=interleave)
    th.start()
    try:
        with psycopg.connect(m.dsn) as a, psycopg.connect(m.dsn) as b:
            a.execute(f"INSERT INTO big SELECT g, {pad}, 1 FROM generate_series(10001, 14000) g")
            a.execute("SAVEPOINT s1")
            a.execute(f"INSERT INTO big SELECT g, {pad}, 2 FROM generate_series(20001, 22000) g")
            a.execute("UPDATE big SET v = 'rolled back' WHERE id BETWEEN 10001 AND 10500")
            a.execute("DELETE FROM big WHERE id BETWEEN 100 AND 200")
            a.execute("ROLLBACK TO SAVEPOINT s1")  # its streamed changes must vanish
            a.execute("SAVEPOINT s2")
            a.execute(f"INSERT INTO bag SELECT g, {pad} FROM generate_series(1, 1500) g")
            a.execute("SAVEPOINT s3")
            a.execute(f"INSERT INTO bag SELECT g, {pad} FROM generate_series(1, 1500) g")
            a.execute("RELEASE SAVEPOINT s3")
            a.execute("ROLLBACK TO SAVEPOINT s2")  # nested: s3's changes go too
            a.execute("SAVEPOINT s4")
            a.execute(f"INSERT INTO bag SELECT g % 7, {pad} FROM generate_series(1, 1200) g")
            a.execute("RELEASE SAVEPOINT s4")  # kept
            # b: a second large transaction, aborted at the top level, streamed meanwhile
            b.execute(f"INSERT INTO big SELECT g, {pad}, 3 FROM generate_series(30001, 34000) g")
            b.execute("UPDATE big SET v = 'aborted' WHERE id <= 500")
            b.execute("DELETE FROM bag")
            a.execute("UPDATE big SET v = 'updated', n = n + 10 WHERE id BETWEEN 10001 AND 11000")
            a.execute("DELETE FROM big WHERE id BETWEEN 11001 AND 11100")
            a.execute("UPDATE big SET id = id + 100000 WHERE id BETWEEN 13001 AND 13100")
            b.rollback()
            a.commit()
            # a streamed transaction that truncates and refills
            a.execute("TRUNCATE side")
            a.execute(f"INSERT INTO side (note) SELECT {pad} FROM generate_series(1, 2000)")
            a.commit()
    finally:
        stop.set()
        th.join()
    m.check("big", "side", "bag")
    deadline = time.time() + 10
    while _slot_stream_stats(m)[0] < 3 and time.time() < deadline:
        time.sleep(0.5)
    txns, chunks = _slot_stream_stats(m)
    assert txns >= 3 and chunks > txns, (
        f"expected streamed transactions, pg_stat_replication_slots says {txns}/{chunks}"
    )
    assert m.sql("SELECT count(*) FROM bag") == [(1200,)]
    m.check("big", "side", "bag", iceberg=True)
    for t in ("big", "side", "bag"):
        assert m.status(t)["missing_keys"] == 0 and m.status(t)["error"] is None
