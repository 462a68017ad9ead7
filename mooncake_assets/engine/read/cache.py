"""What a long-lived union reader keeps between queries (docs/architecture.md#union-read).

A data file's path never changes content (the service writes every file under a new name and never
rewrites one), and a deletion vector is a value: so everything derived from ``(path)`` or ``(path,
rows, deletion vector)`` stays true for as long as the file is read. :class:`ReadCache` keeps:

- the Parquet footer of a file (``pyarrow.parquet.FileMetaData``: its row groups; PyArrow reads of the
  file pass it in instead of reading the footer again), keyed by path;
- a file's decoded deleted positions (``uint32`` array), its lazy-mode :class:`~.plan.FilePlan` (row
  segments and the ``BIT`` string of the positions) and its arrow-mode keep mask, keyed by (path, row
  count, deletion vector). A file whose deletion vector changed gets a new key (the bitmap is compared
  by value: a new delete is a new vector); the entries of its old vector age out of the LRU.

Bounded: an LRU over all entries with a byte budget (``budget_bytes``, default 64 MiB, counted as the
arrays' and footers' sizes); :meth:`ReadCache.retain` drops every entry of a file no longer in any
ReadState the reader holds (compacted away, or all its rows deleted). Not thread-safe: one reader, one
thread at a time (as its DuckDB connection).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import pyarrow.parquet as pq
from pyroaring import FrozenBitMap64

from ..storage.arrow_fs import arrow_source
from .plan import FilePlan, decode_positions, keep_mask, plan_file, row_group_keep

T = TypeVar("T")
DEFAULT_BUDGET = 64 << 20  # bytes of cached vectors, masks, plans and footers per reader


class ReadCache:
    """Per-reader LRU of footers, decoded deletion vectors, plans and keep masks (module docstring).

    ``budget_bytes``: the most the entries may hold together (an entry larger than the whole budget is
    computed and returned but not kept). ``hits`` / ``misses``: lookups answered / computed.
    """

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET) -> None:
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _get(self, key: tuple[Any, ...], build: Callable[[], T], size: Callable[[T], int]) -> T:
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return hit[0]  # type: ignore[no-any-return]  # the entry stored under this key by build()
        self.misses += 1
        value = build()
        n = int(size(value)) + 64
        if n <= self.budget_bytes:
            self._entries[key] = (value, n)
            self.bytes += n
            while self.bytes > self.budget_bytes:
                _, (_, old) = self._entries.popitem(last=False)
                self.bytes -= old
        return value

    # ------------------------------------------------------------------ what is kept
    def metadata(self, path: str) -> pq.FileMetaData:
        """The Parquet footer of ``path`` (local path or ``s3://`` URL), read once."""

        def read() -> pq.FileMetaData:
            return pq.ParquetFile(arrow_source(path)).metadata

        return self._get(("md", path), read, lambda md: md.serialized_size)

    def row_groups(self, path: str) -> tuple[int, ...]:
        """Row counts of ``path``'s row groups (from :meth:`metadata`)."""
        md = self.metadata(path)
        return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))

    def positions(self, path: str, dv: FrozenBitMap64 | str | bytes) -> np.ndarray:
        """The sorted deleted positions of ``path``'s deletion vector ``dv`` (read-only array)."""

        def decode() -> np.ndarray:
            a = decode_positions(dv)
            a.flags.writeable = False
            return a

        return self._get(("pos", path, dv), decode, lambda a: a.nbytes)

    def plan(self, path: str, num_rows: int, dv: FrozenBitMap64 | str) -> FilePlan:
        """:func:`.plan.plan_file` of ``path`` with deletion vector ``dv``."""

        def build() -> FilePlan:
            return plan_file(path, num_rows, self.positions(path, dv), self.row_groups(path))

        return self._get(("plan", path, num_rows, dv), build, lambda p: len(p.dv_bits or b"") + 64 * len(p.segments))

    def keep(self, path: str, num_rows: int, dv: FrozenBitMap64 | str) -> tuple[tuple[int, ...] | None, Any]:
        """For a PyArrow read of ``path``: (row groups to read — None for all —, the keep mask over their
        rows as an Arrow ``BooleanArray``), row groups whose rows are all deleted left out."""

        def build() -> tuple[tuple[int, ...] | None, Any]:
            return row_group_keep(self.row_groups(path), keep_mask(num_rows, self.positions(path, dv)))

        return self._get(("keep", path, num_rows, dv), build, lambda v: v[1].nbytes)

    def retain(self, paths: Iterable[str]) -> int:
        """Drop every entry of a file not in ``paths`` (the files of the ReadStates still held);
        returns how many entries were dropped."""
        keep = set(paths)
        gone = [k for k in self._entries if k[1] not in keep]
        for k in gone:
            self.bytes -= self._entries.pop(k)[1]
        return len(gone)
