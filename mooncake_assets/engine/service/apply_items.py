"""What the stream applies, item by item: a change or a columnar run of one table, at its commit.

:func:`apply_item` (the schema check, then the row-wise or the run apply), :func:`long_runs`
(``apply_mode=auto``'s choice for the reference decoder's transactions) and :func:`generated_work`
(which changes of a batch need their generated columns computed). Used by the stream loop
(``replication.py``), the compiled path's batches (``native_batch.py``) and the copy's queue
(``provision.py``).
"""

from __future__ import annotations

from typing import Any, cast

from ..cdc.columnar import ChangeRun
from ..cdc.txn import Change, Transaction
from ..pg.schema import TableSchema
from ..table.mirror import MirrorTable
from ..table.schema_change import on_relation
from .registry import TableRegistry

__all__ = ["apply_item", "generated_work", "long_runs"]

_NOT_SEEN = object()


class _Truncate:
    kind = "truncate"

    def __init__(self, oid: int) -> None:
        self.relation_oid = oid


def long_runs(changes: list[Change], min_rows: int) -> bool:
    """Do ``changes`` (one transaction) make runs of ``min_rows`` changes or more on average (a run:
    consecutive changes of one kind on one relation, :mod:`~..cdc.columnar`)? ``apply_mode=auto``
    applies such a transaction as runs: below that, a run's fixed cost (its Arrow arrays, its decode,
    its vectorised hash) outweighs what it saves per row (``engine/table/apply_bench.py``)."""
    n = len(changes)
    if n < min_rows:
        return False
    runs, prev = 1, changes[0]
    for c in changes:
        if c.kind != prev.kind or c.relation_oid != prev.relation_oid:
            runs += 1
            prev = c
    return n >= runs * min_rows


def apply_item(
    t: MirrorTable, oid: int, item: Change | ChangeRun, rel: Any, commit_lsn: int, xid: int, catalog: Any
) -> None:
    """Apply one change or columnar run of relation ``oid`` to ``t`` at ``commit_lsn`` of transaction
    ``xid``: the Relation in effect (the item's own, else ``rel``, the assembler's latest) checked
    first — a schema change shows up here (:func:`~..table.schema_change.on_relation` with ``catalog``)
    —, then :meth:`~..table.mirror.MirrorTable.apply_run` or ``apply``. Raises what they raise."""
    if item.kind != "truncate":
        on_relation(t, oid, item.relation or rel, commit_lsn, catalog, xid=xid)
    if isinstance(item, ChangeRun):
        t.apply_run(item, commit_lsn)
    else:
        t.apply(item if item.kind != "truncate" else _Truncate(oid), commit_lsn)


def generated_work(
    reg: TableRegistry, txns: list[Transaction]
) -> tuple[list[Change], dict[int, TableSchema], dict[int, int]]:
    """The changes of ``txns`` whose generated columns are to be computed (the caller holds the service lock):
    those of mirrored tables (being copied or not) whose live schema has generated columns, unless
    :meth:`StreamLoop._apply_txn` will skip them (applied already, table stopped, before the copy's consistent
    point). Returns ``(changes, {oid: schema}, {oid: first commit LSN})``."""
    todo: list[Change]
    schemas: dict[int, TableSchema]
    first: dict[int, int]
    todo, schemas, first = [], {}, {}
    gen_schema: dict[int, object] = {}  # oid -> (live schema with generated columns, table, copy) or None
    for txn in txns:
        lsn = txn.commit_lsn
        for ch in txn.changes:
            if ch.kind == "truncate":
                continue
            oid = ch.relation_oid
            hit = gen_schema.get(oid, _NOT_SEEN)
            if hit is _NOT_SEEN:
                cp = reg.copying.get(oid)
                t = cp["table"] if cp is not None else reg.by_oid.get(oid)
                hit = gen_schema[oid] = (
                    (t, cp) if t is not None and any(c.generated for c in t.schema.columns) else None
                )
            if hit is None:
                continue
            t, cp = cast(tuple[MirrorTable, dict[str, Any] | None], hit)  # (not _NOT_SEEN: set above)
            if (lsn < cp["copy_lsn"]) if cp is not None else (lsn < t.applied_lsn or t.error):
                continue
            todo.append(ch)
            schemas[oid] = t.schema
            first.setdefault(oid, lsn)
    return todo, schemas, first
