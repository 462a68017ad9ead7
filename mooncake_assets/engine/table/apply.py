"""The apply role of a mirrored table: decoded row changes into the MemSlice and the files' deletes.

Apply rules (pgoutput changes of committed transactions, in commit order, each stamped with its
transaction's commit LSN; PostgreSQL documentation "Logical Replication Message Formats"):

- INSERT: the new row is appended to the MemSlice with its key hash (MemIndex);
- DELETE: the live row with the old key is found — newest first: the MemSlice, then the FileIndex
  (rows of data files not deleted yet) — and deleted at the commit LSN: in the MemSlice's batch
  deletion vector, or as a pending position delete of its data file;
- UPDATE: a DELETE of the old key (the new row's key when no old key was sent) and an INSERT of the
  new row; an unchanged TOAST value (``'u'``, not sent) is taken from the old row image (replica
  identity full) or from the row found;
- TRUNCATE: every row of the buffer and of the files deleted as of its LSN.

With ``REPLICA IDENTITY FULL`` the old row image carries every column; when several live rows hold
the key (a key-less table's equal rows, or a DEFERRABLE key inside a transaction) the one equal to
the old row is taken. A hashed key is re-checked against the row on every hit (equal hashes need not
mean equal keys). A change whose row is not found is counted (``missing_keys``) and logged.

:class:`ChangeApplyRole` is one role of :class:`~.mirror.MirrorTable` (a mixin over the table's
schema, ``mem``, ``disk`` and ``hasher``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..cdc import decode_text_columns
from ..index import MemIndex
from ..lsn import Lsn
from .evolution import project
from .memslice import Carried

if TYPE_CHECKING:
    from ..cdc import TableSchema, TupleData
    from ..index import KeyHash
    from .disk_files import DiskFileSet
    from .memslice import MemSlice

#: a located live row: ("mem", MemSlice location, key hash) | ("disk", (file name, row), key hash)
_Found = tuple[str, Any, int]

log = logging.getLogger("mooncake.table")

__all__ = ["ChangeApplyRole"]


class ChangeApplyRole:
    """Apply and key lookup of a :class:`~.mirror.MirrorTable` (module docstring)."""

    # the table's state this role reads and sets (set up by MirrorTable.__init__; declared for the type checker)
    name: str
    schema: TableSchema
    arrow_schema: pa.Schema
    iceberg: Any  # its IcebergMirrorTable, or None (see MirrorTable); Any: MirrorTable uses it unchecked
    mem: MemSlice
    disk: DiskFileSet
    hasher: KeyHash
    defaults: dict[int, pa.Scalar]
    evolved: bool
    missing_keys: int
    _col_names: list[str]
    _key_idx: list[int]
    _match_full_row: bool
    _relmap: dict[int, list[int]]
    _identity: dict[int, list[int]]
    _row_cache: dict[str, pa.Table]

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
    def _cell(v: tuple[str, Any]) -> Any:
        kind, data = v
        if kind == "n":
            return None
        if kind == "u":
            return _UNCHANGED
        return bytes(data).decode("utf-8")

    def _values(self, tup: TupleData, rel_oid: int) -> list[Any]:
        """Our columns' text values of a TupleData (None = NULL, _UNCHANGED = unchanged TOAST)."""
        m = self._relmap[rel_oid]
        if "u" not in tup.kinds and m is self._identity.get(rel_oid):
            return [None if v is None else v.decode() for v in tup.data]  # the hot path
        return [self._cell(tup[i]) if i >= 0 else None for i in m]

    def _key(self, values: list[Any]) -> list[Any]:
        return [values[i] for i in self._key_idx]

    # ------------------------------------------------------------------ locating rows
    def _find(self, key_vals: list[Any]) -> _Found | None:
        """Locate a live row by key: ('mem', loc) | ('disk', file, row) | None. Newest first."""
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
        typed: Any = None
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

    def _find_full(self, key_vals: list[Any], old: list[Any]) -> _Found | None:
        """Like :meth:`_find`, for a change that carries the whole old row (REPLICA IDENTITY FULL): when
        several live rows hold the key — a unique key under a DEFERRABLE constraint may, inside a
        transaction (a one-statement key swap) — take the one equal to the old row."""
        h = self.hasher.hash_one(key_vals)
        cands: list[_Found] = [("mem", loc, h) for loc in self.mem.find(h)]
        cands += [("disk", (fname, row), h) for fname, row in self.disk.live_hits(h)]
        if len(cands) <= 1:
            return self._find(key_vals)
        typed: Any = None
        for c in cands:
            vals = self.mem.row_values(c[1]) if c[0] == "mem" else self._disk_row(*c[1])
            same = True
            for i, (v, o) in enumerate(zip(vals, old)):
                if isinstance(v, Carried):
                    if typed is None:
                        typed = decode_text_columns(self.schema.columns, [[x] for x in old], column_major=True)
                    t = typed.column(i)[0]
                    if not (
                        v.scalar.equals(t)
                        or (
                            pa.types.is_floating(t.type)
                            and t.is_valid
                            and v.scalar.is_valid
                            and t.as_py() != t.as_py()
                            and v.value != v.value
                        )
                    ):
                        same = False
                        break
                elif v != o:
                    same = False
                    break
            if same:
                return c
        return self._find(key_vals)

    def _disk_row(self, fname: str, row: int) -> list[Any]:
        t = self._row_cache.get(fname)
        if t is None:
            path = self.disk.files[fname].read_path
            # a persisted file in an object store is read through the table's FileIO (same endpoint/credentials)
            t = pq.read_table(self.iceberg.io.new_input(path).open() if "://" in path else path)
            if self.evolved:  # written under an older schema: in today's layout
                t = project(t, self.arrow_schema, self.defaults)
            if len(self._row_cache) > 4:
                self._row_cache.pop(next(iter(self._row_cache)))
            self._row_cache[fname] = t
        return [Carried(t.column(i)[row]) for i in range(t.num_columns)]

    def _delete_found(self, found: _Found, lsn: int) -> None:
        kind, loc, h = found
        if kind == "mem":
            self.mem.delete(loc, h, lsn)
        else:
            fname, row = loc
            self.disk.delete(fname, row, lsn)

    def _report_missing(self, what: str, key_vals: list[Any], lsn: int) -> None:
        self.missing_keys += 1
        log.error(
            "table %s: %s of key %r at LSN %s found no live row (invariant violation; change skipped)",
            self.name,
            what,
            key_vals,
            str(Lsn(lsn)),
        )

    # ------------------------------------------------------------------ apply
    def apply(self, change: Any, commit_lsn: int) -> None:
        """Apply one decoded change of a committed transaction at ``commit_lsn`` (the apply rules in the
        module docstring). The caller keeps ``last_change_lsn`` (once per transaction, not per change)."""
        kind = change.kind
        old: list[Any] | None  # the old row's values (None: the change carries no old row)
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
            found = (
                self._find_full(key, old)
                if old is not None and change.old_kind == "O" and self._match_full_row
                else self._find(key)
            )
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
        self.mem.index = MemIndex()
        self.disk.truncate(lsn)


def _same_value(a: Any, b: Any) -> bool:
    if a == b:
        return True
    return isinstance(a, float) and isinstance(b, float) and a != a and b != b  # NaN


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:  # pragma: no cover
        return "UNCHANGED_TOAST"


_UNCHANGED = _Unchanged()
