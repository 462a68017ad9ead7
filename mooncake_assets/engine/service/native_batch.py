"""The stream's compiled path: apply the transactions of one read batch from the compiled decoder.

With ``ServiceConfig.decoder = "native"`` the stream thread reads with
:meth:`~..cdc.stream.ReplicationConnection.read_transactions` and a :class:`~..cdc.native.NativeDecoder`:
every committed transaction of a read batch arrives as a :class:`~..cdc.columnar.ColumnarTransaction`
(no Python object per row). :func:`apply_native_batch` applies them in commit order, with the same
results as the reference path (``read()`` + ``TransactionAssembler`` + ``StreamLoop._apply_txn``):

- The stream's decoder runs with ``batch=True``: a read batch's committed transactions come as one
  :class:`~..cdc.columnar.ColumnarBatch` whose batch runs the decoder cut straight from its buffer
  (applied as below, without ``merge_runs``); a batch that must take the reference path (``apply_mode``
  ``change``, generated columns) is cut back into its transactions first
  (``ColumnarBatch.transactions``). Spilled transactions still come on their own.
- Consecutive transactions are applied together as *batch runs* (:func:`~..cdc.columnar.merge_runs`):
  the runs of the same kind on the same relation under the same Relation joined across transactions,
  each row at its own transaction's commit LSN (insert LSN, delete LSN). A run's fixed cost (its Arrow
  arrays, decode and hash per column) is then paid once per batch instead of once per transaction.
  The per-table rules of ``_apply_txn`` hold per row: rows of a commit below the table's applied LSN are
  skipped (a prefix: commit LSNs never decrease in a batch run), a stopped table takes nothing, a
  table being copied queues the rows at or after its consistent point, cut back into one run per
  transaction (:func:`~..cdc.columnar.split_by_commit`). ``last_change_lsn`` and the applied LSNs move
  once per batch, to the last commit / end LSN.
- ``apply_mode``: ``run`` applies every batch run with ``MirrorTable.apply_run``; ``auto`` applies a
  batch run shorter than ``native_run_min_rows`` row by row (``changes_from_run``: a short run costs
  more than its rows row-wise); ``change`` applies every transaction through the reference path.
- **Generated columns** (:mod:`..cdc.generated`) are computed on ``Change`` objects: a transaction
  touching a table whose mirror has generated columns (mirrored or being copied) goes through the
  reference path as it is today — its runs turned back into changes
  (:func:`~..cdc.columnar.changes_from_run`), filled by ``GeneratedColumns.fill`` with the rest of
  the batch's such changes (one round trip per table and batch), applied by ``StreamLoop._apply_txn``
  in its place in commit order.
- A failing batch run stops only its table (``StreamLoop.stop_table``), at the commit LSN of the failing
  row when the error names it (``BadRowError``, a row applied row by row), else at the first commit
  of the run (the table's applied LSN then stays below every commit of the run: a restart replays
  them all). As in the row-wise path, rows applied before the failure stay applied in memory.

- A transaction the decoder **spilled** to disk (``ColumnarTransaction.spilled``,
  ``engine/cdc/spill.py``) is applied on its own (:func:`apply_spilled`): its runs read back one at a
  time, the memory budget flushing committed buffers between them, the applied LSNs moved at its end.

- A transaction with a **malformed row message** (``ColumnarTransaction.bad``: an Insert, Update,
  Delete or Relation of a readable relation OID the decoder could not decode; the batch decoder hands
  such a transaction over on its own) stops only the tables of those relations, at its commit LSN
  (``StreamLoop.stop_bad``, as the reference path does in ``_apply_txn``); the rest of it is applied
  (:func:`_apply_bad`; spilled, :func:`apply_spilled`, skips the same tables). The stopped table's
  applied LSN stays below the commit and the slot is held at its flush LSN: a restart reads it again.

A message that cannot be attributed to a table (a malformed Begin or Commit, an unknown type byte, a
message too short to hold its relation OID, a broken message sequence) stops the stream as on the
reference path: the decoder raises (``ValueError`` naming the XLogData LSN, or ``ProtocolError``)
before anything of the batch is applied, the stream reconnects and the slot resends from the
confirmed LSN (``status`` shows the stream error and every table ``retrying``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..cdc.columnar import (
    ChangeRun,
    ColumnarBatch,
    ColumnarTransaction,
    changes_from_run,
    merge_runs,
    slice_run,
    split_by_commit,
)
from ..cdc.pgoutput import BadMessage
from ..cdc.spill import Spiller, SpillError
from ..cdc.txn import Transaction
from ..faults import fault
from ..heap import release_unused
from ..lsn import Lsn
from ..table.mirror import MirrorTable
from .apply_items import apply_item, generated_work
from .config import ServiceConfig
from .memory import MemoryBudget
from .parts import StreamHost
from .registry import TableRegistry

if TYPE_CHECKING:
    from ..cdc.native import NativeDecoder
    from ..cdc.stream import ReplicationConnection

__all__ = ["apply_native_batch", "native_decoder", "read_native_batch", "reference_transaction"]

log = logging.getLogger("mooncake.service")


class StreamLoop(Protocol):
    """What this module uses of :class:`~.replication.StreamLoop` (a protocol: that module imports
    this one)."""

    config: ServiceConfig
    lock: Any
    reg: TableRegistry
    svc: StreamHost
    applied_lsn: int
    spilled_txns: int

    def stop_table(self, t: MirrorTable, e: Exception, lsn: int) -> None: ...

    def stop_bad(self, commit_lsn: int, bad: list[BadMessage]) -> set[int]: ...

    def send_status(self, reply: bool = False) -> None: ...

    def stop_generated(self, failed: dict[int, Exception], first: dict[int, int]) -> None: ...

    def _apply_txn(self, txn: Transaction, assembler: Any) -> None: ...


def native_decoder(decoder: str, repl: ReplicationConnection) -> NativeDecoder | None:
    """The compiled decoder for a new stream on ``repl`` when ``decoder`` (``ServiceConfig.decoder``)
    is ``native``, else None (the reference path). None too, logged, where the compiled receive loop
    cannot work with this psycopg/libpq (``engine/cdc/native.py``: not Linux, no binary libpq, a
    psycopg outside the verified range): checked here, before the stream reads anything."""
    if decoder != "native":
        return None
    try:
        from ..cdc.native import NativeDecoder, receiver_for

        receiver_for(repl.pgconn)  # (what read_transactions does first)
        return NativeDecoder(batch=True)
    except (ImportError, OSError, RuntimeError) as e:
        log.warning("compiled decoder unavailable (%s: %s); using the reference decoder", type(e).__name__, e)
        return None


def attach_spill(decoder: NativeDecoder, spill_dir: Path, memory: MemoryBudget) -> None:
    """Give ``decoder`` the stream's spill (``engine/cdc/spill.py``): its open transactions go to
    ``spill_dir`` (created; files left there are deleted) every ``memory.spill_bytes()`` bytes of
    buffer, as the service's stream does (the bench's apply loop too)."""
    decoder.spill = Spiller(spill_dir)
    decoder.spill_bytes = memory.spill_bytes()


#: seconds the read loop sleeps between reads while the stream is busy (:func:`read_native_batch`)
READ_PAUSE_S = 0.005


def read_native_batch(
    repl: ReplicationConnection,
    decoder: NativeDecoder,
    timeout: float,
    window_s: float = 0.02,
    max_rows: int = 20_000,
    pause_s: float = READ_PAUSE_S,
) -> list[ColumnarTransaction | ColumnarBatch]:
    """One read batch of the compiled path: wait up to ``timeout`` seconds for XLogData
    (:meth:`~..cdc.stream.ReplicationConnection.read_transactions`), then, while messages keep coming,
    sleep ``pause_s`` seconds and read what arrived meanwhile, for up to ``window_s`` seconds or until
    the batch holds ``max_rows`` rows. The walsender sends each decoded transaction as it goes, a few
    hundred bytes per TCP segment under a load of small transactions; waking for every segment (a
    poll per segment) cost more CPU in context switches than the decoding itself, so while the stream
    is busy the loop wakes once per ``pause_s`` and takes what the socket buffer holds by then. When
    the stream is idle this adds nothing (the first read returns what there is; a pause that brought
    nothing ends the batch); when busy at most ``window_s``. The decoder's output is taken once, at
    the end: with ``decoder.batch`` the whole read batch's transactions come as one
    :class:`~..cdc.columnar.ColumnarBatch` (and the spilled ones on their own)."""
    first = repl.messages_read
    repl.read_transactions(decoder, timeout, take=False)
    if repl.messages_read == first:
        return decoder.take()
    end = time.monotonic() + window_s
    while decoder.committed_rows < max_rows and time.monotonic() < end:
        seen = repl.messages_read
        if pause_s > 0:
            time.sleep(pause_s)
        while decoder.committed_rows < max_rows and time.monotonic() < end:  # one read: one recv's worth
            before = repl.messages_read
            repl.read_transactions(decoder, 0.0005, take=False)
            if repl.messages_read == before:
                break
        if repl.messages_read == seen:
            break
    return decoder.take()


def reference_transaction(txn: ColumnarTransaction) -> Transaction:
    """``txn`` as the reference's :class:`~..cdc.txn.Transaction` (one ``Change`` per row)."""
    changes = [ch for run in txn.runs for ch in changes_from_run(run)]
    return Transaction(
        txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, changes, txn.streamed, txn.origin, list(txn.bad)
    )


