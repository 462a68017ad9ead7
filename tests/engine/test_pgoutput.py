"""pgoutput message parsing: hand-built messages per the protocol docs, then real ones from Postgres
(SQL interface ``pg_logical_slot_get_binary_changes``, protocol versions 1 and 2)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import psycopg
import pytest

from mooncake_assets.engine.cdc import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    parse_message,
)
from mooncake_assets.engine.cdc.pgoutput import PG_EPOCH


def s(text: str) -> bytes:
    return text.encode() + b"\0"


def tup(*cols) -> bytes:
    out = struct.pack(">h", len(cols))
    for c in cols:
        if c is None:
            out += b"n"
        elif c == "u":
            out += b"u"
        else:
            kind, val = c
            out += kind.encode() + struct.pack(">i", len(val)) + val
    return out


T_US = 759_000_000_123_456  # µs after 2000-01-01
T_DT = datetime(2024, 1, 19, 17, 20, 0, 123456, tzinfo=UTC)


def test_commit_time_conversion():
    assert (T_DT - PG_EPOCH).total_seconds() * 1e6 == pytest.approx(T_US, abs=1)


def test_begin_commit_origin():
    m = parse_message(b"B" + struct.pack(">QqI", 0x1_0000_0010, T_US, 742))
    assert m == Begin(0x1_0000_0010, T_DT, 742)
    m = parse_message(memoryview(b"C" + struct.pack(">BQQq", 0, 0x10, 0x48, T_US)))
    assert m == Commit(0, 0x10, 0x48, T_DT)
    assert parse_message(b"O" + struct.pack(">Q", 99) + s("node1")) == Origin(99, "node1")


@pytest.mark.parametrize("in_stream", [False, True])
def test_data_messages(in_stream):
    x = struct.pack(">I", 4_000_000_000) if in_stream else b""
    xid = 4_000_000_000 if in_stream else None
    rel = (
        b"R"
        + x
        + struct.pack(">I", 16384)
        + s("")
        + s("t")
        + b"f"
        + struct.pack(">h", 2)
        + b"\x01"
        + s("id")
        + struct.pack(">Ii", 23, -1)
        + b"\x00"
        + s("amount")
        + struct.pack(">Ii", 1700, 786438)
    )
    r = parse_message(rel, in_stream)
    assert isinstance(r, Relation) and (r.xid, r.oid, r.namespace, r.name, r.replica_identity) == (
        xid,
        16384,
        "pg_catalog",
        "t",
        "f",
    )
    assert [(c.name, c.type_oid, c.typmod, c.is_key) for c in r.columns] == [
        ("id", 23, -1, True),
        ("amount", 1700, 786438, False),
    ]
    assert parse_message(b"Y" + x + struct.pack(">I", 70000) + s("public") + s("mood"), in_stream) == Type(
        xid, 70000, "public", "mood"
    )

    ins = parse_message(
        b"I" + x + struct.pack(">I", 16384) + b"N" + tup(("t", b"1"), None, ("b", b"\x00\x01")), in_stream
    )
    assert ins == Insert(xid, 16384, TupleData("tnb", [b"1", None, b"\x00\x01"]))
    assert list(ins.new) == ins.new.values == [("t", b"1"), ("n", None), ("b", b"\x00\x01")]
    assert ins.new[1] == ("n", None) and len(ins.new) == 3
    assert ins.new.texts()[0] == "1" and not ins.new.has_unchanged_toast

    up = parse_message(b"U" + x + struct.pack(">I", 16384) + b"N" + tup(("t", b"1"), "u"), in_stream)
    assert up == Update(xid, 16384, None, None, TupleData("tu", [b"1", None]))
    assert up.new.has_unchanged_toast
    for k in "KO":
        up = parse_message(
            b"U"
            + x
            + struct.pack(">I", 16384)
            + k.encode()
            + tup(("t", b"1"), None)
            + b"N"
            + tup(("t", b"2"), ("t", b"")),
            in_stream,
        )
        assert (up.old_kind, up.old, up.new) == (k, TupleData("tn", [b"1", None]), TupleData("tt", [b"2", b""]))
        de = parse_message(b"D" + x + struct.pack(">I", 16384) + k.encode() + tup(("t", b"7"), None), in_stream)
        assert de == Delete(xid, 16384, k, TupleData("tn", [b"7", None]))

    tr = parse_message(b"T" + x + struct.pack(">iB", 2, 3) + struct.pack(">II", 1, 2), in_stream)
    assert tr == Truncate(xid, [1, 2], 3) and tr.cascade and tr.restart_identity

    msg = parse_message(b"M" + x + b"\x01" + struct.pack(">Q", 5) + s("pfx") + struct.pack(">i", 3) + b"abc", in_stream)
    assert msg == Message(xid, True, 5, "pfx", b"abc")


def test_stream_control_messages():
    assert parse_message(b"S" + struct.pack(">IB", 900, 1)) == StreamStart(900, True)
    assert parse_message(b"S" + struct.pack(">IB", 900, 0), True) == StreamStart(900, False)
    assert parse_message(b"E", True) == StreamStop()
    assert parse_message(b"c" + struct.pack(">IBQQq", 900, 0, 0x30, 0x58, T_US)) == StreamCommit(
        900, 0, 0x30, 0x58, T_DT
    )
    assert parse_message(b"A" + struct.pack(">II", 900, 901)) == StreamAbort(900, 901)


def test_bad_messages():
    with pytest.raises(ValueError, match="unknown message type 'Z'"):
        parse_message(b"Z123")
    with pytest.raises(ValueError, match="empty"):
        parse_message(b"")
    with pytest.raises(ValueError, match="truncated 'B'"):
        parse_message(b"B\x00\x00")
    with pytest.raises(ValueError, match="column kind"):
        parse_message(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"x")
    with pytest.raises(ValueError, match="expected 'N'"):
        parse_message(b"I" + struct.pack(">I", 1) + b"X" + tup(None))
    with pytest.raises(ValueError, match="past the end"):
        parse_message(b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 10) + b"ab")


def _sql_changes(conn, slot: str, proto: str) -> list:
    rows = conn.execute(
        "SELECT lsn, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', %s, 'publication_names', 'pub')",
        (slot, proto),
    ).fetchall()
    return [(lsn, parse_message(data)) for lsn, data in rows]


@pytest.mark.parametrize("proto", ["1", "2"])
def test_real_messages_from_postgres(pg_dsn, proto):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2), note text)")
        c.execute("ALTER TABLE acct ALTER COLUMN note SET STORAGE EXTERNAL")
        c.execute("CREATE TABLE hist (v text)")
        c.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR TABLE acct, hist")
        c.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        big = "x" * 10_000
        with c.transaction():
            c.execute("INSERT INTO acct VALUES (1, 'ann', 10.50, %s), (2, 'bob', NULL, NULL)", (big,))
            c.execute("INSERT INTO hist VALUES ('a'), (NULL)")
        with c.transaction():
            c.execute("UPDATE acct SET balance = 11 WHERE id = 1")  # note unchanged TOAST -> 'u'
            c.execute("UPDATE acct SET id = 3 WHERE id = 2")  # key change -> old 'K'
            c.execute("UPDATE hist SET v = 'b' WHERE v = 'a'")  # full identity -> old 'O'
            c.execute("DELETE FROM hist WHERE v IS NULL")
            c.execute("DELETE FROM acct WHERE id = 3")
        c.execute("TRUNCATE acct, hist RESTART IDENTITY")
        msgs = _sql_changes(c, "s", proto)
        oid = c.execute("SELECT 'acct'::regclass::oid").fetchone()[0]
        hoid = c.execute("SELECT 'hist'::regclass::oid").fetchone()[0]

    kinds = [type(m).__name__ for _, m in msgs]
    assert kinds == [
        "Begin",
        "Relation",
        "Insert",
        "Insert",
        "Relation",
        "Insert",
        "Insert",
        "Commit",
        "Begin",
        "Update",
        "Update",
        "Update",
        "Delete",
        "Delete",
        "Commit",
        "Begin",
        "Relation",
        "Relation",
        "Truncate",
        "Commit",
    ]  # TRUNCATE re-sends schemas
    m = [m for _, m in msgs]
    rel = m[1]
    assert (rel.oid, rel.namespace, rel.name, rel.replica_identity) == (oid, "public", "acct", "d")
    assert [(col.name, col.type_oid, col.is_key) for col in rel.columns] == [
        ("id", 23, True),
        ("owner", 25, False),
        ("balance", 1700, False),
        ("note", 25, False),
    ]
    assert m[4].replica_identity == "f" and all(col.is_key for col in m[4].columns)
    assert m[2].new == TupleData("tttt", [b"1", b"ann", b"10.50", big.encode()])
    assert m[3].new == TupleData("ttnn", [b"2", b"bob", None, None])
    assert m[6].new == TupleData("n", [None])
    assert m[9].old is None and m[9].new == TupleData("tttu", [b"1", b"ann", b"11.00", None])
    assert m[10].old_kind == "K" and m[10].old == TupleData("tnnn", [b"2", None, None, None])
    assert m[10].new.data[0] == b"3"
    assert m[11].old_kind == "O" and m[11].old == TupleData("t", [b"a"]) and m[11].new == TupleData("t", [b"b"])
    assert m[12] == Delete(None, hoid, "O", TupleData("n", [None]))
    assert m[13].old_kind == "K" and m[13].old.data[0] == b"3"
    assert sorted(m[18].relation_oids) == sorted([oid, hoid]) and m[18].restart_identity and not m[18].cascade
    # Begin's final LSN is the Commit's commit LSN; end LSN follows it; commit order increases
    for b, cm in [(m[0], m[7]), (m[8], m[14]), (m[15], m[19])]:
        assert b.final_lsn == cm.commit_lsn < cm.end_lsn
        assert abs((cm.commit_time - datetime.now(UTC)).total_seconds()) < 60
    assert m[7].end_lsn <= m[14].commit_lsn
