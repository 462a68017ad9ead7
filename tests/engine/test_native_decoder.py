"""The compiled pgoutput decoder against the reference, message stream by message stream.

Differential: hypothesis builds random pgoutput streams byte by byte (PG docs, "Logical Replication
Message Formats": Begin/Commit, Origin, Relation (also mid-transaction), Type, Message, Insert,
Update with and without an old tuple 'K'/'O', Delete, Truncate; tuples with NULL 'n', unchanged
TOAST 'u', text 't' and binary 'b' values, empty, multibyte and long ones; protocol v2 streamed
transactions interleaved with plain ones, Stream Abort of subtransactions and of the top xid,
first_segment restarts) and feeds them to the reference (:class:`TransactionAssembler` +
:func:`columnar_transaction`) and to :class:`NativeDecoder`: same transactions, same runs
(``ChangeRun.equals``; run limits patched small so runs split), same relation and type caches,
and the same error at the same message for broken sequences; a malformed row message of a readable
relation inside a transaction is no error but the same bad-message marker (``bad``) on both. The receive loop on a real stream:
tests/pg/test_native_receiver.py.
"""

from __future__ import annotations

import random
import struct
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.cdc import columnar
from mooncake_assets.engine.cdc.columnar import ColumnarBatch, changes_from_run, columnar_transaction
from mooncake_assets.engine.cdc.native import (
    NativeDecoder,
    Receiver,
)
from mooncake_assets.engine.cdc.txn import ProtocolError, TransactionAssembler

# -- pgoutput message bytes (big-endian; String = UTF-8 + NUL) -------------------------------------------


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _x(xid: int | None) -> bytes:
    return b"" if xid is None else struct.pack(">I", xid)


def m_begin(final_lsn: int, ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts, xid)


def m_commit(commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, ts)


def m_origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + _s(name)


def m_relation(
    xid: int | None, oid: int, nsp: str, name: str, ident: str, cols: list[tuple[int, str, int, int]]
) -> bytes:
    out = b"R" + _x(xid) + struct.pack(">I", oid) + _s(nsp) + _s(name) + ident.encode() + struct.pack(">h", len(cols))
    for flags, cname, typ, typmod in cols:
        out += bytes([flags]) + _s(cname) + struct.pack(">Ii", typ, typmod)
    return out


def m_type(xid: int | None, oid: int, nsp: str, name: str) -> bytes:
    return b"Y" + _x(xid) + struct.pack(">I", oid) + _s(nsp) + _s(name)


def tuple_data(cells: list[tuple[str, bytes | None]]) -> bytes:
    out = struct.pack(">h", len(cells))
    for kind, value in cells:
        out += kind.encode()
        if kind in "tb":
            assert value is not None
            out += struct.pack(">i", len(value)) + value
    return out


def m_insert(xid: int | None, oid: int, new) -> bytes:
    return b"I" + _x(xid) + struct.pack(">I", oid) + b"N" + tuple_data(new)


def m_update(xid: int | None, oid: int, old_kind: str | None, old, new) -> bytes:
    head = b"U" + _x(xid) + struct.pack(">I", oid)
    if old_kind is not None:
        head += old_kind.encode() + tuple_data(old)
    return head + b"N" + tuple_data(new)


def m_delete(xid: int | None, oid: int, old_kind: str, old) -> bytes:
    return b"D" + _x(xid) + struct.pack(">I", oid) + old_kind.encode() + tuple_data(old)


def m_truncate(xid: int | None, oids: list[int], options: int) -> bytes:
    return b"T" + _x(xid) + struct.pack(">iB", len(oids), options) + struct.pack(f">{len(oids)}I", *oids)


def m_message(xid: int | None, transactional: bool, lsn: int, prefix: str, content: bytes) -> bytes:
    return (
        b"M"
        + _x(xid)
        + bytes([1 if transactional else 0])
        + struct.pack(">Q", lsn)
        + _s(prefix)
        + struct.pack(">i", len(content))
        + content
    )


def m_stream_start(xid: int, first: bool) -> bytes:
    return b"S" + struct.pack(">IB", xid, 1 if first else 0)


def m_stream_stop() -> bytes:
    return b"E"


def m_stream_commit(xid: int, commit_lsn: int, end_lsn: int, ts: int) -> bytes:
    return b"c" + struct.pack(">IBQQq", xid, 0, commit_lsn, end_lsn, ts)


