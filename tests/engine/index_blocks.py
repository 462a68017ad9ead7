"""IndexBlocks from in-memory locations, for tests of the index stack (the table's flush builds its block
directly from ``MemSlice.drain``'s hashes; these build the same block from a MemIndex and a PositionMap).

* :func:`build_flush_block` from the index hashes of the written rows, per new file, in file order;
* :func:`build_block_from_mem_index` from the MemIndex and the flush's :class:`PositionMap` (sources =
  batch ids, per batch row: new file index and row, -1 where the row was not written).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mooncake_assets.engine.index.block import IndexBlock, PathLike, _as_hashes
from mooncake_assets.engine.index.mem_index import MemIndex
from mooncake_assets.engine.index.position_map import PositionMap, as_position_map

__all__ = ["build_flush_block", "build_block_from_mem_index"]


def build_flush_block(path: PathLike, files: Sequence[str], hashes: Sequence[np.ndarray]) -> IndexBlock:
    """One block for the rows of a flush: ``hashes[i]`` = uint64 index hashes of the rows of
    ``files[i]``, in file order (row offset = position). Raises ``ValueError`` when the lengths of
    ``files`` and ``hashes`` differ."""
    files = list(files)
    hashes = [_as_hashes(h) for h in hashes]
    if len(files) != len(hashes):
        raise ValueError(f"one hash array per file expected: {len(files)} files, {len(hashes)} arrays")
    h = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    fid = (
        np.concatenate([np.full(len(x), i, np.int64) for i, x in enumerate(hashes)])
        if hashes
        else np.zeros(0, np.int64)
    )
    rows = np.concatenate([np.arange(len(x), dtype=np.int64) for x in hashes]) if hashes else np.zeros(0, np.int64)
    return IndexBlock.build(path, h, fid, rows, files)


def build_block_from_mem_index(path: PathLike, mem_index: MemIndex, position_map: PositionMap | dict) -> IndexBlock:
    """One block for the batches of ``position_map`` (its sources are batch ids).

    Every live MemIndex location ``(batch, row)`` of those batches is mapped to ``(new file, new row)``;
    locations mapped to -1 are left out. The MemIndex is not changed: call
    ``mem_index.drop_batches(position_map.sources)`` once the flush is visible. Raises ``ValueError``
    when a location's row is past its batch's map.
    """
    pm = as_position_map(position_map)
    hs, fs, rs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int32)], [np.zeros(0, np.uint32)]
    for batch_id in pm.sources:
        h, r = mem_index.batch_entries(batch_id)
        if not len(h):
            continue
        fidx, nrow = pm.map_rows(batch_id, r)
        keep = fidx >= 0
        hs.append(h[keep])
        fs.append(fidx[keep])
        rs.append(nrow[keep])
    return IndexBlock.build(path, np.concatenate(hs), np.concatenate(fs), np.concatenate(rs), pm.files)