def _generated_oids(loop: StreamLoop) -> set[int]:
    """OIDs of the tables (mirrored or being copied) whose live schema has generated columns (lock held)."""
    tables = list(loop.reg.by_oid.items()) + [(oid, cp["table"]) for oid, cp in loop.reg.copying.items()]
    return {oid for oid, t in tables if any(c.generated for c in t.schema.columns)}


def apply_native_batch(
    loop: StreamLoop, items: list[ColumnarTransaction | ColumnarBatch], decoder: NativeDecoder
) -> int:
    """Apply one read batch of the compiled decoder (module docstring); returns the number of
    transactions. Errors as ``StreamLoop.apply_batch`` (``psycopg.OperationalError`` when the generated
    columns' source cannot be asked: the caller reconnects and the slot resends the batch)."""
    if not items:
        return 0
    mode = loop.config.apply_mode
    with loop.lock:
        gen = _generated_oids(loop) if mode != "change" else set()
        plan: list[Transaction | ColumnarTransaction | ColumnarBatch | list[ColumnarTransaction]] = []
        txns: list[ColumnarTransaction | ColumnarBatch] = []
        for item in items:  # a batch that needs the reference path, cut back into its transactions
            if isinstance(item, ColumnarBatch) and (mode == "change" or (gen and _batch_touches(item, gen))):
                txns += item.transactions()
            else:
                txns.append(item)
        for txn in txns:
            if isinstance(txn, ColumnarBatch):
                plan.append(txn)
            elif txn.spilled is not None and txn.spilled.failed is not None:
                plan.append(txn)  # (apply_spilled stops the tables it touches)
            elif mode == "change" or (gen and _touches(txn, gen)):
                if txn.spilled is not None:  # (read back whole: the reference path has no chunks)
                    txn = replace(txn, runs=[*txn.spilled.runs(), *txn.runs], spilled=None)
                plan.append(reference_transaction(txn))
            elif txn.spilled is not None or txn.bad:
                plan.append(txn)  # (applied on its own: apply_spilled, _apply_bad)
            elif plan and isinstance(plan[-1], list):
                plan[-1].append(txn)
            else:
                plan.append([txn])
        ref = [p for p in plan if isinstance(p, Transaction)]
        todo, schemas, first = generated_work(loop.reg, ref) if ref else ([], {}, {})
    failed = loop.svc.generated.fill(todo, schemas) if todo else {}
    with loop.lock:
        loop.stop_generated(failed, first)
        for p in plan:
            if isinstance(p, Transaction):
                loop._apply_txn(p, decoder)
            elif isinstance(p, ColumnarTransaction):
                if p.spilled is not None:
                    apply_spilled(loop, p, decoder)
                else:
                    _apply_bad(loop, p, decoder)
            elif isinstance(p, ColumnarBatch):
                _apply_batch(loop, p, decoder)
            else:
                _apply_group(loop, p, decoder)
    n = 0
    for txn in txns:
        if isinstance(txn, ColumnarBatch):
            n += len(txn)
            continue
        n += 1
        if txn.spilled is not None:
            txn.spilled.delete()
    return n


