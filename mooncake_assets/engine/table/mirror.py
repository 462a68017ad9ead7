"""One mirrored table: the apply path, flush, persist and ReadState (DESIGN.md §3, §4; seed 000).

State of a table (all owned by the replicator service, the single writer):

- ``mem``: the :class:`MemSlice` (committed rows not yet flushed, with their MemIndex and
  BatchDeletionVectors);
- ``files``: :class:`DiskFile` per Parquet data file, flushed (staged on local disk) or persisted
  (in the Iceberg table), each with its persisted deletion vector and its pending position deletes;
- ``file_index``: the FileIndex (IndexBlocks, key hash → (file, row));
- LSNs: ``applied_lsn`` (every commit with commit_lsn < it is applied), ``flushed_lsn`` (the last
  flush boundary: reads at an LSN below it cannot be served exactly), ``flush_lsn`` (durable in
  Iceberg: snapshot summary ``mooncake.flush-lsn``).

LSN convention everywhere: a state "at L" holds exactly the transactions whose commit record starts
before L (``commit_lsn < L``), the same rule Postgres uses for an exported snapshot and for
``confirmed_flush_lsn``.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ..cdc import TableSchema, decode_text_columns
from .evolution import field_id_of, project
from ..index import KEY_HASH_VERSION, FileIndex, IndexBlock, KeyHash
from ..index.key_hash import blob_needs_rebuild
from ..faults import fault
from .memslice import Carried, MemSlice

log = logging.getLogger("mooncake.table")

MAX_FILE_ROWS = 1_000_000


def lsn_str(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(s: str) -> int:
    hi, lo = s.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def local_path_of(location: str) -> str:
    """A path DuckDB/PyArrow can open for a warehouse location (``file://`` stripped)."""
    return location[len("file://"):] if location.startswith("file://") else location


@dataclass
class DiskFile:
    """A Parquet data file of the table.

    ``committed``: positions deleted in the persisted snapshot (its DV); ``pending``: position →
    commit LSN of deletes not yet persisted; ``truncated_lsn``: commit LSN of a TRUNCATE that removed
    every row (0 = none).
    """

    name: str
    num_rows: int
    size_bytes: int
    local_path: str | None = None
    location: str | None = None
    committed: BitMap64 = field(default_factory=BitMap64)
    pending: dict = field(default_factory=dict)
    truncated_lsn: int = 0
    # deleted_at(None), kept while the sizes of committed and pending are unchanged (both only grow,
    # and a persist moves positions from one to the other): union reads ask for it on every query
    _all_deleted: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def persisted(self) -> bool:
        return self.location is not None

    @property
    def read_path(self) -> str:
        return local_path_of(self.location) if self.location else self.local_path

    def is_deleted(self, row: int) -> bool:
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
            if lsn is None:
                bm.update(self.pending.keys())
            else:
                bm.update(p for p, l in self.pending.items() if l < lsn)
        if lsn is None:
            self._all_deleted = (key, BitMap64(bm))
        return bm

    def deleted_payload(self, lsn: int | None) -> tuple[int, str | None]:
        """(how many positions are deleted as of ``lsn``, their portable bitmap as base64 or None when
        none) for a ReadState; for ``lsn=None`` the text is cached with :meth:`deleted_at`'s bitmap."""
        dv = self.deleted_at(lsn)
        if lsn is None and not self.truncated_lsn and self._all_deleted is not None:
            key, bm, *text = self._all_deleted
            if not text:
                text = [base64.b64encode(bm.serialize()).decode() if len(bm) else None]
                self._all_deleted = (key, bm, text[0])
            return len(bm), text[0]
        return len(dv), base64.b64encode(dv.serialize()).decode() if len(dv) else None

    def deleted_count(self) -> int:
        if self.truncated_lsn:
            return self.num_rows
        return len(self.committed) + len(self.pending)


class MirrorTable:
    """The mirror of one Postgres table (see module docstring).

    ``name``: destination name (also the Iceberg table name in namespace ``mooncake``);
    ``schema``: the source table's :class:`TableSchema`; ``iceberg``: its IcebergMirrorTable;
    ``table_dir``: local state (staged Parquet files, index blocks).
    """

    def __init__(self, name: str, source: str, schema: TableSchema, iceberg, table_dir: Path):
        self.name = name
        self.source = source
        self.schema = schema
        self.iceberg = iceberg
        if iceberg is not None and getattr(iceberg, "before_swap", None) is None:
            # crash point for tests: every file of an Iceberg commit written, the pointer not swapped yet
            iceberg.before_swap = lambda location: fault("commit:before_swap")
        self.dir = Path(table_dir)
        (self.dir / "staging").mkdir(parents=True, exist_ok=True)
        (self.dir / "index").mkdir(parents=True, exist_ok=True)
        # schema evolution (engine/table/evolution.py): Iceberg field ids are the Iceberg table's;
        # ``schema_pending``: the current schema is not committed to Iceberg yet (next persist does);
        # ``evolved``: files may have been written under older schemas (readers map by field id)
        self.next_field_id = self._sync_field_ids(schema, iceberg)
        self.schema_pending = iceberg is None or not self._iceberg_has_columns(iceberg)
        self.evolved = iceberg is not None and len(iceberg.table.metadata.schemas) > 1
        self._set_schema(schema, getattr(schema, "hash_field_ids", None))
        self._schema_versions: list = []  # Iceberg schemas since the last commit, oldest first
        self.last_schema_change: str | None = None  # what the last followed ALTER TABLE did, and its LSN
        self.hasher = KeyHash([schema.columns[i].type_oid for i in self._key_idx], keyed=bool(schema.key_columns))
        self.mem = MemSlice(self.arrow_schema, self._decode, specs=schema.columns)
        self.files: dict[str, DiskFile] = {}
        self.file_index = FileIndex()
        self.applied_lsn = 0
        self.flushed_lsn = 0
        self.flush_lsn = 0
        self.last_change_lsn = 0  # commit LSN of the last change applied to this table (0: none since the restore)
        self.missing_keys = 0
        self.error: str | None = None
        self.last_persist = time.time()
        # since when (time.time()) changes have waited for a persist, as the service first saw the table
        # dirty after one (None: everything seen is persisted); status warns past warn_persist_age_s
        self.dirty_since: float | None = None
        self._retired: list[tuple[float, str]] = []
        self._relmap: dict[int, list[int]] = {}
        self._identity: dict[int, list[int]] = {}
        self._row_cache: dict[str, pa.Table] = {}

    # ------------------------------------------------------------------ schema
    @staticmethod
    def _sync_field_ids(schema: TableSchema, iceberg) -> int:
        """Take the Iceberg table's field ids for our columns (by name, list elements too); returns the
        next free field id."""
        last = 0
        if iceberg is not None:
            ice = iceberg.schema
            last = iceberg.table.metadata.last_column_id or 0
            for c in schema.columns:
                try:
                    f = ice.find_field(c.name)
                except ValueError:
                    continue
                c.field_id = f.field_id
                ids = _nested_ids(f.field_type)
                if ids:
                    c.element_ids = ids
        return max([last] + [c.field_id for c in schema.columns]
                   + [max(c.element_ids, default=0) for c in schema.columns]) + 1

    @staticmethod
    def _iceberg_has_columns(iceberg) -> bool:
        return "mooncake.columns" in iceberg.table.metadata.properties

    def _set_schema(self, schema: TableSchema, hash_field_ids: list | None = None) -> None:
        self.schema = schema
        self.arrow_schema = schema.arrow_schema()
        self._col_names = [c.name for c in schema.columns]
        # a table without a key (REPLICA IDENTITY FULL) is keyed by the whole row — the columns it had when
        # its rows were hashed (``hash_field_ids``): a column added later is only re-checked
        if schema.key_columns:
            self.key_names = list(schema.key_columns)
        elif hash_field_ids:
            by_id = {c.field_id: c.name for c in schema.columns}
            self.key_names = [by_id[f] for f in hash_field_ids]
        else:
            self.key_names = list(self._col_names)
        self._key_idx = [self._col_names.index(k) for k in self.key_names]
        # a change carrying the whole old row (REPLICA IDENTITY FULL) picks among several candidate rows by
        # comparing all columns: for keyed tables (a DEFERRABLE key may repeat inside a transaction) and
        # for key-less ones hashed on fewer columns than they now have
        self._match_full_row = bool(schema.key_columns) or len(self._key_idx) < len(self._col_names)
        self.defaults = initial_defaults(schema.columns)
        self._read_fields = None

    @property
    def hash_field_ids(self) -> list[int]:
        """Field ids of the columns row keys are hashed from (the key, or a key-less table's original row)."""
        return [self.schema.columns[i].field_id for i in self._key_idx]

    def evolve(self, change) -> None:
        """Follow a source schema change at ``change.lsn`` (a :class:`.evolution.SchemaChange`): seal the
        open buffer under the old schema, convert the buffered rows, switch decoding, and make the next
        persist commit the new Iceberg schema. Reads at LSNs before the change are refused afterwards.
        Raises :class:`BadRowError` (nothing changed) when a buffered row cannot be decoded."""
        hash_ids = self.hash_field_ids
        new = TableSchema(schema=self.schema.schema, name=self.schema.name, oid=self.schema.oid, columns=change.columns,
                          key_columns=change.key_columns, has_primary_key=self.schema.has_primary_key,
                          replica_identity=self.schema.replica_identity, relkind=self.schema.relkind,
                          excluded=list(self.schema.excluded), column_types=dict(self.schema.column_types))
        old_arrow, new_arrow = self.arrow_schema, new.arrow_schema()
        defaults = initial_defaults(new.columns)
        self.mem.evolve(new_arrow, self._decode, lambda rb: project(
            pa.RecordBatch.from_arrays(rb.columns, schema=old_arrow), new_arrow, defaults), specs=new.columns)
        self._set_schema(new, hash_ids if not new.key_columns else None)
        self._relmap.clear()
        self._identity.clear()
        self.__dict__.get("_relations_seen", {}).clear()
        self._row_cache.clear()
        self.flushed_lsn = max(self.flushed_lsn, change.lsn)
        self.next_field_id = max(self.next_field_id, change.next_field_id)
        self.schema_pending = True
        self.evolved = True
        self._schema_versions.append(self.iceberg_schema())  # files may be flushed under each version
        self.last_schema_change = change.describe()
        log.info("table %s: %s", self.name, self.last_schema_change)

    def columns_property(self) -> str:
        """The Iceberg table property ``mooncake.columns``: the mirror's columns as a restart needs them."""
        from ..pg.schema import column_signature

        return json.dumps({"columns": column_signature(self.schema), "key": list(self.schema.key_columns),
                           "hash_field_ids": self.hash_field_ids})

    def iceberg_schema(self):
        """The current schema as a PyIceberg ``Schema`` (our field ids; added columns carry their
        ``initial-default``)."""
        from pyiceberg.io.pyarrow import pyarrow_to_schema

        sch = pyarrow_to_schema(self.arrow_schema, format_version=getattr(self.iceberg, "format_version", 3))
        if not self.defaults:
            return sch
        fields = []
        for f in sch.fields:
            d = self.defaults.get(f.field_id)
            if d is not None and d.is_valid:
                try:
                    from pyiceberg.conversions import to_json

                    value = d.as_py()
                    to_json(f.field_type, value)  # checked here: the metadata writer would fail on it later
                    f = f.model_copy(update={"initial_default": value})
                except Exception:  # noqa: BLE001 — e.g. timestamp 'infinity', a list: older rows read NULL there
                    log.warning("table %s: column %s: its default cannot be an Iceberg initial-default; Iceberg "
                                "readers show NULL for rows older than the column", self.name, f.name)
            fields.append(f)
        return type(sch)(*fields, schema_id=sch.schema_id)

    def read_fields(self) -> list[dict] | None:
        """For readers of a table whose files may have older layouts (None otherwise): per current column
        ``{"id", "name", "type" (DuckDB type), "default" (text DuckDB casts, or None)}``."""
        if not self.evolved:
            return None
        if self._read_fields is None:
            import duckdb

            con = duckdb.connect()
            empty = self.arrow_schema.empty_table()
            types = con.from_arrow(empty).types
            out = []
            for f, t in zip(self.arrow_schema, types):
                fid = field_id_of(f)
                d = self.defaults.get(fid)
                text = None
                if d is not None and d.is_valid:
                    one = pa.Table.from_arrays([pa.repeat(d, 1)], names=["v"])
                    text = con.from_arrow(one).project("CAST(v AS VARCHAR)").fetchone()[0]
                out.append({"id": fid, "name": f.name, "type": str(t), "default": text})
            con.close()
            self._read_fields = out
        return self._read_fields

    # ------------------------------------------------------------------ decoding helpers
    def _decode(self, cols: list[list]) -> pa.RecordBatch:
        return decode_text_columns(self.schema.columns, cols, column_major=True)

    def column_map(self, rel_oid: int, rel_columns: list[str]) -> list[int]:
        """Indices of our columns in a Relation message's column list (-1 = not sent)."""
        m = [rel_columns.index(c) if c in rel_columns else -1 for c in self._col_names]
        self._relmap[rel_oid] = m
        if m == list(range(len(rel_columns))):
            self._identity[rel_oid] = m
        else:
            self._identity.pop(rel_oid, None)
        return m

    @staticmethod
    def _cell(v):
        kind, data = v
        if kind == "n":
            return None
        if kind == "u":
            return _UNCHANGED
        return bytes(data).decode("utf-8")

    def _values(self, tup, rel_oid: int) -> list:
        """Our columns' text values of a TupleData (None = NULL, _UNCHANGED = unchanged TOAST)."""
        m = self._relmap[rel_oid]
        if "u" not in tup.kinds and m is self._identity.get(rel_oid):
            return [None if v is None else v.decode() for v in tup.data]  # the hot path
        return [self._cell(tup[i]) if i >= 0 else None for i in m]

    def _key(self, values: list) -> list:
        return [values[i] for i in self._key_idx]

    # ------------------------------------------------------------------ locating rows
    def _find(self, key_vals: list):
        """Locate a live row by key: ('mem', loc) | ('disk', file, row) | None. Newest first."""
        h = self.hasher.hash_one(key_vals)
        for loc in self.mem.find(h):
            if self.hasher.exact or self._recheck(self.mem.row_values(loc), key_vals):
                return ("mem", loc, h)
        for fname, row in self.file_index.lookup(h):
            f = self.files.get(fname)
            if f is None or f.is_deleted(row):
                continue
            if not self.hasher.exact and not self._recheck(self._disk_row(fname, row), key_vals):
                continue
            return ("disk", (fname, row), h)
        return None

    def _recheck(self, vals: list, key_vals: list) -> bool:
        """Does a candidate row (text or Carried values) really hold this key (text values)?

        Hashed keys are re-checked on every hit (DESIGN.md §3): a text value is compared as text, a
        typed value (sealed batch or data file) with the key decoded by the table's own decoder;
        NULL equals NULL and NaN equals NaN, as for a row identity."""
        typed = None
        for j, (i, kv) in enumerate(zip(self._key_idx, key_vals)):
            v = vals[i]
            if isinstance(v, Carried):
                if typed is None:
                    specs = [self.schema.columns[k] for k in self._key_idx]
                    typed = decode_text_columns(specs, [[x] for x in key_vals], column_major=True).to_pylist()[0]
                    typed = [typed[c.name] for c in specs]
                if not _same_value(v.value, typed[j]):
                    return False
            elif v != kv:
                return False
        return True

    def _find_full(self, key_vals: list, old: list):
        """Like :meth:`_find`, for a change that carries the whole old row (REPLICA IDENTITY FULL): when
        several live rows hold the key — a unique key under a DEFERRABLE constraint may, inside a
        transaction (a one-statement key swap) — take the one equal to the old row."""
        h = self.hasher.hash_one(key_vals)
        cands = [("mem", loc, h) for loc in self.mem.find(h)]
        cands += [("disk", (fname, row), h) for fname, row in self.file_index.lookup(h)
                  if fname in self.files and not self.files[fname].is_deleted(row)]
        if len(cands) <= 1:
            return self._find(key_vals)
        typed = None
        for c in cands:
            vals = self.mem.row_values(c[1]) if c[0] == "mem" else self._disk_row(*c[1])
            same = True
            for i, (v, o) in enumerate(zip(vals, old)):
                if isinstance(v, Carried):
                    if typed is None:
                        typed = decode_text_columns(self.schema.columns, [[x] for x in old], column_major=True)
                    t = typed.column(i)[0]
                    if not (v.scalar.equals(t) or (pa.types.is_floating(t.type) and t.is_valid and v.scalar.is_valid
                                                   and t.as_py() != t.as_py() and v.value != v.value)):
                        same = False
                        break
                elif v != o:
                    same = False
                    break
            if same:
                return c
        return self._find(key_vals)

    def _disk_row(self, fname: str, row: int) -> list:
        t = self._row_cache.get(fname)
        if t is None:
            path = self.files[fname].read_path
            # a persisted file in an object store is read through the table's FileIO (same endpoint/credentials)
            t = pq.read_table(self.iceberg.io.new_input(path).open() if "://" in path else path)
            if self.evolved:  # written under an older schema: in today's layout
                t = project(t, self.arrow_schema, self.defaults)
            if len(self._row_cache) > 4:
                self._row_cache.pop(next(iter(self._row_cache)))
            self._row_cache[fname] = t
        return [Carried(t.column(i)[row]) for i in range(t.num_columns)]

    def _delete_found(self, found, lsn: int) -> None:
        kind, loc, h = found
        if kind == "mem":
            self.mem.delete(loc, h, lsn)
        else:
            fname, row = loc
            self.files[fname].pending[row] = lsn

    def _report_missing(self, what: str, key_vals, lsn: int) -> None:
        self.missing_keys += 1
        log.error("table %s: %s of key %r at LSN %s found no live row (invariant violation; change skipped)",
                  self.name, what, key_vals, lsn_str(lsn))

    # ------------------------------------------------------------------ apply
    def apply(self, change, commit_lsn: int) -> None:
        """Apply one decoded change of a committed transaction (DESIGN.md §3 apply rules). The caller
        keeps ``last_change_lsn`` (once per transaction, not per change)."""
        kind = change.kind
        if kind == "insert":
            vals = self._values(change.new, change.relation_oid)
            self.mem.append(vals, self.hasher.hash_one(self._key(vals)), commit_lsn)
        elif kind == "delete":
            old = self._values(change.old, change.relation_oid)
            key = self._key(old)
            found = self._find_full(key, old) if change.old_kind == "O" and self._match_full_row else self._find(key)
            if found is None:
                self._report_missing("DELETE", key, commit_lsn)
            else:
                self._delete_found(found, commit_lsn)
        elif kind == "update":
            new = self._values(change.new, change.relation_oid)
            old = self._values(change.old, change.relation_oid) if change.old is not None else None
            key = self._key(old) if old is not None else self._key(new)
            found = (self._find_full(key, old) if old is not None and change.old_kind == "O" and self._match_full_row
                     else self._find(key))
            if any(v is _UNCHANGED for v in new):
                if old is not None and change.old_kind == "O":
                    src = old
                elif found is not None:
                    src = self.mem.row_values(found[1]) if found[0] == "mem" else self._disk_row(*found[1])
                else:
                    src = [None] * len(new)
                new = [src[i] if v is _UNCHANGED else v for i, v in enumerate(new)]
                new = [None if v is _UNCHANGED else v for v in new]
            if found is None:
                self._report_missing("UPDATE", key, commit_lsn)
            else:
                self._delete_found(found, commit_lsn)
            nkey = self._key(new)
            nkey_text = [v.value if isinstance(v, Carried) else v for v in nkey]
            self.mem.append(new, self.hasher.hash_one([None if x is None else str(x) for x in nkey_text]), commit_lsn)
        elif kind == "truncate":
            self.truncate(commit_lsn)

    def truncate(self, lsn: int) -> None:
        """TRUNCATE at ``lsn``: every row deleted as of that LSN."""
        self.mem.seal()
        for b in self.mem.batches:
            live = b.del_lsn == 0
            b.del_lsn[live] = lsn
            self.mem.deleted_rows += int(live.sum())
        from ..index import MemIndex
        self.mem.index = MemIndex()
        for f in self.files.values():
            if not f.truncated_lsn:
                f.truncated_lsn = lsn

    # ------------------------------------------------------------------ flush
    def flush(self) -> dict:
        """Write the MemSlice's live rows to Parquet in ``staging/`` plus one IndexBlock for them.

        Rows stay visible throughout (the caller holds the service lock). Returns
        ``{"rows", "files", "bytes", "seconds"}``.
        """
        t0 = time.time()
        table, hashes, horizon = self.mem.drain()
        if horizon:
            self.flushed_lsn = max(self.flushed_lsn, horizon + 1)
        self._row_cache.clear()
        if table.num_rows == 0:
            return {"rows": 0, "files": 0, "bytes": 0, "seconds": time.time() - t0}
        names, file_ids, rows = [], [], []
        nbytes = 0
        for fi, start in enumerate(range(0, table.num_rows, MAX_FILE_ROWS)):
            part = table.slice(start, MAX_FILE_ROWS)
            name = f"{uuid.uuid4().hex}.parquet"
            path = self.dir / "staging" / name
            pq.write_table(part, path, compression="zstd", row_group_size=128 * 1024)
            size = path.stat().st_size
            nbytes += size
            self.files[name] = DiskFile(name=name, num_rows=part.num_rows, size_bytes=size, local_path=str(path))
            names.append(name)
            file_ids.append(np.full(part.num_rows, fi, dtype=np.uint32))
            rows.append(np.arange(part.num_rows, dtype=np.uint32))
        block = IndexBlock.build(str(self.dir / "index" / f"{uuid.uuid4().hex}.idx"), hashes,
                                 np.concatenate(file_ids), np.concatenate(rows), names)
        self.file_index.add_block(block)
        return {"rows": table.num_rows, "files": len(names), "bytes": nbytes, "seconds": time.time() - t0}

    def add_copied_file(self, path: Path, num_rows: int, hashes: np.ndarray) -> None:
        """Register a Parquet file written by the initial copy (rows in file order, their key hashes)."""
        name = path.name
        self.files[name] = DiskFile(name=name, num_rows=num_rows, size_bytes=path.stat().st_size, local_path=str(path))
        block = IndexBlock.build(str(self.dir / "index" / f"{uuid.uuid4().hex}.idx"), hashes,
                                 np.zeros(num_rows, dtype=np.uint32), np.arange(num_rows, dtype=np.uint32), [name])
        self.file_index.add_block(block)

    # ------------------------------------------------------------------ persist
    def is_dirty(self) -> bool:
        """True when something applied is not yet durable in Iceberg."""
        return not self.mem.is_empty() or self.schema_pending or any(
            not f.persisted or f.pending or f.truncated_lsn for f in self.files.values())

    def _pending_schemas(self):
        """The Iceberg schemas the next commit adds, oldest first (each evolve appended the then-current
        one, so the last is today's), or None when Iceberg has the current schema."""
        if not self.schema_pending:
            return None
        return list(self._schema_versions) or [self.iceberg_schema()]

    def upload_plan(self) -> tuple[list[tuple[str, str]], object]:
        """(name, local path) of the live data files not in Iceberg yet, and the schema versions a commit
        would add — what :meth:`upload` may copy to the warehouse without the service lock (call this
        under it, after a :meth:`flush`)."""
        todo = [(f.name, f.local_path) for f in self.files.values()
                if not f.persisted and f.local_path and not (f.truncated_lsn or f.deleted_count() >= f.num_rows)]
        return todo, self._pending_schemas()

    def upload(self, todo: list[tuple[str, str]], schema) -> dict[str, str]:
        """Copy staged files (immutable) to the warehouse; name → location, for :meth:`persist`'s
        ``uploaded``. Changes no state of the table, so it runs without the service lock; a failure
        raises (the next persist uploads again, overwriting)."""
        out = {}
        for name, path in todo:
            fault("persist:upload")
            out[name] = self.iceberg.upload_data_file(path, overwrite=True, schema=schema)
        return out

    def persist(self, uploaded: dict[str, str] | None = None) -> dict:
        """Flush, then commit to Iceberg in ONE commit: new data files, merged deletes (one DV per file),
        files whose rows are all deleted removed, the FileIndex blob and ``mooncake.flush-lsn``.

        ``uploaded``: files :meth:`upload` already copied (name → location); the others are uploaded
        here. Only after it returns may the slot be confirmed up to ``flush_lsn``. Returns counts:
        ``rows`` (rows of the data files this commit adds, flushed now or by an earlier flush),
        ``rows_flushed`` (of those, rows this call flushed from the buffer), ``files_added``,
        ``files_removed``, ``deleted_rows`` (positions newly in deletion vectors), ``flush_lsn``, ``seconds``.
        """
        t0 = time.time()
        fl = self.flush()
        lsn = self.applied_lsn
        add, deletes, remove = [], {}, []
        # Nothing below changes a DiskFile or self.files until the commit has landed: a failed upload or
        # commit (e.g. the warehouse is unreachable) leaves files, pending deletes and removals as they
        # were, so the next persist retries all of it.
        pre = dict(uploaded or {})
        uploaded = {}  # file name -> its warehouse location
        new_schema = self._pending_schemas()
        for f in list(self.files.values()):
            fully = f.truncated_lsn or f.deleted_count() >= f.num_rows
            if fully:
                if f.persisted:
                    remove.append(f.location)
                continue
            if not f.persisted:  # overwrite: an earlier failed persist may have uploaded it (names are unique)
                uploaded[f.name] = pre.get(f.name) or self.iceberg.upload_data_file(
                    f.local_path, overwrite=True, schema=new_schema)
                add.append(f)
            if f.pending:
                deletes[uploaded.get(f.name, f.location)] = BitMap64(f.pending.keys())
        gone = [f for f in self.files.values() if f.truncated_lsn or f.deleted_count() >= f.num_rows]
        new_dvs = sum(len(b) for b in deletes.values())
        changed = bool(add or deletes or remove or fl["rows"]) or self.flush_lsn == 0 or self.schema_pending
        if changed:
            fault("persist:after_upload")
            self.iceberg.commit(
                add_files=[uploaded[f.name] for f in add],
                deletes=deletes,
                remove_files=remove,
                index_blob=self.index_blob(),
                summary={"mooncake.flush-lsn": lsn_str(lsn), "mooncake.source": self.source},
                schema=new_schema,
                properties={"mooncake.columns": self.columns_property()} if self.schema_pending else None,
            )
            fault("persist:after_commit")
            self.schema_pending = False
            self._schema_versions = []
        for f in add:
            f.location = uploaded[f.name]
        for f in gone:
            self.files.pop(f.name)
        now = time.time()
        for f in add:
            if f.local_path:
                self._retired.append((now, f.local_path))
                f.local_path = None
        for f in self.files.values():
            if f.pending:
                # committed positions lose their LSN: reads below the newest of them are no longer exact
                self.flushed_lsn = max(self.flushed_lsn, max(f.pending.values()) + 1)
                f.committed.update(f.pending.keys())
                f.pending = {}
        for f in gone:
            self.flushed_lsn = max(self.flushed_lsn, f.truncated_lsn + 1, max(f.pending.values(), default=0) + 1)
            if f.local_path:
                self._retired.append((now, f.local_path))
        self.flush_lsn = lsn
        self.last_persist = now
        self.dirty_since = None
        self._gc_retired()
        return {"rows": sum(f.num_rows for f in add), "rows_flushed": fl["rows"], "files_added": len(add),
                "files_removed": len(remove),
                "deleted_rows": new_dvs, "flush_lsn": lsn_str(lsn), "seconds": now - t0}

    def _gc_retired(self, grace_s: float = 120.0) -> None:
        """Delete staged files that were persisted or dropped more than ``grace_s`` ago (readers may hold them)."""
        keep = []
        for t, p in self._retired:
            if time.time() - t > grace_s:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            else:
                keep.append((t, p))
        self._retired = keep

    # ------------------------------------------------------------------ index persistence
    def index_blob(self) -> bytes:
        """The FileIndex as bytes: 4-byte LE header length, JSON header {"blocks": [{"name","size"}],
        "key_hash": KEY_HASH_VERSION}, then each IndexBlock file's bytes, newest first."""
        blobs, meta = [], []
        for b in self.file_index.blocks:
            data = Path(b.path).read_bytes()
            blobs.append(data)
            meta.append({"name": Path(b.path).name, "size": len(data)})
        head = json.dumps({"blocks": meta, "key_hash": KEY_HASH_VERSION}).encode()
        return len(head).to_bytes(4, "little") + head + b"".join(blobs)

    def restore_index(self, blob: bytes) -> None:
        """Rebuild the FileIndex from :meth:`index_blob` bytes (no data file is read). Blocks hashed
        under an older key hash (header without ``"key_hash"``) are rebuilt from the data files instead
        when the table's key is not exact (:func:`~..index.key_hash.blob_needs_rebuild`)."""
        n = int.from_bytes(blob[:4], "little")
        head = json.loads(blob[4:4 + n])
        if blob_needs_rebuild(head.get("key_hash"), self.hasher.exact):
            from .key_text import rebuild_file_index

            self.file_index = rebuild_file_index(self)
            return
        off = 4 + n
        blocks = []
        for m in head["blocks"]:
            p = self.dir / "index" / m["name"]
            p.write_bytes(blob[off:off + m["size"]])
            off += m["size"]
            blocks.append(IndexBlock.open(str(p)))
        self.file_index = FileIndex(blocks)

    def restore(self, interrupted: bool = True) -> None:
        """Load the persisted state (data files, DVs, index, flush LSN) after a restart.
        ``interrupted``: the previous run was not stopped cleanly (how its leftovers are logged)."""
        st = self.iceberg.state()
        self.files = {}
        for loc, df in st.data_files.items():
            name = loc.rsplit("/", 1)[-1]
            self.files[name] = DiskFile(name=name, num_rows=df.record_count, size_bytes=df.file_size_in_bytes,
                                        location=loc, committed=BitMap64(df.deleted))
        lsn = st.summary.get("mooncake.flush-lsn") if st.summary else None
        self.flush_lsn = parse_lsn(lsn) if lsn else 0
        self.applied_lsn = self.flushed_lsn = self.flush_lsn
        if st.index_blob:
            self.restore_index(st.index_blob)
        self.evolved = len(self.iceberg.table.metadata.schemas) > 1
        for p in (self.dir / "staging").glob("*.parquet"):
            if p.name not in self.files:
                p.unlink()
        # leftovers of a run the restart interrupted: unused index blocks, compaction outputs, warehouse orphans
        from ..compaction import cleanup_after_restore

        self.last_cleanup = cleanup_after_restore(self, interrupted=interrupted)

    # ------------------------------------------------------------------ maintenance (engine/compaction)
    def merge_index(self, **kw) -> dict:
        """Merge IndexBlocks by policy; see :func:`mooncake_assets.engine.compaction.merge_index`
        (keywords: ``lock``, ``policy``, ``full``). The heavy part runs without ``lock``."""
        from ..compaction import merge_index

        return merge_index(self, **kw)

    def compact(self, **kw) -> dict:
        """Data compaction by policy; see :func:`mooncake_assets.engine.compaction.compact` (keywords:
        ``lock``, ``policy``, ``full``, ``dry_run``, ``persist_first``, ``expire``)."""
        from ..compaction import compact

        return compact(self, **kw)

    # ------------------------------------------------------------------ reads
    def read_state(self, lsn: int | None = None) -> tuple[dict, pa.Table]:
        """ReadState at ``lsn`` (None = all applied): (description of files + deletes, in-memory rows).

        Raises ``ValueError`` when ``lsn`` is below the last flush boundary (it cannot be served exactly).
        """
        if lsn is not None and lsn < self.flushed_lsn:
            raise ValueError(f"table {self.name}: cannot read at LSN {lsn_str(lsn)}, it was flushed up to "
                             f"{lsn_str(self.flushed_lsn)}; read at a newer LSN")
        files = []
        for f in self.files.values():
            count, deleted = f.deleted_payload(lsn)
            if count >= f.num_rows:
                continue
            files.append({"name": f.name, "path": f.read_path, "rows": f.num_rows, "deleted": deleted})
        mem = self.mem.visible(lsn)
        rs = {"table": self.name, "lsn": lsn_str(lsn if lsn is not None else self.applied_lsn), "files": files}
        return rs, mem

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict:
        data_bytes = sum(f.size_bytes for f in self.files.values())
        deleted = sum(f.deleted_count() for f in self.files.values())
        file_rows = sum(f.num_rows for f in self.files.values())
        return {
            "name": self.name, "source": self.source,
            "applied_lsn": lsn_str(self.applied_lsn), "flush_lsn": lsn_str(self.flush_lsn),
            "last_change_lsn": lsn_str(self.last_change_lsn or self.flush_lsn),
            "buffer_rows": self.mem.live_rows, "buffer_bytes": self.mem.nbytes,
            "data_files": len(self.files), "data_bytes": data_bytes,
            "index_blocks": len(self.file_index.blocks),
            "pending_deletes": sum(len(f.pending) for f in self.files.values()),
            "deletion_vectors": sum(1 for f in self.files.values() if len(f.committed)),
            "deleted_rows": deleted, "live_rows": file_rows - deleted + self.mem.live_rows,
            "missing_keys": self.missing_keys,
            "columns": len(self._col_names),
            "last_schema_change": self.last_schema_change,
        }


def _nested_ids(t) -> list[int]:
    """The field ids nested in an Iceberg type, in the pre-order :func:`~..pg.schema.assign_field_ids`
    gives them (list: element, then inside it; struct: each field, then inside it; map: key, value,
    then inside them)."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(t, ListType):
        return [t.element_id] + _nested_ids(t.element_type)
    if isinstance(t, MapType):
        return [t.key_id, t.value_id] + _nested_ids(t.key_type) + _nested_ids(t.value_type)
    if isinstance(t, StructType):
        out = []
        for f in t.fields:
            out += [f.field_id] + _nested_ids(f.field_type)
        return out
    return []


def initial_defaults(columns) -> dict:
    """Field id → Arrow scalar of the value rows older than a column read (its ``initial_default``
    text decoded with the column's own decoder). Raises ``ValueError`` for a text the type rejects."""
    return {c.field_id: decode_text_columns([c], [[c.initial_default]], column_major=True).column(0)[0]
            for c in columns if c.initial_default is not None}


def _same_value(a, b) -> bool:
    if a == b:
        return True
    return isinstance(a, float) and isinstance(b, float) and a != a and b != b  # NaN


class _Unchanged:
    __slots__ = ()

    def __repr__(self):  # pragma: no cover
        return "UNCHANGED_TOAST"


_UNCHANGED = _Unchanged()
