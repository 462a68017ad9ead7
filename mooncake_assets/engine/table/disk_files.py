"""The data files of one mirrored table with their deletion state, and the FileIndex over them.

A table's rows that left the MemSlice live in Parquet data files: *flushed* (staged on local disk
under ``staging/``) or *persisted* (in the Iceberg table's warehouse). Each :class:`DiskFile` carries
the positions deleted in the persisted snapshot (its deletion vector, Iceberg v3 "Deletion Vectors")
and the deletes applied since (position → commit LSN), so a read at an LSN sees exactly the deletes
committed before it. The :class:`DiskFileSet` holds them with the FileIndex (IndexBlocks: key hash →
(file, row)) and writes, persists-in-memory, serializes and restores both.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64, FrozenBitMap64

from ..index import FileIndex, IndexBlock
from ..index.file_index import sorted_run
from ..index.saved import IndexBlob, encode_index_blob
from .pending_deletes import PendingDeletes
from .read_state import FileState, frozen

__all__ = [
    "DiskFile",
    "DiskFileSet",
    "WrittenFiles",
    "MAX_FILE_ROWS",
    "PARQUET_COMPRESSION",
    "ROW_GROUP_ROWS",
    "local_path_of",
    "write_parquet",
]

MAX_FILE_ROWS = 1_000_000  # rows per data file a flush writes
PARQUET_COMPRESSION = "zstd"  # the codec of every data file the mirror writes
ROW_GROUP_ROWS = 128 * 1024  # rows per Parquet row group of those files


def write_parquet(table: pa.Table, path: str | Path) -> int:
    """Write ``table`` as one Parquet data file with the mirror's settings (PyArrow, ZSTD, row groups of
    :data:`ROW_GROUP_ROWS` rows; field ids as ``table``'s schema carries them); returns its size in bytes."""
    pq.write_table(table, path, compression=PARQUET_COMPRESSION, row_group_size=ROW_GROUP_ROWS)
    return os.path.getsize(path)


def local_path_of(location: str) -> str:
    """A path DuckDB/PyArrow can open for a warehouse location (``file://`` stripped)."""
    return location[len("file://") :] if location.startswith("file://") else location


@dataclass
class DiskFile:
    """A Parquet data file of the table.

    ``committed``: positions deleted in the persisted snapshot (its DV); ``pending``: position →
    commit LSN of deletes not yet persisted (a :class:`~.pending_deletes.PendingDeletes`; a plain
    mapping assigned to it is converted); ``truncated_lsn``: commit LSN of a TRUNCATE that removed
    every row (0 = none).
    """

    name: str
    num_rows: int
    size_bytes: int
    local_path: str | None = None
    location: str | None = None
    committed: BitMap64 = field(default_factory=BitMap64)
    pending: PendingDeletes = field(default_factory=PendingDeletes)
    truncated_lsn: int = 0
    # deleted_at(None), kept while the sizes of committed and pending are unchanged (both only grow,
    # and a persist moves positions from one to the other): union reads ask for it on every query
    _all_deleted: tuple[tuple[int, int], BitMap64] | None = field(default=None, repr=False, compare=False)
    _frozen: tuple[tuple[int, int], FrozenBitMap64 | None] | None = field(
        default=None, repr=False, compare=False
    )  # deleted_vector(None), same rule

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "pending" and not isinstance(value, PendingDeletes):
            value = PendingDeletes(value)
        object.__setattr__(self, name, value)

    @property
    def persisted(self) -> bool:
        """Is the file in the Iceberg table (it has a warehouse ``location``)? Staged files are not."""
        return self.location is not None

    @property
    def read_path(self) -> str:
        """Where readers open the file: its warehouse location (``file://`` stripped) once persisted,
        else its staged local path."""
        # a file has a warehouse location or a local copy (staged), or both
        return local_path_of(self.location) if self.location else cast(str, self.local_path)

    def is_deleted(self, row: int) -> bool:
        """Is position ``row`` (0-based) deleted by anything applied: the committed DV, a pending delete
        or a TRUNCATE?"""
        return self.truncated_lsn != 0 or row in self.committed or row in self.pending

    def deleted_at(self, lsn: int | None) -> BitMap64:
        """Deleted positions as of ``lsn`` (None = everything applied)."""
        if self.truncated_lsn and (lsn is None or self.truncated_lsn < lsn):
            return BitMap64(range(self.num_rows))
        if lsn is None:
            key = (len(self.committed), len(self.pending))
            if self._all_deleted is not None and self._all_deleted[0] == key:
                return BitMap64(self._all_deleted[1])
            self._all_deleted = None
        bm = BitMap64(self.committed)
        if self.pending:
            bm |= self.pending.bitmap if lsn is None else self.pending.before(lsn)
        if lsn is None:
            self._all_deleted = (key, BitMap64(bm))
        return bm

    def deleted_vector(self, lsn: int | None) -> FrozenBitMap64 | None:
        """The positions deleted as of ``lsn`` as a ReadState carries them (frozen; None when none);
        for ``lsn=None`` cached while the deletes are unchanged (readers memoize plans by it)."""
        if lsn is not None or self.truncated_lsn:
            return frozen(self.deleted_at(lsn))
        key = (len(self.committed), len(self.pending))
        if self._frozen is None or self._frozen[0] != key:
            self._frozen = (key, frozen(self.deleted_at(None)))
        return self._frozen[1]

    def deleted_count(self) -> int:
        """Deleted positions, committed plus pending (every row after a TRUNCATE)."""
        if self.truncated_lsn:
            return self.num_rows
        return len(self.committed) + len(self.pending)


