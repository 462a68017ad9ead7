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

A *batch run* (:func:`merge_runs`) spans several transactions of one read batch: the runs of consecutive
committed transactions that have the same kind, relation OID and Relation in effect concatenated (within
the same limits), with ``commit_lsns`` giving each row its own transaction's commit LSN. A run of one
transaction has ``commit_lsns = None`` (every row at the commit LSN the caller passes).

Tuple columns follow the Relation message's column order (pgoutput sends every column of the
relation in each tuple; PG docs, "Logical Replication Message Formats", TupleData).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from .pgoutput import BadMessage, Relation, TupleData, pg_time_to_datetime
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
    "ColumnarBatch",
    "runs_from_changes",
    "columnar_transaction",
    "merge_runs",
    "changes_from_run",
    "slice_run",
    "split_by_commit",
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
    ``commit_lsns``: ``uint64`` per row, the commit LSN of the row's transaction, for a batch run
    spanning several transactions (:func:`merge_runs`; non-decreasing); ``None`` for a run of one
    transaction.
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
    commit_lsns: npt.NDArray[np.uint64] | None = None
    #: the compiled decoder's ``(new, old)`` layouts of the run's own arrays, as :func:`_layout` reads
    #: them (saves :func:`merge_runs` reading the buffers back per run); None when not known. Not part
    #: of the run's value (``equals`` ignores it); :func:`slice_run` drops it.
    layouts: tuple[Any, Any] | None = None

    def commit_lsn_at(self, i: int, default: int) -> int:
        """Row ``i``'s commit LSN: ``commit_lsns[i]``, or ``default`` (the caller's commit LSN) for a run of
        one transaction."""
        return default if self.commit_lsns is None else int(self.commit_lsns[i])

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
            and arr(self.commit_lsns, other.commit_lsns)
        )


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarTransaction:
    """A committed transaction in columnar form (fields as :class:`.txn.Transaction`, ``runs`` in commit
    order instead of ``changes``). ``spilled``: the compiled decoder wrote the transaction's first
    changes to disk (:class:`.spill.TransactionSpill`); they come before ``runs``, read back with
    ``spilled.runs()``; None for a transaction held in memory whole. ``bad``: as
    :attr:`.txn.Transaction.bad` (the compiled decoder's batch mode hands such a transaction over on
    its own, never inside a :class:`ColumnarBatch`)."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime
    runs: list[ChangeRun] = field(default_factory=list)
    streamed: bool = False
    origin: str | None = None
    spilled: Any = None  # a .spill.TransactionSpill (not imported: spill builds on this module)
    bad: list[BadMessage] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Changes held in memory (``runs``; a spilled part not counted)."""
        return sum(r.rows for r in self.runs)


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarBatch:
    """Consecutive committed transactions as batch runs, cut by the compiled decoder straight from its
    batch buffer (``NativeDecoder(batch=True)``): the same rows as :func:`merge_runs` of those
    transactions' runs, without building each transaction's own runs first.

    ``runs``: batch runs in commit order (module docstring's boundaries, counted from the start of each
    batch run; every run has ``commit_lsns``). Per transaction, in commit order (``n`` of them):
    ``xids`` (``uint32``), ``commit_lsns`` and ``end_lsns`` (``uint64``), ``commit_times`` (``int64`` µs
    since 2000-01-01 UTC, pgoutput's timestamps), ``row_ends`` (``int64``: rows of the batch up to and
    including that transaction's; an empty transaction adds none), ``streamed``, ``origins``.
    Never spilled (a spilled transaction comes as its own :class:`ColumnarTransaction`)."""

    runs: list[ChangeRun]
    xids: npt.NDArray[np.uint32]
    commit_lsns: npt.NDArray[np.uint64]
    end_lsns: npt.NDArray[np.uint64]
    commit_times: npt.NDArray[np.int64]
    row_ends: npt.NDArray[np.int64]
    streamed: list[bool]
    origins: list[str | None]

    def __len__(self) -> int:
        """Number of transactions."""
        return len(self.xids)

    @property
    def rows(self) -> int:
        return int(self.row_ends[-1]) if len(self.row_ends) else 0

    def transactions(self) -> list[ColumnarTransaction]:
        """The batch cut back into one :class:`ColumnarTransaction` per transaction (zero-copy slices of
        the batch runs; a transaction's runs may be cut where the batch run was, so compare rows, not
        run boundaries): for the paths that take transactions one by one (the reference apply)."""
        starts = np.cumsum([0] + [r.rows for r in self.runs]).tolist()
        out = []
        lo = k = 0
        for i in range(len(self.xids)):
            hi = int(self.row_ends[i])
            runs = []
            while k < len(self.runs) and starts[k + 1] <= lo:
                k += 1  # (the first run holding row lo)
            j = k
            while j < len(self.runs) and starts[j] < hi:
                run, rs = self.runs[j], starts[j]
                part = run if run.kind == "truncate" else slice_run(run, max(lo, rs) - rs, min(hi, starts[j + 1]) - rs)
                runs.append(replace(part, commit_lsns=None, layouts=None))
                j += 1
            lo = hi
            out.append(
                ColumnarTransaction(
                    int(self.xids[i]),
                    int(self.commit_lsns[i]),
                    int(self.end_lsns[i]),
                    pg_time_to_datetime(int(self.commit_times[i])),
                    runs,
                    self.streamed[i],
                    self.origins[i],
                )
            )
        return out


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
        None,
        list(txn.bad),
    )


