"""The pending position deletes of a data file (engine/table/pending_deletes.py) against the
``dict[int, int]`` they replace: the same entries, reads at an LSN and newest LSN. In-process."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from mooncake_assets.engine.table.disk_files import DiskFile
from mooncake_assets.engine.table.pending_deletes import PendingDeletes

# (position, lsn) in apply order: LSNs mostly non-decreasing (commit order) with repeats, some positions
# deleted again, a few past 32 bits
_ops = st.lists(
    st.tuples(st.one_of(st.integers(0, 300), st.integers(2**32 - 2, 2**32 + 2)), st.integers(1, 40)),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops=_ops, cut=st.integers(0, 42))
def test_same_as_a_dict(ops, cut):
    ref: dict[int, int] = {}
    pd = PendingDeletes()
    for p, lsn in sorted(ops, key=lambda o: o[1]) if cut % 2 else ops:
        ref[p] = lsn
        pd[p] = lsn
    assert pd == ref and len(pd) == len(ref) and bool(pd) == bool(ref)
    assert sorted(pd.items()) == sorted(ref.items()) and pd.items() == sorted(ref.items())
    assert list(pd.keys()) == sorted(ref) and pd.values() == [ref[p] for p in sorted(ref)]
    assert all(pd[p] == v and pd.get(p) == v and p in pd for p, v in ref.items())
    assert pd.get(10**12) is None and 10**12 not in pd
    assert pd.max_lsn() == max(ref.values(), default=0)
    assert pd.before(cut) == BitMap64(p for p, at in ref.items() if at < cut)
    assert pd.bitmap == BitMap64(ref)
    pos, lsn = pd.arrays()
    assert dict(zip(pos.tolist(), lsn.tolist())) == ref
    again = PendingDeletes.from_arrays(pos, lsn)
    assert again == ref
    assert (pd.nbytes > 0) == bool(ref)


def test_one_transaction_is_one_run_and_a_few_bytes_per_delete():
    pd = PendingDeletes()
    pd.add_many(np.arange(1_000_000, dtype=np.uint64), np.full(1_000_000, 77, dtype=np.uint64))
    assert len(pd) == 1_000_000 and pd.max_lsn() == 77
    assert pd.nbytes < 5 * 1_000_000  # 4 B per position + the bitmap (a dict: ~100 B per entry)
    assert len(pd.before(77)) == 0 and len(pd.before(78)) == 1_000_000


def test_a_disk_file_takes_a_plain_mapping():
    f = DiskFile(name="a.parquet", num_rows=10, size_bytes=1, pending={3: 5})
    assert isinstance(f.pending, PendingDeletes) and f.pending == {3: 5}
    f.pending = {}
    assert isinstance(f.pending, PendingDeletes) and f.pending == {} and not f.pending
    f.pending = {1: 4, 2: 9}
    assert f.is_deleted(1) and not f.is_deleted(3)
    assert list(f.deleted_at(5)) == [1] and list(f.deleted_at(None)) == [1, 2] and f.deleted_count() == 2