def m_stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + struct.pack(">II", xid, subxid)


# -- random streams ----------------------------------------------------------------------------------------

OIDS = [16384, 16385, 16390]
SAMPLES = ["", "é", "日本語", "🦆", "a\u0301", "NULL", "\\x00", "plain text", "ü" * 2000, "x" * 70000]


def cells(rng: random.Random, ncols: int, allow_u: bool = True) -> list[tuple[str, bytes | None]]:
    """One tuple's cells. The values come from ``rng`` (seeded by hypothesis: the stream's structure
    shrinks, the bulk of its bytes does not need to): NULL, unchanged TOAST, empty, multibyte, long
    (one in ~40 is 70 kB, past a small MAX_RUN_BYTES) and random text, and binary."""
    out = []
    for _ in range(ncols):
        k = rng.choice("ttttnub" if allow_u else "tttnb")
        if k in "nu":
            out.append((k, None))
        elif k == "t":
            r = rng.random()
            if r < 0.5:
                v = rng.choice(SAMPLES[:-2])
            elif r < 0.975:
                v = "".join(
                    chr(rng.choice([rng.randrange(32, 127), rng.randrange(160, 0x2FFF)]))
                    for _ in range(rng.randrange(12))
                )
            else:
                v = rng.choice(SAMPLES[-2:])
            out.append(("t", v.encode()))
        else:
            out.append(("b", rng.randbytes(rng.randrange(20))))
    return out


class StreamBuilder:
    """Draws one pgoutput stream: ``msgs`` = [(wal_lsn, payload)] in arrival order."""

    def __init__(self, draw):
        self.draw = draw
        self.rng = random.Random(draw(st.integers(0, 2**32)))
        self.lsn = 0x1_0000_0000
        self.ts = 800_000_000_000_000
        self.next_xid = 700
        self.ncols: dict[int, int] = {}
        self.msgs: list[tuple[int, bytes]] = []

    def emit(self, payload: bytes) -> None:
        self.lsn += self.draw(st.integers(0, 300))  # 0: several messages at one WAL position
        self.msgs.append((self.lsn, payload))

    def xid(self) -> int:
        self.next_xid += self.draw(st.integers(1, 3))
        return self.next_xid

    def relation(self, xid: int | None, oid: int | None = None) -> None:
        oid = oid if oid is not None else self.draw(st.sampled_from(OIDS))
        n = self.draw(st.one_of(st.integers(1, 5), st.integers(20, 40)))
        ident = self.draw(st.sampled_from("dfin"))
        cols = [(1 if i == 0 or ident == "f" else 0, f"c{i}_ü", 25, -1) for i in range(n)]
        nsp = self.draw(st.sampled_from(["public", "", "Sch é"]))
        self.ncols[oid] = n
        self.emit(m_relation(xid, oid, nsp, f"t{oid}", ident, cols))

    def change(self, xid: int | None) -> None:
        d = self.draw
        what = d(st.sampled_from(["ins"] * 6 + ["upd", "upd_old", "del", "trunc", "rel", "type", "msg"]))
        oid = d(st.sampled_from(OIDS))
        n = self.ncols[oid]
        if what == "ins":
            for _ in range(d(st.integers(1, 8))):  # bursts: runs long enough to split
                self.emit(m_insert(xid, oid, cells(self.rng, n, allow_u=False)))
        elif what == "upd":
            self.emit(m_update(xid, oid, None, None, cells(self.rng, n)))
        elif what == "upd_old":
            k = d(st.sampled_from("KO"))
            self.emit(m_update(xid, oid, k, cells(self.rng, n, allow_u=False), cells(self.rng, n)))
        elif what == "del":
            self.emit(m_delete(xid, oid, d(st.sampled_from("KO")), cells(self.rng, n, allow_u=False)))
        elif what == "trunc":
            oids = d(st.lists(st.sampled_from(OIDS), min_size=0, max_size=3, unique=True))
            self.emit(m_truncate(xid, oids, d(st.integers(0, 3))))
        elif what == "rel":
            self.relation(xid)  # a schema change in the middle of a transaction
        elif what == "type":
            self.emit(m_type(xid, d(st.integers(20000, 20003)), "public", d(st.sampled_from(["mood", "ü"]))))
        else:
            self.emit(m_message(xid, d(st.booleans()), self.lsn, "pfx", d(st.binary(max_size=8))))

    def commit_times(self) -> tuple[int, int, int]:
        self.ts += self.draw(st.integers(0, 10**6))
        commit = self.lsn + 1
        return commit, commit + self.draw(st.integers(1, 64)), self.ts

    def plain(self) -> None:
        d = self.draw
        xid = self.xid()
        self.emit(m_begin(self.lsn + 1000, self.ts, xid))
        if d(st.booleans()):
            self.emit(m_origin(self.lsn, d(st.sampled_from(["", "node_ü", "o1"]))))
        for _ in range(d(st.integers(0, 6))):
            self.change(None)
        self.emit(m_commit(*self.commit_times()))

    def build(self) -> list[tuple[int, bytes]]:
        d = self.draw
        for oid in OIDS:
            self.relation(None, oid)
        streams: dict[int, list[int]] = {}  # open streamed xid -> its subxids
        for _ in range(d(st.integers(1, 14))):
            act = d(
                st.sampled_from(
                    ["plain", "plain", "chunk", "chunk", "chunk", "commit", "abort_sub", "abort_top", "rel"]
                )
            )
            if act == "plain":
                self.plain()
            elif act == "chunk":
                if streams and d(st.booleans()):
                    xid = d(st.sampled_from(sorted(streams)))
                    first = d(st.integers(0, 5)) == 0  # a restart of a known xid
                    if first:
                        streams[xid] = []
                else:
                    xid, first = self.xid(), True
                    streams[xid] = []
                self.emit(m_stream_start(xid, first))
                for _ in range(d(st.integers(0, 5))):
                    if d(st.booleans()):
                        sub = self.xid() if d(st.booleans()) or not streams[xid] else d(st.sampled_from(streams[xid]))
                        if sub not in streams[xid]:
                            streams[xid].append(sub)
                    else:
                        sub = xid
                    self.change(sub)
                self.emit(m_stream_stop())
            elif act == "commit" and streams:
                xid = d(st.sampled_from(sorted(streams)))
                del streams[xid]
                self.emit(m_stream_commit(xid, *self.commit_times()))
            elif act == "abort_sub" and streams:
                xid = d(st.sampled_from(sorted(streams)))
                sub = d(st.sampled_from(streams[xid] + [12345]))  # also a subxid that streamed nothing
                self.emit(m_stream_abort(xid, sub))
            elif act == "abort_top" and streams:
                xid = d(st.sampled_from(sorted(streams)))
                del streams[xid]
                self.emit(m_stream_abort(xid, xid))
            elif act == "rel":
                self.relation(None)
        for xid in sorted(streams):
            if d(st.booleans()):
                self.emit(m_stream_commit(xid, *self.commit_times()))
        return self.msgs


