"""The compiled receive loop on a real stream (engine/cdc/native): libpq is psycopg's own, two slots over
the same WAL (one read by the reference ``read()``, one by the C receive loop: same transactions),
keepalives and a lost connection. The decoder alone against the reference: tests/engine/test_native_decoder.py."""

from __future__ import annotations

import time

import psycopg
import pytest

from mooncake_assets.engine.cdc.columnar import columnar_transaction
from mooncake_assets.engine.cdc.native import (
    PSYCOPG_RANGE,
    NativeDecoder,
    libpq_path,
    receiver_for,
)
from mooncake_assets.engine.cdc.stream import ReplicationConnection
from mooncake_assets.engine.cdc.txn import TransactionAssembler
from tests.engine.test_native_decoder import assert_same_transactions


def test_libpq_is_psycopgs_own(pg_dsn):
    """The compatibility assumption: the libpq found is loaded, is psycopg's (same PQlibVersion), with
    the binary wheel it is the wheel's copy (not the system's), and a Receiver binds to it."""
    from mooncake_assets.engine.cdc.native import _check_version

    _check_version()
    path = libpq_path()
    assert psycopg.pq.__impl__ != "binary" or "psycopg_binary" in path, path
    lo, hi = PSYCOPG_RANGE
    assert lo <= tuple(int(x) for x in psycopg.__version__.split(".")[:2]) < hi
    with psycopg.connect(pg_dsn) as c:
        rx = receiver_for(c.pgconn)
        assert rx.lib_version == psycopg.pq.version()


SMALL_MEM = "options=-c%20logical_decoding_work_mem%3D64kB"


def _workload(w: psycopg.Connection, w2: psycopg.Connection) -> None:
    w.execute("INSERT INTO t SELECT g, 'row ' || g, NULL FROM generate_series(1, 300) g")
    w.execute("UPDATE t SET v = 'é' || v WHERE id % 3 = 0")
    w.execute("UPDATE t SET id = id + 10000 WHERE id % 50 = 0")  # key change: old 'K' tuple
    w.execute("DELETE FROM t WHERE id % 7 = 0")
    w.execute("UPDATE t SET big = repeat('toast', 5000) WHERE id = 1")
    w.execute("UPDATE t SET v = 'toast kept' WHERE id = 1")  # unchanged TOAST 'u'
    with w.transaction():  # streamed (64kB work mem), with a rolled-back savepoint
        w.execute("INSERT INTO t SELECT g, repeat('s', 300), NULL FROM generate_series(20001, 21000) g")
        w.execute("SAVEPOINT a")
        w.execute("INSERT INTO t SELECT g, repeat('d', 300), NULL FROM generate_series(30001, 30500) g")
        w.execute("ROLLBACK TO SAVEPOINT a")
        w2.execute("INSERT INTO t VALUES (-1, 'small', NULL)")
        w.execute("INSERT INTO t2 VALUES (1, 'other table')")
        w.execute("ALTER TABLE t2 ADD COLUMN extra text DEFAULT 'x'")
        w.execute("INSERT INTO t2 VALUES (2, 'after ddl', 'y')")
    w.execute("TRUNCATE t2")
    w.execute("INSERT INTO mark VALUES (1)")


