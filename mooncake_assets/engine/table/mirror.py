"""One mirrored table: the roles composed (apply, disk files, persist, ReadState).

State of a table (all owned by the replicator service, the single writer):

- ``mem``: the :class:`MemSlice` (committed rows not yet flushed, with their MemIndex and
  BatchDeletionVectors);
- ``disk``: the :class:`~.disk_files.DiskFileSet` — ``files``: a :class:`DiskFile` per Parquet data
  file, flushed (staged on local disk) or persisted (in the Iceberg table), each with its persisted
  deletion vector and its pending position deletes; ``file_index``: the FileIndex (IndexBlocks, key
  hash → (file, row));
- LSNs: ``applied_lsn`` (every commit with commit_lsn < it is applied), ``flushed_lsn`` (the last
  flush boundary: reads at an LSN below it cannot be served exactly), ``flush_lsn`` (durable in
  Iceberg: snapshot summary ``mooncake.flush-lsn``).

The roles: :mod:`.schema_state` (columns, key, field ids, evolution), :mod:`.apply` (changes into
the MemSlice and the files' deletes), :mod:`.apply_run` (the same for whole columnar runs),
:mod:`.lookup` (locating live rows by key), :mod:`.disk_files` (the file set and its index),
:mod:`.persist` (the payload of one Iceberg commit), :mod:`.read_state` (what a union read gets).

LSN convention everywhere: a state "at L" holds exactly the transactions whose commit record starts
before L (``commit_lsn < L``), the same rule Postgres uses for an exported snapshot and for
``confirmed_flush_lsn``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..cdc import TableSchema
from ..faults import fault
from ..heap import release_unused
from ..iceberg.names import SUMMARY_DELETE_LOG, SUMMARY_DELETE_LOG_ROWS
from ..index import FileIndex, KeyHash
from ..index.key_hash import blob_needs_rebuild
from ..index.saved import decode_index_blob
from ..lsn import Lsn
from . import maintenance
from .apply_run import RunApplyRole
from .delete_log import FULL_COLUMN, DeleteLog, build_log, write_log
from .disk_files import MAX_FILE_ROWS, DiskFile, DiskFileSet, WrittenFiles
from .maintenance import CompactionInput, CompactionResult, IndexMergeInput, PreparedSwap
from .memslice import FrozenRows, MemSlice
from .persist import INDEX_SAVE_INTERVAL_S, PersistPayload, apply_persist, build_payload
from .read_state import ReadField, ReadState
from .schema_state import TableSchemaRole

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from ..iceberg.lineage import FileLineage
    from ..iceberg.table import IcebergMirrorTable
    from ..index import IndexBlock

log = logging.getLogger("mooncake.table")

__all__ = ["MirrorTable", "DiskFile"]


class MirrorTable(TableSchemaRole, RunApplyRole):
    """The mirror of one Postgres table (see module docstring).

    ``name``: destination name (also the Iceberg table name in namespace ``mooncake``);
    ``schema``: the source table's :class:`TableSchema`; ``iceberg``: its IcebergMirrorTable (None:
    a table that applies, flushes and serves reads but cannot persist, e.g. in unit tests);
    ``table_dir``: local state (staged Parquet files, index blocks).
    """

    #: the last report of each maintenance operation (set by ``compaction.runner``; absent before the first)
    last_maintenance: dict[str, Any]
    #: what the cleanup after the last restore found and removed (set by the registry when it opens the table)
    last_cleanup: dict[str, Any]

    def __init__(
        self, name: str, source: str, schema: TableSchema, iceberg: IcebergMirrorTable | None, table_dir: Path
    ) -> None:
        self.name = name
        self.source = source
        self.schema = schema
        self.iceberg = iceberg
        if iceberg is not None and getattr(iceberg, "before_swap", None) is None:
            # crash point for tests: every file of an Iceberg commit written, the pointer not swapped yet
            iceberg.before_swap = lambda location: fault("commit:before_swap")
        self.dir = Path(table_dir)
        self.disk = DiskFileSet(self.dir)
        # schema evolution (engine/table/evolution.py): Iceberg field ids are the Iceberg table's;
        # ``schema_pending``: the current schema is not committed to Iceberg yet (next persist does);
        # ``evolved``: files may have been written under older schemas (readers map by field id)
        self.next_field_id = self._sync_field_ids(schema, iceberg)
        self.schema_pending = iceberg is None or not self._iceberg_has_columns(iceberg)
        self.evolved = iceberg is not None and len(iceberg.table.metadata.schemas) > 1
        self._set_schema(schema, getattr(schema, "hash_field_ids", None))
        self._schema_versions: list[Schema] = []  # Iceberg schemas since the last commit, oldest first
        self.last_schema_change: str | None = None  # what the last followed ALTER TABLE did, and its LSN
        self.hasher = KeyHash([schema.columns[i].type_oid for i in self._key_idx], keyed=bool(schema.key_columns))
        # an exact key's hashes are recomputed from the key column at flush, not kept per buffered row
        key_col = self._key_idx[0] if self.hasher.exact else None
        if key_col is not None and not pa.types.is_integer(self.arrow_schema.field(key_col).type):
            key_col = None
        self.mem = MemSlice(self.arrow_schema, self._decode, specs=schema.columns, key_column=key_col)
        # keys (and whole old rows, REPLICA IDENTITY FULL) of file rows deleted since the last persist
        self.delete_log = DeleteLog(self.key_names, value_names=self.value_names)
        self.applied_lsn = 0
        self.flushed_lsn = 0
        self.flush_lsn = 0
        self.last_change_lsn = 0  # commit LSN of the last change applied to this table (0: none since the restore)
        self.missing_keys = 0
        self.error: str | None = None
        self.last_persist = time.time()
        self.index_saved_at = 0.0  # time.time() of the last persist that saved the FileIndex (0: none yet)
        # since when (time.time()) changes have waited for a persist, as the service first saw the table
        # dirty after one (None: everything seen is persisted); status warns past warn_persist_age_s
        self.dirty_since: float | None = None
        self._relmap: dict[int, list[int]] = {}
        self._identity: dict[int, list[int]] = {}
        self._row_cache: dict[str, pa.Table] = {}

    # ------------------------------------------------------------------ the file set
    @property
    def files(self) -> dict[str, DiskFile]:
        """The data files by name (:attr:`disk` ``.files``)."""
        return self.disk.files

    @files.setter
    def files(self, value: dict[str, DiskFile]) -> None:
        self.disk.files = value

    @property
    def file_index(self) -> FileIndex:
        """The FileIndex over the data files (:attr:`disk` ``.index``)."""
        return self.disk.index

    @file_index.setter
    def file_index(self, value: FileIndex) -> None:
        self.disk.index = value

    # ------------------------------------------------------------------ flush
    def flush(self) -> dict[str, Any]:
        """Write the MemSlice's live rows to Parquet in ``staging/`` plus one IndexBlock for them.

        Rows stay visible throughout (the caller holds the service lock). The freed memory is released
        afterwards (:func:`~..heap.release_unused`: Arrow's pool and glibc's heap). Returns
        ``{"rows", "files", "bytes", "seconds"}``.
        """
        t0 = time.time()
        table, hashes, horizon = self.mem.drain()
        if horizon:
            self.flushed_lsn = max(self.flushed_lsn, horizon + 1)
        self._row_cache.clear()
        if table.num_rows == 0:
            return {"rows": 0, "files": 0, "bytes": 0, "seconds": time.time() - t0}
        files, nbytes = self.disk.write(table, hashes)
        rows = table.num_rows
        del table, hashes
        # hand the drained buffers' free pages back to the OS: Arrow's pool and glibc's heap (the numpy
        # arrays and the MemIndex of the slice; see engine/heap.py, service.process.select_memory_pool)
        release_unused()
        return {"rows": rows, "files": files, "bytes": nbytes, "seconds": time.time() - t0}

    def begin_flush(self) -> FrozenRows:
        """A flush in three steps, so that the service lock is not held while Parquet is written: this
        one (under the lock) takes the MemSlice's rows as they are (:meth:`MemSlice.freeze`); they stay
        visible and deletable. :meth:`write_frozen` (without the lock) writes them;
        :meth:`finish_flush` (under it) swaps the files in. Raises ``BadRowError`` from sealing."""
        return self.mem.freeze()

    def write_frozen(self, frozen: FrozenRows) -> WrittenFiles | None:
        """The rows :meth:`begin_flush` took, written as staged Parquet files and one IndexBlock that
        nothing references yet (:meth:`.disk_files.DiskFileSet.prepare`); None when none was live.
        Reads only immutable data: call it WITHOUT the service lock."""
        table, hashes = frozen.rows()
        if table.num_rows == 0:
            return None
        return self.disk.prepare(table, hashes)

    def finish_flush(self, frozen: FrozenRows, written: WrittenFiles | None) -> dict[str, Any] | None:
        """Swap the files :meth:`write_frozen` wrote in for the rows :meth:`begin_flush` took (under the
        service lock): the rows leave the MemSlice, the files and their IndexBlock join the set, and
        rows deleted meanwhile become pending deletes of the new files at their commit LSNs (a read at
        any LSN sees what it saw before). Returns ``{"rows", "files", "bytes"}``, or None when the
        MemSlice changed under the write (drained by another flush, a schema change): the files are
        then removed and nothing changes — the caller flushes as usual."""
        newly = self.mem.release(frozen)
        if newly is None:
            if written is not None:
                self.disk.discard(written)
            return None
        if frozen.horizon:
            self.flushed_lsn = max(self.flushed_lsn, frozen.horizon + 1)
        self._row_cache.clear()
        if written is None:
            return {"rows": 0, "files": 0, "bytes": 0}
        self.disk.register(written)
        pos, lsns = newly
        if len(pos):
            fi = pos // MAX_FILE_ROWS
            names = [written.files[i].name for i in fi.tolist()]
            self.disk.delete_many(names, (pos % MAX_FILE_ROWS).tolist(), lsns.tolist())
        rows = sum(f.num_rows for f in written.files)
        return {"rows": rows, "files": len(written.files), "bytes": written.nbytes}

    def add_copied_file(
        self, path: Path, num_rows: int, hashes: np.ndarray | Sequence[tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """Register a Parquet file written by the initial copy: its rows' key hashes in file order, or
        sorted runs of them (:meth:`.disk_files.DiskFileSet.add_copied`)."""
        self.disk.add_copied(path, num_rows, hashes)

    # ------------------------------------------------------------------ persist
    def is_dirty(self) -> bool:
        """True when something applied is not yet durable in Iceberg."""
        return not self.mem.is_empty() or self.schema_pending or self.disk.is_dirty()

    def _pending_schemas(self) -> list[Schema] | None:
        """The Iceberg schemas the next commit adds, oldest first (each evolve appended the then-current
        one, so the last is today's), or None when Iceberg has the current schema."""
        if not self.schema_pending:
            return None
        return list(self._schema_versions) or [self.iceberg_schema()]

    def upload_plan(self) -> tuple[list[tuple[str, str]], object]:
        """(name, local path) of the live data files not in Iceberg yet, and the schema versions a commit
        would add — what :meth:`upload` may copy to the warehouse without the service lock (call this
        under it, after a :meth:`flush`)."""
        todo = [
            (f.name, f.local_path)
            for f in self.files.values()
            if not f.persisted and f.local_path and not self.disk.fully_deleted(f)
        ]
        return todo, self._pending_schemas()

    def upload(self, todo: list[tuple[str, str]], schema: object) -> dict[str, str]:
        """Copy staged files (immutable) to the warehouse; name → location, for :meth:`persist`'s
        ``uploaded``. Changes no state of the table, so it runs without the service lock; a failure
        raises (the next persist uploads again, overwriting)."""
        out = {}
        for name, path in todo:
            fault("persist:upload")
            out[name] = self.iceberg.upload_data_file(path, overwrite=True, schema=schema)
        return out

    def persist(self, uploaded: dict[str, str] | None = None, save_index: bool = True) -> dict[str, Any]:
        """Flush, then commit to Iceberg in ONE commit: new data files, merged deletes (one DV per file),
        files whose rows are all deleted removed, the FileIndex blob and ``mooncake.flush-lsn`` (the
        :class:`~.persist.PersistPayload`).

        ``uploaded``: files :meth:`upload` already copied (name → location); the others are uploaded
        here. ``save_index`` False: the commit carries the last saved FileIndex over unless that save is
        :data:`~.persist.INDEX_SAVE_INTERVAL_S` old (or the key is not exact, the schema is new, nothing
        was committed yet); the service's own persists pass it. Only after it returns may the slot be confirmed up to ``flush_lsn``. Nothing of the table
        changes until the commit has landed: a failed upload or commit (e.g. the warehouse is
        unreachable) leaves files, pending deletes and removals as they were, so the next persist
        retries all of it. Returns counts: ``rows`` (rows of the data files this commit adds, flushed
        now or by an earlier flush), ``rows_flushed`` (of those, rows this call flushed from the
        buffer), ``files_added``, ``files_removed``, ``deleted_rows`` (positions newly in deletion
        vectors), ``flush_lsn``, ``seconds``.
        """
        t0 = time.time()
        fl = self.flush()
        schemas = self._pending_schemas()
        with_index = save_index or self.index_save_due(t0)
        payload = build_payload(
            self.disk,
            self.applied_lsn,
            self.source,
            dict(uploaded or {}),
            lambda path: self.iceberg.upload_data_file(path, overwrite=True, schema=schemas),
            schemas=schemas,
            properties={"mooncake.columns": self.columns_property()} if self.schema_pending else None,
            with_index=with_index,
        )
        if payload.add or payload.deletes or payload.remove or fl["rows"] or self.flush_lsn == 0 or self.schema_pending:
            self._commit(self._with_delete_log(payload))
            if with_index:
                self.index_saved_at = t0
        self.delete_log.clear()
        rows_added = sum(self.files[name].num_rows for name, _ in payload.add)
        self.flushed_lsn = max(self.flushed_lsn, apply_persist(self.disk, payload))
        self.flush_lsn = payload.lsn
        self.last_persist = time.time()
        self.dirty_since = None
        return {
            "rows": rows_added,
            "rows_flushed": fl["rows"],
            "files_added": len(payload.add),
            "files_removed": len(payload.remove),
            "deleted_rows": payload.new_deletes,
            "flush_lsn": str(payload.lsn),
            "seconds": self.last_persist - t0,
        }

    def _with_delete_log(self, payload: PersistPayload) -> PersistPayload:
        """``payload`` with its delete log (:mod:`.delete_log`) written and named in its summary: the keys
        of the positions it newly deletes in files already persisted, where the log holds them all or
        some (unchanged when none). The log file is written before the commit that references it."""
        if self.iceberg is None or not payload.deletes or not len(self.delete_log):
            return payload
        targets = {
            f.name: (f.location, payload.deletes[f.location])
            for f in self.files.values()
            if f.location is not None and f.location in payload.deletes
        }
        specs = [self.schema.columns[i] for i in self._key_idx]
        value_specs = [self.schema.columns[i] for i in self._value_idx]
        log_table = build_log(self.delete_log, targets, specs, value_specs)
        if log_table is None:
            return payload
        fault("persist:delete_log")
        location = write_log(self.iceberg.io, self.iceberg.location, log_table)
        summary = {**payload.summary, SUMMARY_DELETE_LOG: location}
        if FULL_COLUMN in log_table.column_names:  # whole old rows: the full-row feed reads this log too
            summary[SUMMARY_DELETE_LOG_ROWS] = str(int(pc.sum(log_table.column(FULL_COLUMN)).as_py() or 0))
        return dataclasses.replace(payload, summary=summary)

    def _commit(self, payload: PersistPayload) -> None:
        """ONE Iceberg commit of ``payload`` (raises what the commit raises; then nothing changed)."""
        fault("persist:after_upload")
        self.iceberg.commit(
            add_files=[loc for _, loc in payload.add],
            deletes=payload.deletes,
            remove_files=list(payload.remove),
            index_blob=payload.index_blob,
            summary=payload.summary,
            schema=payload.schemas,
            properties=payload.properties,
        )
        fault("persist:after_commit")
        self.schema_pending = False
        self._schema_versions = []

    # ------------------------------------------------------------------ index persistence, restore
    def index_save_due(self, now: float) -> bool:
        """Whether a commit of the service's own (persist, compaction) must save the FileIndex: the key
        is not exact (a restart re-indexes the files a saved index misses from their keys' text, exact
        keys only), nothing was committed yet, the schema is new, or the last save is
        :data:`~.persist.INDEX_SAVE_INTERVAL_S` old."""
        return (
            not self.hasher.exact
            or self.flush_lsn == 0
            or self.schema_pending
            or now - self.index_saved_at >= INDEX_SAVE_INTERVAL_S
        )

    def index_blob(self) -> bytes:
        """The FileIndex as bytes (:meth:`DiskFileSet.index_blob`)."""
        return self.disk.index_blob()

    def restore_index(self, blob: bytes) -> None:
        """Rebuild the FileIndex from :meth:`index_blob` bytes (no data file is read). Blocks hashed
        under an older key hash (header without ``"key_hash"``) are rebuilt from the data files instead
        when the table's key is not exact (:func:`~..index.key_hash.blob_needs_rebuild`). The blob is
        parsed once (:func:`~..index.saved.decode_index_blob`; ``IndexBlockFormatError`` when it is not one)."""
        saved = decode_index_blob(blob)
        if blob_needs_rebuild(saved.key_hash, self.hasher.exact):
            from .key_text import rebuild_file_index

            self.file_index = rebuild_file_index(self)
            return
        self.disk.restore_index(saved)

    def restore(self) -> None:
        """Load the persisted state (data files, DVs, index, flush LSN) after a restart (the caller then
        removes the leftovers of an interrupted run: ``engine.compaction.cleanup_after_restore``)."""
        st = self.iceberg.state()
        self.delete_log.clear()
        self.disk.load(st.data_files)
        lsn = st.summary.get("mooncake.flush-lsn") if st.summary else None
        self.flush_lsn = Lsn.parse(lsn) if lsn else 0
        self.applied_lsn = self.flushed_lsn = self.flush_lsn
        if st.index_blob:
            self.restore_index(st.index_blob)
        self._index_unsaved_files()
        self.evolved = len(self.iceberg.table.metadata.schemas) > 1

    def _index_unsaved_files(self) -> None:
        """After a restore: the data files the saved FileIndex does not cover (persisted after its last
        save, :data:`~.persist.INDEX_SAVE_INTERVAL_S`) get an IndexBlock each, from their key columns
        (:func:`~.key_text.rebuild_file_index`; sets :attr:`error` when that fails)."""
        covered = {name for b in self.file_index.blocks for name in b.files}
        missing = [name for name in self.files if name not in covered]
        if not missing or self.error:
            return
        from .key_text import rebuild_file_index

        for block in rebuild_file_index(self, missing).blocks:
            self.file_index.add_block(block)
        if not self.error:
            log.info("table %s: %d data file(s) persisted after the saved index re-indexed", self.name, len(missing))

    # ------------------------------------------------------------------ maintenance (engine/compaction)
    # Compaction and index merge take a frozen input and hand back a result this table applies; the
    # caller holds the service lock around each of these (see :mod:`.maintenance`).
    def compaction_input(self, names: list[str]) -> CompactionInput:
        """A frozen snapshot of the picked files, their IndexBlocks, the Iceberg layout and (format v3)
        each file's row lineage in the current snapshot (the rewrite carries it into the new files)."""
        return maintenance.compaction_input(self.disk, names, self.arrow_schema, self.defaults, self._lineage(names))

    def _lineage(self, names: list[str]) -> dict[str, FileLineage] | None:
        """File name -> :class:`FileLineage` of the persisted files ``names`` (None before format v3)."""
        row_lineage = getattr(self.iceberg, "row_lineage", None)  # test doubles of the Iceberg side may lack it
        if row_lineage is None or getattr(self.iceberg, "format_version", 3) < 3:
            return None
        locations = {n: cast(str, self.disk.files[n].location) for n in names}
        got = row_lineage(locations.values())
        return {n: got[loc] for n, loc in locations.items()}

    def prepare_compaction(self, inp: CompactionInput, res: CompactionResult, save_index: bool = True) -> PreparedSwap:
        """The swap a compaction's result makes, ready to commit (nothing changes yet); it saves the
        FileIndex when ``save_index`` or :meth:`index_save_due`."""
        return maintenance.prepare_compaction(self.disk, inp, res, save_index or self.index_save_due(time.time()))

    def apply_compaction(self, inp: CompactionInput, res: CompactionResult, prep: PreparedSwap) -> None:
        """After the compaction's commit landed: its files and IndexBlock replace the old ones."""
        maintenance.apply_compaction(self.disk, inp, res, prep)
        if prep.index_blob is not None:
            self.index_saved_at = time.time()
        self._row_cache.clear()

    def index_merge_input(self, blocks: Iterable[IndexBlock]) -> IndexMergeInput:
        """A frozen snapshot for merging ``blocks``: them and the live file names."""
        return maintenance.index_merge_input(self.disk, blocks)

    def apply_index_merge(self, old_blocks: Sequence[IndexBlock], new_block: IndexBlock | None) -> None:
        """``new_block`` replaces ``old_blocks`` (their files are deleted)."""
        maintenance.apply_index_merge(self.disk, old_blocks, new_block)

    # ------------------------------------------------------------------ reads
    def read_state(
        self, lsn: int | None = None, known: str | None = None, storage: dict[str, Any] | None = None
    ) -> ReadState:
        """The :class:`ReadState` at ``lsn`` (None = all applied): live files with their deleted positions,
        the column names, ``fields`` when files may have older layouts, ``storage`` (the warehouse's
        hints for readers), the visible in-memory rows (``mem``) and ``token``
        (:meth:`ReadState.content_token` with :meth:`MemSlice.read_token`: no row is serialized or
        hashed for it). When ``known`` equals the token, ``mem`` is None (the asker holds those rows).
        Raises ``ValueError`` when ``lsn`` is below the last flush boundary (it cannot be served
        exactly), :class:`BadRowError` when a buffered row cannot be decoded."""
        if lsn is not None and lsn < self.flushed_lsn:
            raise ValueError(
                f"table {self.name}: cannot read at LSN {Lsn(lsn)}, it was flushed up to "
                f"{Lsn(self.flushed_lsn)}; read at a newer LSN"
            )
        files = self.disk.file_states(lsn)
        fields = self.read_fields()
        rs = ReadState(
            table=self.name,
            lsn=Lsn(lsn if lsn is not None else self.applied_lsn),
            files=files,
            schema=tuple(f.name for f in self.arrow_schema),
            fields=tuple(ReadField(**d) for d in fields) if fields else None,
            storage=storage or None,
        )
        token = rs.content_token(self.mem.read_token(lsn))
        return rs.with_(token=token, mem=None if known == token else self.mem.visible(lsn))

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        """The table's part of ``list-tables --json``: name, source, LSNs as ``X/Y`` text (applied, flush,
        last change), ``buffer_rows``/``buffer_bytes`` of the MemSlice, the file counts of
        :meth:`DiskFileSet.stats`, ``live_rows`` (files minus deletes plus buffer), ``missing_keys``,
        ``columns`` and ``last_schema_change`` (docs/ describes each field)."""
        d = self.disk.stats()
        return {
            "name": self.name,
            "source": self.source,
            "applied_lsn": str(Lsn(self.applied_lsn)),
            "flush_lsn": str(Lsn(self.flush_lsn)),
            "last_change_lsn": str(Lsn(self.last_change_lsn or self.flush_lsn)),
            "buffer_rows": self.mem.live_rows,
            "buffer_bytes": self.mem.nbytes,
            "data_files": d["data_files"],
            "data_bytes": d["data_bytes"],
            "index_blocks": d["index_blocks"],
            "pending_deletes": d["pending_deletes"],
            "deletion_vectors": d["deletion_vectors"],
            "deleted_rows": d["deleted_rows"],
            "live_rows": d["file_rows"] - d["deleted_rows"] + self.mem.live_rows,
            "missing_keys": self.missing_keys,
            "columns": len(self._col_names),
            "last_schema_change": self.last_schema_change,
        }
