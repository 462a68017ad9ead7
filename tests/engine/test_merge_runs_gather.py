"""The one-pass join of the compiled decoder's runs in ``merge_runs`` equals the column-by-column join.

Many small transactions of the compiled decoder (NULL, unchanged-TOAST, empty and long values, key-only
and whole old rows) are joined by :func:`merge_runs`; the result must equal the reference decoder's
joined runs, the column-by-column join of the same runs, and split back into each transaction's run.
Joining already-joined runs again takes the same path and must give the same values.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from mooncake_assets.engine.cdc import columnar
from mooncake_assets.engine.cdc.columnar import columnar_transaction, merge_runs, split_by_commit
from mooncake_assets.engine.cdc.native import NativeDecoder
from mooncake_assets.engine.cdc.txn import TransactionAssembler

from .test_native_decoder import m_begin, m_commit, m_delete, m_insert, m_relation, m_update

OID = 16384
COLS = [(1, "id", 23, -1), (0, "a", 25, -1), (0, "b", 25, -1)]


def _cell(rng: random.Random, allow_u: bool) -> tuple[str, bytes | None]:
    r = rng.random()
    if r < 0.2:
        return ("n", None)
    if allow_u and r < 0.3:
        return ("u", None)
    if r < 0.4:
        return ("t", b"")
    return ("t", bytes(rng.randrange(97, 123) for _ in range(rng.choice([1, 5, 300]))))


def _stream(seed: int, kind: str, ntx: int) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    msgs: list[tuple[int, bytes]] = []
    lsn = 1000
    for x in range(ntx):
        lsn += 1000
        msgs.append((lsn, m_begin(lsn + 900, 0, 700 + x)))
        if x == 0:
            msgs.append((lsn + 1, m_relation(None, OID, "public", "t", "d", COLS)))
        for i in range(rng.choice([1, 1, 1, 2, 3])):
            key = [("t", str(rng.randrange(10**6)).encode())]
            new = key + [_cell(rng, kind == "update") for _ in COLS[1:]]
            old_kind = rng.choice(["K", "O"])
            old = key + ([("n", None)] * 2 if old_kind == "K" else [_cell(rng, False) for _ in COLS[1:]])
            if kind == "insert":
                payload = m_insert(None, OID, new)
            elif kind == "update":
                payload = m_update(None, OID, rng.choice([None, old_kind]), old, new)
            else:
                payload = m_delete(None, OID, old_kind, old)
            msgs.append((lsn + 2 + i, payload))
        msgs.append((lsn + 900, m_commit(lsn + 900, lsn + 950, 0)))
    return msgs


@pytest.mark.parametrize("kind", ["insert", "update", "delete"])
@pytest.mark.parametrize("seed", range(4))
def test_one_pass_join_equals_reference_and_column_join(kind, seed, monkeypatch):
    msgs = _stream(seed, kind, 200)
    asm, dec = TransactionAssembler(), NativeDecoder()
    ref = [t for lsn, p in msgs for t in asm.feed_payload(p, lsn)]
    nat = [t for lsn, p in msgs for t in dec.feed(p, lsn)]
    fast = merge_runs(nat)
    assert len(fast) == 1 and fast[0].rows == sum(t.rows for t in nat)
    ref_runs = merge_runs([columnar_transaction(t) for t in ref])
    assert len(ref_runs) == len(fast) and all(x.equals(y) for x, y in zip(ref_runs, fast))
    # the column-by-column join of the same runs (layouts not recognised)
    # the decoder's own layouts are the ones read back from its arrays
    for t in nat:
        for r in t.runs:
            assert r.layouts is not None
            for mine, read in zip(r.layouts, (columnar._layout(r.new), columnar._layout(r.old))):
                assert mine[0] == read[0] and mine[1] is read[1]
                assert (mine[2] is None) == (read[2] is None)
                if mine[2] is not None:
                    assert (mine[2].address, mine[3].address) == (read[2].address, read[3].address)
    layout = columnar._layout
    with monkeypatch.context() as m:
        m.setattr(columnar, "_layout", lambda cells: (layout(cells)[0], None, None, None))
        m.setattr(columnar, "_run_layouts", lambda r: (columnar._layout(r.new), columnar._layout(r.old)))
        slow = merge_runs(nat)
    assert all(x.equals(y) for x, y in zip(slow, fast))
    for col in (fast[0].new or ()) + (fast[0].old or ()):
        col.values.validate(full=True)
        sent = (col.kinds == columnar.KIND_TEXT) | (col.kinds == columnar.KIND_BINARY)
        assert np.array_equal(col.values.is_valid().to_numpy(zero_copy_only=False), sent)
    # split back into each transaction's own run
    parts = split_by_commit(fast[0])
    assert [lsn for lsn, _ in parts] == [t.commit_lsn for t in nat]
    assert all(p.equals(t.runs[0]) for (_, p), t in zip(parts, nat) if len(t.runs) == 1)
    # joined runs joined again (they are in the same layout) give the same values
    half = len(nat) // 2
    a, b = merge_runs(nat[:half]), merge_runs(nat[half:])
    again = merge_runs(
        [
            columnar.ColumnarTransaction(0, 0, 0, nat[0].commit_time, a),
            columnar.ColumnarTransaction(0, 0, 0, nat[0].commit_time, b),
        ]
    )
    assert len(again) == 1 and again[0].equals(fast[0])