@dataclass
class WrittenFiles:
    """Staged data files and their one IndexBlock, written by :meth:`DiskFileSet.prepare` and not yet
    in the set; ``nbytes``: the files' total size."""

    files: list[DiskFile]
    block: IndexBlock
    nbytes: int


class DiskFileSet:
    """The table's :class:`DiskFile` s by name (``files``) and its FileIndex (``index``), under
    ``table_dir`` (``staging/`` for flushed files, ``index/`` for IndexBlock files).

    Staged files that became persisted or were dropped are *retired*: deleted ``grace_s`` later
    (a reader may still hold a ReadState naming them)."""

    def __init__(self, table_dir: Path):
        self.dir = Path(table_dir)
        (self.dir / "staging").mkdir(parents=True, exist_ok=True)
        (self.dir / "index").mkdir(parents=True, exist_ok=True)
        self.files: dict[str, DiskFile] = {}
        self.index = FileIndex()
        self.retired: list[tuple[float, str]] = []

    # ------------------------------------------------------------------ adding files
    def new_block_path(self) -> str:
        """A fresh IndexBlock file path, ``<table dir>/index/<uuid>.idx``."""
        return str(self.dir / "index" / f"{uuid.uuid4().hex}.idx")

    def write(self, table: pa.Table, hashes: np.ndarray) -> tuple[int, int]:
        """Write ``table``'s rows (in order; ``hashes``: their key hashes) as staged Parquet files of at
        most :data:`MAX_FILE_ROWS` rows, plus ONE IndexBlock for them, and add them to the set
        (:meth:`prepare` then :meth:`register`). Returns (files, bytes)."""
        written = self.prepare(table, hashes)
        self.register(written)
        return len(written.files), written.nbytes

    def prepare(self, table: pa.Table, hashes: np.ndarray) -> WrittenFiles:
        """:meth:`write` without adding anything to the set: new files only (fresh names under
        ``staging/`` and ``index/``), so it may run without the service lock while the set changes;
        :meth:`register` adds them, :meth:`discard` removes them instead. File ``i`` holds rows
        ``[i * MAX_FILE_ROWS, (i + 1) * MAX_FILE_ROWS)`` of ``table``. An error (a full disk, say) removes
        what it wrote so far and propagates."""
        files, file_ids, rows = [], [], []
        nbytes = 0
        path = block_path = None
        try:
            for fi, start in enumerate(range(0, table.num_rows, MAX_FILE_ROWS)):
                part = table.slice(start, MAX_FILE_ROWS)
                name = f"{uuid.uuid4().hex}.parquet"
                path = self.dir / "staging" / name
                size = write_parquet(part, path)
                nbytes += size
                files.append(DiskFile(name=name, num_rows=part.num_rows, size_bytes=size, local_path=str(path)))
                file_ids.append(np.full(part.num_rows, fi, dtype=np.uint32))
                rows.append(np.arange(part.num_rows, dtype=np.uint32))
            names = [f.name for f in files]
            block_path = self.new_block_path()
            block = IndexBlock.build(block_path, hashes, np.concatenate(file_ids), np.concatenate(rows), names)
        except BaseException:
            # nothing references these files yet: an error mid-way leaves none of them behind
            for p in [*(f.local_path for f in files), path, block_path]:
                if p:
                    Path(p).unlink(missing_ok=True)
            raise
        return WrittenFiles(files, block, nbytes)

    def register(self, written: WrittenFiles) -> None:
        """Add files :meth:`prepare` wrote (and their IndexBlock) to the set."""
        for f in written.files:
            self.files[f.name] = f
        self.index.add_block(written.block)

    @staticmethod
    def discard(written: WrittenFiles) -> None:
        """Remove files :meth:`prepare` wrote that will not be registered (nothing references them)."""
        written.block.unlink()
        for f in written.files:
            if f.local_path:
                Path(f.local_path).unlink(missing_ok=True)

    def add_copied(
        self, path: Path, num_rows: int, hashes: np.ndarray | Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """Register a Parquet file written by the initial copy. ``hashes``: its rows' key hashes in file
        order (uint64, ``(num_rows,)``), or sorted runs ``(hashes, rows)`` covering its rows
        (:func:`~..index.file_index.sorted_run` per batch), merged instead of sorted again.
        ``ValueError`` when they do not hold ``num_rows`` entries."""
        name = path.name
        runs = [sorted_run(hashes)] if isinstance(hashes, np.ndarray) else hashes
        n = sum(len(h) for h, _ in runs)
        if n != num_rows:
            raise ValueError(f"data file {name}: {num_rows} rows but {n} key hashes")
        self.files[name] = DiskFile(name=name, num_rows=num_rows, size_bytes=path.stat().st_size, local_path=str(path))
        block = FileIndex.build_from_runs(runs, self.new_block_path(), name)
        self.index.add_block(block)

    # ------------------------------------------------------------------ deletes
    def live_hits(self, h: int) -> Iterator[tuple[str, int]]:
        """(file name, row) of the index entries for key hash ``h`` whose row is not deleted, newest first."""
        for fname, row in self.index.lookup(h):
            f = self.files.get(fname)
            if f is not None and not f.is_deleted(row):
                yield fname, row

    def delete(self, fname: str, row: int, lsn: int) -> None:
        """Delete position ``row`` of file ``fname`` by a change committed at ``lsn`` (pending until the
        next persist writes it into the file's deletion vector); ``KeyError`` for an unknown file."""
        self.files[fname].pending.add(row, lsn)

    def delete_many(self, fnames: list[str], rows: list[int], lsns: list[int]) -> None:
        """:meth:`delete` of ``(fnames[i], rows[i], lsns[i])`` in order, each file's positions added in one
        batch (:meth:`~.pending_deletes.PendingDeletes.add_many`); ``KeyError`` for an unknown file, the
        deletes before it applied (as one by one)."""
        if not fnames:
            return
        if any(f not in self.files for f in set(fnames)):
            for f, r, at in zip(fnames, rows, lsns):
                self.delete(f, r, at)
            return
        first = fnames[0]
        if all(f == first for f in fnames):
            by_file = {first: (rows, lsns)}
        else:
            by_file = {}
            for f, r, at in zip(fnames, rows, lsns):
                rs, ls = by_file.setdefault(f, ([], []))
                rs.append(r)
                ls.append(at)
        for f, (rs, ls) in by_file.items():
            self.files[f].pending.add_many(np.asarray(rs, dtype=np.int64), np.asarray(ls, dtype=np.uint64))

    def truncate(self, lsn: int) -> None:
        """Every row of every file deleted by a TRUNCATE committed at ``lsn``."""
        for f in self.files.values():
            if not f.truncated_lsn:
                f.truncated_lsn = lsn

    @staticmethod
    def fully_deleted(f: DiskFile) -> bool:
        """Is every row of ``f`` deleted (a TRUNCATE, or as many deletes as rows)? A persist drops such a
        file from the snapshot instead of writing its deletion vector."""
        return bool(f.truncated_lsn) or f.deleted_count() >= f.num_rows

    def file_states(self, lsn: int | None) -> tuple[FileState, ...]:
        """The ReadState's files at ``lsn``: those with a live row, each with its deleted positions."""
        out = []
        for f in self.files.values():
            deleted = f.deleted_vector(lsn)
            if deleted is not None and len(deleted) >= f.num_rows:
                continue
            out.append(FileState(name=f.name, path=f.read_path, rows=f.num_rows, deleted=deleted))
        return tuple(out)

    # ------------------------------------------------------------------ persist bookkeeping
    def is_dirty(self) -> bool:
        """Something in the files is not durable in Iceberg (a staged file, a pending delete, a TRUNCATE)."""
        return any(not f.persisted or f.pending or f.truncated_lsn for f in self.files.values())

    def retire(self, path: str, now: float) -> None:
        """Schedule the staged file at ``path`` for deletion (``now``: seconds since the epoch) once
        readers are done with it (:meth:`gc_retired`)."""
        self.retired.append((now, path))

    def gc_retired(self, grace_s: float = 120.0) -> None:
        """Delete staged files that were persisted or dropped more than ``grace_s`` ago (readers may hold them)."""
        keep = []
        for t, p in self.retired:
            if time.time() - t > grace_s:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            else:
                keep.append((t, p))
        self.retired = keep

    # ------------------------------------------------------------------ index persistence
    def index_blob(self, index: FileIndex | None = None) -> bytes:
        """The FileIndex (``index``, default ours) as index blob bytes (layout: :mod:`~..index.saved`):
        each IndexBlock file's bytes, newest first, under today's key hash version."""
        return encode_index_blob((Path(b.path).name, Path(b.path).read_bytes()) for b in (index or self.index).blocks)

    def restore_index(self, saved: IndexBlob) -> None:
        """Rebuild the FileIndex from a decoded index blob (:func:`~..index.saved.decode_index_blob`):
        each block is written under ``<table dir>/index/`` and memory-mapped; no data file is read.
        Raises :class:`~..index.IndexBlockFormatError` for a block whose bytes are not a block."""
        blocks = []
        for name, data in saved.blocks:
            p = self.dir / "index" / name
            p.write_bytes(data)
            blocks.append(IndexBlock.open(str(p)))
        self.index = FileIndex(blocks)

    def load(self, data_files: dict[str, Any]) -> None:
        """The persisted files after a restart: ``data_files``: location → an object with
        ``record_count``, ``file_size_in_bytes`` and ``deleted`` (committed positions); staged files
        not among them are deleted."""
        self.files = {}
        for loc, df in data_files.items():
            name = loc.rsplit("/", 1)[-1]
            self.files[name] = DiskFile(
                name=name,
                num_rows=df.record_count,
                size_bytes=df.file_size_in_bytes,
                location=loc,
                committed=BitMap64(df.deleted),
            )
        for p in (self.dir / "staging").glob("*.parquet"):
            if p.name not in self.files:
                p.unlink()

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, int]:
        """Counts for ``status``: ``data_files``, ``data_bytes``, ``index_blocks``, ``pending_deletes``,
        ``deletion_vectors`` (files with a committed DV), ``deleted_rows``, ``file_rows``."""
        deleted = sum(f.deleted_count() for f in self.files.values())
        return {
            "data_files": len(self.files),
            "data_bytes": sum(f.size_bytes for f in self.files.values()),
            "index_blocks": len(self.index.blocks),
            "pending_deletes": sum(len(f.pending) for f in self.files.values()),
            "deletion_vectors": sum(1 for f in self.files.values() if len(f.committed)),
            "deleted_rows": deleted,
            "file_rows": sum(f.num_rows for f in self.files.values()),
        }
