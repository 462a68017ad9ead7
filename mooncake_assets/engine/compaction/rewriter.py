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

Row lineage (format v3, Iceberg spec "Row Lineage"): with ``lineage=True`` the outputs carry the
reserved ``_row_id`` and ``_last_updated_sequence_number`` columns (:mod:`..iceberg.lineage`), each
row's values from before the move: the source file's stored column where it has one, else inherited
(the input's ``first_row_id`` + position, its data sequence number). Compaction modifies no row, so
both are copied, never reset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ..iceberg.lineage import FileLineage, fill_lineage, with_lineage
from ..index import PositionMap
from ..table.evolution import project

__all__ = ["RewriteInput", "RewriteOutput", "RewriteResult", "rewrite_files"]

ROW_GROUP_ROWS = 128 * 1024
MIN_ROW_GROUP_ROWS = 1024
READ_BATCH_ROWS = 64 * 1024


@dataclass(frozen=True)
class RewriteInput:
    """One file to rewrite: ``name`` (its data file name, the position map's source), ``path`` (a local
    path or URI PyArrow opens), ``rows`` (all rows), ``deleted`` (positions to drop), ``size_bytes``;
    ``lineage``: what its rows inherit in the Iceberg table (needed when rewriting with lineage)."""

    name: str
    path: str
    rows: int
    deleted: BitMap64
    size_bytes: int
    lineage: FileLineage | None = None


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


class _Outputs:
    """The output files being written: the current file's ParquetWriter, its unflushed batches and counts.

    ``names``: every output opened so far (its index is the file index of the position map)."""

    def __init__(
        self, out_dir: Path, schema: pa.Schema, target_bytes: int, compression: str, res: RewriteResult
    ) -> None:
        self.out_dir = out_dir
        self.schema = schema
        self.target_bytes = target_bytes
        self.compression = compression
        self.res = res
        self.names: list[str] = []
        self.writer: Any = None  # pq.ParquetWriter of the current file
        self.sink: Any = None  # its pa.OSFile
        self.parts: list[pa.RecordBatch] = []  # rows of the current file not yet written (at most one row group)
        self.cur: dict[str, Any] = {"name": None, "path": None, "rows": 0, "written": 0, "buffered": 0}

    def row_group_rows(self, per_row_input: float) -> int:
        """Rows the next row group of the current file should hold."""
        cur = self.cur
        size = self.sink.tell()
        per_row = size / cur["written"] if cur["written"] else (per_row_input or 1.0)
        want = int(np.ceil(max(self.target_bytes - size, 0) / max(per_row, 1e-9)))
        return int(min(ROW_GROUP_ROWS, max(MIN_ROW_GROUP_ROWS, want)))

    def write_parts(self) -> None:
        if self.parts:
            self.writer.write_table(
                pa.Table.from_batches(self.parts, schema=self.schema), row_group_size=ROW_GROUP_ROWS
            )
            self.cur["written"] += self.cur["buffered"]
            self.parts.clear()
            self.cur["buffered"] = 0

    def close_current(self) -> None:
        if self.writer is None:
            return
        self.write_parts()
        self.writer.close()
        self.sink.close()
        self.writer = self.sink = None
        size = Path(self.cur["path"]).stat().st_size
        self.res.outputs.append(RewriteOutput(self.cur["name"], self.cur["path"], self.cur["rows"], size))
        self.res.bytes_out += size

    def open_new(self) -> None:
        name = f"{uuid.uuid4().hex}.parquet"
        path = self.out_dir / name
        self.sink = pa.OSFile(str(path), "wb")  # unbuffered: tell() is what the row groups written so far take
        self.writer = pq.ParquetWriter(self.sink, self.schema, compression=self.compression)
        self.names.append(name)
        self.cur.update(name=name, path=str(path), rows=0, written=0, buffered=0)

    def add_live(
        self,
        batch: pa.RecordBatch,
        live: np.ndarray,
        whole: bool,
        start: int,
        per_row: float,
        idx: np.ndarray,
        rows: np.ndarray,
    ) -> None:
        """Append the ``live`` rows of ``batch`` (rows ``start``.. of its input), filling ``idx``/``rows``."""
        cur = self.cur
        off = 0
        while off < len(live):
            if self.writer is None:
                self.open_new()
            want = self.row_group_rows(per_row)
            take = int(max(1, min(len(live) - off, want - cur["buffered"])))
            sel = live[off : off + take]
            self.parts.append(batch.slice(off, take) if whole else batch.take(pa.array(sel)))
            idx[start + sel] = len(self.names) - 1
            rows[start + sel] = np.arange(cur["rows"], cur["rows"] + take, dtype=np.uint32)
            cur["rows"] += take
            cur["buffered"] += take
            self.res.rows_out += take
            off += take
            if cur["buffered"] >= want:
                self.write_parts()
                if self.sink.tell() >= self.target_bytes:
                    self.close_current()

    def abandon(self) -> None:
        """After an error: close what is open (ignoring errors) and delete every output written."""
        self.parts.clear()
        for closable in (self.writer, self.sink):
            if closable is not None:
                try:
                    closable.close()
                except Exception:
                    pass
        for n in self.names:
            (self.out_dir / n).unlink(missing_ok=True)


def _rewrite_one(
    inp: RewriteInput,
    out: _Outputs,
    open_input: Callable[[str], Any] | None,
    defaults: dict[int, pa.Scalar] | None,
    lineage: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Copy the live rows of one input into ``out``; returns its (new file index, new row) arrays.
    ``lineage``: ``out.schema`` ends with the lineage columns, filled from the input (module docstring)."""
    if lineage and inp.lineage is None:
        raise ValueError(f"data file {inp.name}: rewriting with row lineage needs the file's lineage")
    res = out.res
    res.rows_in += inp.rows
    res.bytes_in += inp.size_bytes
    idx = np.full(inp.rows, -1, dtype=np.int32)
    rows = np.zeros(inp.rows, dtype=np.uint32)
    per_row = inp.size_bytes / inp.rows if inp.rows else 0.0
    deleted = np.fromiter(inp.deleted, dtype=np.int64, count=len(inp.deleted))
    if len(deleted) >= inp.rows:
        res.rows_dropped += inp.rows
        return idx, rows
    src = open_input(inp.path) if open_input else inp.path
    try:
        pf = pq.ParquetFile(src)
        if pf.metadata.num_rows != inp.rows:
            raise ValueError(f"data file {inp.name}: expected {inp.rows} rows, found {pf.metadata.num_rows}")
        start = 0
        for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS):
            if not batch.schema.equals(out.schema, check_metadata=True):
                batch = project(batch, out.schema, defaults)
            if lineage:
                batch = fill_lineage(batch, cast(FileLineage, inp.lineage), start)
            n = batch.num_rows
            keep = _keep_mask(deleted, start, n)
            whole = bool(keep.all())
            live = np.arange(n) if whole else np.flatnonzero(keep)
            res.rows_dropped += n - len(live)
            out.add_live(batch, live, whole, start, per_row, idx, rows)
            start += n
    finally:
        if hasattr(src, "close"):
            src.close()
    return idx, rows


def rewrite_files(
    inputs: list[RewriteInput],
    out_dir: str | Path,
    schema: pa.Schema,
    target_bytes: int,
    compression: str = "zstd",
    open_input: Callable[[str], Any] | None = None,
    defaults: dict[int, pa.Scalar] | None = None,
    lineage: bool = False,
) -> RewriteResult:
    """Rewrite ``inputs`` into new files under ``out_dir`` (see the module docstring).

    ``schema``: the table's Arrow schema (input batches are brought to it: columns matched by field id,
    promoted types cast, columns a file written under an older schema lacks filled from ``defaults``
    — field id → Arrow scalar — or NULL; see :func:`mooncake_assets.engine.table.evolution.project`;
    a file whose columns cannot be cast raises ``pyarrow.ArrowInvalid`` — permanent). ``target_bytes``: bytes, ≥ 1. ``open_input``:
    path → what ``pyarrow.parquet.ParquetFile`` takes (e.g. a FileIO stream for ``s3://``); default:
    the path itself. ``compression``: the Parquet codec (default ZSTD, as flushes write). Returns a
    :class:`RewriteResult`; on any error the partly written outputs are deleted and the error raised.
    ``OSError`` passes through (may be temporary). ``lineage``: write the row lineage columns after
    ``schema``'s (format v3; every input must carry its ``lineage``, else ``ValueError``). Inputs are
    decoded on Arrow's thread pool; :func:`~.worker.compact_in_child` runs this in a process of lower
    CPU priority.
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = RewriteResult()
    out = _Outputs(out_dir, with_lineage(schema) if lineage else schema, target_bytes, compression, res)
    maps: dict[Hashable, tuple[np.ndarray, np.ndarray]] = {}  # input name -> (new file index, new row)
    try:
        for inp in inputs:
            maps[inp.name] = _rewrite_one(inp, out, open_input, defaults, lineage)
        out.close_current()
    except BaseException:
        out.abandon()
        raise
    res.position_map = PositionMap(tuple(o.name for o in res.outputs), maps)
    res.seconds = time.time() - t0
    return res