def _batch_touches(batch: ColumnarBatch, oids: set[int]) -> bool:
    """Does ``batch`` change a row of a relation in ``oids``?"""
    return any(r.kind != "truncate" and r.relation_oid in oids for r in batch.runs)


def _touches(txn: ColumnarTransaction, oids: set[int]) -> bool:
    """Does ``txn`` (its spilled part included) change a row of a relation in ``oids``?"""
    if txn.spilled is not None and txn.spilled.oids & oids:
        return True
    return any(r.kind != "truncate" and r.relation_oid in oids for r in txn.runs)


def apply_spilled(loop: StreamLoop, txn: ColumnarTransaction, decoder: NativeDecoder) -> None:
    """A transaction the decoder spilled to disk (``engine/cdc/spill.py``), applied run by run from
    its file, then its in-memory tail (the caller holds the lock): one run (at most ``MAX_RUN_ROWS``
    rows) in memory at a time; between runs the memory budget flushes committed buffers
    (``MemoryBudget.relieve``; local staging only, no Iceberg commit, and nothing is read while the
    lock is held, so no one sees part of the transaction). The applied LSNs move once, at the end,
    and the memory the apply freed goes back to the OS (:func:`~..heap.release_unused`).
    A failing flush stops its table at the transaction's commit."""
    assert txn.spilled is not None
    if txn.spilled.failed is not None:
        _spill_failed(loop, txn, decoder)
        return
    skip = loop.stop_bad(txn.commit_lsn, txn.bad) if txn.bad else set()
    touched: dict[MirrorTable, int] = {}
    budget = loop.svc.memory
    last, flushes = time.monotonic(), budget.early_flushes
    for run in chain(txn.spilled.runs(), txn.runs):
        if skip:
            kept = _without([run], skip)
            if not kept:
                continue
            run = kept[0]
        one = ColumnarTransaction(txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, [run], txn.streamed)
        _apply_runs(loop, [one], decoder, touched)
        del one, run
        budget.relieve(loop.reg.tables.values(), on_error=lambda t, e: loop.stop_table(t, e, txn.commit_lsn))
        if budget.early_flushes > flushes:  # (part of the transaction is in local staging now)
            fault("spill:apply")
        if time.monotonic() - last > 5.0:  # a long apply: the walsender hears from us (wal_sender_timeout)
            loop.send_status()
            last = time.monotonic()
    _finish(loop, touched, txn.end_lsn)
    loop.spilled_txns += 1
    release_unused()  # (the runs read back, the apply's buffers: engine/heap.py)


