"""Compaction and index merge as the table sees them: an immutable input out, a result in.

Data compaction and IndexBlock merge run mostly without the service lock (``engine/compaction``).
They never touch a table's state: under the lock the table hands out a frozen snapshot
(:class:`CompactionInput`: the picked files with a copy of their committed deletion vectors, the
IndexBlocks covering them, the live file names, the Iceberg layout; :class:`IndexMergeInput`), the
work turns it into a result (:class:`CompactionResult`: new files, the old → new
:class:`~..index.PositionMap`, the rebuilt IndexBlock), and under the lock again the table
*prepares* the swap (:func:`prepare_compaction`: the deletes that arrived during the work re-mapped
onto the new files, the index blob of the swapped index — nothing changed yet, so the Iceberg commit
can fail harmlessly) and, once the commit landed, *applies* it (:func:`apply_compaction`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from pyroaring import BitMap64, FrozenBitMap64

from ..index import FileIndex, IndexBlock, PositionMap
from .disk_files import DiskFile, DiskFileSet
from .pending_deletes import PendingDeletes

log = logging.getLogger("mooncake.compaction")

__all__ = [
    "FileSnapshot",
    "CompactionInput",
    "CompactionResult",
    "PreparedSwap",
    "IndexMergeInput",
    "compaction_input",
    "index_merge_input",
    "prepare_compaction",
    "apply_compaction",
    "apply_index_merge",
]


@dataclass(frozen=True)
class FileSnapshot:
    """A picked data file as it was when the snapshot was taken: ``committed``: its persisted deleted
    positions then (the rewrite drops those rows)."""

    name: str
    path: str
    rows: int
    size_bytes: int
    location: str | None
    committed: FrozenBitMap64


@dataclass(frozen=True)
class CompactionInput:
    """What a compaction works on (taken under the lock; immutable). ``blocks``: the IndexBlocks that
    cover the picked files; ``live``: every data file name of the table then; ``schema`` and
    ``defaults``: the layout the Iceberg table has (Arrow schema, field id → initial-default);
    ``lineage``: file name → its :class:`~mooncake_assets.engine.iceberg.lineage.FileLineage` (format v3;
    None: the table keeps no row lineage)."""

    files: tuple[FileSnapshot, ...]
    blocks: tuple[IndexBlock, ...]
    live: frozenset[str]
    schema: Any
    defaults: dict[int, Any]
    lineage: dict[str, Any] | None = None


@dataclass(frozen=True)
class IndexMergeInput:
    """What an index merge works on: the picked IndexBlocks and the table's live file names."""

    blocks: tuple[IndexBlock, ...]
    live: frozenset[str]
    blocks_before: int


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction produced: ``outputs``: (name, rows, size_bytes, warehouse location) of the new
    files in order; ``position_map``: old (file, row) → new (file, row), -1 for a dropped row;
    ``new_block``: the IndexBlock replacing ``CompactionInput.blocks`` (None when there were none)."""

    outputs: tuple[tuple[str, int, int, str], ...]
    position_map: PositionMap
    new_block: Any = None


@dataclass(frozen=True)
class PreparedSwap:
    """A compaction ready to commit: the new :class:`DiskFile` s (deletes that arrived meanwhile moved
    onto them), ``adds``: new location → committed positions for the commit, ``remove``: old
    locations, ``index_blob``: the swapped index as bytes (None: the commit carries the saved one over,
    :data:`~.persist.INDEX_SAVE_INTERVAL_S`), and counts (``remapped``, ``dropped``:
    deletes whose row has no new position, ``vanished``: inputs a persist removed meanwhile)."""

    new_files: tuple[DiskFile, ...]
    adds: dict[str, BitMap64]
    remove: tuple[str, ...]
    index_blob: bytes | None
    remapped: int
    dropped: int
    vanished: int


def compaction_input(
    disk: DiskFileSet, names: list[str], schema: Any, defaults: dict[int, Any], lineage: dict[str, Any] | None = None
) -> CompactionInput:
    """Snapshot the picked files ``names`` of ``disk`` (call under the lock); ``lineage``: see
    :class:`CompactionInput`."""
    files = tuple(
        FileSnapshot(n, f.read_path, f.num_rows, f.size_bytes, f.location, FrozenBitMap64(f.committed))
        for n in names
        for f in [disk.files[n]]
    )
    return CompactionInput(
        files=files,
        blocks=tuple(disk.index.blocks_for_files(names)),
        live=frozenset(disk.files),
        schema=schema,
        defaults=dict(defaults or {}),
        lineage=lineage,
    )


def index_merge_input(disk: DiskFileSet, blocks: Iterable[IndexBlock]) -> IndexMergeInput:
    """The frozen input of an index merge: the IndexBlocks to merge (``blocks``, newest first), the
    names of the live data files (entries of other files are dropped) and how many blocks the index
    had when the input was taken."""
    return IndexMergeInput(blocks=tuple(blocks), live=frozenset(disk.files), blocks_before=len(disk.index.blocks))


def _still_there(disk: DiskFileSet, s: FileSnapshot) -> DiskFile | None:
    """The file as it is now, or None when a persist removed it meanwhile (every row deleted)."""
    cur = disk.files.get(s.name)
    return cur if cur is not None and cur.location == s.location else None


def _pending_of(positions: list[np.ndarray], lsns: list[np.ndarray]) -> PendingDeletes:
    """The pending deletes of one compaction output: its re-mapped positions at their commit LSNs."""
    if not positions:
        return PendingDeletes()
    return PendingDeletes.from_arrays(np.concatenate(positions), np.concatenate(lsns))


def prepare_compaction(
    disk: DiskFileSet, inp: CompactionInput, res: CompactionResult, with_index: bool = True
) -> PreparedSwap:
    """Under the lock, before the commit (changes nothing): the new DiskFiles with the deletes that
    arrived during the run moved onto them, and the index blob of the swapped index (``with_index``
    False: none; a restart re-indexes the new files from their keys)."""
    pm = res.position_map
    nout = len(res.outputs)
    committed = [BitMap64() for _ in range(nout)]
    pend_pos: list[list[np.ndarray]] = [[] for _ in range(nout)]
    pend_lsn: list[list[np.ndarray]] = [[] for _ in range(nout)]
    truncated = 0
    remove: list[str] = []
    remapped = dropped = vanished = 0
    for s in inp.files:
        cur = _still_there(disk, s)
        if cur is None:  # removed by a persist meanwhile (every row deleted, committed): all its rewritten rows go
            vanished += 1
            newly, pend = BitMap64(range(s.rows)) - BitMap64(s.committed), PendingDeletes()
        else:
            remove.append(cast(str, cur.location))  # the snapshot's location: a persisted file
            newly, pend = cur.committed - BitMap64(s.committed), cur.pending
            truncated = max(truncated, cur.truncated_lsn)
        if len(newly):
            rows = np.fromiter(newly, dtype=np.int64, count=len(newly))
            fi, fr = pm.map_rows(s.name, rows)
            ok = fi >= 0
            dropped += int((~ok).sum())
            remapped += int(ok.sum())
            for k in np.unique(fi[ok]):
                committed[int(k)].update(fr[ok & (fi == k)].astype(np.uint64).tolist())
        if pend:
            old_pos, old_lsn = pend.arrays()
            fi, fr = pm.map_rows(s.name, old_pos.astype(np.int64))
            ok = fi >= 0
            dropped += int((~ok).sum())
            remapped += int(ok.sum())
            for k in np.unique(fi[ok]):
                sel = ok & (fi == k)
                pend_pos[int(k)].append(fr[sel].astype(np.uint64))
                pend_lsn[int(k)].append(old_lsn[sel])
    new_files: list[DiskFile] = []
    adds: dict[str, BitMap64] = {}
    for i, (name, out_rows, size, loc) in enumerate(res.outputs):
        new_files.append(
            DiskFile(
                name=name,
                num_rows=out_rows,
                size_bytes=size,
                location=loc,
                committed=committed[i],
                pending=_pending_of(pend_pos[i], pend_lsn[i]),
                truncated_lsn=truncated,
            )
        )
        if len(committed[i]):
            adds[loc] = committed[i]
    staged = FileIndex(disk.index.blocks)
    if inp.blocks:
        staged.replace_blocks(list(inp.blocks), res.new_block)
    return PreparedSwap(
        new_files=tuple(new_files),
        adds=adds,
        remove=tuple(remove),
        index_blob=disk.index_blob(staged) if with_index else None,
        remapped=remapped,
        dropped=dropped,
        vanished=vanished,
    )


def apply_compaction(disk: DiskFileSet, inp: CompactionInput, res: CompactionResult, prep: PreparedSwap) -> None:
    """Under the lock, after the commit landed: the old files out, the new ones in, the IndexBlocks
    swapped (the old block files deleted)."""
    for s in inp.files:
        if _still_there(disk, s) is not None:
            disk.files.pop(s.name)
    for f in prep.new_files:
        disk.files[f.name] = f
    if inp.blocks:
        apply_index_merge(disk, inp.blocks, res.new_block)


def apply_index_merge(disk: DiskFileSet, old_blocks: Sequence[IndexBlock], new_block: IndexBlock | None) -> None:
    """Under the lock: ``new_block`` replaces ``old_blocks`` in the FileIndex; their files are deleted."""
    disk.index.replace_blocks(list(old_blocks), new_block)
    for b in old_blocks:
        try:
            b.unlink()
        except OSError as e:  # pragma: no cover - the file is orphaned, cleaned at next start
            log.warning("could not delete index block %s: %s", b.path, e)
