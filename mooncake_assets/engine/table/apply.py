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
mean equal keys); locating rows is :mod:`.lookup`'s. A change whose row is not found is counted
(``missing_keys``) and logged. :meth:`~.apply_run.RunApplyRole.apply_run` applies a whole columnar
run with the same results.

:class:`ChangeApplyRole` is one role of :class:`~.mirror.MirrorTable` (a mixin over the table's
schema, ``mem``, ``disk`` and ``hasher``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..lsn import Lsn
from .lookup import KeyLookup
from .memslice import Carried

if TYPE_CHECKING:
    from ..cdc import TableSchema, TupleData
    from ..index import KeyHash
    from .disk_files import DiskFileSet
    from .memslice import MemSlice

log = logging.getLogger("mooncake.table")

__all__ = ["ChangeApplyRole"]


class ChangeApplyRole(KeyLookup):
    """The apply rules of a :class:`~.mirror.MirrorTable` (module docstring); locating rows by key is
    :class:`~.lookup.KeyLookup`'s."""

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
                self._delete_found(found, commit_lsn, key, old if change.old_kind == "O" else None)
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
                    src = self._found_values(found)
                else:
                    src = [None] * len(new)
                new = [src[i] if v is _UNCHANGED else v for i, v in enumerate(new)]
                new = [None if v is _UNCHANGED else v for v in new]
            if found is None:
                self._report_missing("UPDATE", key, commit_lsn)
            else:
                self._delete_found(found, commit_lsn, key, old if change.old_kind == "O" else None)
            nkey = self._key(new)
            nkey_text = [v.value if isinstance(v, Carried) else v for v in nkey]
            self.mem.append(new, self.hasher.hash_one([None if x is None else str(x) for x in nkey_text]), commit_lsn)
        elif kind == "truncate":
            self.truncate(commit_lsn)

    def truncate(self, lsn: int) -> None:
        """TRUNCATE at ``lsn``: every row deleted as of that LSN."""
        self.mem.truncate(lsn)
        self.disk.truncate(lsn)


class _Unchanged:
    __slots__ = ()

    def __repr__(self) -> str:  # pragma: no cover
        return "UNCHANGED_TOAST"


_UNCHANGED = _Unchanged()