def _layout(cells: tuple[CellColumn, ...] | None) -> tuple[int, Any, Any, Any]:
    """``(value bytes, kinds, offsets, data)`` of a run's tuples, read once per run by :func:`merge_runs`.

    ``value bytes`` is :func:`_cells_bytes`. For the compiled decoder's layout (``cells`` are the column
    slices of one ``ncols * rows`` binary array, kinds the rows of one ``(ncols, rows)`` array) the
    others are that kinds array and the array's offsets and data buffers; ``None`` for another layout
    (then the runs are joined column by column)."""
    if not cells:
        return 0, None, None, None
    c0, cl = cells[0].values, cells[-1].values
    b = c0.buffers()
    data = b[2]
    if cl is c0:
        same = data is not None
    else:
        dl = cl.buffers()[2]
        same = data is not None and dl is not None and dl.address == data.address
    if not same:
        return sum(int(x.size) for c in cells if (x := c.values.buffers()[2]) is not None), None, None, None
    k, n = len(cells), len(c0)
    base = cells[0].kinds.base
    if (
        isinstance(base, np.ndarray)
        and base.shape == (k, n)
        and c0.offset == 0
        and cl.offset == (k - 1) * n
        and b[1] is not None
        and b[1].size % 4 == 0
    ):
        return int(data.size), base, b[1], data
    return int(data.size), None, None, None


def _gather_shared(parts: list[tuple[Any, Any, Any]], k: int) -> tuple[CellColumn, ...]:
    """:func:`_concat_cells` for parts all in the compiled decoder's layout (``(kinds, offsets buffer,
    data buffer)`` each, from :func:`_layout`): the values of every part and column gathered in one
    pass into one ``k * total`` binary array, column after column (validity from the kinds: a value
    is present exactly where its kind is text or binary, the :class:`CellColumn` contract)."""
    kinds = np.concatenate([p[0] for p in parts], axis=1)
    ns = np.fromiter((p[0].shape[1] for p in parts), dtype=np.int64, count=len(parts))
    total = int(kinds.shape[1])
    kn = k * ns  # cells per part
    osz = np.fromiter((p[1].size for p in parts), dtype=np.int64, count=len(parts)) // 4
    dsz = np.fromiter((p[2].size for p in parts), dtype=np.int64, count=len(parts))
    all_off = np.frombuffer(b"".join([p[1] for p in parts]), dtype=np.int32).astype(np.int64)
    all_data = np.frombuffer(b"".join([p[2] for p in parts]), dtype=np.uint8)
    ostart, dstart, cstart = np.cumsum(osz) - osz, np.cumsum(dsz) - dsz, np.cumsum(kn) - kn
    ncell = int(kn.sum())
    cell_part = np.repeat(np.arange(len(parts)), kn)
    at = ostart[cell_part] + np.arange(ncell, dtype=np.int64) - cstart[cell_part]  # cell's offset entry
    starts = all_off[at] + dstart[cell_part]
    lens = all_off[at + 1] - all_off[at]
    # output cell (c, row of the batch) is cell c * n_p + row within part p of the concatenation
    rstart = np.cumsum(ns) - ns
    row_part = np.repeat(np.arange(len(parts)), ns)
    within = np.arange(total, dtype=np.int64) - rstart[row_part]
    perm = (cstart[row_part][None, :] + np.arange(k, dtype=np.int64)[:, None] * ns[row_part][None, :] + within).ravel()
    out_len = lens[perm]
    out_off = np.zeros(k * total + 1, dtype=np.int64)
    np.cumsum(out_len, out=out_off[1:])
    nbytes = int(out_off[-1])
    if nbytes > 0x7FFFFFFF:
        raise OverflowError(f"a batch run's tuples hold {nbytes} value bytes (> 2 GiB)")
    src = np.repeat(starts[perm] - out_off[:-1], out_len) + np.arange(nbytes, dtype=np.int64)
    data = all_data[src] if nbytes else np.empty(0, dtype=np.uint8)
    flat = kinds.ravel()
    valid = (flat == KIND_TEXT) | (flat == KIND_BINARY)
    nulls = int(valid.size - np.count_nonzero(valid))
    bufs = [
        pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None,
        pa.py_buffer(out_off.astype(np.int32)),
        pa.py_buffer(data),
    ]
    big = pa.Array.from_buffers(pa.binary(), k * total, bufs, null_count=nulls)
    return tuple(CellColumn(kinds[c], big.slice(c * total, total)) for c in range(k))


