# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled MemIndex table: key hash → locations ``(batch_id, row)`` of the MemSlice's rows.

See :mod:`.mem_index` for the public face and the measurements. Layout (one flat array of slots, 16
bytes each):

* ``key`` (uint64): the key hash passed through a bijective 64-bit mixer (MurmurHash3's fmix64
  finalizer), so any distribution of the input hashes (small integers, values below 2⁶¹) spreads
  over the table; enumeration inverts the mixer, so no hash value is lost or reserved.
* ``val`` (uint64): ``EMPTY`` (all ones) for a free slot; else a location packed as
  ``batch_id << 32 | row`` (bit 63 clear, as ``batch_id < 2³¹``); else ``LIST | list id`` (bit 63
  set) for a hash with several locations, kept in an overflow vector in insertion order. The empty
  marker lives in ``val``, which a real location never takes, so every hash 0 … 2⁶⁴−1 is a valid key.

Open addressing with linear probing in Robin Hood order (a resident further from its home slot is
never displaced by a newcomer closer to its own), home slot ``(key × capacity) >> 64`` (any
capacity, no power of two), deletion by backward shift (no tombstones). The table grows by ×1.3 when
its distinct hashes pass 7/8 of the capacity, so its load stays in [0.67, 0.875]: 18.3–23.8 bytes per
distinct hash. It grows in place (``_reserve``: realloc, then every resident re-placed), so a growth
never holds the old array beside the new one (that was +16 bytes per slot at the peak). The C loops hold the GIL (no other Python thread runs during one); callers that share
a MemIndex between threads serialize their calls (the table's lock), as with the dict version.
"""

from cpython.mem cimport PyMem_RawFree, PyMem_RawMalloc, PyMem_RawRealloc
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove, memset

import numpy as np

cimport numpy as cnp

from .block import _as_hashes

cnp.import_array()

cdef extern from *:
    """
    static inline uint64_t mc_mulhi(uint64_t a, uint64_t b) {
        return (uint64_t)(((unsigned __int128)a * b) >> 64);
    }
    static inline uint64_t mc_mix(uint64_t x) {  /* fmix64 (MurmurHash3): a bijection of uint64 */
        x ^= x >> 33; x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL;
        x ^= x >> 33; return x;
    }
    static inline uint64_t mc_unmix(uint64_t x) {  /* the inverse of mc_mix */
        x ^= x >> 33; x *= 0x9cb4b2f8129337dbULL;
        x ^= x >> 33; x *= 0x4f74430c22a54005ULL;
        x ^= x >> 33; return x;
    }
    #define mc_prefetch(p) __builtin_prefetch((const void *)(p))
    """
    uint64_t mc_mulhi(uint64_t a, uint64_t b) noexcept nogil
    uint64_t mc_mix(uint64_t x) noexcept nogil
    uint64_t mc_unmix(uint64_t x) noexcept nogil
    void mc_prefetch(const void *p) noexcept nogil

ctypedef struct Slot:
    uint64_t key  # mixed hash
    uint64_t val  # EMPTY, a packed location, or LIST | list id

ctypedef struct LocList:
    uint64_t *data  # packed locations in insertion order (NULL: a free list id)
    uint32_t n      # locations held (for a free id: the next free id + 1, 0 = none)
    uint32_t cap

cdef uint64_t EMPTY = 0xFFFFFFFFFFFFFFFFULL
cdef uint64_t LIST = 0x8000000000000000ULL
cdef uint64_t M32 = 0xFFFFFFFFULL
cdef size_t MIN_CAP = 16

M64 = (1 << 64) - 1
MAX_BATCH_ID = (1 << 31) - 1


def mix(h: int) -> int:
    """The table's mixer of one hash (exposed for tests)."""
    return mc_mix(<uint64_t>(int(h) & M64))


def unmix(x: int) -> int:
    """The inverse of :func:`mix` (exposed for tests)."""
    return mc_unmix(<uint64_t>(int(x) & M64))


cdef inline uint64_t _u64(object h) except? 0xFFFFFFFFFFFFFFFF:
    """A hash given as a Python int (any sign: its low 64 bits) or a numpy integer."""
    cdef uint64_t k
    try:
        k = h
    except OverflowError:
        k = int(h) & M64
    return k


cdef inline uint64_t _location(object batch_id, object row) except 0xFFFFFFFFFFFFFFFF:
    cdef long long b, r
    try:
        b = batch_id
    except OverflowError:
        b = -1
    try:
        r = row
    except OverflowError:
        r = -1
    if b < 0 or b > MAX_BATCH_ID:
        raise ValueError(f"batch_id must be in [0, 2**31), found {batch_id}")
    if r < 0 or r > <long long>M32:
        raise ValueError(f"row must be in [0, 2**32), found {row}")
    return (<uint64_t>b << 32) | <uint64_t>r


cdef inline bint _member(const uint64_t[::1] sorted_ids, Py_ssize_t n, uint64_t b) noexcept nogil:
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if sorted_ids[mid] < b:
            lo = mid + 1
        else:
            hi = mid
    return lo < n and sorted_ids[lo] == b


cdef class MemIndex:
    """Hash → locations of the in-memory rows (several per hash allowed).

    Locations are ``(batch_id, row)``: ``batch_id`` an int in ``[0, 2³¹)``, ``row`` in ``[0, 2³²)``.
    ``len(m)`` is the number of locations. Memory: 16 bytes per slot at a load of 0.67–0.875 distinct
    hashes per slot, plus 8 bytes (×≤2 for vector growth) per location of a hash with several.
    Measured (``python -m mooncake_assets.engine.index.mem_index_bench --sizes 1000000 10000000``,
    tracemalloc / RSS growth per entry): 23.6 / 24.1 bytes at 1M entries, 19.2 / 19.3 at 10M; the
    dict version it replaces: 153 / 408 and 145 / 399 (table in :mod:`.mem_index`).
    """

    cdef Slot *slots
    cdef size_t cap
    cdef size_t used         # distinct hashes in the table
    cdef size_t count        # locations
    cdef LocList *lists
    cdef size_t nlists       # list ids handed out (live or free)
    cdef size_t lists_cap
    cdef size_t free_head    # free list id + 1 (0 = none)
    cdef set _batch_set
    cdef long long _last_batch

    def __cinit__(self):
        self.slots = NULL
        self.cap = self.used = self.count = 0
        self.lists = NULL
        self.nlists = self.lists_cap = self.free_head = 0
        self._batch_set = set()
        self._last_batch = -1

    def __dealloc__(self):
        self._free_all()

    cdef void _free_all(self) noexcept:
        cdef size_t i
        for i in range(self.nlists):
            if self.lists[i].data != NULL:
                PyMem_RawFree(self.lists[i].data)
        PyMem_RawFree(self.lists)
        PyMem_RawFree(self.slots)
        self.slots = NULL
        self.lists = NULL
        self.cap = self.used = self.count = 0
        self.nlists = self.lists_cap = self.free_head = 0

    # -- the table ----------------------------------------------------------------------------
    cdef inline size_t _home(self, uint64_t key) noexcept nogil:
        return <size_t>mc_mulhi(key, <uint64_t>self.cap)

    cdef inline size_t _dist(self, size_t i, uint64_t key) noexcept nogil:
        cdef size_t h = self._home(key)
        return i - h if i >= h else i + self.cap - h

    cdef inline Py_ssize_t _find(self, uint64_t key) noexcept nogil:
        """The slot of ``key`` or -1."""
        if self.cap == 0:
            return -1
        cdef size_t i = self._home(key)
        cdef size_t d = 0
        cdef Slot *s
        while True:
            s = &self.slots[i]
            if s.val == EMPTY:
                return -1
            if s.key == key:
                return <Py_ssize_t>i
            if self._dist(i, s.key) < d:
                return -1
            i += 1
            if i == self.cap:
                i = 0
            d += 1

    cdef inline void _place(self, uint64_t key, uint64_t val) noexcept nogil:
        """Insert a key known to be absent (capacity available), in Robin Hood order."""
        self._robin_hood(key, val, NULL)
        self.used += 1

    cdef inline void _erase(self, size_t i) noexcept nogil:
        """Empty slot ``i`` by backward shift (the following cluster moves one slot home-wards)."""
        cdef size_t j = i + 1
        if j == self.cap:
            j = 0
        while self.slots[j].val != EMPTY and self._dist(j, self.slots[j].key) > 0:
            self.slots[i] = self.slots[j]
            i = j
            j += 1
            if j == self.cap:
                j = 0
        self.slots[i].val = EMPTY
        self.used -= 1

    cdef int _reserve(self, size_t distinct) except -1:
        """Grow (rehash) so ``distinct`` hashes fit under the load limit 7/8. In place: the slot array is
        reallocated (a large one is remapped by the C library, not copied) and every resident re-placed
        under the new capacity, a bitmap (1 bit per slot) telling the re-placed from those not yet
        moved, so a growth needs the new array only, not the old one beside it."""
        if distinct * 8 <= self.cap * 7:
            return 0
        cdef size_t new_cap = self.cap + self.cap * 3 // 10
        if new_cap < MIN_CAP:
            new_cap = MIN_CAP
        while distinct * 8 > new_cap * 7:
            new_cap += new_cap * 3 // 10
        cdef Slot *grown = <Slot *>PyMem_RawRealloc(self.slots, new_cap * sizeof(Slot))
        if grown == NULL:
            raise MemoryError()
        cdef size_t old_cap = self.cap, i
        memset(grown + old_cap, 0xFF, (new_cap - old_cap) * sizeof(Slot))
        cdef uint8_t *done = <uint8_t *>PyMem_RawMalloc((new_cap + 7) // 8)
        if done == NULL:
            self.slots = grown  # (still the old table: the extra slots are empty, beyond its capacity)
            raise MemoryError()
        memset(done, 0, (new_cap + 7) // 8)
        self.slots = grown
        self.cap = new_cap
        cdef uint64_t key, val
        for i in range(old_cap):
            if grown[i].val != EMPTY and not (done[i >> 3] >> (i & 7)) & 1:
                key = grown[i].key
                val = grown[i].val
                grown[i].val = EMPTY
                self._robin_hood(key, val, done)
        PyMem_RawFree(done)
        return 0

    cdef inline void _robin_hood(self, uint64_t key, uint64_t val, uint8_t *done) noexcept nogil:
        """Place ``key`` (absent from the table) in Robin Hood order: walking from its home, it takes the
        first empty slot, or the slot of a resident nearer its own home (which moves on in its stead).
        ``done``: NULL, or during an in-place growth (:meth:`_reserve`) the bitmap of re-placed slots — a
        slot whose resident is not re-placed yet (bit clear) counts as free: the newcomer takes it and
        that resident is placed next, from its own home. Does not count ``used``."""
        cdef size_t i = self._home(key)
        cdef size_t d = 0, rd
        cdef uint64_t tk, tv
        cdef Slot *s
        while True:
            s = &self.slots[i]
            if s.val == EMPTY or (done != NULL and not (done[i >> 3] >> (i & 7)) & 1):
                tk = s.key
                tv = s.val
                s.key = key
                s.val = val
                if done != NULL:
                    done[i >> 3] |= <uint8_t>(1 << (i & 7))
                if tv == EMPTY:
                    return
                key = tk
                val = tv
                i = self._home(key)
                d = 0
                continue
            rd = self._dist(i, s.key)
            if rd < d:
                tk = s.key
                tv = s.val
                s.key = key
                s.val = val
                key = tk
                val = tv
                d = rd
            i += 1
            if i == self.cap:
                i = 0
            d += 1

    # -- overflow vectors ---------------------------------------------------------------------
    cdef int _new_list(self, uint64_t a, uint64_t b, uint64_t *ref) except -1:
        cdef size_t lid
        cdef LocList *grown
        cdef uint64_t *data = <uint64_t *>PyMem_RawMalloc(4 * sizeof(uint64_t))
        if data == NULL:
            raise MemoryError()
        if self.free_head:
            lid = self.free_head - 1
            self.free_head = self.lists[lid].n
        else:
            if self.nlists == self.lists_cap:
                grown = <LocList *>PyMem_RawRealloc(
                    self.lists, (self.lists_cap * 2 + 16) * sizeof(LocList)
                )
                if grown == NULL:
                    PyMem_RawFree(data)
                    raise MemoryError()
                self.lists = grown
                self.lists_cap = self.lists_cap * 2 + 16
            lid = self.nlists
            self.nlists += 1
        data[0] = a
        data[1] = b
        self.lists[lid].data = data
        self.lists[lid].n = 2
        self.lists[lid].cap = 4
        ref[0] = LIST | <uint64_t>lid
        return 0

    cdef inline void _free_list(self, size_t lid) noexcept nogil:
        PyMem_RawFree(self.lists[lid].data)
        self.lists[lid].data = NULL
        self.lists[lid].cap = 0
        self.lists[lid].n = <uint32_t>self.free_head
        self.free_head = lid + 1

    cdef int _append(self, LocList *ls, uint64_t p) except -1:
        cdef uint64_t *grown
        cdef size_t ncap
        if ls.n == ls.cap:
            if ls.cap >= 0x80000000U:
                raise OverflowError("more than 2**32 locations under one hash")
            ncap = <size_t>ls.cap * 2
            grown = <uint64_t *>PyMem_RawRealloc(ls.data, ncap * sizeof(uint64_t))
            if grown == NULL:
                raise MemoryError()
            ls.data = grown
            ls.cap = <uint32_t>ncap
        ls.data[ls.n] = p
        ls.n += 1
        return 0

    # -- one location -------------------------------------------------------------------------
    cdef int _add(self, uint64_t key, uint64_t p) except -1:
        cdef Py_ssize_t i = self._find(key)
        cdef uint64_t v
        if i < 0:
            self._reserve(self.used + 1)
            self._place(key, p)
        else:
            v = self.slots[i].val
            if v & LIST:
                self._append(&self.lists[v & ~LIST], p)
            else:
                self._new_list(v, p, &self.slots[i].val)
        self.count += 1
        return 0

    cdef int _remove(self, uint64_t key, uint64_t p) except -1:
        """Remove location ``p`` under ``key``: 0, or 1 when it is not there."""
        cdef Py_ssize_t i = self._find(key)
        cdef uint64_t v
        cdef LocList *ls
        cdef uint32_t j
        if i < 0:
            return 1
        v = self.slots[i].val
        if v & LIST:
            ls = &self.lists[v & ~LIST]
            j = 0
            while j < ls.n and ls.data[j] != p:
                j += 1
            if j == ls.n:
                return 1
            memmove(&ls.data[j], &ls.data[j + 1], (ls.n - j - 1) * sizeof(uint64_t))
            ls.n -= 1
            if ls.n == 1:
                self.slots[i].val = ls.data[0]
                self._free_list(v & ~LIST)
        elif v == p:
            self._erase(<size_t>i)
        else:
            return 1
        self.count -= 1
        return 0

    cdef inline void _note_batch(self, long long b):
        if b != self._last_batch:
            self._batch_set.add(b)
            self._last_batch = b

    # -- the public API -----------------------------------------------------------------------
    def __len__(self):
        return self.count

    @property
    def batch_ids(self):
        """Batch ids with locations inserted (and not dropped), ascending."""
        return sorted(self._batch_set)

    @property
    def nbytes(self):
        """Bytes held by the table and its overflow vectors (not the Python object itself)."""
        cdef size_t n = self.cap * sizeof(Slot) + self.lists_cap * sizeof(LocList), i
        for i in range(self.nlists):
            n += self.lists[i].cap * sizeof(uint64_t)
        return n

    @property
    def capacity(self):
        """Slots allocated (16 bytes each)."""
        return self.cap

    def insert(self, hashes, batch_id, rows=None):
        """Add locations ``(batch_id, rows[i])`` under ``hashes[i]``.

        ``hashes``: uint64 (n,) (:class:`~.key_hash.KeyHash` of the batch's keys); ``rows``: int (n,) row
        offsets in the batch, default ``0..n-1``. Raises ``ValueError`` for bad ids or lengths.
        """
        h = np.ascontiguousarray(_as_hashes(hashes))
        cdef Py_ssize_t n = len(h), i
        cdef uint64_t base = _location(batch_id, 0)
        if rows is None:
            r = np.arange(n, dtype=np.uint64)
        else:
            r = np.asarray(rows)
            if r.shape != (n,):
                raise ValueError(f"hashes and rows must have one length, found {n} and {r.shape}")
            if n and (int(r.min()) < 0 or int(r.max()) >= 1 << 32):
                raise ValueError("rows must be in [0, 2**32)")
            r = np.ascontiguousarray(r, dtype=np.uint64)
        if n == 0:
            return
        cdef const uint64_t[::1] hv = h
        cdef const uint64_t[::1] rv = r
        self._note_batch(<long long>(base >> 32))
        for i in range(n):
            self._add(mc_mix(hv[i]), base | rv[i])

    def insert_one(self, h, batch_id, row):
        """Add one location ``(batch_id, row)`` under hash ``h`` (an int): the per-row path."""
        cdef uint64_t p = _location(batch_id, row)
        cdef uint64_t key = mc_mix(_u64(h))
        self._note_batch(<long long>(p >> 32))
        self._add(key, p)

    def lookup(self, h):
        """Every (batch_id, row) under hash ``h``, in insertion order."""
        cdef Py_ssize_t i = self._find(mc_mix(_u64(h)))
        cdef uint64_t v
        cdef LocList *ls
        cdef uint32_t j
        if i < 0:
            return []
        v = self.slots[i].val
        if not v & LIST:
            return [(<long long>(v >> 32), <long long>(v & M32))]
        ls = &self.lists[v & ~LIST]
        out = []
        for j in range(ls.n):
            out.append((<long long>(ls.data[j] >> 32), <long long>(ls.data[j] & M32)))
        return out

    def lookup_batch(self, hashes):
        """Every location of many hashes: ``(query_index int64, batch_id int64, row uint32)`` (m,),
        ``query_index`` non-decreasing, locations of one hash in insertion order."""
        q = np.ascontiguousarray(_as_hashes(hashes))
        cdef const uint64_t[::1] qv = q
        cdef Py_ssize_t n = len(q)
        cdef Py_ssize_t i, si, m = 0
        cdef Py_ssize_t room = n if n > 16 else 16
        cdef int64_t *qi = <int64_t *>PyMem_RawMalloc(room * sizeof(int64_t))
        cdef uint64_t *locs = <uint64_t *>PyMem_RawMalloc(room * sizeof(uint64_t))
        cdef uint64_t v, key
        cdef LocList *ls
        cdef uint32_t j, k
        cdef void *g1
        cdef void *g2
        try:
            if qi == NULL or locs == NULL:
                raise MemoryError()
            for i in range(n):
                if i + 8 < n and self.cap:
                    mc_prefetch(&self.slots[self._home(mc_mix(qv[i + 8]))])
                si = self._find(mc_mix(qv[i]))
                if si < 0:
                    continue
                v = self.slots[si].val
                k = 1 if not v & LIST else self.lists[v & ~LIST].n
                if m + k > room:
                    while m + k > room:
                        room *= 2
                    g1 = PyMem_RawRealloc(qi, room * sizeof(int64_t))
                    if g1 != NULL:
                        qi = <int64_t *>g1
                    g2 = PyMem_RawRealloc(locs, room * sizeof(uint64_t))
                    if g2 != NULL:
                        locs = <uint64_t *>g2
                    if g1 == NULL or g2 == NULL:
                        raise MemoryError()
                if not v & LIST:
                    qi[m] = i
                    locs[m] = v
                    m += 1
                else:
                    ls = &self.lists[v & ~LIST]
                    for j in range(k):
                        qi[m] = i
                        locs[m] = ls.data[j]
                        m += 1
            out_q = np.empty(m, dtype=np.int64)
            out_p = np.empty(m, dtype=np.uint64)
            if m:
                memcpy(cnp.PyArray_DATA(out_q), qi, m * sizeof(int64_t))
                memcpy(cnp.PyArray_DATA(out_p), locs, m * sizeof(uint64_t))
        finally:
            PyMem_RawFree(qi)
            PyMem_RawFree(locs)
        return out_q, (out_p >> np.uint64(32)).astype(np.int64), (out_p & np.uint64(0xFFFFFFFF)).astype(np.uint32)

    def remove(self, h, location):
        """Remove one location (a DELETE that hit an in-memory row). Raises ``KeyError`` when
        ``location`` is not under ``h`` (the caller's invariant is broken: report it)."""
        cdef uint64_t k = _u64(h)
        cdef uint64_t key = mc_mix(k)
        batch_id, row = int(location[0]), int(location[1])
        cdef Py_ssize_t i = self._find(key)
        if i < 0:
            raise KeyError(f"hash {k:#018x} is not in the MemIndex")
        if not (0 <= batch_id <= MAX_BATCH_ID and 0 <= row <= M32) or self._remove(key, _location(batch_id, row)):
            raise KeyError(f"location {(batch_id, row)} is not under hash {k:#018x}")

    def remove_many(self, hashes, locations):
        """:meth:`remove` of many locations (``hashes[i]``: the hash ``locations[i]`` is under), in
        order. Raises ``KeyError`` as :meth:`remove` (the locations before the bad one are removed)."""
        for h, loc in zip(hashes, locations):
            self.remove(h, loc)

    cdef tuple _collect(self, long long only):
        """Every location (of batch ``only``; -1: all) as (hashes uint64, packed uint64), sorted by
        packed location (batch, then row; scan order among equal ones)."""
        cdef Py_ssize_t m = 0
        cdef size_t i
        cdef uint32_t j
        cdef uint64_t v, p
        cdef LocList *ls
        cdef bint all_ = only < 0
        cdef uint64_t want = <uint64_t>only if only >= 0 else 0
        for i in range(self.cap):
            v = self.slots[i].val
            if v == EMPTY:
                continue
            if not v & LIST:
                if all_ or v >> 32 == want:
                    m += 1
            else:
                ls = &self.lists[v & ~LIST]
                if all_:
                    m += ls.n
                else:
                    for j in range(ls.n):
                        if ls.data[j] >> 32 == want:
                            m += 1
        hs = np.empty(m, dtype=np.uint64)
        ps = np.empty(m, dtype=np.uint64)
        cdef uint64_t[::1] hv = hs
        cdef uint64_t[::1] pv = ps
        cdef Py_ssize_t o = 0
        for i in range(self.cap):  # (the bounds checks keep memory safe should the table change between passes)
            v = self.slots[i].val
            if v == EMPTY:
                continue
            if not v & LIST:
                if (all_ or v >> 32 == want) and o < m:
                    hv[o] = mc_unmix(self.slots[i].key)
                    pv[o] = v
                    o += 1
            else:
                ls = &self.lists[v & ~LIST]
                for j in range(ls.n):
                    p = ls.data[j]
                    if (all_ or p >> 32 == want) and o < m:
                        hv[o] = mc_unmix(self.slots[i].key)
                        pv[o] = p
                        o += 1
        order = np.argsort(ps[:o], kind="stable")
        return hs[:o][order], ps[:o][order]

    def batch_entries(self, batch_id):
        """Live locations of one batch: ``(hashes uint64 (n,), rows uint32 (n,))`` in row order (the
        MemSlice inserts a batch's rows in row order; removed locations left out). O(capacity)."""
        b = int(batch_id)
        if b not in self._batch_set:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint32)
        hs, ps = self._collect(b)
        return hs, (ps & np.uint64(0xFFFFFFFF)).astype(np.uint32)

    def entries(self, batch_ids=None):
        """Live locations of ``batch_ids`` (default all, ascending), batch by batch, rows in order:
        ``(hashes uint64, batch_ids int64, rows uint32)`` (n,). One O(capacity) scan."""
        hs, ps = self._collect(-1)
        bs = (ps >> np.uint64(32)).astype(np.int64)
        rs = (ps & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        if batch_ids is None:
            return hs, bs, rs
        parts = [(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.uint32))]
        for b in batch_ids:
            lo, hi = np.searchsorted(bs, int(b), "left"), np.searchsorted(bs, int(b), "right")
            parts.append((hs[lo:hi], bs[lo:hi], rs[lo:hi]))
        return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))

    def drop_batches(self, batch_ids):
        """Forget every location of ``batch_ids`` (after their rows were flushed). One O(capacity)
        pass, in place."""
        ids = {int(b) for b in batch_ids} & self._batch_set
        if not ids:
            return
        if ids == self._batch_set:
            self.clear()
            return
        drop = np.array(sorted(ids), dtype=np.uint64)
        cdef const uint64_t[::1] dv = drop
        cdef Py_ssize_t nd = len(drop)
        cdef size_t i = 0, visited = 0
        cdef uint32_t j, o
        cdef uint64_t v
        cdef LocList *ls
        # visit every slot once; a backward shift moves the next slot's entry into slot i, so i is
        # looked at again (nothing skipped; keeping an entry twice is harmless)
        while visited < self.cap:
            v = self.slots[i].val
            if v != EMPTY:
                if not v & LIST:
                    if _member(dv, nd, v >> 32):
                        self._erase(i)
                        self.count -= 1
                        continue
                else:
                    ls = &self.lists[v & ~LIST]
                    o = 0
                    for j in range(ls.n):
                        if not _member(dv, nd, ls.data[j] >> 32):
                            ls.data[o] = ls.data[j]
                            o += 1
                    self.count -= ls.n - o
                    ls.n = o
                    if o == 0:
                        self._free_list(v & ~LIST)
                        self._erase(i)
                        continue
                    if o == 1:
                        self.slots[i].val = ls.data[0]
                        self._free_list(v & ~LIST)
            i += 1
            if i == self.cap:
                i = 0
            visited += 1
        self._batch_set -= ids
        self._last_batch = -1

    def drop_first(self, k):
        """Forget every location of batches ``0 … k-1`` and renumber each later batch ``b`` as
        ``b - k``, in place: what a MemSlice does when its first ``k`` batches leave for a data file
        (the rows of later batches keep their hashes and row offsets). ``k``: int ≥ 0 (0 changes
        nothing). Two O(capacity) passes (:meth:`drop_batches`, then one that lowers every packed
        location by ``k << 32``; a slot's key, hence its place, does not change), no re-placement."""
        cdef long long kk = int(k)
        cdef uint64_t sub
        cdef size_t i
        cdef uint32_t j
        cdef uint64_t v
        cdef LocList *ls
        if kk < 0:
            raise ValueError(f"k must be >= 0, found {k}")
        if kk == 0:
            return
        self.drop_batches(range(kk))
        sub = (<uint64_t>kk) << 32
        for i in range(self.cap):
            v = self.slots[i].val
            if v == EMPTY:
                continue
            if not v & LIST:
                self.slots[i].val = v - sub
            else:
                ls = &self.lists[v & ~LIST]
                for j in range(ls.n):
                    ls.data[j] -= sub
        self._batch_set = {b - kk for b in self._batch_set}
        self._last_batch = -1

    def clear(self):
        """Forget everything (and free the table)."""
        self._free_all()
        self._batch_set = set()
        self._last_batch = -1

    def __repr__(self):
        return f"MemIndex({self.count} locations, {self.used} hashes, capacity {self.cap})"

