"""PositionMap: where each old row went when rows were rewritten.

Used twice:

* **compaction** (``FileIndex.build_from_compaction``): sources are old data file names; the map says,
  per old row, which new file and row it was written to, or that it was dropped (deleted by a DV);
* **flush** (in-memory rows written to Parquet): sources are in-memory batch ids; the map says, per batch
  row, where the flush wrote it in the new Parquet file(s), or that it was dropped (BatchDeletionVector).

Shape: ``PositionMap(files, sources)``; ``files`` = new data file names (tuple of str);
``sources[source] = (new_file_idx, new_row)``, two arrays of one length (the old file's / batch's row
count): ``new_file_idx`` int32, an index into ``files`` or ``-1`` for a dropped row; ``new_row`` uint32,
the row offset in that file (ignored where dropped).

The issue's dict form ``{old_name: (new_file_names, new_file_idx, new_row)}`` (each source with its own
list of new names) is accepted by :meth:`PositionMap.from_dict` and everywhere a PositionMap is taken.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["PositionMap", "as_position_map"]


@dataclass(frozen=True)
class PositionMap:
    files: tuple[str, ...]
    sources: dict[Hashable, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        files = tuple(self.files)
        if len(set(files)) != len(files):
            raise ValueError(f"new file names must be unique, found {list(files)}")
        object.__setattr__(self, "files", files)
        checked = {}
        for src, (idx, rows) in self.sources.items():
            idx = np.asarray(idx)
            rows = np.asarray(rows)
            if idx.ndim != 1 or idx.shape != rows.shape:
                raise ValueError(
                    f"position map of {src!r}: new_file_idx and new_row must be 1-D of one length, "
                    f"found {idx.shape} and {rows.shape}"
                )
            if len(idx) and (idx.dtype.kind not in "iu" or rows.dtype.kind not in "iu"):
                raise TypeError(f"position map of {src!r}: expected integer arrays, found {idx.dtype}, {rows.dtype}")
            idx = idx.astype(np.int32, copy=False)
            if len(idx) and (int(idx.min()) < -1 or int(idx.max()) >= len(files)):
                raise ValueError(
                    f"position map of {src!r}: new_file_idx must be in [-1, {len(files)}), "
                    f"found [{int(idx.min())}, {int(idx.max())}]"
                )
            live = idx >= 0
            if live.any():
                r = rows[live]
                if int(r.min()) < 0 or int(r.max()) >= 1 << 32:
                    raise ValueError(f"position map of {src!r}: new rows must be in [0, 2**32)")
            checked[src] = (idx, rows.astype(np.uint32, copy=False))
        object.__setattr__(self, "sources", checked)

    @classmethod
    def from_dict(cls, d: dict[Hashable, tuple[Sequence[str], np.ndarray, np.ndarray]]) -> PositionMap:
        """From ``{source: (new_file_names, new_file_idx, new_row)}``: the per-source name lists are
        united (first appearance order) and the indices rewritten into the union."""
        files: list[str] = []
        pos: dict[str, int] = {}
        sources = {}
        for src, (names, idx, rows) in d.items():
            remap = np.empty(len(names) + 1, dtype=np.int32)
            remap[-1] = -1  # idx -1 -> -1
            for i, name in enumerate(names):
                if name not in pos:
                    pos[name] = len(files)
                    files.append(name)
                remap[i] = pos[name]
            idx = np.asarray(idx)
            if len(idx) and (int(idx.min()) < -1 or int(idx.max()) >= len(names)):
                raise ValueError(f"position map of {src!r}: new_file_idx must be in [-1, {len(names)})")
            sources[src] = (remap[idx.astype(np.int64)] if len(idx) else idx.astype(np.int32), rows)
        return cls(tuple(files), sources)

    def map_rows(self, source: Hashable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """New (file_idx int32, row uint32) of old ``rows`` of ``source``; file_idx -1 = dropped.
        Raises ``KeyError`` for an unknown source and ``ValueError`` for a row past the map."""
        idx, new_rows = self.sources[source]
        rows = np.asarray(rows)
        if len(rows) and int(rows.max()) >= len(idx):
            raise ValueError(f"position map of {source!r} covers {len(idx)} rows, found row {int(rows.max())}")
        rows = rows.astype(np.intp, copy=False)
        return idx[rows], new_rows[rows]


def as_position_map(m: PositionMap | dict[Hashable, tuple[Sequence[str], np.ndarray, np.ndarray]]) -> PositionMap:
    """A PositionMap from a PositionMap or the dict form (see module docstring)."""
    if isinstance(m, PositionMap):
        return m
    if isinstance(m, dict):
        return PositionMap.from_dict(m)
    raise TypeError(f"expected a PositionMap or a dict, found {type(m).__name__}")
