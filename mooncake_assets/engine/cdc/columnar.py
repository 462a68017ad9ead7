"""Committed transactions as columnar runs of changes: the seam between decoding and apply.

The row-wise decoder (:mod:`.pgoutput` + :class:`~.txn.TransactionAssembler`) yields one
:class:`~.txn.Change` object per row; it stays as the reference implementation. The columnar form
carries the same information with no Python object per row: a transaction is a list of
:class:`ChangeRun` — maximal runs of consecutive changes of one kind on one relation under one
Relation message — and each run holds its tuples column by column as Arrow arrays. The compiled
decoder produces this form directly; :func:`runs_from_changes` builds it from the reference's
``Change`` list, and the two must agree exactly (the differential tests compare them).

Run boundaries (both producers follow them, so their outputs compare equal run by run): a new run
starts when the change kind, the relation OID or the Relation message in effect changes, when the
run holds :data:`MAX_RUN_ROWS` rows, or when adding the row would take the run's value bytes (new and
old tuples together) past :data:`MAX_RUN_BYTES` (a run always takes at least one row). A TRUNCATE
is always a run of its own with ``rows == 1``.

Tuple columns follow the Relation message's column order (pgoutput sends every column of the
relation in each tuple; PG docs, "Logical Replication Message Formats", TupleData).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .pgoutput import Relation, TupleData
from .txn import Change, Transaction

__all__ = [
    "MAX_RUN_BYTES",
    "MAX_RUN_ROWS",
    "KIND_NULL",
    "KIND_UNCHANGED",
    "KIND_TEXT",
    "KIND_BINARY",
    "CellColumn",
    "ChangeRun",
    "ColumnarTransaction",
    "runs_from_changes",
    "columnar_transaction",
]

#: most rows in one run
MAX_RUN_ROWS = 65536
#: most value bytes (sum of the sent values of the new and old tuples) in one run, in bytes
MAX_RUN_BYTES = 64 * 1024 * 1024

#: per-cell kinds, the TupleData kind bytes of pgoutput: NULL, unchanged TOAST (not sent), text, binary
KIND_NULL = ord("n")
KIND_UNCHANGED = ord("u")
KIND_TEXT = ord("t")
KIND_BINARY = ord("b")

RunKind = Literal["insert", "update", "delete", "truncate"]


@dataclass(frozen=True, slots=True, eq=False)
class CellColumn:
    """One column of a run's tuples.

    ``kinds``: ``uint8`` array, one of ``KIND_*`` per row. ``values``: ``pa.binary()`` array of the
    same length; the value's bytes (UTF-8 text for ``KIND_TEXT``) where sent, null where the kind is
    NULL or unchanged TOAST (and where the row has no such tuple, e.g. an UPDATE without old tuple).
    """

    kinds: npt.NDArray[np.uint8]
    values: pa.Array

    def __len__(self) -> int:
        return len(self.kinds)

    def equals(self, other: CellColumn) -> bool:
        return np.array_equal(self.kinds, other.kinds) and self.values.equals(other.values)


@dataclass(frozen=True, slots=True, eq=False)
class ChangeRun:
    """Consecutive changes of one kind on one relation under one Relation message (module docstring).

    ``rows``: number of changes. ``lsns``: ``uint64`` per row, the WAL position of the XLogData that
    carried the change (as :attr:`.txn.Change.lsn`). ``relation``: the Relation in effect (as
    :attr:`.txn.Change.relation`; ``None`` for TRUNCATE). ``new``: one :class:`CellColumn` per
    relation column for inserts and updates, else ``None``. ``old``: for updates and deletes, one
    :class:`CellColumn` per relation column (rows without an old tuple have every cell NULL), else
    ``None``. ``old_kinds``: for updates and deletes, ``uint8`` per row: ``ord('K')`` old key only,
    ``ord('O')`` whole old row, ``0`` no old tuple sent. TRUNCATE: ``truncate_oids``, ``cascade``,
    ``restart_identity`` as in :class:`.txn.Change`; ``relation_oid`` is the first OID.
    """

    kind: RunKind
    relation_oid: int
    relation: Relation | None
    rows: int
    lsns: npt.NDArray[np.uint64]
    new: tuple[CellColumn, ...] | None = None
    old: tuple[CellColumn, ...] | None = None
    old_kinds: npt.NDArray[np.uint8] | None = None
    truncate_oids: tuple[int, ...] = ()
    cascade: bool = False
    restart_identity: bool = False

    def equals(self, other: ChangeRun) -> bool:
        """Same kind, relation, rows, LSNs and cells (the differential tests' comparison)."""

        def cols(a: tuple[CellColumn, ...] | None, b: tuple[CellColumn, ...] | None) -> bool:
            if a is None or b is None:
                return a is b
            return len(a) == len(b) and all(x.equals(y) for x, y in zip(a, b))

        def arr(a: np.ndarray | None, b: np.ndarray | None) -> bool:
            return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))

        return (
            self.kind == other.kind
            and self.relation_oid == other.relation_oid
            and self.relation == other.relation
            and self.rows == other.rows
            and np.array_equal(self.lsns, other.lsns)
            and cols(self.new, other.new)
            and cols(self.old, other.old)
            and arr(self.old_kinds, other.old_kinds)
            and self.truncate_oids == other.truncate_oids
            and self.cascade == other.cascade
            and self.restart_identity == other.restart_identity
        )


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarTransaction:
    """A committed transaction in columnar form (fields as :class:`.txn.Transaction`, ``runs`` in commit
    order instead of ``changes``)."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime
    runs: list[ChangeRun] = field(default_factory=list)
    streamed: bool = False
    origin: str | None = None

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.runs)


def _tuple_bytes(t: TupleData | None) -> int:
    return 0 if t is None else sum(len(v) for v in t.data if v is not None)


def _cells(tuples: Sequence[TupleData | None], ncols: int) -> tuple[CellColumn, ...]:
    out = []
    for i in range(ncols):
        kinds = np.fromiter(
            (KIND_NULL if t is None else ord(t.kinds[i]) for t in tuples), dtype=np.uint8, count=len(tuples)
        )
        vals = [None if t is None else t.data[i] for t in tuples]
        out.append(CellColumn(kinds, pa.array([None if v is None else bytes(v) for v in vals], type=pa.binary())))
    return tuple(out)


def _make_run(changes: list[Change]) -> ChangeRun:
    first = changes[0]
    lsns = np.fromiter((c.lsn for c in changes), dtype=np.uint64, count=len(changes))
    if first.kind == "truncate":
        return ChangeRun(
            "truncate",
            first.relation_oid,
            None,
            1,
            lsns,
            truncate_oids=tuple(first.truncate_oids),
            cascade=first.truncate_cascade,
            restart_identity=first.truncate_restart_identity,
        )
    assert first.relation is not None
    ncols = len(first.relation.columns)
    new = _cells([c.new for c in changes], ncols) if first.kind in ("insert", "update") else None
    old = old_kinds = None
    if first.kind in ("update", "delete"):
        old = _cells([c.old for c in changes], ncols)
        old_kinds = np.fromiter(
            (0 if c.old_kind is None else ord(c.old_kind) for c in changes), dtype=np.uint8, count=len(changes)
        )
    return ChangeRun(first.kind, first.relation_oid, first.relation, len(changes), lsns, new, old, old_kinds)


def runs_from_changes(changes: Sequence[Change]) -> list[ChangeRun]:
    """The reference's ``Change`` list (one transaction, commit order) → its runs (module docstring)."""
    runs: list[ChangeRun] = []
    cur: list[Change] = []
    cur_bytes = 0
    for c in changes:
        nbytes = _tuple_bytes(c.new) + _tuple_bytes(c.old)
        if cur and (
            c.kind == "truncate"
            or cur[0].kind == "truncate"
            or c.kind != cur[0].kind
            or c.relation_oid != cur[0].relation_oid
            or (c.relation is not cur[0].relation and c.relation != cur[0].relation)
            or len(cur) >= MAX_RUN_ROWS
            or cur_bytes + nbytes > MAX_RUN_BYTES
        ):
            runs.append(_make_run(cur))
            cur, cur_bytes = [], 0
        cur.append(c)
        cur_bytes += nbytes
    if cur:
        runs.append(_make_run(cur))
    return runs


def columnar_transaction(txn: Transaction) -> ColumnarTransaction:
    """The reference's :class:`.txn.Transaction` in columnar form."""
    return ColumnarTransaction(
        txn.xid,
        txn.commit_lsn,
        txn.end_lsn,
        txn.commit_time,
        runs_from_changes(txn.changes),
        txn.streamed,
        txn.origin,
    )
