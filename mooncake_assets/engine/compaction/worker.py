"""A compaction's CPU-heavy work in a child process of lower CPU priority (``maintenance: auto``):
the rewrite (:func:`~.rewriter.rewrite_files`) and the rebuild of the IndexBlocks it moved
(:func:`compact_in_child`), and an index merge (:func:`merge_in_child`), through
:func:`~mooncake_assets.engine.workers.run_niced` (that module says why a process). What crosses
the pipe is small or columnar: the inputs (names, paths, deletion-vector bitmaps, lineage), the
Arrow schema, the FileIO (PyIceberg FileIOs pickle their properties, so ``s3://``, ``gs://`` and
``abfs://`` inputs open in the child as in the service), the paths of the immutable IndexBlock files,
and back the :class:`~.rewriter.RewriteResult` (output paths and the PositionMap, 12 bytes per input
row) and the new block's path.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..index import FileIndex, IndexBlock, PositionMap, dead_file_maps
from ..workers import run_niced
from .rewriter import RewriteInput, RewriteResult, rewrite_files

__all__ = ["Reindex", "CompactedFiles", "compact_in_child", "merge_in_child"]


def _open_with(io: Any) -> Callable[[str], Any]:
    """path → what ``pyarrow.parquet.ParquetFile`` takes: a FileIO stream for URIs, the path otherwise."""
    return lambda p: io.new_input(p).open() if io is not None and "://" in p else p


@dataclass(frozen=True)
class Reindex:
    """The IndexBlocks to rebuild after a rewrite, in the child: ``blocks`` (paths of the immutable
    block files that cover the rewritten files), ``live`` (names of the table's data files now: entries
    of other files are dropped, :func:`~..index.dead_file_maps`), ``out`` (path of the new block)."""

    blocks: tuple[str, ...]
    live: frozenset[str]
    out: str


@dataclass(frozen=True)
class CompactedFiles:
    """What :func:`compact_in_child` returns: the ``rewrite``'s result, the new IndexBlock's path
    (``block``, None without a :class:`Reindex`) and the seconds its rebuild took (``index_seconds``)."""

    rewrite: RewriteResult
    block: str | None = None
    index_seconds: float = 0.0


def _build_block(blocks: tuple[str, ...], live: frozenset[str], out: str, position_map: PositionMap | None) -> str:
    """Open ``blocks`` and write their entries to ``out`` through ``FileIndex.build_from_compaction``:
    moved by ``position_map`` (None: nothing moves, a merge), entries of files not in ``live`` dropped,
    of other files kept. When nothing moves and nothing is dropped, ``build_from_merge`` (a k-way merge
    by hash, the same entries) is the faster way. Returns ``out``."""
    opened = [IndexBlock.open(p) for p in blocks]
    try:
        dead = dead_file_maps(opened, live)
        if position_map is None and not dead:
            new = FileIndex.build_from_merge(opened, out)
        else:
            pm = position_map if position_map is not None else PositionMap((), {})
            pm = PositionMap(pm.files, {**dead, **pm.sources})
            new = FileIndex.build_from_compaction(opened, pm, out, unmapped="keep")
        new.close()
    finally:
        for b in opened:
            b.close()
    return out


def _compact(
    inputs: list[RewriteInput],
    out_dir: str,
    schema: pa.Schema,
    target_bytes: int,
    io: Any,
    defaults: dict[int, pa.Scalar] | None,
    lineage: bool,
    reindex: Reindex | None,
) -> CompactedFiles:
    """In the child (or this thread): :func:`rewrite_files`, then the :class:`Reindex`; a failing
    rebuild deletes the rewrite's outputs and its partial block."""
    rw = rewrite_files(
        inputs, out_dir, schema, target_bytes, open_input=_open_with(io), defaults=defaults, lineage=lineage
    )
    if reindex is None:
        return CompactedFiles(rw)
    t0 = time.perf_counter()
    try:
        _build_block(reindex.blocks, reindex.live, reindex.out, rw.position_map)
    except BaseException:
        for o in rw.outputs:
            with contextlib.suppress(OSError):
                os.unlink(o.path)
        with contextlib.suppress(OSError):
            os.unlink(reindex.out)
        raise
    return CompactedFiles(rw, reindex.out, time.perf_counter() - t0)


def _merge(blocks: tuple[str, ...], live: frozenset[str], out: str) -> str:
    """In the child (or this thread): :func:`_build_block` without a map; a failure deletes ``out``."""
    try:
        return _build_block(blocks, live, out, None)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(out)
        raise


def compact_in_child(
    inputs: list[RewriteInput],
    out_dir: str | Path,
    schema: pa.Schema,
    target_bytes: int,
    nice: int,
    io: Any = None,
    defaults: dict[int, pa.Scalar] | None = None,
    lineage: bool = False,
    reindex: Reindex | None = None,
) -> CompactedFiles:
    """A compaction's CPU-heavy work in the child process of priority ``nice`` (steps below this
    process, 1–19; 0 or less: here, in the calling thread, at its priority):
    :func:`~.rewriter.rewrite_files` of ``inputs`` (same arguments, ``open_input`` made from ``io``: a
    PyIceberg FileIO for URI inputs, None for local paths; outputs written under ``out_dir``, local
    paths), then, with ``reindex``, the IndexBlocks covering the inputs rebuilt through the rewrite's
    PositionMap into one new block file (``FileIndex.build_from_compaction``: entries of rewritten rows
    move, of dropped rows and of files not in ``reindex.live`` go, of other files stay). Blocks until
    done. Raises what the rewrite or the rebuild raises (what they wrote deleted), or
    ``BrokenProcessPool`` when the child died (its partial outputs are left to the orphan cleanup)."""
    return run_niced(nice, _compact, list(inputs), str(out_dir), schema, target_bytes, io, defaults, lineage, reindex)


def merge_in_child(blocks: list[IndexBlock], live: frozenset[str] | set[str], out: str | Path, nice: int) -> IndexBlock:
    """The IndexBlock merging ``blocks`` (k-way by hash, ``FileIndex.build_from_merge``; rebuilt without
    the entries of files not in ``live`` when some block has them), written to ``out`` in the child of
    priority ``nice`` (≤ 0: in this thread) and opened here. Raises what the build raises (``out``
    deleted) or ``BrokenProcessPool``."""
    path = run_niced(nice, _merge, tuple(str(b.path) for b in blocks), frozenset(live), str(out))
    return IndexBlock.open(path)
