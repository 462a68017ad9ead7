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


def _state(pd: PendingDeletes) -> tuple:
    return (pd.items(), pd.max_lsn(), pd.nbytes, [pd.before(c) for c in range(0, 45, 3)], list(pd.bitmap))


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.one_of(st.integers(0, 3000), st.integers(2**32 - 2, 2**32 + 2)), st.integers(1, 40))),
        max_size=6,
    ),
    sort=st.booleans(),
)
def test_add_many_is_add_one_by_one(batches, sort):
    """A batch of deletes (new positions in bulk, positions deleted again one by one) leaves the same
    entries, runs (hence ``nbytes``), reads at an LSN and newest LSN as adding them one at a time."""
    one, bulk = PendingDeletes(), PendingDeletes()
    for ops in batches:
        ops = sorted(ops, key=lambda o: o[1]) if sort else ops
        for p, lsn in ops:
            one.add(p, lsn)
        bulk.add_many(np.array([p for p, _ in ops], dtype=np.int64), np.array([x for _, x in ops], dtype=np.uint64))
        assert _state(bulk) == _state(one)


def test_add_many_of_new_positions_extends_the_last_run():
    pd = PendingDeletes()
    pd.add_many(np.arange(10, dtype=np.int64), np.full(10, 5, dtype=np.uint64))
    pd.add_many(np.arange(10, 20, dtype=np.int64), np.array([5] * 5 + [6] * 5, dtype=np.uint64))
    pd.add_many(np.array([2**33, 30, 2**33 + 1, 40], dtype=np.int64), np.array([6, 7, 7, 7], dtype=np.uint64))
    ref = {**{p: 5 for p in range(15)}, **{p: 6 for p in range(15, 20)}, 2**33: 6, 30: 7, 2**33 + 1: 7, 40: 7}
    assert pd == ref and pd.max_lsn() == 7
    assert pd.nbytes == 8 * 24 + 16 * 3 + _bitmap_bytes(pd)  # 3 runs (5, 6, 7), positions past 32 bits: 8 B
    # a batch with a position deleted again keeps its newest LSN (beside the runs)
    pd.add_many(np.array([50, 51, 7, 52], dtype=np.int64), np.array([8, 8, 8, 8], dtype=np.uint64))
    assert pd[7] == 8 and pd[50] == 8 and pd.max_lsn() == 8 and len(pd) == 27
    assert pd.nbytes == 8 * 27 + 16 * 4 + _bitmap_bytes(pd) + 100


def _bitmap_bytes(pd: PendingDeletes) -> int:
    st_ = pd.bitmap.get_statistics()
    return int(st_["n_bytes_array_containers"] + st_["n_bytes_run_containers"] + st_["n_bytes_bitset_containers"])