@st.composite
def streams(draw):
    return StreamBuilder(draw).build()


CONTROL = set(b"BCSEcA")


@st.composite
def broken_streams(draw):
    """A valid stream with one control message dropped, duplicated or moved, or one message cut short
    (any message, or a row message cut after its relation OID: a bad-message marker on both decoders)."""
    msgs = list(draw(streams()))
    ctl = [i for i, (_, p) in enumerate(msgs) if p[0] in CONTROL]
    rows = [i for i, (_, p) in enumerate(msgs) if p[0] in b"IUDR"]
    how = draw(st.sampled_from(["drop", "dup", "cut", "cut_row"]))
    if how == "cut_row" and rows:
        i = draw(st.sampled_from(rows))
        lsn, p = msgs[i]
        msgs[i] = (lsn, p[: draw(st.integers(min(9, len(p) - 1), len(p) - 1))])  # (9: past a stream xid + OID)
    elif how == "cut":
        i = draw(st.integers(0, len(msgs) - 1))
        lsn, p = msgs[i]
        msgs[i] = (lsn, p[: draw(st.integers(0, len(p) - 1))])
    elif ctl:
        i = draw(st.sampled_from(ctl))
        if how == "drop":
            del msgs[i]
        else:
            msgs.insert(draw(st.integers(0, len(msgs))), msgs[i])
    return msgs


# -- the comparison ----------------------------------------------------------------------------------------


class _RefUndefined(Exception):
    """The reference's columnar conversion itself fails (e.g. a change of a relation never described)."""


