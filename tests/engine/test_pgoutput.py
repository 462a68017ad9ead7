"""pgoutput message parsing: hand-built messages per the protocol docs (real ones from Postgres:
tests/pg/test_pgoutput_messages.py)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

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