def _cells_bytes(cells: tuple[CellColumn, ...] | None) -> int:
    """An upper bound of the value bytes of a run's tuples (the data buffers' sizes: exact for a
    run's own arrays, the whole parent buffer for slices)."""
    return _layout(cells)[0]


def _run_bytes(run: ChangeRun) -> int:
    return _cells_bytes(run.new) + _cells_bytes(run.old)


_Layout = tuple[int, Any, Any, Any]


def _describes(lay: _Layout, cells: tuple[CellColumn, ...] | None, rows: int) -> bool:
    """Is ``lay`` (a decoder's layout) still that of ``cells`` (the same kinds array, ``rows`` rows)?"""
    if not cells:
        return lay[1] is None
    base = lay[1]
    return base is not None and base.shape[1] == rows and base is cells[0].kinds.base


def _run_layouts(run: ChangeRun) -> tuple[_Layout, _Layout]:
    """:func:`_layout` of a run's new and old tuples: the decoder's (``run.layouts``) when they still
    describe the run's kinds arrays, else read from the arrays."""
    lay = run.layouts
    if lay is not None and _describes(lay[0], run.new, run.rows) and _describes(lay[1], run.old, run.rows):
        return lay[0], lay[1]
    return _layout(run.new), _layout(run.old)


def _concat_cells(parts: list[tuple[CellColumn, ...]], layouts: list[_Layout]) -> tuple[CellColumn, ...]:
    """Column ``i`` of the result: column ``i`` of each part, in order (``layouts``: :func:`_layout` of
    each part). Parts all in the compiled decoder's layout are gathered in one pass for all columns
    (:func:`_gather_shared`); others column by column."""
    k = len(parts[0])
    if all(x[1] is not None for x in layouts):
        return _gather_shared([x[1:] for x in layouts], k)
    return tuple(
        CellColumn(np.concatenate([p[i].kinds for p in parts]), pa.concat_arrays([p[i].values for p in parts]))
        for i in range(k)
    )


def _stamped(run: ChangeRun, commit_lsn: int) -> ChangeRun:
    """``run`` with ``commit_lsns`` (all ``commit_lsn`` unless it has them already; arrays shared)."""
    if run.commit_lsns is not None:
        return run
    return replace(run, commit_lsns=np.full(run.rows, commit_lsn, dtype=np.uint64))


_Member = tuple[ChangeRun, int, _Layout, _Layout]  # a run, its transaction's commit LSN, layouts of new / old


def _concat(group: list[_Member]) -> ChangeRun:
    """One batch run of ``group`` (runs with the commit LSN of their transaction and their layouts,
    commit order, same kind and Relation)."""
    first = group[0][0]
    runs = [m[0] for m in group]
    rows = np.fromiter((r.rows for r in runs), dtype=np.int64, count=len(runs))
    if all(r.commit_lsns is None for r in runs):
        commit_lsns = np.repeat(np.fromiter((m[1] for m in group), dtype=np.uint64, count=len(group)), rows)
    else:
        commit_lsns = np.concatenate(
            [
                r.commit_lsns if r.commit_lsns is not None else np.full(r.rows, m[1], dtype=np.uint64)
                for r, m in zip(runs, group)
            ]
        )
    new = old = None
    if first.new is not None:
        new = _concat_cells([r.new for r in runs if r.new is not None], [m[2] for m in group if m[0].new is not None])
    if first.old is not None:
        old = _concat_cells([r.old for r in runs if r.old is not None], [m[3] for m in group if m[0].old is not None])
    return ChangeRun(
        first.kind,
        first.relation_oid,
        first.relation,
        int(rows.sum()),
        np.concatenate([r.lsns for r in runs]),
        new,
        old,
        np.concatenate([r.old_kinds for r in runs if r.old_kinds is not None]) if first.old_kinds is not None else None,
        commit_lsns=commit_lsns,
    )


