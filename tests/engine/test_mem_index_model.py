"""Model-based test of the compiled MemIndex against a dict of lists (hash → locations in insertion order).

Random inserts (vectorised and per row), removes (one and many), lookups (single and batched), drops of batches
(any, and the first k with the rest renumbered), entries, clears; hashes drawn from a small pool (so hashes repeat: equal rows of key-less tables) that
holds the extremes 0 and 2⁶⁴−1 and values the mixer sends next to each other; bursts of many distinct
hashes force the table through many rehashes. No Postgres.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from mooncake_assets.engine.index import MemIndex
from mooncake_assets.engine.index._mem_index import mix, unmix

M64 = (1 << 64) - 1
POOL = [0, 1, 2, M64, M64 - 1, 1 << 63, (1 << 63) - 1, 0xDEADBEEF, unmix(0), unmix(M64), unmix(1), unmix(1 << 63)]
HASH = st.one_of(st.sampled_from(POOL), st.integers(0, M64))


class Model:
    """The reference: hash → [(batch, row)] in insertion order, plus the batch ids seen."""

    def __init__(self) -> None:
        self.map: dict[int, list[tuple[int, int]]] = {}
        self.batches: set[int] = set()

    def add(self, h: int, b: int, r: int) -> None:
        self.map.setdefault(h, []).append((b, r))
        self.batches.add(b)

    def entries(self) -> list[tuple[int, int, int]]:
        return sorted((h, b, r) for h, locs in self.map.items() for b, r in locs)


class MemIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = MemIndex()
        self.model = Model()
        self.next_row: dict[int, int] = {}

    def _rows(self, b: int, n: int) -> list[int]:
        r0 = self.next_row.get(b, 0)
        self.next_row[b] = r0 + n
        return list(range(r0, r0 + n))

    @rule(b=st.integers(0, 5), hs=st.lists(HASH, min_size=0, max_size=12))
    def insert(self, b, hs):
        rows = self._rows(b, len(hs))
        self.m.insert(np.array(hs, dtype=np.uint64), b, rows)
        for h, r in zip(hs, rows):
            self.model.add(h, b, r)

    @rule(b=st.integers(0, 5), h=HASH, signed=st.booleans())
    def insert_one(self, b, h, signed):
        (r,) = self._rows(b, 1)
        self.m.insert_one(h - (1 << 64) if signed and h >= 1 << 63 else h, b, r)
        self.model.add(h, b, r)

    @rule(b=st.integers(6, 8), n=st.integers(100, 1500), seed=st.integers(0, 2**32 - 1))
    def burst(self, b, n, seed):
        """Many distinct hashes at once: several rehashes."""
        hs = np.random.default_rng(seed).integers(0, M64, size=n, dtype=np.uint64, endpoint=True)
        rows = self._rows(b, n)
        self.m.insert(hs, b, np.array(rows))
        for h, r in zip(hs.tolist(), rows):
            self.model.add(h, b, r)

    @rule(data=st.data())
    def remove(self, data):
        if not self.model.map:
            return
        h = data.draw(st.sampled_from(sorted(self.model.map)))
        loc = data.draw(st.sampled_from(self.model.map[h]))
        self.m.remove(h, loc)
        self.model.map[h].remove(loc)
        if not self.model.map[h]:
            del self.model.map[h]
        with pytest.raises(KeyError):
            self.m.remove(h, (loc[0], 1 << 31))  # never inserted

    @rule(data=st.data())
    def remove_many(self, data):
        pairs = [(h, loc) for h, locs in self.model.map.items() for loc in locs]
        if not pairs:
            return
        picked = data.draw(st.lists(st.sampled_from(pairs), max_size=6, unique=True))
        self.m.remove_many([h for h, _ in picked], [loc for _, loc in picked])
        for h, loc in picked:
            self.model.map[h].remove(loc)
            if not self.model.map[h]:
                del self.model.map[h]

    @rule(h=HASH)
    def remove_missing(self, h):
        if h not in self.model.map:
            with pytest.raises(KeyError):
                self.m.remove(h, (0, 0))

    @rule(ids=st.sets(st.integers(0, 8), max_size=4))
    def drop_batches(self, ids):
        self.m.drop_batches(ids)
        for h in list(self.model.map):
            self.model.map[h] = [loc for loc in self.model.map[h] if loc[0] not in ids]
            if not self.model.map[h]:
                del self.model.map[h]
        self.model.batches -= ids

    @rule(k=st.integers(0, 9))
    def drop_first(self, k):
        """A MemSlice releasing its first k batches: theirs go, later ones are renumbered b - k."""
        self.m.drop_first(k)
        for h in list(self.model.map):
            self.model.map[h] = [(b - k, r) for b, r in self.model.map[h] if b >= k]
            if not self.model.map[h]:
                del self.model.map[h]
        self.model.batches = {b - k for b in self.model.batches if b >= k}
        self.next_row = {b - k: n for b, n in self.next_row.items() if b >= k}

    @rule()
    def clear(self):
        self.m.clear()
        self.model = Model()

    @rule(hs=st.lists(HASH, max_size=10))
    def lookup_batch(self, hs):
        qi, b, r = self.m.lookup_batch(np.array(hs, dtype=np.uint64))
        want = [(i, lb, lr) for i, h in enumerate(hs) for lb, lr in self.model.map.get(h, [])]
        assert list(zip(qi.tolist(), b.tolist(), r.tolist())) == want
        assert qi.dtype == np.int64 and b.dtype == np.int64 and r.dtype == np.uint32

    @rule(b=st.integers(0, 8))
    def batch_entries(self, b):
        h, r = self.m.batch_entries(b)
        want = sorted((lr, lh) for lh, locs in self.model.map.items() for lb, lr in locs if lb == b)
        assert list(zip(r.tolist(), h.tolist())) == want

    @invariant()
    def agrees(self):
        assert len(self.m) == sum(len(v) for v in self.model.map.values())
        assert self.m.batch_ids == sorted(self.model.batches)
        for h in POOL + list(self.model.map)[:20]:
            assert self.m.lookup(h) == self.model.map.get(h, [])
        h, b, r = self.m.entries()
        assert sorted(zip(h.tolist(), b.tolist(), r.tolist())) == self.model.entries()
        assert b.tolist() == sorted(b.tolist())


def test_mem_index_against_dict_model():
    run_state_machine_as_test(
        MemIndexMachine,
        settings=settings(
            max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )


@given(st.integers(0, M64))
def test_mixer_is_a_bijection(h):
    assert unmix(mix(h)) == h and mix(unmix(h)) == h


def test_extremes_and_sentinel_free():
    m = MemIndex()
    extremes = (0, M64, unmix(M64), unmix(1))  # also hashes whose mixed value is all ones (0 mixes to 0)
    for h in extremes:
        m.insert_one(h, 0, len(m))
    assert [m.lookup(h) for h in extremes] == [[(0, 0)], [(0, 1)], [(0, 2)], [(0, 3)]]
    assert m.lookup(-1) == [(0, 1)]  # the low 64 bits of a negative int
    m.insert_one(M64, 1, 0)
    assert m.lookup(M64) == [(0, 1), (1, 0)]
    m.insert_one(np.uint64(7), 1, 1)  # numpy integers too
    assert m.lookup(np.uint64(7)) == [(1, 1)] and m.lookup(7) == [(1, 1)]
    m.insert_one(5, (1 << 31) - 1, (1 << 32) - 1)  # the largest location
    assert m.lookup(5) == [((1 << 31) - 1, (1 << 32) - 1)]
    for bad in ((1 << 31, 0), (-1, 0), (0, 1 << 32), (0, -1), (1 << 70, 0)):
        with pytest.raises(ValueError):
            m.insert_one(1, *bad)


def test_growth_through_many_rehashes_and_shrinking_by_removal():
    m = MemIndex()
    rng = np.random.default_rng(7)
    hs = np.unique(rng.integers(0, M64, size=200_000, dtype=np.uint64, endpoint=True))
    caps = set()
    for i in range(0, len(hs), 5000):  # grow in steps: every rehash keeps every location
        m.insert(hs[i : i + 5000], i // 5000)
        caps.add(m.capacity)
    assert len(caps) > 10 and len(m) == len(hs)
    qi, b, r = m.lookup_batch(hs)
    assert qi.tolist() == list(range(len(hs)))
    assert (b * 5000 + r).tolist() == list(range(len(hs)))
    assert m.capacity * 7 >= len(hs) * 8 and m.capacity * 0.67 <= len(hs) + 16  # load within [0.67, 7/8]
    for i in range(0, len(hs), 2):  # backward-shift deletion of half the table
        m.remove(int(hs[i]), (i // 5000, i % 5000))
    qi, b, r = m.lookup_batch(hs)
    assert qi.tolist() == list(range(1, len(hs), 2))
    m.drop_batches(range(0, 40, 2))
    assert len(m) == len([i for i in range(1, len(hs), 2) if (i // 5000) % 2])
    assert m.entries()[1].tolist() == sorted(m.entries()[1].tolist())


def test_many_equal_hashes_stay_linear():
    """A key-less table of equal rows: one hash, many locations (an overflow vector, not a probe chain)."""
    m = MemIndex()
    m.insert(np.zeros(50_000, np.uint64), 0)
    for r in range(50_000):
        m.insert_one(0, 1, r)
    assert len(m) == 100_000 and m.capacity == 16
    assert m.lookup(0)[:2] == [(0, 0), (0, 1)] and m.lookup(0)[-1] == (1, 49_999)
    m.drop_batches([0])
    assert len(m) == 50_000 and m.lookup(0)[0] == (1, 0)
    for r in range(49_999):
        m.remove(0, (1, r))
    assert m.lookup(0) == [(1, 49_999)]
    m.remove(0, (1, 49_999))
    assert len(m) == 0 and m.lookup(0) == [] and m.batch_ids == [1]


def test_drop_first_renumbers_single_and_listed_locations():
    """Batches 0-1 go; 2 and 3 become 0 and 1, whether a hash has one location or several (an
    overflow vector), and the table keeps working (inserts, removes, lookups) after it."""
    m = MemIndex()
    m.insert(np.arange(100, dtype=np.uint64), 0)
    m.insert(np.arange(100, dtype=np.uint64), 1)
    m.insert(np.arange(50, 150, dtype=np.uint64), 2)
    m.insert_one(60, 3, 6)
    m.insert_one(7, 3, 5)
    m.drop_first(2)
    assert m.batch_ids == [0, 1] and len(m) == 102
    assert m.lookup(60) == [(0, 10), (1, 6)]  # a listed hash
    assert m.lookup(7) == [(1, 5)] and m.lookup(149) == [(0, 99)] and m.lookup(10) == []
    qi, b, r = m.lookup_batch(np.array([60, 149], dtype=np.uint64))
    assert list(zip(qi.tolist(), b.tolist(), r.tolist())) == [(0, 0, 10), (0, 1, 6), (1, 0, 99)]
    m.insert_one(60, 1, 7)
    m.drop_first(1)
    assert m.lookup(60) == [(0, 6), (0, 7)] and m.lookup(7) == [(0, 5)] and len(m) == 3 and m.batch_ids == [0]
    m.remove(7, (0, 5))
    assert m.lookup(7) == [] and len(m) == 2
    m.drop_first(0)
    assert len(m) == 2
    with pytest.raises(ValueError):
        m.drop_first(-1)
    m.drop_first(5)
    assert len(m) == 0 and m.batch_ids == []