def run_reference(msgs):
    asm = TransactionAssembler()
    out, err = [], None
    for i, (lsn, payload) in enumerate(msgs):
        try:
            txns = asm.feed_payload(payload, lsn)
        # KeyError: a change in a chunk whose stream was aborted mid-chunk (both decoders raise it)
        except (ProtocolError, ValueError, KeyError) as e:
            err = (i, e)
            break
        try:
            out += [columnar_transaction(t) for t in txns]
        except (AssertionError, IndexError) as e:
            raise _RefUndefined() from e
    return asm, out, err


def run_native(msgs, batch: bool = False):
    dec = NativeDecoder(batch=batch)
    out, err = [], None
    for i, (lsn, payload) in enumerate(msgs):
        try:
            out += dec.feed(payload, lsn)
        # KeyError: a change in a chunk whose stream was aborted mid-chunk (both decoders raise it)
        except (ProtocolError, ValueError, KeyError) as e:
            err = (i, e)
            break
        if batch and i % 5 == 4:
            out += dec.take()  # (batches of a few messages' transactions, as the receive loop takes them)
    if batch:
        out += dec.take()  # (the transactions committed before an error stay in the batch buffer until taken)
    return dec, out, err


def _row_keys(runs) -> list[tuple]:
    """The rows of ``runs`` as comparable tuples (kind, relation, LSN, old kind, new and old cells)."""

    def tup(t):
        return None if t is None else (t.kinds, [None if v is None else bytes(v) for v in t.data])

    return [
        (
            c.kind,
            c.relation_oid,
            c.relation,
            c.lsn,
            c.old_kind,
            tup(c.new),
            tup(c.old),
            c.truncate_oids,
            c.truncate_cascade,
            c.truncate_restart_identity,
        )
        for run in runs
        for c in changes_from_run(run)
    ]


def assert_batches_hold(ref, out) -> None:
    """``out`` (a batch decoder's output: :class:`ColumnarBatch` and spilled transactions) holds the
    transactions ``ref`` (the reference's, columnar), row for row: each batch run of one kind, relation
    and Relation within the run limits, with its rows' commit LSNs; cut back into transactions
    (``ColumnarBatch.transactions``) the same transactions and rows."""
    txns = []
    for item in out:
        if isinstance(item, ColumnarBatch):
            starts = 0
            for run in item.runs:
                assert run.commit_lsns is not None and len(run.commit_lsns) == run.rows
                assert run.rows <= columnar.MAX_RUN_ROWS
                rows = changes_from_run(run) if run.kind != "truncate" else []
                assert all(c.kind == run.kind and c.relation_oid == run.relation_oid for c in rows)
                # each row's commit LSN is its transaction's
                tx = np.searchsorted(item.row_ends, np.arange(starts, starts + run.rows), side="right")
                assert run.commit_lsns.tolist() == item.commit_lsns[tx].tolist()
                starts += run.rows
            assert starts == item.rows
            txns += item.transactions()
        else:
            txns.append(item)
    assert len(ref) == len(txns)
    for a, b in zip(ref, txns):
        assert _txn_header(a) == _txn_header(b)
        assert _row_keys(a.runs) == _row_keys(b.runs)


def _txn_header(t) -> tuple:
    """What a decoded transaction says of itself, apart from its rows."""
    bad = [(b.relation_oid, b.lsn, b.kind, b.xid) for b in t.bad]
    return (t.xid, t.commit_lsn, t.end_lsn, t.commit_time, t.streamed, t.origin, t.rows, bad)


def assert_same_transactions(ref, nat) -> None:
    assert len(ref) == len(nat)
    for a, b in zip(ref, nat):
        assert _txn_header(a) == _txn_header(b)
        assert len(a.runs) == len(b.runs), (
            a.xid,
            [(r.kind, r.rows) for r in a.runs],
            [(r.kind, r.rows) for r in b.runs],
        )
        for ra, rb in zip(a.runs, b.runs):
            assert ra.equals(rb), (ra, rb)


