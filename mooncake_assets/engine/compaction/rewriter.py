"""Rewrite data files: read each input applying its deletion vector, write the live rows into new
Parquet files of a target size, and record where every old row went (docs/architecture.md#maintenance).

Pure file work: no table state, no lock. Inputs are read record batch by record batch (memory stays
around one batch plus the Parquet writer's open row group); rows keep their input order, inputs are
taken in the order given, so a new file holds a contiguous stretch of the inputs.

File size: rows are written in row groups of at most ``ROW_GROUP_ROWS``; each row group is sized to
what the file still needs to reach ``target_bytes`` (bytes per row measured on the file so far, or the
input's before its first row group; at least ``MIN_ROW_GROUP_ROWS``), and the file is closed as soon
as its written bytes reach the target. So every output but the last of a run holds at least
``target_bytes`` (and less than one more row group): a freshly compacted file is never "small" to the
planner, which is what keeps compaction from rewriting its own output over and over.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ..index import PositionMap
from ..table.evolution import project

__all__ = ["RewriteInput", "RewriteOutput", "RewriteResult", "rewrite_files"]

ROW_GROUP_ROWS = 128 * 1024
MIN_ROW_GROUP_ROWS = 1024
READ_BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class RewriteInput:
    """One file to rewrite: ``name`` (its data file name, the position map's source), ``path`` (a local
    path or URI PyArrow opens), ``rows`` (all rows), ``deleted`` (positions to drop), ``size_bytes``."""

    name: str
    path: str
    rows: int
    deleted: BitMap64
    size_bytes: int


@dataclass(frozen=True)
class RewriteOutput:
    """One new file: ``name`` (``<uuid>.parquet``), ``path`` (local), ``rows``, ``size_bytes``."""

    name: str
    path: str
    rows: int
    size_bytes: int


@dataclass
class RewriteResult:
    """``outputs``: the new files in order; ``position_map``: sources = input names, files = output
    names (-1 for a dropped row); ``rows_in`` (all input rows), ``rows_out``, ``rows_dropped`` (rows
    deleted by the inputs' DVs), ``bytes_in``, ``bytes_out``, ``seconds``."""

    outputs: list[RewriteOutput] = field(default_factory=list)
    position_map: PositionMap | None = None
    rows_in: int = 0
    rows_out: int = 0
    rows_dropped: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


def _keep_mask(deleted_sorted: np.ndarray, start: int, n: int) -> np.ndarray:
    """Rows [start, start + n) that are not in ``deleted_sorted`` (sorted int64 positions)."""
    keep = np.ones(n, dtype=bool)
    lo, hi = np.searchsorted(deleted_sorted, [start, start + n])
    keep[deleted_sorted[lo:hi] - start] = False
    return keep


def rewrite_files(
    inputs: list[RewriteInput],
    out_dir: str | Path,
    schema: pa.Schema,
    target_bytes: int,
    compression: str = "zstd",
    open_input: Callable[[str], Any] | None = None,
    defaults: dict[int, pa.Scalar] | None = None,
) -> RewriteResult:
    """Rewrite ``inputs`` into new files under ``out_dir`` (see the module docstring).

    ``schema``: the table's Arrow schema (input batches are brought to it: columns matched by field id,
    promoted types cast, columns a file written under an older schema lacks filled from ``defaults``
    — field id → Arrow scalar — or NULL; see :func:`mooncake_assets.engine.table.evolution.project`;
    a file whose columns cannot be cast raises ``pyarrow.ArrowInvalid`` — permanent). ``target_bytes``: bytes, ≥ 1. ``open_input``:
    path → what ``pyarrow.parquet.ParquetFile`` takes (e.g. a FileIO stream for ``s3://``); default:
    the path itself. ``compression``: the Parquet codec (default ZSTD, as flushes write). Returns a
    :class:`RewriteResult`; on any error the partly written outputs are deleted and the error raised.
    ``OSError`` passes through (may be temporary).
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = RewriteResult()
    names: list[str] = []
    maps: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}  # input name -> (new file index, new row)
    writer: Any = None  # pq.ParquetWriter of the current file
    sink: Any = None  # its pa.OSFile
    parts: list[pa.RecordBatch] = []  # rows of the current file not yet written (at most one row group)
    cur: dict[str, Any] = {"name": None, "path": None, "rows": 0, "written": 0, "buffered": 0}

    def row_group_rows(per_row_input: float) -> int:
        """Rows the next row group of the current file should hold."""
        size = sink.tell()
        per_row = size / cur["written"] if cur["written"] else (per_row_input or 1.0)
        want = int(np.ceil(max(target_bytes - size, 0) / max(per_row, 1e-9)))
        return int(min(ROW_GROUP_ROWS, max(MIN_ROW_GROUP_ROWS, want)))

    def write_parts() -> None:
        if parts:
            writer.write_table(pa.Table.from_batches(parts, schema=schema), row_group_size=ROW_GROUP_ROWS)
            cur["written"] += cur["buffered"]
            parts.clear()
            cur["buffered"] = 0

    def close_current() -> None:
        nonlocal writer, sink
        if writer is None:
            return
        write_parts()
        writer.close()
        sink.close()
        writer = sink = None
        size = Path(cur["path"]).stat().st_size
        res.outputs.append(RewriteOutput(cur["name"], cur["path"], cur["rows"], size))
        res.bytes_out += size

    def open_new() -> None:
        nonlocal writer, sink
        name = f"{uuid.uuid4().hex}.parquet"
        path = out_dir / name
        sink = pa.OSFile(str(path), "wb")  # unbuffered: tell() is what the row groups written so far take
        writer = pq.ParquetWriter(sink, schema, compression=compression)
        names.append(name)
        cur.update(name=name, path=str(path), rows=0, written=0, buffered=0)

    try:
        for inp in inputs:
            res.rows_in += inp.rows
            res.bytes_in += inp.size_bytes
            idx = np.full(inp.rows, -1, dtype=np.int32)
            rows = np.zeros(inp.rows, dtype=np.uint32)
            per_row = inp.size_bytes / inp.rows if inp.rows else 0.0
            deleted = np.fromiter(inp.deleted, dtype=np.int64, count=len(inp.deleted))
            if len(deleted) >= inp.rows:
                res.rows_dropped += inp.rows
                maps[inp.name] = (idx, rows)
                continue
            src = open_input(inp.path) if open_input else inp.path
            try:
                pf = pq.ParquetFile(src)
                if pf.metadata.num_rows != inp.rows:
                    raise ValueError(f"data file {inp.name}: expected {inp.rows} rows, found {pf.metadata.num_rows}")
                start = 0
                for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS):
                    if not batch.schema.equals(schema, check_metadata=True):
                        batch = project(batch, schema, defaults)
                    n = batch.num_rows
                    keep = _keep_mask(deleted, start, n)
                    whole = bool(keep.all())
                    live = np.arange(n) if whole else np.flatnonzero(keep)
                    res.rows_dropped += n - len(live)
                    off = 0
                    while off < len(live):
                        if writer is None:
                            open_new()
                        want = row_group_rows(per_row)
                        take = int(max(1, min(len(live) - off, want - cur["buffered"])))
                        sel = live[off : off + take]
                        parts.append(batch.slice(off, take) if whole else batch.take(pa.array(sel)))
                        idx[start + sel] = len(names) - 1
                        rows[start + sel] = np.arange(cur["rows"], cur["rows"] + take, dtype=np.uint32)
                        cur["rows"] += take
                        cur["buffered"] += take
                        res.rows_out += take
                        off += take
                        if cur["buffered"] >= want:
                            write_parts()
                            if sink.tell() >= target_bytes:
                                close_current()
                    start += n
            finally:
                if hasattr(src, "close"):
                    src.close()
            maps[inp.name] = (idx, rows)
        close_current()
    except BaseException:
        parts.clear()
        for closable in (writer, sink):
            if closable is not None:
                try:
                    closable.close()
                except Exception:
                    pass
        for n in names:
            (out_dir / n).unlink(missing_ok=True)
        raise
    res.position_map = PositionMap(tuple(o.name for o in res.outputs), maps)
    res.seconds = time.time() - t0
    return res
