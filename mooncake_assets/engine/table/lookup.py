"""Key lookup of a mirrored table: which live row a DELETE or UPDATE hits.

A key is located newest first: the MemSlice (its MemIndex, live rows only), then the FileIndex (rows
of data files not deleted yet, newest IndexBlock first). A key hash that is not exact (anything but
one integer key column, :class:`~..index.KeyHash`) is re-checked against the row on every hit: equal
hashes need not mean equal keys. With ``REPLICA IDENTITY FULL`` (the change carries the whole old
row) and several live rows holding the key — a key-less table's equal rows, or a unique key under a
DEFERRABLE constraint inside a transaction — the one equal to the old row is taken
(:meth:`KeyLookup._find_full`).

Two forms: the scalar one (``_find``/``_find_full``, one key of text values) for the row-wise apply,
and :meth:`KeyLookup.find_exact_batch` for the batched apply of a run of an exact key (hashes in,
one location or ``None`` per hash out, the same answers as ``_find`` per row).

:class:`KeyLookup` is one role of :class:`~.mirror.MirrorTable` (a mixin over the table's schema,
``mem``, ``disk``, ``hasher`` and its cache of data files read back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..cdc import decode_text_columns
from ..iceberg.lineage import has_lineage
from .delete_log import DeleteLog
from .evolution import project
from .memslice import Carried
from .schema_state import value_columns

if TYPE_CHECKING:
    from ..cdc import TableSchema
    from ..index import KeyHash
    from .disk_files import DiskFileSet
    from .memslice import MemSlice

#: a located live row: ("mem", MemSlice location, key hash) | ("disk", (file name, row), key hash)
Found = tuple[str, Any, int]

__all__ = ["KeyLookup", "Found"]


class KeyLookup:
    """Locate, re-check, read back and delete live rows by key (module docstring)."""

    # the table's state this role reads (set up by MirrorTable.__init__; declared for the type checker)
    schema: TableSchema
    arrow_schema: pa.Schema
    iceberg: Any
    mem: MemSlice
    disk: DiskFileSet
    hasher: KeyHash
    defaults: dict[int, pa.Scalar]
    evolved: bool
    _key_idx: list[int]
    _col_names: list[str]
    key_names: list[str]
    delete_log: DeleteLog
    _row_cache: dict[str, pa.Table]

    # ------------------------------------------------------------------ scalar
    def _find(self, key_vals: list[Any], h: int | None = None) -> Found | None:
        """Locate a live row by key (its text values; ``h``: its hash when known): a :data:`Found` or
        None. Newest first."""
        if h is None:
            h = self.hasher.hash_one(key_vals)
        for loc in self.mem.find(h):
            if self.hasher.exact or self._recheck(self.mem.row_values(loc), key_vals):
                return ("mem", loc, h)
        for fname, row in self.disk.live_hits(h):
            if not self.hasher.exact and not self._recheck(self._disk_row(fname, row), key_vals):
                continue
            return ("disk", (fname, row), h)
        return None

    def _recheck(self, vals: list[Any], key_vals: list[Any]) -> bool:
        """Does a candidate row (text or Carried values) really hold this key (text values)?

        Hashed keys are re-checked on every hit (module docstring): a text value is compared as text, a
        typed value (sealed batch or data file) with the key decoded by the table's own decoder;
        NULL equals NULL and NaN equals NaN, as for a row identity."""
        typed: pa.RecordBatch | None = None
        for j, (i, kv) in enumerate(zip(self._key_idx, key_vals)):
            v = vals[i]
            if isinstance(v, Carried):
                if typed is None:
                    specs = [self.schema.columns[k] for k in self._key_idx]
                    typed = decode_text_columns(specs, [[x] for x in key_vals], column_major=True)
                if not same_scalar(v.scalar, typed.column(j)[0]):
                    return False
            elif v != kv:
                return False
        return True

    def _candidates(self, h: int) -> list[Found]:
        """Every live row under hash ``h``: the MemSlice's, then the files' (newest first)."""
        cands: list[Found] = [("mem", loc, h) for loc in self.mem.find(h)]
        cands += [("disk", (fname, row), h) for fname, row in self.disk.live_hits(h)]
        return cands

    def _find_full(self, key_vals: list[Any], old: list[Any], h: int | None = None) -> Found | None:
        """Like :meth:`_find`, for a change that carries the whole old row (REPLICA IDENTITY FULL): when
        several live rows hold the key — a unique key under a DEFERRABLE constraint may, inside a
        transaction (a one-statement key swap) — take the one equal to the old row."""
        if h is None:
            h = self.hasher.hash_one(key_vals)
        cands = self._candidates(h)
        if len(cands) <= 1:
            return self._find(key_vals, h)
        typed: Any = None
        for c in cands:
            vals = self.mem.row_values(c[1]) if c[0] == "mem" else self._disk_row(*c[1])
            same = True
            for i, (v, o) in enumerate(zip(vals, old)):
                if isinstance(v, Carried):
                    if typed is None:
                        typed = decode_text_columns(self.schema.columns, [[x] for x in old], column_major=True)
                    if not same_scalar(v.scalar, typed.column(i)[0]):
                        same = False
                        break
                elif v != o:
                    same = False
                    break
            if same:
                return c
        return self._find(key_vals, h)

    def _disk_row(self, fname: str, row: int) -> list[Any]:
        """One row of a data file as Carried values (in today's layout; the last few files read are cached)."""
        t = self._row_cache.get(fname)
        if t is None:
            path = self.disk.files[fname].read_path
            # a persisted file in an object store is read through the table's FileIO (same endpoint/credentials)
            t = pq.read_table(self.iceberg.io.new_input(path).open() if "://" in path else path)
            # written under an older schema, or by a compaction (row lineage columns): in today's layout
            if self.evolved or has_lineage(t.schema):
                t = project(t, self.arrow_schema, self.defaults)
            if len(self._row_cache) > 4:
                self._row_cache.pop(next(iter(self._row_cache)))
            self._row_cache[fname] = t
        return [Carried(t.column(i)[row]) for i in range(t.num_columns)]

    def _found_values(self, found: Found) -> list[Any]:
        """The values of a located row (text/None/Carried in the open buffer, Carried elsewhere)."""
        return self.mem.row_values(found[1]) if found[0] == "mem" else self._disk_row(*found[1])

    def _delete_found(self, found: Found, lsn: int, key: list[Any] | None = None, old: list[Any] | None = None) -> None:
        """Delete a located row at commit ``lsn`` (MemSlice deletion vector, or a pending file delete).
        ``key``: its key as the change carried it (text values), kept in the delete log for a file row;
        ``old``: the whole old row (every column's text value) when the change carried it (REPLICA
        IDENTITY FULL), kept there too."""
        kind, loc, h = found
        if kind == "mem":
            self.mem.delete(loc, h, lsn)
        else:
            fname, row = loc
            self.disk.delete(fname, row, lsn)
            if key is not None and self._delete_log_on():
                values = [old[i] for i in self._value_idx] if old is not None else None
                self.delete_log.add(fname, row, key, values)

    @property
    def value_names(self) -> list[str]:
        """The columns that are not the key, in table order (a delete log's whole old rows hold them)."""
        return value_columns(self._col_names, self.key_names)

    @property
    def _value_idx(self) -> list[int]:
        return [i for i, n in enumerate(self._col_names) if n not in self.key_names]

    def _delete_log_on(self) -> bool:
        """Deletes of file rows are logged with their keys (:mod:`.delete_log`): tables with a primary key
        only (the keys feed serves no other); a new key definition or column list starts a new log."""
        if not self.schema.key_columns:
            return False
        values = self.value_names
        if self.delete_log.key_names != self.key_names or self.delete_log.value_names != values:
            self.delete_log = DeleteLog(self.key_names, self.delete_log.max_bytes, values)
        return True

    # ------------------------------------------------------------------ batched
    def live_candidate_counts(self, hashes: np.ndarray) -> np.ndarray:
        """Live rows under each hash (MemSlice and files together), int64 (n,)."""
        out = np.zeros(len(hashes), dtype=np.int64)
        for q, h in enumerate(hashes.tolist()):
            out[q] = len(self.mem.find(h)) + sum(1 for _ in self.disk.live_hits(h))
        return out

    def find_exact_batch(self, hashes: np.ndarray) -> list[Found | None]:
        """For an exact key (``hasher.exact``): the live row of each hash (uint64 (n,)), as :meth:`_find`
        answers it row by row — the first live MemSlice location, else the first live file row (newest
        block first) — or None. The hashes must be distinct (lookups see the state before any of them
        is applied). Raises ``ValueError`` for a key that is not exact."""
        if not self.hasher.exact:
            raise ValueError("find_exact_batch needs an exact key hash (one integer key column)")
        n = len(hashes)
        out: list[Found | None] = [None] * n
        hl = hashes.tolist()
        qi, bi, ri = self.mem.index.lookup_batch(hashes)
        for q, b, r in zip(qi.tolist(), bi.tolist(), ri.tolist()):
            if out[q] is None and self.mem.is_live((b, r)):
                out[q] = ("mem", (b, r), hl[q])
        rest = [q for q in range(n) if out[q] is None]
        if rest and len(self.disk.index):
            sub = hashes[np.asarray(rest, dtype=np.int64)]
            hits = self.disk.index.lookup_batch(sub)
            files = self.disk.files
            for j, f, r in zip(hits.query_index.tolist(), hits.file_idx.tolist(), hits.row.tolist()):
                q = rest[j]
                if out[q] is not None:
                    continue
                fname = hits.files[f]
                df = files.get(fname)
                if df is not None and not df.is_deleted(r):
                    out[q] = ("disk", (fname, r), hl[q])
        return out


def same_scalar(a: pa.Scalar, b: pa.Scalar) -> bool:
    """Do two Arrow scalars hold the same value (NULL equals NULL, NaN equals NaN)? Compared as Arrow
    values, never as Python ones: timestamp and date ``infinity``, BC values and years past 9999 have
    no Python value (``as_py`` raises). ``b`` is cast to ``a``'s type when they differ (False when it
    cannot be)."""
    if not a.type.equals(b.type):
        try:
            b = b.cast(a.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return False
    if a.equals(b):
        return True
    nan = pa.types.is_floating(a.type) and a.is_valid and b.is_valid
    return bool(nan and a.as_py() != a.as_py() and b.as_py() != b.as_py())