def compare(msgs) -> None:
    try:
        asm, ref, ref_err = run_reference(msgs)
    except _RefUndefined:
        event("reference undefined")
        return
    dec, nat, nat_err = run_native(msgs)
    assert_same_transactions(ref, nat)
    bdec, bat, bat_err = run_native(msgs, batch=True)
    assert_batches_hold(ref, bat)
    assert (bat_err is None) == (nat_err is None) and (bat_err is None or bat_err[0] == nat_err[0])
    if any(t.bad for t in ref):
        event("bad message marker")
    if ref_err is None:
        assert nat_err is None, nat_err
        assert (dec.in_stream, dec.in_transaction, dec.open_streams, dec.buffered_changes, dec.idle) == (
            asm.in_stream,
            asm.in_transaction,
            asm.open_streams,
            asm.buffered_changes,
            asm.idle,
        )
    else:
        event(f"error {type(ref_err[1]).__name__}")
        assert nat_err is not None, f"reference failed at message {ref_err[0]}: {ref_err[1]}"
        assert nat_err[0] == ref_err[0]
        assert type(nat_err[1]) is type(ref_err[1])
        if isinstance(ref_err[1], (ProtocolError, KeyError)):
            assert str(nat_err[1]) == str(ref_err[1])
        elif isinstance(ref_err[1], ValueError):
            assert "at LSN" in str(nat_err[1])  # the malformed message's XLogData is named
    assert dec.relations == asm.relations
    assert dec.types == asm.types


LIMITS = st.sampled_from([(65536, 64 << 20), (3, 64 << 20), (1, 64 << 20), (5, 64), (65536, 1), (65536, 100_000)])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(msgs=streams(), limits=LIMITS)
def test_native_matches_reference(msgs, limits):
    with (
        mock.patch.object(columnar, "MAX_RUN_ROWS", limits[0]),
        mock.patch.object(columnar, "MAX_RUN_BYTES", limits[1]),
    ):
        compare(msgs)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(msgs=broken_streams(), limits=LIMITS)
def test_native_matches_reference_on_broken_streams(msgs, limits):
    with (
        mock.patch.object(columnar, "MAX_RUN_ROWS", limits[0]),
        mock.patch.object(columnar, "MAX_RUN_BYTES", limits[1]),
    ):
        compare(msgs)


def test_long_runs_split_at_max_run_rows():
    """70000 inserts in one transaction: two runs at the real MAX_RUN_ROWS, as the reference cuts them."""
    msgs = [(1, m_relation(None, 1, "public", "t", "d", [(1, "id", 23, -1), (0, "v", 25, -1)]))]
    msgs.append((2, m_begin(100, 0, 9)))
    msgs += [
        (3 + i, m_insert(None, 1, [("t", str(i).encode()), ("n", None) if i % 7 == 0 else ("t", b"v\xc3\xa9")]))
        for i in range(70000)
    ]
    msgs.append((80000, m_commit(80001, 80002, 5)))
    asm, ref, err = run_reference(msgs)
    dec, nat, nerr = run_native(msgs)
    assert err is None and nerr is None
    assert [r.rows for r in nat[0].runs] == [columnar.MAX_RUN_ROWS, 70000 - columnar.MAX_RUN_ROWS]
    assert_same_transactions(ref, nat)


def test_errors_name_the_lsn_and_emit_nothing():
    """An Insert too short to hold its relation OID in an open transaction: ValueError naming its
    XLogData's LSN (it cannot be attributed to a table: the stream fails); the transaction is not
    emitted (its Commit, fed after the error, finds it still open: no partial row kept)."""
    rel = m_relation(None, 1, "public", "t", "d", [(1, "id", 23, -1)])
    for dec in (NativeDecoder(), TransactionAssembler()):
        feed = dec.feed if isinstance(dec, NativeDecoder) else dec.feed_payload
        feed(rel, 1)
        feed(m_begin(10, 0, 5), 2)
        feed(m_insert(None, 1, [("t", b"1")]), 3)
        with pytest.raises(ValueError, match=r"at LSN 1/23456789"):
            feed(b"I\0\0", 0x1_23456789)
        assert dec.buffered_changes == 1
        (txn,) = feed(m_commit(11, 12, 0), 4)
        assert len(txn.changes if hasattr(txn, "changes") else range(txn.rows)) == 1 and not txn.bad
    with pytest.raises(ProtocolError, match="Insert for relation 1 outside any transaction"):
        NativeDecoder().feed(m_insert(None, 1, [("t", b"1")]), 4)
    with pytest.raises(ValueError, match=r"past the end .* at LSN 0/4"):  # malformed outside a transaction
        NativeDecoder().feed(m_insert(None, 1, [("t", b"1")])[:-1], 4)