def _drop_slots(w: psycopg.Connection, names: list[str]) -> None:
    """Drop the slots ``names`` once their walsenders are gone (a hang guard of 10 s)."""
    deadline = time.monotonic() + 10
    while w.execute("SELECT count(*) FROM pg_replication_slots WHERE active").fetchone()[0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    w.execute("SELECT pg_drop_replication_slot(s) FROM unnest(%s::text[]) s", (names,))


def _pump(until, read, timeout=30.0):
    got = []
    deadline = time.monotonic() + timeout
    while not until(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} transactions"
        got += read()
    return got


def test_receive_loop_matches_read_on_the_same_wal(pg_dsn):
    """Two slots made at one moment over the same WAL: slot ``ref`` read by ``read()`` and assembled by
    the reference, slot ``nat`` by the C receive loop and the native decoder — same transactions."""
    dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + SMALL_MEM
    with psycopg.connect(pg_dsn, autocommit=True) as w, psycopg.connect(pg_dsn, autocommit=True) as w2:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
        w.execute("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
        w.execute("CREATE TABLE mark (id int PRIMARY KEY)")
        w.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        w.execute("CREATE PUBLICATION p FOR TABLE t, t2, mark")
        mark_oid = w.execute("SELECT 'mark'::regclass::oid").fetchone()[0]
        ref_rc, nat_rc = ReplicationConnection(dsn), ReplicationConnection(dsn)
        try:
            ref_rc.create_slot("ref", export_snapshot=False)
            nat_rc.create_slot("nat", export_snapshot=False)
            _workload(w, w2)
            ref_rc.start("ref", ["p"])
            nat_rc.start("nat", ["p"])
            asm, dec = TransactionAssembler(), NativeDecoder()

            def done(txns):
                return any(r.relation_oid == mark_oid for t in txns for r in t.runs)

            ref = _pump(
                done,
                lambda: [columnar_transaction(t) for wal, p in ref_rc.read(0.2) for t in asm.feed_payload(p, wal)],
            )
            nat = _pump(done, lambda: nat_rc.read_transactions(dec, 0.2))
            assert nat_rc.messages_read > 0 and nat_rc.server_wal_end >= nat[-1].end_lsn
            nat_rc.send_status(nat[-1].end_lsn, nat[-1].end_lsn, nat[-1].end_lsn, reply=True)
            assert nat_rc.read_transactions(dec, 0.3) == []  # the keepalive answering the status
        finally:
            ref_rc.close()
            nat_rc.close()
            _drop_slots(w, ["ref", "nat"])
    assert any(t.streamed for t in nat)
    assert_same_transactions(ref, nat)
    assert dec.relations == asm.relations
    kinds = {r.kind for t in nat for r in t.runs}
    assert kinds == {"insert", "update", "delete", "truncate"}
    assert any(r.old_kinds is not None and (r.old_kinds == ord("K")).any() for t in nat for r in t.runs)
    assert any((c.kinds == ord("u")).any() for t in nat for r in t.runs if r.new for c in r.new)


def test_receive_loop_keepalives_and_lost_connection(pg_dsn):
    """As read(): with a short wal_sender_timeout the server asks for replies and read_transactions
    answers them (the walsender stays); a terminated walsender is a temporary ReplicationError."""
    from mooncake_assets.engine.cdc.stream import ReplicationError

    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE t (id int PRIMARY KEY)")
        w.execute("CREATE PUBLICATION p FOR TABLE t")
        dsn = pg_dsn + ("&" if "?" in pg_dsn else "?") + "options=-c%20wal_sender_timeout%3D2s"
        rc = ReplicationConnection(dsn, status_interval=60)
        try:
            rc.create_slot("main", export_snapshot=False)
            rc.start("main", ["p"])
            w.execute("INSERT INTO t VALUES (1)")
            dec = NativeDecoder()
            (txn,) = _pump(lambda t: len(t) == 1, lambda: rc.read_transactions(dec, 0.2))
            assert txn.runs[0].new[0].values.to_pylist() == [b"1"]
            rc.send_status(txn.end_lsn, txn.end_lsn, txn.end_lsn)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                assert rc.read_transactions(dec, 0.3) == []
            assert rc.keepalive_replies >= 1 and rc.keepalives >= 1 and rc.server_wal_end >= txn.end_lsn
            active = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'main' AND active"
            assert w.execute(active).fetchone()[0] == 1
            w.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'main'")
            with pytest.raises(ReplicationError) as ei:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    rc.read_transactions(dec, 0.2)
            assert ei.value.temporary
            with pytest.raises(ReplicationError, match="before start"):
                rc.read_transactions(dec, 0.1)  # the PGconn is not touched once the stream is gone
        finally:
            rc.close()


def test_a_read_batch_takes_what_the_stream_sent_and_returns_at_once_when_idle(pg_dsn):
    """The service's read batch (engine/service/native_batch.py, read_native_batch): 3000 one-row
    transactions the walsender has sent come back in ONE batch, in commit order (the first read, a
    pause, then reads until the socket is drained), as one ColumnarBatch; the reads after the pause
    take more than one socket read each (a mutant reading once per pause needs several batches); an
    idle stream returns what there is (nothing) after the timeout without pausing."""
    from mooncake_assets.engine.service.native_batch import read_native_batch

    n = 3000
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        w.execute("CREATE PUBLICATION p FOR TABLE t")
        rc = ReplicationConnection(pg_dsn, status_interval=60)
        try:
            rc.create_slot("main", export_snapshot=False)
            rc.start("main", ["p"])
            dec = NativeDecoder(batch=True)
            t0 = time.monotonic()
            assert read_native_batch(rc, dec, 0.3, pause_s=0.2) == []
            assert 0.3 <= time.monotonic() - t0 < 0.45  # the timeout, no pause after it
            with w.pipeline() as pipe:  # a Sync per statement: n transactions
                for i in range(n):
                    w.execute("INSERT INTO t VALUES (%s, repeat('x', 100))", (i,))
                    pipe.sync()
            end = w.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            sent = "SELECT sent_lsn >= %s FROM pg_stat_replication WHERE application_name = 'mooncake'"
            deadline = time.monotonic() + 20
            while not w.execute(sent, (end,)).fetchone()[0]:  # everything is in this socket's buffers
                assert time.monotonic() < deadline
                time.sleep(0.05)
            calls = []
            read = rc.read_transactions

            def counted(*a, **k):
                before = rc.messages_read
                r = read(*a, **k)
                calls.append(rc.messages_read - before)
                return r

            rc.read_transactions = counted
            (batch,) = read_native_batch(rc, dec, 5.0, window_s=0.5, pause_s=0.2)
            assert len(batch.xids) == n and batch.row_ends[-1] == n
            ids = [int(v) for r in batch.runs for v in r.new[0].values.to_pylist()]
            assert ids == list(range(n))
            assert sum(1 for c in calls if c) >= 2, calls  # the first read did not take it all
        finally:
            rc.close()
            _drop_slots(w, ["main"])
