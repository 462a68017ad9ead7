"""The transaction assembler alone (engine/cdc/txn.py): hand-made pgoutput message sequences, no Postgres."""

from __future__ import annotations

from datetime import UTC

import pytest

from mooncake_assets.engine.cdc import (
    StreamAbort,
    StreamCommit,
    StreamStart,
    TransactionAssembler,
)


def _ins(xid, oid, v):
    from mooncake_assets.engine.cdc import Insert, TupleData

    return Insert(xid, oid, TupleData("t", [v]))


def test_assembler_stream_bookkeeping():
    from datetime import datetime

    from mooncake_assets.engine.cdc import (
        Begin,
        Commit,
        ProtocolError,
        Relation,
        RelationColumn,
        StreamStop,
        Truncate,
    )

    now = datetime.now(UTC)
    asm = TransactionAssembler()
    rel = Relation(100, 7, "public", "t", "d", [RelationColumn(1, "v", 25, -1)])
    feed = lambda m: asm.feed(m, 1)
    assert feed(StreamStart(100, True)) == [] and asm.in_stream
    feed(rel)
    feed(_ins(100, 7, b"a"))
    feed(_ins(101, 7, b"sub1"))
    feed(_ins(102, 7, b"sub2"))
    feed(StreamStop())
    # a plain transaction between chunks
    feed(Begin(50, now, 200))
    feed(_ins(None, 7, b"plain"))
    feed(Truncate(None, [7, 8], 1))
    (plain,) = feed(Commit(0, 50, 60, now))
    assert [c.kind for c in plain.changes] == ["insert", "truncate"]
    tr = plain.changes[1]
    assert (tr.relation_oid, tr.truncate_oids, tr.truncate_cascade, tr.truncate_restart_identity) == (
        7,
        [7, 8],
        True,
        False,
    )
    assert plain.changes[0].relation is rel  # relation cached from inside the stream
    feed(StreamStart(100, False))
    feed(_ins(101, 7, b"sub1-more"))
    feed(_ins(100, 7, b"b"))
    feed(StreamStop())
    assert asm.buffered_changes == 5 and asm.open_streams == [100]
    feed(StreamAbort(100, 101))
    feed(StreamAbort(100, 999))  # a subxact that never streamed anything
    (t,) = feed(StreamCommit(100, 0, 70, 80, now))
    assert [c.new.data[0] for c in t.changes] == [b"a", b"sub2", b"b"] and t.streamed
    assert (t.xid, t.commit_lsn, t.end_lsn) == (100, 70, 80) and asm.idle

    # a re-sent first segment restarts the buffer (the server re-streams after a reconnect)
    feed(StreamStart(300, True))
    feed(_ins(300, 7, b"x"))
    feed(StreamStop())
    feed(StreamStart(300, True))
    feed(_ins(300, 7, b"x"))
    feed(StreamStop())
    feed(StreamAbort(300, 300))
    assert asm.idle

    with pytest.raises(ProtocolError, match="outside any transaction"):
        feed(_ins(None, 7, b"orphan"))
    with pytest.raises(ProtocolError, match="first segment"):
        feed(StreamStart(400, False))
    feed(Begin(1, now, 1))
    with pytest.raises(ProtocolError, match="while xid 1 is open"):
        feed(Begin(2, now, 2))
    with pytest.raises(ProtocolError, match="never streamed"):
        asm.reset() or feed(StreamCommit(5, 0, 1, 2, now))