def merge_runs(txns: Sequence[ColumnarTransaction]) -> list[ChangeRun]:
    """The runs of ``txns`` (consecutive committed transactions, commit order) as batch runs (module
    docstring): a run is appended to the previous one when both have the same kind (not TRUNCATE),
    relation OID and Relation in effect (``is``, else ``==``) and the sum stays within
    :data:`MAX_RUN_ROWS` and :data:`MAX_RUN_BYTES` (bytes counted by an upper bound: the runs' data
    buffers). Every returned run has ``commit_lsns`` (also a run
    left alone), so applying them row by row at those commit LSNs is applying ``txns`` in order. The
    inputs are not changed (the values are copied into new arrays only where runs are joined)."""
    out: list[ChangeRun] = []
    group: list[_Member] = []
    rows = nbytes = 0

    def close() -> None:
        if group:
            out.append(_concat(group) if len(group) > 1 else _stamped(group[0][0], group[0][1]))

    for txn in txns:
        for run in txn.runs:
            if run.kind == "truncate":
                close()
                group, rows, nbytes = [], 0, 0
                out.append(_stamped(run, txn.commit_lsn))
                continue
            ln, lo = _run_layouts(run)
            b = ln[0] + lo[0]
            head = group[0][0] if group else None
            if head is None or not (
                run.kind == head.kind
                and run.relation_oid == head.relation_oid
                and (run.relation is head.relation or run.relation == head.relation)
                and rows + run.rows <= MAX_RUN_ROWS
                and nbytes + b <= MAX_RUN_BYTES
            ):
                close()
                group, rows, nbytes = [], 0, 0
            group.append((run, txn.commit_lsn, ln, lo))
            rows += run.rows
            nbytes += b
    close()
    return out


def _tuples(cells: tuple[CellColumn, ...], n: int, present: npt.NDArray[np.bool_] | None) -> list[TupleData | None]:
    kinds = ["".join(map(chr, col)) for col in zip(*(c.kinds.tolist() for c in cells))] if cells else [""] * n
    data = list(zip(*(c.values.to_pylist() for c in cells))) if cells else [()] * n
    return [TupleData(kinds[i], list(data[i])) if present is None or present[i] else None for i in range(n)]


def changes_from_run(run: ChangeRun) -> list[Change]:
    """A run's rows as the reference's :class:`.txn.Change` objects (commit order; the inverse of
    ``runs_from_changes`` for one run): for the row-wise apply and for what works on changes (the
    generated columns, :mod:`.generated`). Row ``i``'s commit LSN is ``run.commit_lsn_at(i, …)``."""
    n = run.rows
    if run.kind == "truncate":
        return [
            Change(
                "truncate",
                run.relation_oid,
                truncate_oids=list(run.truncate_oids),
                truncate_cascade=run.cascade,
                truncate_restart_identity=run.restart_identity,
                lsn=int(run.lsns[0]),
            )
        ]
    lsns = run.lsns.tolist()
    new = _tuples(run.new, n, None) if run.new is not None else [None] * n
    ok = run.old_kinds.tolist() if run.old_kinds is not None else [0] * n
    old = _tuples(run.old, n, run.old_kinds != 0) if run.old is not None and run.old_kinds is not None else [None] * n
    return [
        Change(
            run.kind,
            run.relation_oid,
            new=new[i],
            old=old[i],
            old_kind=chr(ok[i]) if ok[i] else None,
            lsn=lsns[i],
            relation=run.relation,
        )
        for i in range(n)
    ]


def slice_run(run: ChangeRun, start: int, stop: int) -> ChangeRun:
    """Rows ``start:stop`` of a (non-TRUNCATE) run, as a run (zero-copy slices of its arrays)."""
    if start == 0 and stop == run.rows:
        return run

    def cells(cs: tuple[CellColumn, ...] | None) -> tuple[CellColumn, ...] | None:
        if cs is None:
            return None
        return tuple(CellColumn(c.kinds[start:stop], c.values.slice(start, stop - start)) for c in cs)

    return replace(
        run,
        layouts=None,
        rows=stop - start,
        lsns=run.lsns[start:stop],
        new=cells(run.new),
        old=cells(run.old),
        old_kinds=None if run.old_kinds is None else run.old_kinds[start:stop],
        commit_lsns=None if run.commit_lsns is None else run.commit_lsns[start:stop],
    )


def split_by_commit(run: ChangeRun) -> list[tuple[int, ChangeRun]]:
    """A batch run cut back into ``(commit LSN, its rows as a run of one transaction)`` (commit order)."""
    assert run.commit_lsns is not None
    cl = run.commit_lsns
    cuts = [0, *(np.flatnonzero(cl[1:] != cl[:-1]) + 1).tolist(), run.rows]
    out = []
    for a, b in zip(cuts, cuts[1:]):
        part = run if run.kind == "truncate" else slice_run(run, a, b)
        out.append((int(cl[a]), replace(part, commit_lsns=None)))
    return out
