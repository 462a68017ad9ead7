"""The position deletes of one data file applied since the last persist, each with its commit LSN.

A :class:`PendingDeletes` is what ``DiskFile.pending`` holds: a mapping position (0-based row of the
Parquet data file) → commit LSN of the change that deleted it, kept until a persist writes the
positions into the file's deletion vector (Iceberg v3 "Deletion Vectors"). A read at LSN L sees the
positions whose LSN is below L; the change feed reads the LSN of each position.

It is kept compactly because one UPDATE of every row of a large table leaves one pending delete per
row until the next persist (a Python ``dict[int, int]`` costs about 100 B per entry; this about 5 B):

- ``bitmap``: the positions as a roaring bitmap (``BitMap64``; membership and union with the DV);
- the positions in the order they were deleted, in a flat ``array('I')`` (``'Q'`` once one does not
  fit in 32 bits), with their LSNs run-length encoded: two ``array('Q')`` of run LSN and run end
  (exclusive offset into the positions). Deletes arrive in commit order, so one transaction's deletes
  of a file are one run;
- a position deleted again (the mapping's ``pending[p] = lsn`` overwrites) keeps its newest LSN in a
  small dict beside the runs, as the dict did.

Memory: ``nbytes`` (positions 4 or 8 B each, 16 B per run, the bitmap's serialized size, ~100 B per
overwritten position).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from pyroaring import BitMap64

__all__ = ["PendingDeletes", "OVERWRITE_BYTES"]

#: estimated bytes per position deleted a second time (an entry of the overwrite dict)
OVERWRITE_BYTES = 100

_U32 = 0xFFFFFFFF


class PendingDeletes:
    """Position → commit LSN of one file's deletes not yet persisted (module docstring for the layout).

    Behaves as a read-only ``Mapping[int, int]`` plus ``pending[p] = lsn`` (:meth:`add`); ``keys()``
    are the positions ascending, ``values()``/``items()`` in the same order. Equal to a dict with the
    same entries. Positions are ints ≥ 0, LSNs ints ≥ 0 (``pg_lsn`` as an integer)."""

    __slots__ = ("_bm", "_pos", "_run_lsn", "_run_end", "_re", "_max")

    def __init__(self, entries: Mapping[int, int] | Iterable[tuple[int, int]] | None = None):
        self._bm = BitMap64()
        self._pos: array[int] = array("I")
        self._run_lsn: array[int] = array("Q")
        self._run_end: array[int] = array("Q")
        self._re: dict[int, int] = {}
        self._max = 0  # the newest run LSN
        if entries is not None:
            items = entries.items() if isinstance(entries, (Mapping, PendingDeletes)) else entries
            for p, lsn in items:
                self.add(int(p), int(lsn))

    # ------------------------------------------------------------------ adding
    def add(self, pos: int, lsn: int) -> None:
        """Position ``pos`` deleted by a change committed at ``lsn`` (a second delete of ``pos``
        replaces its LSN, as ``dict[pos] = lsn`` does)."""
        if pos in self._bm:
            self._re[pos] = lsn
            return
        self._bm.add(pos)
        if pos > _U32 and self._pos.typecode == "I":
            self._pos = array("Q", self._pos)
        self._pos.append(pos)
        if self._run_lsn and self._run_lsn[-1] == lsn:
            self._run_end[-1] = len(self._pos)
        else:
            self._run_lsn.append(lsn)
            self._run_end.append(len(self._pos))
            self._max = max(self._max, lsn)

    __setitem__ = add

    def add_many(self, positions: np.ndarray, lsns: np.ndarray) -> None:
        """Add ``positions[i]`` at ``lsns[i]`` in order (both 1-D integer arrays of one length; positions
        ≥ 0, LSNs ≥ 0): the same result as :meth:`add` of each in turn. Positions all new (distinct and
        not pending yet, the usual case) are added in bulk: one bitmap union, one append of positions,
        the runs of equal LSNs found with numpy; otherwise one by one."""
        pos = np.asarray(positions)
        at = np.asarray(lsns)
        n = len(pos)
        if n == 0:
            return
        if n < 4:
            for p, lsn in zip(pos.tolist(), at.tolist()):
                self.add(p, lsn)
            return
        pos = pos.astype(np.uint64, copy=False)
        fresh = BitMap64(pos)
        if len(fresh) != n or not self._bm.isdisjoint(fresh):
            for p, lsn in zip(pos.tolist(), at.tolist()):
                self.add(p, lsn)
            return
        self._bm |= fresh
        if self._pos.typecode == "I" and int(pos.max()) > _U32:
            self._pos = array("Q", self._pos)
        start = len(self._pos)
        self._pos.frombytes(pos.astype(np.uint32 if self._pos.typecode == "I" else np.uint64).tobytes())
        at = at.astype(np.uint64, copy=False)
        cuts = np.flatnonzero(at[1:] != at[:-1]) + 1  # where a new LSN starts, within the batch
        run_lsn = at[np.concatenate(([0], cuts))]
        run_end = np.concatenate((cuts, [n])).astype(np.uint64) + np.uint64(start)
        if self._run_lsn and self._run_lsn[-1] == int(run_lsn[0]):
            self._run_end[-1] = int(run_end[0])
            run_lsn, run_end = run_lsn[1:], run_end[1:]
        self._run_lsn.frombytes(run_lsn.tobytes())
        self._run_end.frombytes(run_end.tobytes())
        if len(run_lsn):
            self._max = max(self._max, int(run_lsn.max()))

    @classmethod
    def from_arrays(cls, positions: np.ndarray, lsns: np.ndarray) -> PendingDeletes:
        """A new set of ``positions`` (distinct) at ``lsns``, grouped by LSN so runs stay few."""
        out = cls()
        order = np.argsort(lsns, kind="stable")
        out.add_many(np.asarray(positions)[order], np.asarray(lsns)[order])
        return out

    # ------------------------------------------------------------------ reading
    @property
    def bitmap(self) -> BitMap64:
        """The deleted positions (the live bitmap: do not modify it; copy with ``BitMap64(...)``)."""
        return self._bm

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, lsns)``: uint64 arrays, one entry per position, positions ascending."""
        n = len(self._pos)
        pos = np.frombuffer(self._pos, dtype=np.uint32 if self._pos.typecode == "I" else np.uint64).astype(np.uint64)
        ends = np.frombuffer(self._run_end, dtype=np.uint64).astype(np.int64)
        counts = np.diff(ends, prepend=0)
        lsn = np.repeat(np.frombuffer(self._run_lsn, dtype=np.uint64), counts)
        assert len(lsn) == n
        order = np.argsort(pos, kind="stable")
        pos, lsn = pos[order], lsn[order]
        if self._re:
            re_pos = np.fromiter(self._re.keys(), dtype=np.uint64, count=len(self._re))
            lsn[np.searchsorted(pos, re_pos)] = np.fromiter(self._re.values(), dtype=np.uint64, count=len(self._re))
        return pos, lsn

    def before(self, lsn: int) -> BitMap64:
        """The positions deleted by changes committed below ``lsn`` (a new bitmap)."""
        if self.max_lsn() < lsn:
            return BitMap64(self._bm)
        pos, at = self.arrays()
        return BitMap64(pos[at < lsn])

    def max_lsn(self) -> int:
        """The newest commit LSN among the deletes (0 when there are none)."""
        if not self._re:
            return self._max
        return int(self.arrays()[1].max())

    @property
    def nbytes(self) -> int:
        """Estimated bytes held (module docstring)."""
        if not self._pos:
            return 0
        st = self._bm.get_statistics()
        bitmap = st["n_bytes_array_containers"] + st["n_bytes_run_containers"] + st["n_bytes_bitset_containers"]
        return (
            self._pos.itemsize * len(self._pos)
            + 16 * len(self._run_lsn)
            + int(bitmap)
            + OVERWRITE_BYTES * len(self._re)
        )

    # ------------------------------------------------------------------ the Mapping protocol
    def __len__(self) -> int:
        return len(self._bm)

    def __bool__(self) -> bool:
        return len(self._bm) > 0

    def __contains__(self, pos: object) -> bool:
        return isinstance(pos, int) and pos >= 0 and pos in self._bm

    def __getitem__(self, pos: int) -> int:
        if pos in self._re:
            return self._re[pos]
        if pos not in self:
            raise KeyError(pos)
        pos_arr = np.frombuffer(self._pos, dtype=np.uint32 if self._pos.typecode == "I" else np.uint64)
        i = int(np.flatnonzero(pos_arr == pos)[0])
        return int(self._run_lsn[bisect_right(self._run_end, i)])

    def get(self, pos: int, default: Any = None) -> Any:
        """The LSN that deleted ``pos``, or ``default``."""
        try:
            return self[pos]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[int]:
        return iter(self._bm)

    def keys(self) -> BitMap64:
        """The positions, ascending (a new bitmap)."""
        return BitMap64(self._bm)

    def values(self) -> list[int]:
        """The LSNs, in ascending order of their positions."""
        values: list[int] = self.arrays()[1].tolist()
        return values

    def items(self) -> list[tuple[int, int]]:
        """``(position, lsn)`` pairs, positions ascending."""
        pos, lsn = self.arrays()
        return list(zip(pos.tolist(), lsn.tolist()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PendingDeletes, Mapping)):
            return len(self) == len(other) and dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like dict

    def __repr__(self) -> str:
        if len(self) <= 8:
            return f"PendingDeletes({dict(self.items())!r})"
        return f"PendingDeletes(<{len(self)} positions, {len(self._run_lsn)} runs>)"
