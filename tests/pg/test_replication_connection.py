"""The replication connection, with the transaction assembler and the initial copy, against a real Postgres
(the assembler alone: tests/engine/test_txn.py).

Oracle for the stream: a second slot created at the same moment and read through the SQL interface
with protocol version 1 (no streaming), assembled by the same code: both must give the same
transactions (xid, commit LSN, end LSN, changes). Contents are also checked directly."""

from __future__ import annotations

import time
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest

from mooncake_assets.engine.cdc import (
    ReplicationConnection,
    ReplicationError,
    StreamAbort,
    StreamCommit,
    StreamStart,
    TransactionAssembler,
    decode_text_columns,
    describe_table,
    initial_copy,
    parse_message,
)
from mooncake_assets.engine.lsn import Lsn

SMALL_MEM = "options=-c%20logical_decoding_work_mem%3D64kB"


def _with_params(dsn: str, params: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + params


@pytest.fixture()
def repl(pg_dsn):
    """Factory of ReplicationConnections; closes them and waits until their slots are released."""
    opened: list[ReplicationConnection] = []

    def make(params: str = "", **kw) -> ReplicationConnection:
        rc = ReplicationConnection(_with_params(pg_dsn, params) if params else pg_dsn, **kw)
        opened.append(rc)
        return rc

    yield make
    for rc in opened:
        rc.close()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        deadline = time.monotonic() + 10
        while c.execute("SELECT count(*) FROM pg_replication_slots WHERE active").fetchone()[0]:
            assert time.monotonic() < deadline, "a slot stayed active after close()"
            time.sleep(0.05)


def pump(rc: ReplicationConnection, asm: TransactionAssembler, until, timeout: float = 20.0, log=None):
    """Read and assemble until ``until(transactions)`` is true."""
    txns = []
    deadline = time.monotonic() + timeout
    while not until(txns):
        assert time.monotonic() < deadline, f"timed out with {len(txns)} transactions"
        for wal, payload in rc.read(0.2):
            msg = parse_message(payload, asm.in_stream)
            if log is not None:
                log.append(msg)
            txns += asm.feed(msg, wal)
    return txns


def oracle(conn: psycopg.Connection, slot: str, pubs: str) -> list:
    """Transactions of ``slot`` via the SQL interface, protocol 1 (never streamed)."""
    asm = TransactionAssembler()
    out = []
    for lsn, data in conn.execute(
        "SELECT lsn, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', '1', 'publication_names', %s)",
        (slot, pubs),
    ).fetchall():
        out += asm.feed(parse_message(data, False), Lsn.parse(str(lsn)))
    return out


def key(txns) -> list:
    """What must agree between the streamed and the oracle decoding (a Relation's xid differs:
    inside a stream it carries the streaming xid)."""
    return [
        (
            t.xid,
            t.commit_lsn,
            t.end_lsn,
            t.commit_time,
            [
                (
                    c.kind,
                    c.relation_oid,
                    c.new,
                    c.old,
                    c.old_kind,
                    c.truncate_oids,
                    c.lsn,
                    c.relation and (c.relation.oid, c.relation.replica_identity, c.relation.columns),
                )
                for c in t.changes
            ],
        )
        for t in txns
    ]


def marker_done(mark_oid: int):
    return lambda txns: any(c.relation_oid == mark_oid for t in txns for c in t.changes)


def test_identify_and_slots(pg_dsn, repl):
    rc = repl()
    info = rc.identify_system()
    assert info["timeline"] >= 1 and info["xlogpos"] > 0 and info["dbname"] == pg_dsn.rsplit("/", 1)[1]
    lsn, snap = rc.create_slot("s_export")
    assert lsn > 0 and snap
    lsn2, snap2 = rc.create_slot("s_plain", export_snapshot=False)
    assert lsn2 >= lsn and snap2 is None
    with pytest.raises(ReplicationError, match="slot s_plain already exists") as ei:
        rc.create_slot("s_plain", export_snapshot=False)
    assert ei.value.temporary is False
    rc.drop_slot("s_plain")
    with pytest.raises(ReplicationError, match="slot s_plain does not exist"):
        rc.drop_slot("s_plain")
    with pytest.raises(ValueError, match="must be 1-63 characters"):
        rc.create_slot("Bad-Name")
    tmp_lsn, _ = rc.create_slot("s_tmp", export_snapshot=False, temporary=True)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        assert {r[0] for r in c.execute("SELECT slot_name FROM pg_replication_slots")} == {"s_export", "s_tmp"}


def test_start_errors(pg_dsn, repl):
    rc = repl()
    with pytest.raises(ReplicationError, match="slot nope does not exist") as ei:
        rc.start("nope", ["p"])
    assert not ei.value.temporary
    rc.create_slot("s1", export_snapshot=False)  # the connection is still usable after the failed start
    rc.start("s1", ["no_such_pub"])
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        c.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(ReplicationError, match="publication no_such_pub does not exist"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rc.read(0.2)
    assert rc.streaming_slot is None
    with pytest.raises(ReplicationError, match="before start"):
        rc.read(0.1)


def test_stream_insert_update_delete_truncate(pg_dsn, repl):
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2))")
        w.execute("CREATE TABLE hist (v text, n int)")
        w.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        w.execute("CREATE TABLE mark (id int PRIMARY KEY)")
        w.execute("CREATE PUBLICATION p FOR TABLE acct, hist, mark")
        w.execute("CREATE TABLE unpublished (id int)")
        acct = describe_table(w, "acct")
        hist = describe_table(w, "hist")
        mark_oid = describe_table(w, "mark").oid

        rc = repl()
        cp, _ = rc.create_slot("main", export_snapshot=False)
        w.execute("SELECT pg_create_logical_replication_slot('oracle', 'pgoutput')")
        rc.start("main", ["p"])

        bounds = []  # (insert position before COMMIT, after COMMIT) per transaction

        def txn(*stmts):
            with w.transaction():
                for s in stmts:
                    w.execute(s)
                before = Lsn.parse(str(w.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
            after = Lsn.parse(str(w.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]))
            bounds.append((before, after))

        txn("INSERT INTO acct VALUES (1, 'ann', 10.5), (2, 'bob', NULL)", "INSERT INTO hist VALUES ('a', 1), ('a', 1)")
        txn("INSERT INTO unpublished VALUES (1)")  # not in the publication: an empty transaction is not sent
        txn(
            "UPDATE acct SET balance = balance + 1 WHERE id = 1",
            "UPDATE acct SET id = 20 WHERE id = 2",
            "UPDATE hist SET n = 2 WHERE ctid = (SELECT min(ctid) FROM hist)",
            "DELETE FROM hist WHERE n = 1",
        )
        txn("DELETE FROM acct WHERE id = 20")
        txn("TRUNCATE acct, hist")
        txn("INSERT INTO mark VALUES (1)")

        asm = TransactionAssembler()
        got = pump(rc, asm, marker_done(mark_oid))
        expected = oracle(w, "oracle", "p")

    assert key(got) == key(expected)
    assert len(got) == 5  # the transaction touching only an unpublished table was skipped
    for t, (before, after) in zip(got, [b for i, b in enumerate(bounds) if i != 1]):
        assert before <= t.commit_lsn < t.end_lsn <= after
        assert t.commit_lsn > cp
    assert [t.commit_lsn for t in got] == sorted(t.commit_lsn for t in got)
    assert set(asm.relations) >= {acct.oid, hist.oid, mark_oid}

    t1, t2, t3, t4, t5 = got
    assert [(c.kind, c.relation_oid) for c in t1.changes] == [
        ("insert", acct.oid),
        ("insert", acct.oid),
        ("insert", hist.oid),
        ("insert", hist.oid),
    ]
    rows = decode_text_columns(acct.columns, [c.new.data for c in t1.changes[:2]]).to_pylist()
    assert [(r["id"], r["owner"], r["balance"]) for r in rows] == [(1, "ann", Decimal("10.50")), (2, "bob", None)]
    kinds = [(c.kind, c.old_kind) for c in t2.changes]
    assert kinds == [("update", None), ("update", "K"), ("update", "O"), ("delete", "O")]
    assert t2.changes[1].old.data[0] == b"2" and t2.changes[1].new.data[0] == b"20"
    assert t2.changes[2].old.data == [b"a", b"1"] and t2.changes[2].new.data == [b"a", b"2"]
    assert (t3.changes[0].kind, t3.changes[0].old_kind, t3.changes[0].old.data[0]) == ("delete", "K", b"20")
    (tr,) = t4.changes
    assert tr.kind == "truncate" and sorted(tr.truncate_oids) == sorted([acct.oid, hist.oid])
    assert tr.relation_oid == tr.truncate_oids[0] and not tr.truncate_cascade
    assert asm.idle


def _big_insert(table: str, lo: int, hi: int, tag: str) -> str:
    return f"INSERT INTO {table} SELECT g, '{tag}', repeat('x', 200) FROM generate_series({lo}, {hi}) g"


def test_streamed_transactions_savepoints_and_aborts(pg_dsn, repl):
    """logical_decoding_work_mem=64kB on the walsender makes the big transactions stream before they
    commit; subtransaction rollbacks and a top-level abort must drop exactly their changes."""
    with psycopg.connect(pg_dsn, autocommit=True) as w, psycopg.connect(pg_dsn, autocommit=True) as w2:
        w.execute("CREATE TABLE big (id int PRIMARY KEY, tag text, pad text)")
        w.execute("CREATE TABLE mark (id int PRIMARY KEY)")
        w.execute("CREATE PUBLICATION p FOR TABLE big, mark")
        big_oid = describe_table(w, "big").oid
        mark_oid = describe_table(w, "mark").oid

        rc = repl(SMALL_MEM)
        rc.create_slot("main", export_snapshot=False)
        w.execute("SELECT pg_create_logical_replication_slot('oracle', 'pgoutput')")
        rc.start("main", ["p"])
        assert rc.proto_version == 2

        # 1: streamed, with nested savepoints: keep 1..1000, drop 1001..2000 and 2001..2500 (a released
        #    child of the rolled-back savepoint), keep 3001..3500, an update and a delete; meanwhile
        #    a small transaction commits on another connection (it must come out first).
        with w.transaction():
            w.execute(_big_insert("big", 1, 1000, "keep"))
            w.execute("SAVEPOINT a")
            w.execute(_big_insert("big", 1001, 2000, "drop-a"))
            w.execute("SAVEPOINT b")
            w.execute(_big_insert("big", 2001, 2500, "drop-b"))
            w.execute("RELEASE SAVEPOINT b")
            w.execute("ROLLBACK TO SAVEPOINT a")
            w.execute("SAVEPOINT c")
            w.execute(_big_insert("big", 3001, 3500, "keep-c"))
            w.execute("RELEASE SAVEPOINT c")
            w2.execute("INSERT INTO big VALUES (-1, 'small', '')")
            w.execute("UPDATE big SET tag = 'upd' WHERE id = 7")
            w.execute("DELETE FROM big WHERE id = 8")
        # 2: streamed, then aborted at the top level
        with pytest.raises(RuntimeError):
            with w.transaction():
                w.execute(_big_insert("big", 10001, 12000, "aborted"))
                raise RuntimeError("rollback")
        # 3: a plain transaction, then the marker
        w.execute("INSERT INTO big VALUES (-2, 'after', '')")
        w.execute("INSERT INTO mark VALUES (1)")

        log: list = []
        asm = TransactionAssembler()
        got = pump(rc, asm, marker_done(mark_oid), log=log)
        expected = oracle(w, "oracle", "p")

    assert key(got) == key(expected)
    assert [t.streamed for t in got] == [False, True, False, False]
    small, streamed, after, _ = got
    assert [c.new.data[1] for c in small.changes] == [b"small"]
    assert [c.new.data[1] for c in after.changes] == [b"after"]
    ins = [c for c in streamed.changes if c.kind == "insert"]
    assert [int(c.new.data[0]) for c in ins] == list(range(1, 1001)) + list(range(3001, 3501))
    assert [(c.kind, c.new.data[:2] if c.new else c.old.data[0]) for c in streamed.changes[-2:]] == [
        ("update", [b"7", b"upd"]),
        ("delete", b"8"),
    ]
    assert small.commit_lsn < streamed.commit_lsn < after.commit_lsn
    assert all(c.relation_oid == big_oid for c in streamed.changes)

    starts = [m for m in log if isinstance(m, StreamStart)]
    aborts = [m for m in log if isinstance(m, StreamAbort)]
    assert len({m.xid for m in starts}) == 2 and sum(m.first_segment for m in starts) == 2
    assert any(m.xid != m.subxid for m in aborts)  # savepoint rollback
    assert any(m.xid == m.subxid for m in aborts)  # top-level abort
    assert [m.xid for m in log if isinstance(m, StreamCommit)] == [streamed.xid]
    assert asm.idle and asm.buffered_changes == 0


def test_interleaved_streams(pg_dsn, repl):
    """Two large transactions stream in alternating chunks; each commits whole, in commit order."""
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE big (id int PRIMARY KEY, tag text, pad text)")
        w.execute("CREATE TABLE mark (id int PRIMARY KEY)")
        w.execute("CREATE PUBLICATION p FOR TABLE big, mark")
        mark_oid = describe_table(w, "mark").oid
        rc = repl(SMALL_MEM)
        rc.create_slot("main", export_snapshot=False)
        rc.start("main", ["p"])
        with psycopg.connect(pg_dsn) as a, psycopg.connect(pg_dsn) as b:
            for i in range(4):
                a.execute(_big_insert("big", i * 1000 + 1, i * 1000 + 500, "a"))
                b.execute(_big_insert("big", 100000 + i * 1000 + 1, 100000 + i * 1000 + 500, "b"))
            b.commit()
            a.commit()
        w.execute("INSERT INTO mark VALUES (1)")
        log: list = []
        got = pump(rc, TransactionAssembler(), marker_done(mark_oid), log=log)
    assert [(t.streamed, {c.new.data[1] for c in t.changes}, len(t.changes)) for t in got[:2]] == [
        (True, {b"b"}, 2000),
        (True, {b"a"}, 2000),
    ]
    xs = [m.xid for m in log if isinstance(m, StreamStart)]
    assert len(set(xs)) == 2 and any(x != y for x, y in zip(xs, xs[1:]))  # chunks alternate


def test_initial_copy_at_consistent_point(pg_dsn, repl):
    """Rows committed before the slot come from the copy, changes after it from the stream: nothing
    lost, nothing twice — even though the writes happen before the copy runs."""
    with psycopg.connect(pg_dsn, autocommit=True) as w, psycopg.connect(pg_dsn) as reader:
        w.execute("CREATE TABLE items (id bigint PRIMARY KEY, name text, price numeric(10,2))")
        w.execute("CREATE TABLE mark (id int PRIMARY KEY)")
        w.execute("INSERT INTO items SELECT g, 'item ' || g, g / 100.0 FROM generate_series(1, 5000) g")
        w.execute("CREATE PUBLICATION p FOR TABLE items, mark")
        schema = describe_table(w, "items")
        mark_oid = describe_table(w, "mark").oid

        rc = repl()
        cp, snap = rc.create_slot("main")
        # after the consistent point, before the copy
        w.execute("INSERT INTO items SELECT g, 'late ' || g, 1 FROM generate_series(5001, 5100) g")
        w.execute("UPDATE items SET name = 'renamed' WHERE id = 1")
        w.execute("DELETE FROM items WHERE id = 2")

        it = initial_copy(reader, schema, snap, batch_rows=2000)
        first = next(it)  # the snapshot is imported now; starting the stream ends the export
        rc.start("main", ["p"], start_lsn=cp)
        copied = pa.Table.from_batches([first, *it])
        w.execute("INSERT INTO mark VALUES (1)")
        got = pump(rc, TransactionAssembler(), marker_done(mark_oid))

    assert copied.num_rows == 5000
    assert copied.column("id").to_pylist() == list(range(1, 5001))
    assert copied.slice(0, 2).to_pylist()[0]["name"] == "item 1" and copied.column("price")[1].as_py() is not None
    assert all(t.commit_lsn >= cp for t in got)
    kinds = [[c.kind for c in t.changes] for t in got]
    assert kinds == [["insert"] * 100, ["update"], ["delete"], ["insert"]]
    assert int(got[0].changes[0].new.data[0]) == 5001


def test_status_keepalive_and_lost_connection(pg_dsn, repl):
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE t (id int PRIMARY KEY)")
        w.execute("CREATE PUBLICATION p FOR TABLE t")
        # a short wal_sender_timeout makes the server ask for replies; unanswered, it would hang up
        rc = repl("options=-c%20wal_sender_timeout%3D2s", status_interval=60)
        rc.create_slot("main", export_snapshot=False)
        rc.start("main", ["p"])
        w.execute("INSERT INTO t VALUES (1)")
        got = pump(rc, TransactionAssembler(), lambda t: len(t) == 1)
        rc.send_status(got[0].end_lsn, got[0].end_lsn, got[0].end_lsn)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # idle: keepalives requesting replies arrive and are answered
            assert rc.read(0.3) == []
        assert rc.keepalive_replies >= 1 and rc.server_wal_end >= got[0].end_lsn
        with psycopg.connect(pg_dsn) as c2:  # wal_sender_timeout really applied to our walsender
            assert (
                c2.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'main' AND active").fetchone()[
                    0
                ]
                == 1
            )

        def confirmed():
            v = w.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'main'").fetchone()[0]
            return Lsn.parse(str(v))

        deadline = time.monotonic() + 5
        while confirmed() < got[0].end_lsn:
            assert time.monotonic() < deadline
            rc.read(0.1)
        # idle mirror: confirm the keepalive's WAL end
        w.execute("CREATE TABLE other (x int)")
        w.execute("INSERT INTO other VALUES (1)")
        target = Lsn.parse(str(w.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]))
        deadline = time.monotonic() + 10
        while rc.server_wal_end < target:
            assert time.monotonic() < deadline
            rc.read(0.2)
        rc.send_status(rc.server_wal_end, rc.server_wal_end, rc.server_wal_end)
        deadline = time.monotonic() + 5
        while confirmed() < target:
            assert time.monotonic() < deadline
            rc.read(0.1)

        w.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'main'")
        with pytest.raises(ReplicationError) as ei:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                rc.read(0.2)
        assert ei.value.temporary


