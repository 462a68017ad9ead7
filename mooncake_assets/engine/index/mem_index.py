"""MemIndex: key hash → (batch id, row) for the rows of the in-memory MemSlice.

docs/architecture.md#apply: INSERT adds
the row's location, a DELETE that hits the MemIndex marks the batch's deletion vector and removes the
location here, and at flush the flushed batches' locations become file locations in one new IndexBlock
(built by the table's flush from the drained hashes) and are dropped from here.

A plain ``dict`` from the hash (int) to one packed location ``batch_id << 32 | row`` or, when several
rows share the hash (tables without a primary key, a key deleted and inserted again in one batch, or a
collision of non-integer keys), a list of them. Inserts of a whole batch go through ``dict.update``
(:meth:`MemIndex.insert`), single rows through :meth:`MemIndex.insert_one`; the locations inserted per
batch are also kept in insertion order, so the flush reads them back as arrays.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from .block import _as_hashes

__all__ = ["MemIndex"]

_M64 = (1 << 64) - 1
MAX_BATCH_ID = (1 << 31) - 1


def _add(v: int | list[int], p: int) -> list[int]:
    if isinstance(v, list):
        v.append(p)
        return v
    return [v, p]


class MemIndex:
    """Hash → locations of the in-memory rows (several per hash allowed).

    Locations are ``(batch_id, row)``: ``batch_id`` an int in ``[0, 2³¹)``, ``row`` in ``[0, 2³²)``.
    ``len(m)`` is the number of locations.
    """

    def __init__(self) -> None:
        self._map: dict[int, int | list[int]] = {}
        self._batches: dict[int, tuple[list[int], list[int]]] = {}  # batch -> (hashes, rows) as inserted
        self._removed: dict[int, set[int]] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def batch_ids(self) -> list[int]:
        """Batch ids with locations inserted (and not dropped), ascending."""
        return sorted(self._batches)

    def insert(self, hashes: npt.ArrayLike, batch_id: int, rows: npt.ArrayLike | None = None) -> None:
        """Add locations ``(batch_id, rows[i])`` under ``hashes[i]``.

        ``hashes``: uint64 (n,) (:class:`~.key_hash.KeyHash` of the batch's keys); ``rows``: int (n,) row
        offsets in the batch, default ``0..n-1``. Raises ``ValueError`` for bad ids or lengths.
        """
        h = _as_hashes(hashes)
        n = len(h)
        batch_id = int(batch_id)
        if not 0 <= batch_id <= MAX_BATCH_ID:
            raise ValueError(f"batch_id must be in [0, 2**31), found {batch_id}")
        if rows is None:
            r = np.arange(n, dtype=np.uint64)
        else:
            r = np.asarray(rows)
            if r.shape != (n,):
                raise ValueError(f"hashes and rows must have one length, found {n} and {r.shape}")
            if n and (int(r.min()) < 0 or int(r.max()) >= 1 << 32):
                raise ValueError("rows must be in [0, 2**32)")
            r = r.astype(np.uint64)
        if n == 0:
            return
        hl = h.tolist()
        rl = r.tolist()
        self._append(batch_id, hl, rl)
        packed = (np.uint64(batch_id) << np.uint64(32)) | r
        m = self._map
        before = len(m)
        if m.keys().isdisjoint(hl):  # the common case: every hash is new
            m.update(zip(hl, packed.tolist()))
            if len(m) != before + n:  # repeated hashes inside the batch: rebuild them as lists
                _, inv, cnt = np.unique(h, return_inverse=True, return_counts=True)
                rep = cnt[inv] > 1
                dups: dict[int, list[int]] = {}
                for k, p in zip(h[rep].tolist(), packed[rep].tolist()):
                    dups.setdefault(k, []).append(p)
                m.update(dups)
        else:
            for k, p in zip(hl, packed.tolist()):
                v = m.get(k)
                m[k] = p if v is None else _add(v, p)
        self._len += n

    def insert_one(self, h: int, batch_id: int, row: int) -> None:
        """Add one location ``(batch_id, row)`` under hash ``h`` (an int): the per-row path, no numpy."""
        k = int(h) & _M64
        batch_id = int(batch_id)
        row = int(row)
        if not 0 <= batch_id <= MAX_BATCH_ID:
            raise ValueError(f"batch_id must be in [0, 2**31), found {batch_id}")
        if not 0 <= row < 1 << 32:
            raise ValueError(f"row must be in [0, 2**32), found {row}")
        self._append(batch_id, (k,), (row,))
        p = (batch_id << 32) | row
        v = self._map.get(k)
        self._map[k] = p if v is None else _add(v, p)
        self._len += 1

    def _append(self, batch_id: int, hashes: Sequence[int], rows: Sequence[int]) -> None:
        lists = self._batches.get(batch_id)
        if lists is None:
            lists = self._batches[batch_id] = ([], [])
        lists[0].extend(hashes)
        lists[1].extend(rows)
        removed = self._removed.get(batch_id)
        if removed:
            removed.difference_update(rows)

    def lookup(self, h: int) -> list[tuple[int, int]]:
        """Every (batch_id, row) under hash ``h``, in insertion order."""
        v = self._map.get(int(h) & _M64)
        if v is None:
            return []
        if isinstance(v, list):
            return [(p >> 32, p & 0xFFFFFFFF) for p in v]
        return [(v >> 32, v & 0xFFFFFFFF)]

    def lookup_batch(self, hashes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every location of many hashes: ``(query_index int64, batch_id int64, row uint32)`` (m,),
        ``query_index`` non-decreasing."""
        q = _as_hashes(hashes)
        qi: list[int] = []
        locs: list[int] = []
        get = self._map.get
        for i, k in enumerate(q.tolist()):
            v = get(k)
            if v is None:
                continue
            if isinstance(v, list):
                qi.extend([i] * len(v))
                locs.extend(v)
            else:
                qi.append(i)
                locs.append(v)
        p = np.array(locs, dtype=np.uint64)
        return (
            np.array(qi, dtype=np.int64),
            (p >> np.uint64(32)).astype(np.int64),
            (p & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        )

    def remove(self, h: int, location: tuple[int, int]) -> None:
        """Remove one location (a DELETE that hit an in-memory row). Raises ``KeyError`` when
        ``location`` is not under ``h`` (the caller's invariant is broken: report it)."""
        k = int(h) & _M64
        batch_id, row = int(location[0]), int(location[1])
        p = (batch_id << 32) | row
        v = self._map.get(k)
        if v is None:
            raise KeyError(f"hash {k:#018x} is not in the MemIndex")
        if isinstance(v, list):
            try:
                v.remove(p)
            except ValueError:
                raise KeyError(f"location {(batch_id, row)} is not under hash {k:#018x}") from None
            if len(v) == 1:
                self._map[k] = v[0]
        elif v == p:
            del self._map[k]
        else:
            raise KeyError(f"location {(batch_id, row)} is not under hash {k:#018x}")
        self._removed.setdefault(batch_id, set()).add(row)
        self._len -= 1

    def remove_many(self, hashes: Sequence[int], locations: Sequence[tuple[int, int]]) -> None:
        """:meth:`remove` of many locations (``hashes[i]``: the hash ``locations[i]`` is under). Raises
        ``KeyError`` as :meth:`remove` (the locations before the bad one are removed)."""
        m = self._map
        removed = self._removed
        for h, (batch_id, row) in zip(hashes, locations):
            k = int(h) & _M64
            p = (int(batch_id) << 32) | int(row)
            v = m.get(k)
            if v is not None and v.__class__ is int and v == p:
                del m[k]
            else:
                self.remove(h, (batch_id, row))
                continue
            s = removed.get(batch_id)
            if s is None:
                s = removed[batch_id] = set()
            s.add(row)
            self._len -= 1

    def batch_entries(self, batch_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Live locations of one batch: ``(hashes uint64 (n,), rows uint32 (n,))`` in insertion order
        (removed locations left out)."""
        lists = self._batches.get(int(batch_id))
        if not lists:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint32)
        h = np.array(lists[0], dtype=np.uint64)
        r = np.array(lists[1], dtype=np.uint64)
        removed = self._removed.get(int(batch_id))
        if removed:
            keep = ~np.isin(r, np.fromiter(removed, dtype=np.uint64, count=len(removed)))
            h, r = h[keep], r[keep]
        return h, r.astype(np.uint32)

    def entries(self, batch_ids: Iterable[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Live locations of ``batch_ids`` (default all), batch by batch:
        ``(hashes uint64, batch_ids int64, rows uint32)`` (n,)."""
        ids = self.batch_ids if batch_ids is None else [int(b) for b in batch_ids]
        hs, bs, rs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)], [np.zeros(0, np.uint32)]
        for b in ids:
            h, r = self.batch_entries(b)
            hs.append(h)
            rs.append(r)
            bs.append(np.full(len(h), b, dtype=np.int64))
        return np.concatenate(hs), np.concatenate(bs), np.concatenate(rs)

    def drop_batches(self, batch_ids: Iterable[int]) -> None:
        """Forget every location of ``batch_ids`` (after their rows were flushed)."""
        ids = {int(b) for b in batch_ids} & set(self._batches)
        if not ids:
            return
        if ids == set(self._batches):
            self._map.clear()
            self._batches.clear()
            self._removed.clear()
            self._len = 0
            return
        m = self._map
        for b in ids:
            h, r = self.batch_entries(b)
            for k, p in zip(h.tolist(), ((np.uint64(b) << np.uint64(32)) | r.astype(np.uint64)).tolist()):
                v = m[k]
                if isinstance(v, list):
                    v.remove(p)
                    if len(v) == 1:
                        m[k] = v[0]
                else:
                    del m[k]
                self._len -= 1
            del self._batches[b]
            self._removed.pop(b, None)

    def clear(self) -> None:
        """Forget everything."""
        self.drop_batches(list(self._batches))