@pytest.mark.parametrize(("native", "batch"), [(False, False), (True, False), (True, True)])
def test_malformed_row_message_is_a_marker_of_its_transaction(native, batch):
    """A malformed Insert/Update/Delete/Relation whose relation OID can be read, inside a transaction:
    no error; the transaction assembles with a BadMessage (relation, XLogData LSN, type byte, what was
    wrong) and without that message's row; the other relation's rows are all there. In batch mode the
    transaction comes on its own (not inside a ColumnarBatch), after the batch before it."""
    r1 = m_relation(None, 1, "public", "a", "d", [(1, "id", 23, -1)])
    r2 = m_relation(None, 2, "public", "b", "d", [(1, "id", 23, -1)])
    msgs = [(1, r1), (2, r2), (3, m_begin(9, 0, 4)), (4, m_insert(None, 2, [("t", b"0")])), (5, m_commit(9, 10, 0))]
    msgs += [(6, m_begin(20, 0, 5)), (7, m_insert(None, 1, [("t", b"1")])), (8, m_insert(None, 2, [("t", b"1")]))]
    msgs += [
        (0x1_00000009, m_insert(None, 1, [("t", b"2")])[:-1]),  # cut: value runs past the end
        (10, m_insert(None, 2, [("t", b"2")])),
        (11, m_delete(None, 1, "X", [("t", b"1")])),  # bad old-tuple kind
        (12, m_insert(None, 1, [("t", b"3"), ("t", b"4")])),  # two columns, its Relation says one
        (13, m_relation(None, 2, "public", "b", "d", [(1, "id", 23, -1)])[:-3]),  # cut Relation
        (14, m_commit(20, 21, 0)),
    ]
    if native:
        _, out, err = run_native(msgs, batch=batch)
    else:
        _, out, err = run_reference(msgs)
    assert err is None
    if batch:
        assert isinstance(out[0], ColumnarBatch) and len(out) == 2
        out = out[0].transactions() + out[1:]
    assert [t.bad for t in out[:1]] == [[]]
    txn = out[1]
    assert [(b.relation_oid, b.lsn, b.kind, b.xid) for b in txn.bad] == [
        (1, 0x1_00000009, "I", 5),
        (1, 11, "D", 5),
        (1, 12, "I", 5),
        (2, 13, "R", 5),
    ]
    assert "XLogData at LSN 1/9" in txn.bad[0].error and "runs past the end" in txn.bad[0].error
    assert "has 2 columns, its Relation message 1" in txn.bad[2].error
    rows = [(c.relation_oid, bytes(c.new.data[0])) for run in txn.runs for c in changes_from_run(run)]
    assert rows == [(1, b"1"), (2, b"1"), (2, b"2")]


@pytest.mark.parametrize("native", [True, False])
def test_a_bad_message_of_an_aborted_subtransaction_goes_with_it(native):
    """Streamed: a malformed Insert tagged with a subxid that later aborts (ROLLBACK TO SAVEPOINT) is
    dropped with that subtransaction's changes; one of the top xid stays."""
    rel = m_relation(None, 1, "public", "a", "d", [(1, "id", 23, -1)])
    msgs = [(1, rel), (2, m_stream_start(7, True)), (3, m_insert(7, 1, [("t", b"1")]))]
    msgs += [(4, m_insert(8, 1, [("t", b"2")])[:-1]), (5, m_insert(7, 1, [("t", b"3")])[:-1]), (6, m_stream_stop())]
    msgs += [(7, b"A" + struct.pack(">II", 7, 8)), (8, m_stream_commit(7, 30, 31, 0))]
    _, out, err = run_native(msgs) if native else run_reference(msgs)
    assert err is None
    (txn,) = out
    assert [(b.relation_oid, b.lsn, b.xid) for b in txn.bad] == [(1, 5, 7)] and txn.rows == 1


def test_receiver_needs_a_loaded_libpq():
    with pytest.raises(OSError, match="not loaded"):
        Receiver(1, "/nonexistent/libpq.so.5")


def test_change_of_a_relation_never_described():
    """No Relation seen for the OID (the reference's columnar form cannot be built then): the run's
    relation is None and its columns take the tuples' own width (NULL where a row has fewer)."""
    dec = NativeDecoder()
    dec.feed(m_begin(10, 0, 5), 1)
    dec.feed(m_insert(None, 77, [("t", b"a"), ("t", b"b")]), 2)
    dec.feed(m_insert(None, 77, [("t", b"c")]), 3)
    (txn,) = dec.feed(m_commit(11, 12, 0), 4)
    (run,) = txn.runs
    assert (run.relation, run.rows, len(run.new)) == (None, 2, 2)
    assert run.new[1].values.to_pylist() == [b"b", None] and run.new[1].kinds.tolist() == [ord("t"), ord("n")]