def _spill_failed(loop: StreamLoop, txn: ColumnarTransaction, decoder: NativeDecoder) -> None:
    """A committed transaction whose spill failed (a full disk; ``engine/cdc/spill.py``; the caller
    holds the lock): every table whose changes were dropped is stopped with the spill's one-line error
    (``StreamLoop.stop_table``: its applied LSN stays below the commit, the slot is held at its flush
    LSN); the rest of the transaction, kept in memory, goes to the other tables."""
    sp = txn.spilled
    assert sp is not None and sp.failed is not None
    skip = loop.stop_bad(txn.commit_lsn, txn.bad) if txn.bad else set()
    for oid in sorted(sp.oids):
        cp = loop.reg.copying.get(oid)
        t = cp["table"] if cp is not None else loop.reg.by_oid.get(oid)
        if t is None or t.error or (cp is None and txn.commit_lsn < t.applied_lsn):
            continue  # not mirrored, stopped already, or applied before a reconnect resent it
        loop.stop_table(
            t,
            SpillError(
                f"table {t.name}: {sp.failed} (transaction committed at LSN {Lsn(txn.commit_lsn)}); this table "
                "stopped (the others go on) and holds the replication slot at its flush LSN; "
                f"free space under {sp.path.parent} and restart the service"
            ),
            txn.commit_lsn,
        )
    tail = _without([r for r in txn.runs if r.kind == "truncate" or r.relation_oid not in sp.oids], skip)
    touched: dict[MirrorTable, int] = {}
    if tail:
        _apply_runs(loop, [replace(txn, runs=tail, spilled=None)], decoder, touched)
    _finish(loop, touched, txn.end_lsn)


def _without(runs: list[ChangeRun], oids: set[int]) -> list[ChangeRun]:
    """``runs`` without the rows of the relations in ``oids`` (a TRUNCATE keeps its other OIDs)."""
    if not oids:
        return runs
    out = []
    for r in runs:
        if r.kind == "truncate":
            keep = tuple(o for o in r.truncate_oids if o not in oids)
            if keep:
                out.append(
                    r if len(keep) == len(r.truncate_oids) else replace(r, relation_oid=keep[0], truncate_oids=keep)
                )
        elif r.relation_oid not in oids:
            out.append(r)
    return out


def _apply_bad(loop: StreamLoop, txn: ColumnarTransaction, decoder: NativeDecoder) -> None:
    """A transaction with malformed row messages (``txn.bad``; the caller holds the lock): their tables
    stopped at its commit (``StreamLoop.stop_bad``), the rest of it applied as a group of one."""
    skip = loop.stop_bad(txn.commit_lsn, txn.bad)
    _apply_group(loop, [replace(txn, runs=_without(txn.runs, skip), bad=[])], decoder)


