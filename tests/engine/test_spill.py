"""Open transactions spilled to disk by the compiled decoder (engine/cdc/spill.py), and the memory
budget's sizes (engine/service/memory.py). In-process: generated pgoutput streams, no Postgres."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.cdc.columnar import changes_from_run
from mooncake_assets.engine.cdc.native import NativeDecoder
from mooncake_assets.engine.cdc.spill import Spiller
from mooncake_assets.engine.service.memory import (
    MIN_MEMORY_LIMIT,
    MemoryBudget,
    check_memory_limit,
    default_memory_limit,
    parse_size,
)

from .test_native_decoder import (
    m_begin,
    m_commit,
    m_insert,
    m_relation,
    m_stream_abort,
    m_stream_commit,
    m_stream_start,
    m_stream_stop,
    run_native,
    streams,
)

_counter = itertools.count()


def _decode(msgs, spill_dir: Path | None, spill_bytes: int):
    dec = NativeDecoder()
    if spill_dir is not None:
        dec.spill = Spiller(spill_dir)
        dec.spill_bytes = spill_bytes
    out, err = [], None
    for i, (lsn, payload) in enumerate(msgs):
        try:
            out += dec.feed(payload, lsn)
        except Exception as e:  # (the same error as without spilling: checked by the caller)
            err = (i, type(e), str(e))
            break
    return dec, out, err


def _changes(txn) -> list:
    runs = [*(txn.spilled.runs() if txn.spilled is not None else ()), *txn.runs]
    return [ch for r in runs for ch in changes_from_run(r)]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(msgs=streams(), spill_bytes=st.sampled_from([0, 1, 100, 2000]))
def test_spilled_transactions_equal_in_memory_ones(msgs, spill_bytes, tmp_path):
    """Whatever spills (a threshold of 0 spills after every change), each transaction's changes, read
    back from its spill file then memory, are those of the decoder that keeps everything in memory —
    streamed transactions with subtransaction aborts included; nothing is left on disk once applied."""
    d = tmp_path / f"spill{next(_counter)}"
    _, plain, plain_err = run_native(msgs)
    dec, spilled, err = _decode(msgs, d, spill_bytes)
    assert (err is None) == (plain_err is None)
    assert len(plain) == len(spilled)
    for a, b in zip(plain, spilled):
        assert (a.xid, a.commit_lsn, a.end_lsn, a.streamed) == (b.xid, b.commit_lsn, b.end_lsn, b.streamed)
        assert _changes(a) == _changes(b) and a.bad == b.bad
        if b.spilled is not None:
            b.spilled.delete()
    open_xids = set(dec.open_streams) | ({None} if dec.in_transaction else set())
    if not open_xids:
        assert list(d.glob("*.arrow")) == []
    dec.reset()
    assert list(d.glob("*.arrow")) == []


REL = m_relation(None, 1, "public", "t", "d", [(1, "id", 23, -1), (0, "v", 25, -1)])


def test_top_level_abort_deletes_the_spill_file(tmp_path):
    """A streamed transaction that spilled and then aborted (Stream Abort, subxid == xid) leaves no file."""
    msgs = [(1, REL), (2, m_stream_start(77, True))]
    msgs += [(3 + i, m_insert(77, 1, [("t", str(i).encode()), ("t", b"x" * 50)])) for i in range(200)]
    msgs += [(300, m_stream_stop()), (301, m_stream_abort(77, 77))]
    dec, out, err = _decode(msgs[:-1], tmp_path, 1000)
    assert err is None and out == []
    assert [p.name for p in tmp_path.glob("*.arrow")] == ["77.arrow"]
    dec.feed(msgs[-1][1], msgs[-1][0])
    assert list(tmp_path.glob("*.arrow")) == []


def test_subtransaction_abort_drops_its_spilled_rows(tmp_path):
    """Rows of an aborted subtransaction are left out of the spilled part too."""
    msgs = [(1, REL), (2, m_stream_start(50, True))]
    lsn = 3
    for i in range(300):
        msgs.append((lsn, m_insert(51 if i % 3 == 0 else 50, 1, [("t", str(i).encode()), ("t", b"y" * 40)])))
        lsn += 1
    msgs += [(lsn, m_stream_stop()), (lsn + 1, m_stream_abort(50, 51)), (lsn + 2, m_stream_commit(50, 1000, 1001, 0))]
    dec, out, err = _decode(msgs, tmp_path, 2000)
    assert err is None and len(out) == 1 and out[0].spilled is not None
    ids = [int(bytes(ch.new.data[0])) for ch in _changes(out[0])]
    assert ids == [i for i in range(300) if i % 3 != 0]


def test_rows_of_a_subtransaction_after_its_abort_are_kept_as_in_memory(tmp_path):
    """An abort drops the subtransaction's rows received *so far*, as the in-memory decoder does; rows of
    the same subxid that arrive after it (hypothesis generated such a stream; Postgres never reuses an
    xid) are kept. The spill once left out every row of an aborted subxid, whenever it came."""
    msgs = [(1, REL), (2, m_stream_start(60, True))]
    msgs += [(3 + i, m_insert(61 if i % 2 else 60, 1, [("t", f"a{i}".encode()), ("t", b"y" * 40)])) for i in range(40)]
    msgs += [(100, m_stream_stop()), (101, m_stream_abort(60, 61)), (102, m_stream_start(60, False))]
    msgs += [(103 + i, m_insert(61 if i % 2 else 60, 1, [("t", f"b{i}".encode()), ("t", b"")])) for i in range(40)]
    msgs += [(200, m_stream_stop()), (201, m_stream_commit(60, 1000, 1001, 0))]
    want = [f"a{i}" for i in range(40) if i % 2 == 0] + [f"b{i}" for i in range(40)]
    _, plain, _ = run_native(msgs)
    assert [bytes(ch.new.data[0]).decode() for ch in _changes(plain[0])] == want
    for spill_bytes in (0, 1000):
        _, out, err = _decode(msgs, tmp_path / f"s{spill_bytes}", spill_bytes)
        assert err is None and len(out) == 1 and out[0].spilled is not None
        assert [bytes(ch.new.data[0]).decode() for ch in _changes(out[0])] == want, spill_bytes


def test_plain_transaction_spills_and_reads_back_in_chunks(tmp_path):
    """A plain (not streamed) transaction spills too; it reads back as runs in order."""
    msgs = [(1, REL), (2, m_begin(900, 0, 9))]
    msgs += [(3 + i, m_insert(None, 1, [("t", str(i).encode()), ("t", b"z" * 30)])) for i in range(5000)]
    msgs.append((6000, m_commit(6000, 6001, 0)))
    dec, out, err = _decode(msgs, tmp_path, 20_000)
    assert err is None and len(out) == 1
    t = out[0]
    assert t.spilled is not None and t.spilled.rows + t.rows == 5000
    assert len(list(t.spilled.runs())) > 1
    assert [int(bytes(ch.new.data[0])) for ch in _changes(t)] == list(range(5000))
    t.spilled.delete()
    assert list(tmp_path.glob("*.arrow")) == []


def test_a_spilled_transaction_keeps_its_bad_messages(tmp_path):
    """A malformed Insert of a readable relation in a transaction that spills (threshold 0: after every
    change) is a BadMessage of the committed transaction, not lost with the spilled rows; one of a
    streamed subtransaction that aborts goes with it."""
    rel = m_relation(None, 1, "public", "t", "d", [(1, "id", 23, -1)])
    msgs = [(1, rel), (2, m_begin(10, 0, 5)), (3, m_insert(None, 1, [("t", b"1")]))]
    msgs += [
        (4, m_insert(None, 1, [("t", b"2")])[:-1]),
        (5, m_insert(None, 1, [("t", b"3")])),
        (6, m_commit(10, 11, 0)),
    ]
    msgs += [(7, m_stream_start(8, True)), (8, m_insert(8, 1, [("t", b"4")])), (9, m_insert(9, 1, [("t", b"5")])[:-1])]
    msgs += [(10, m_insert(8, 1, [("t", b"6")])[:-1]), (11, m_stream_stop()), (12, m_stream_abort(8, 9))]
    msgs += [(13, m_stream_commit(8, 20, 21, 0))]
    dec, out, err = _decode(msgs, tmp_path / "s", 0)
    assert err is None and len(out) == 2 and all(t.spilled is not None for t in out)
    assert [(b.relation_oid, b.lsn, b.xid) for b in out[0].bad] == [(1, 4, 5)]
    assert [(b.relation_oid, b.lsn, b.xid) for b in out[1].bad] == [(1, 10, 8)]
    assert [bytes(c.new.data[0]) for c in _changes(out[0])] == [b"1", b"3"]
    assert [bytes(c.new.data[0]) for c in _changes(out[1])] == [b"4"]
    for t in out:
        t.spilled.delete()


def test_a_new_spiller_removes_files_left_behind(tmp_path):
    (tmp_path / "12.arrow").write_bytes(b"left by a killed process")
    Spiller(tmp_path)
    assert list(tmp_path.glob("*.arrow")) == []


@pytest.mark.parametrize(
    "text,n",
    [
        ("512MiB", 512 << 20),
        ("2GiB", 2 << 30),
        ("2G", 2 << 30),
        ("1500MB", 1_500_000_000),
        ("1048576", 1 << 20),
        ("1.5GiB", 3 << 29),
        (" 64 mib ", 64 << 20),
    ],
)
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "lots", "5 parsecs", "-1GiB", "1e9"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_minimum_and_default(tmp_path):
    with pytest.raises(ValueError, match="working minimum of 128.0 MiB"):
        check_memory_limit(MIN_MEMORY_LIMIT - 1)
    assert check_memory_limit(MIN_MEMORY_LIMIT) == MIN_MEMORY_LIMIT
    mi = tmp_path / "meminfo"
    mi.write_text("MemTotal:       25165824 kB\nMemFree: 1 kB\n")
    assert default_memory_limit(str(mi)) == 6 << 30
    assert default_memory_limit(str(tmp_path / "none")) == 1 << 30


@pytest.mark.parametrize("limit", [MIN_MEMORY_LIMIT, 512 << 20, 6 << 30, 64 << 30])
def test_an_open_transaction_spills_every_16_mib_whatever_the_budget(limit):
    """Not a share of the budget: a transaction held whole until its commit costs wall time and RSS
    (``memory.SPILL_BYTES``'s measurement); at the smallest budget 16 MiB is an eighth of it."""
    assert MemoryBudget(limit).spill_bytes() == 16 << 20


class _Mem:
    def __init__(self, rows: int, nbytes: int):
        self.num_rows, self.nbytes = rows, nbytes


class _File:
    def __init__(self, pending: int):
        self.pending = dict.fromkeys(range(pending), 1)


class _Table:
    """A test double with what MemoryBudget reads of a MirrorTable (``mem``, ``files``, ``error``)."""

    def __init__(self, name: str, rows: int, nbytes: int, pending: int = 0):
        self.name, self.error = name, None
        self.mem = _Mem(rows, nbytes)
        self.files = {"f": _File(pending)}
        self.flushed = 0

    def flush(self):
        self.flushed += 1
        self.mem = _Mem(0, 0)


def test_relieve_flushes_largest_first_then_backpressure():
    from mooncake_assets.engine.service.memory import MemoryBudget

    b = MemoryBudget(128 << 20)
    small, big = _Table("small", 1000, 10 << 20), _Table("big", 100_000, 60 << 20)
    assert b.relieve([small, big]) is False
    assert (big.flushed, small.flushed) == (1, 0)  # 81 MiB > 32 MiB: the big one goes, then it is under
    assert b.early_flushes == 1
    # pending deletes only a persist frees: over the budget after flushing -> backpressure
    stuck = _Table("stuck", 10, 1000, pending=1_500_000)
    assert b.relieve([stuck]) is True and b.backpressure
    assert stuck.flushed == 0  # (its MemSlice is too small to be worth a file)
    assert b.status([stuck])["backpressure"] is True


def test_a_full_disk_fails_only_that_transactions_spill(tmp_path, monkeypatch):
    """ENOSPC while appending to a spill file (the fault point ``spill:write``) does not leave the
    decoder: the transaction's spill is marked failed with one line naming the file, the LSN and the
    error, the file is deleted, the later changes are dropped as they would have spilled (the buffer
    stays bounded), the relations are still known, and the next transaction decodes as usual."""
    from mooncake_assets.engine.cdc.spill import SpillError

    monkeypatch.setenv("MOONCAKE_FAULT", "spill:write=errno:ENOSPC")
    msgs = [(1, REL), (2, m_begin(900, 0, 9))]
    msgs += [(3 + i, m_insert(None, 1, [("t", str(i).encode()), ("t", b"z" * 30)])) for i in range(5000)]
    msgs.append((6000, m_commit(6000, 6001, 0)))
    dec, out, err = _decode(msgs[:-1], tmp_path, 20_000)
    assert err is None and out == []
    assert dec.buffered_bytes < 100_000  # dropped, not kept in memory
    assert list(tmp_path.glob("*.arrow")) == []
    out = dec.feed(msgs[-1][1], msgs[-1][0])
    (t,) = out
    sp = t.spilled
    assert sp is not None and sp.oids == {1}
    assert sp.failed is not None and "\n" not in sp.failed
    assert sp.failed.startswith(f"spilling transaction 9 to {tmp_path / '9.arrow'} failed at LSN 0/3: ")
    assert sp.failed.endswith("OSError: [Errno 28] No space left on device (injected at spill:write)")
    with pytest.raises(SpillError, match="No space left on device"):
        next(sp.runs())
    sp.delete()
    monkeypatch.delenv("MOONCAKE_FAULT")
    again = [(7000, m_begin(7002, 0, 10)), (7001, m_insert(None, 1, [("t", b"1"), ("t", b"a")]))]
    again.append((7002, m_commit(7002, 7003, 0)))
    got = [x for lsn, p in again for x in dec.feed(p, lsn)]
    assert len(got) == 1 and got[0].spilled is None and len(_changes(got[0])) == 1


def test_a_large_transactions_buffers_are_freed_once_it_is_taken():
    """The batch decoder keeps at most 4 MiB of row/cell/value arrays for reuse after a batch is taken:
    a 50,000-row transaction (~12 MiB of arrays while it is buffered) does not leave its capacity
    allocated for the life of the service (it was kept up to 16 MiB)."""
    dec = NativeDecoder(batch=True)
    msgs = [(1, REL), (2, m_begin(900, 0, 9))]
    msgs += [(3 + i, m_insert(None, 1, [("t", str(i).encode()), ("t", b"z" * 84)])) for i in range(50_000)]
    msgs.append((60_000, m_commit(60_000, 60_001, 0)))
    for lsn, payload in msgs:
        dec.feed(payload, lsn)
    held = dec.buffered_bytes
    assert held > 8 << 20  # the committed transaction, not taken yet
    (batch,) = dec.take()
    assert batch.rows == 50_000
    assert dec.buffered_bytes <= 4 << 20, (held, dec.buffered_bytes)