def test_decode_streamed_tuples_matches_copy(pg_dsn, repl):
    """The same rows through pgoutput (TupleData bytes) and through COPY decode to the same Arrow."""
    from tests.pg.all_types import ALL_TYPES_DDL, ALL_TYPES_ROWS  # the shared all-types fixture rows

    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute(ALL_TYPES_DDL)
        w.execute("CREATE PUBLICATION p FOR TABLE all_types")
        schema = describe_table(w, "all_types")
        rc = repl("options=-c%20TimeZone%3DAsia/Tokyo")  # our forced UTC must win
        rc.create_slot("main", export_snapshot=False)
        rc.start("main", ["p"])
        w.execute("SET TimeZone = 'America/Los_Angeles'")
        w.execute(ALL_TYPES_ROWS)
        got = pump(rc, TransactionAssembler(), lambda t: len(t) == 1)
        copied = next(initial_copy(w, schema, None))
    # Postgres before 18 does not send STORED generated columns (the service computes them: test_generated_columns)
    sent = [c for c in schema.columns if not c.generated]
    if len(got[0].changes[0].new.data) == len(sent):
        copied = copied.select([c.name for c in sent])
    else:
        sent = schema.columns
    streamed = decode_text_columns(sent, [c.new.data for c in got[0].changes])
    assert streamed.schema.equals(copied.schema)
    for name in streamed.schema.names:
        a, b = streamed.column(name), copied.column(name)
        if pa.types.is_floating(a.type):  # NaN != NaN in Array.equals
            a, b = a.cast(pa.string()), b.cast(pa.string())
        assert a.equals(b), (name, a, b)


# -- the assembler alone (hand-made message sequences) --------------------------------------------