def _apply_group(loop: StreamLoop, txns: list[ColumnarTransaction], decoder: NativeDecoder) -> None:
    """Consecutive transactions as batch runs (module docstring; the caller holds the lock)."""
    touched: dict[MirrorTable, int] = {}
    _apply_runs(loop, txns, decoder, touched)
    _finish(loop, touched, txns[-1].end_lsn)


def _apply_batch(loop: StreamLoop, batch: ColumnarBatch, decoder: NativeDecoder) -> None:
    """A :class:`~..cdc.columnar.ColumnarBatch` (the decoder's batch runs, as ``_apply_group`` makes
    them with ``merge_runs``; the caller holds the lock)."""
    touched: dict[MirrorTable, int] = {}
    commits = batch.commit_lsns.tolist()
    xids = dict(zip(commits, batch.xids.tolist()))
    ends = dict(zip(commits, batch.end_lsns.tolist()))
    _apply_batch_runs(loop, batch.runs, xids, ends, decoder, touched)
    _finish(loop, touched, int(batch.end_lsns[-1]))


def _apply_runs(
    loop: StreamLoop, txns: list[ColumnarTransaction], decoder: NativeDecoder, touched: dict[MirrorTable, int]
) -> None:
    """The batch runs of ``txns`` to their tables (``touched``: table -> last commit LSN applied, filled)."""
    xids = {t.commit_lsn: t.xid for t in txns}
    ends = {t.commit_lsn: t.end_lsn for t in txns}
    _apply_batch_runs(loop, merge_runs(txns), xids, ends, decoder, touched)


def _apply_batch_runs(
    loop: StreamLoop,
    runs: list[ChangeRun],
    xids: dict[int, int],
    ends: dict[int, int],
    decoder: NativeDecoder,
    touched: dict[MirrorTable, int],
) -> None:
    """Batch runs (each with ``commit_lsns``) to their tables; ``xids`` / ``ends``: commit LSN -> xid /
    end LSN of the runs' transactions."""
    for run in runs:
        assert run.commit_lsns is not None  # (every batch run has them)
        for oid in run.truncate_oids if run.kind == "truncate" else [run.relation_oid]:
            rel = decoder.relations.get(oid)
            cp = loop.reg.copying.get(oid)
            if cp is not None:
                for c, part in split_by_commit(run):
                    if c >= cp["copy_lsn"]:
                        cp["queue"].append((c, ends[c], part, rel, xids[c]))
                continue
            t = loop.reg.by_oid.get(oid)
            if t is None or t.error:
                continue  # not mirrored, or stopped by an error
            start = int(np.searchsorted(run.commit_lsns, t.applied_lsn, side="left"))
            if start >= run.rows:
                continue  # applied already (durable before a restart, or in memory before a reconnect)
            part = run if start == 0 or run.kind == "truncate" else slice_run(run, start, run.rows)
            _apply_part(loop, t, oid, part, rel, xids)
            touched[t] = int(run.commit_lsns[-1])


def _finish(loop: StreamLoop, touched: dict[MirrorTable, int], end_lsn: int) -> None:
    """The LSNs moved once per batch: tables' last change, the stream's and every table's applied LSN."""
    for t, lsn in touched.items():
        t.last_change_lsn = max(t.last_change_lsn, lsn)
    loop.applied_lsn = max(loop.applied_lsn, end_lsn)
    for t in loop.reg.tables.values():
        if not t.error:  # a stopped table stays at the commit that failed
            t.applied_lsn = max(t.applied_lsn, loop.applied_lsn)


def _apply_part(loop: StreamLoop, t: MirrorTable, oid: int, run: ChangeRun, rel: Any, xids: dict[int, int]) -> None:
    """One batch run (rows not yet applied) of relation ``oid`` to ``t``: as a run, or row by row when
    ``apply_mode=auto`` and it is short; a failure stops ``t`` (module docstring)."""
    assert run.commit_lsns is not None
    catalog = loop.svc.source_catalog
    first = int(run.commit_lsns[0])
    short = run.kind != "truncate" and loop.config.apply_mode == "auto" and run.rows < loop.config.native_run_min_rows
    at = first
    try:
        if short:
            for i, ch in enumerate(changes_from_run(run)):
                at = int(run.commit_lsns[i])
                apply_item(t, oid, ch, rel, at, xids[at], catalog)
        else:
            apply_item(t, oid, run, rel, first, xids[first], catalog)
    except Exception as e:  # a bad change stops only its table; its slot position is held
        loop.stop_table(t, e, at)
