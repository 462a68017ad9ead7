"""Open transactions on local disk: the compiled decoder's spill files (Arrow IPC, one file per xid).

A transaction the compiled decoder (``_native.pyx``) holds grows with every change until its Commit
(or, streamed with protocol version 2, its Stream Commit; PG docs "Logical Streaming Replication
Protocol"). Past ``NativeDecoder.spill_bytes`` of buffer, its changes so far are cut into
:class:`~.columnar.ChangeRun` runs (the boundaries of :mod:`.columnar`, at most ``MAX_RUN_ROWS`` rows
each) and appended to ``<dir>/<xid>.arrow``, one Arrow IPC stream per run (Arrow columnar format,
"IPC Streaming Format"), and the buffer starts again empty. The file holds per run a record batch:

- ``lsn`` (uint64: WAL position of the change's XLogData), ``xid`` (uint32: the (sub)transaction
  that made it, for a streamed transaction's subtransaction abort);
- ``old_kind`` (uint8, updates and deletes), ``n<i>k``/``n<i>v`` (the new tuple's column ``i``:
  kind byte uint8, value binary) and ``o<i>k``/``o<i>v`` (the old tuple's);

the rest (kind, relation OID, the Relation in effect, TRUNCATE's options; a TRUNCATE run whole) stays
in memory, a few objects per run. At commit :meth:`TransactionSpill.runs` reads the runs back one at
a time — a run in memory at once, not the transaction — with the rows of aborted subtransactions
(Stream Abort with ``subxid != xid``) left out. A top-level Stream Abort, a :meth:`Spiller.discard_all`
(the decoder's ``reset()``: the stream reconnects and the slot resends) and a new :class:`Spiller`
on the directory (a restart) delete spill files; an applied transaction's file is deleted by
:meth:`TransactionSpill.delete`.

Errors: an ``OSError`` while creating or appending to a spill file (a full disk: ``ENOSPC``) does not
leave :meth:`Spiller.write`. The transaction's spill is marked **failed** (``TransactionSpill.failed``:
one line naming the file, the LSN of the first change that could not be written and the error), its
file is deleted, and its later changes are dropped as they would have been spilled (the relations they
touch still collected in ``oids``), so the decoder's memory stays bounded and the stream goes on. At
commit the service stops the tables in ``oids`` with that line (``SpillError``) and holds the slot at
their flush LSN; an abort just forgets it. The fault point ``spill:write`` (``engine/faults.py``)
injects the error in tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ..faults import fault
from ..lsn import Lsn
from .columnar import CellColumn, ChangeRun, slice_run

__all__ = ["SpillError", "Spiller", "TransactionSpill"]

log = logging.getLogger("mooncake.cdc")


@dataclass
class _Segment:
    """One spilled run: where its record batch is (``offset``/``length`` bytes in the file; -1 for a
    run kept in memory, ``run``) and what the file does not hold."""

    offset: int
    length: int
    kind: str
    relation_oid: int
    relation: Any
    ncols_new: int
    ncols_old: int
    rows: int
    run: ChangeRun | None = None
    xid: int = 0  # (a TRUNCATE kept in memory: the subtransaction that made it)


def _batch(run: ChangeRun, xids: np.ndarray) -> pa.RecordBatch:
    cols: dict[str, pa.Array] = {"lsn": pa.array(run.lsns, pa.uint64()), "xid": pa.array(xids, pa.uint32())}
    if run.old_kinds is not None:
        cols["old_kind"] = pa.array(run.old_kinds, pa.uint8())
    for tag, cells in (("n", run.new), ("o", run.old)):
        for i, c in enumerate(cells or ()):
            cols[f"{tag}{i}k"] = pa.array(c.kinds, pa.uint8())
            cols[f"{tag}{i}v"] = c.values
    return pa.RecordBatch.from_pydict(cols)


def _run_of(seg: _Segment, rb: pa.RecordBatch) -> ChangeRun:
    def u8(name: str) -> np.ndarray:
        return cast(np.ndarray, rb.column(name).to_numpy(zero_copy_only=False))

    def cells(tag: str, n: int) -> tuple[CellColumn, ...] | None:
        if not n:
            return None
        return tuple(CellColumn(u8(f"{tag}{i}k"), rb.column(f"{tag}{i}v")) for i in range(n))

    return ChangeRun(
        seg.kind,  # type: ignore[arg-type]
        seg.relation_oid,
        seg.relation,
        rb.num_rows,
        rb.column("lsn").to_numpy(zero_copy_only=False),
        cells("n", seg.ncols_new),
        cells("o", seg.ncols_old),
        u8("old_kind") if "old_kind" in rb.schema.names else None,
    )


class SpillError(OSError):
    """A transaction could not be spilled (``str``: :attr:`TransactionSpill.failed`, one line)."""


class TransactionSpill:
    """The spill file of one transaction (module docstring). ``rows``: changes spilled; ``oids``: the
    relations they touch; ``aborted``: subtransaction -> rows spilled when it aborted (its rows among
    those are left out; rows of the same xid spilled later are kept, as the in-memory decoder keeps what
    arrives after an abort); ``failed``: why the
    spill failed (one line; None while it works), after which nothing is kept."""

    def __init__(self, path: Path, xid: int) -> None:
        self.path = path
        self.xid = xid
        self.rows = 0
        self.bytes = 0
        self.oids: set[int] = set()
        self.aborted: dict[int, int] = {}
        self.failed: str | None = None
        self._segs: list[_Segment] = []
        self._f: Any = None  # opened by the first write
        self._closed = False

    def fail(self, e: OSError, runs: list[ChangeRun]) -> None:
        """Writing ``runs`` failed with ``e``: record it (:attr:`failed`), delete the file, keep only
        the relations the transaction touches."""
        lsn = next((int(r.lsns[0]) for r in runs if r.lsns is not None and len(r.lsns)), 0)
        why = f"{type(e).__name__}: " + (f"[Errno {e.errno}] {e.strerror}" if e.strerror else str(e))
        self.failed = f"spilling transaction {self.xid} to {self.path} failed at LSN {Lsn(lsn)}: {why}"
        self.drop(runs)
        self._segs, self.bytes = [], 0
        try:
            self.close()
        except OSError:  # (its buffered bytes cannot be written either)
            self._f = None
        self.delete()
        log.error("%s", self.failed)

    def drop(self, runs: list[ChangeRun]) -> None:
        """``runs`` of a failed spill: only the relations they touch are kept."""
        for run in runs:
            self.oids.update(run.truncate_oids if run.kind == "truncate" else (run.relation_oid,))

    def write(self, runs: list[ChangeRun], xids: np.ndarray) -> None:
        """Append ``runs`` (in order; ``xids``: the (sub)xid of each of their rows, concatenated)."""
        assert not self._closed, "spill file closed"
        if self._f is None:
            self._f = open(self.path, "wb")
        at = 0
        for run in runs:
            x = xids[at : at + run.rows]
            at += run.rows
            self.rows += run.rows
            self.oids.update(run.truncate_oids if run.kind == "truncate" else (run.relation_oid,))
            if run.kind == "truncate":
                self._segs.append(_Segment(-1, 0, run.kind, run.relation_oid, None, 0, 0, run.rows, run, int(x[0])))
                continue
            fault("spill:write")
            rb = _batch(run, x)
            off = self._f.tell()
            with pa.ipc.new_stream(self._f, rb.schema) as w:
                w.write_batch(rb)
            n = self._f.tell() - off
            self.bytes += n
            seg = _Segment(
                off, n, run.kind, run.relation_oid, run.relation, len(run.new or ()), len(run.old or ()), run.rows
            )
            self._segs.append(seg)
        self._f.flush()

    def close(self) -> None:
        """Stop writing (the transaction committed)."""
        self._closed = True
        if self._f is not None:
            self._f.close()
            self._f = None

    def runs(self) -> Iterator[ChangeRun]:
        """The spilled runs in order, one in memory at a time, aborted subtransactions' rows left out
        (:class:`SpillError` for a failed spill)."""
        if self.failed is not None:
            raise SpillError(self.failed)
        self.close()
        aborted = self.aborted
        start = 0  # rows of the segments before this one (the row count ``aborted`` is in)
        with open(self.path, "rb") as f:
            for seg in self._segs:
                at, start = start, start + seg.rows
                if seg.run is not None:
                    if at >= aborted.get(seg.xid, 0):
                        yield seg.run
                    continue
                f.seek(seg.offset)
                data = f.read(seg.length)
                rb = pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()
                del data
                run = _run_of(seg, rb)
                if not aborted or at >= max(aborted.values()):
                    yield run
                    continue
                xids = rb.column("xid").to_numpy(zero_copy_only=False)
                row = np.arange(at, at + rb.num_rows)
                keep = np.ones(rb.num_rows, dtype=bool)
                for x, upto in aborted.items():
                    if upto > at:
                        keep &= ~((xids == x) & (row < upto))
                edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).astype(np.int8)))
                for a, b in zip(edges[::2], edges[1::2]):
                    yield slice_run(run, int(a), int(b))

    def delete(self) -> None:
        """Remove the file (applied, or the transaction aborted)."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class Spiller:
    """The spill files of one stream, under ``dir`` (created; spill files left by an earlier process
    are deleted: the slot resends those transactions). ``spilled``: transactions spilled so far."""

    def __init__(self, dir: Path) -> None:
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for p in self.dir.glob("*.arrow"):
            p.unlink(missing_ok=True)
        self.open: dict[int, TransactionSpill] = {}
        self.spilled = 0

    def write(self, xid: int, runs: list[ChangeRun], xids: np.ndarray) -> None:
        """Append ``runs`` of the open transaction ``xid`` to its file; an ``OSError`` (disk full…)
        marks the spill failed instead (module docstring), and a failed spill drops ``runs``."""
        sp = self.open.get(xid)
        if sp is not None and sp.failed is not None:
            sp.drop(runs)
            return
        if sp is None:
            sp = self.open[xid] = TransactionSpill(self.dir / f"{xid}.arrow", xid)
            self.spilled += 1
            log.info("transaction %d spills to %s", xid, sp.path)
        try:
            sp.write(runs, xids)
        except OSError as e:
            sp.fail(e, runs)

    def take(self, xid: int) -> TransactionSpill | None:
        """The spill of ``xid``, which committed (None: nothing spilled); the caller deletes it once applied."""
        sp = self.open.pop(xid, None)
        if sp is not None:
            sp.close()
        return sp

    def abort_sub(self, xid: int, subxid: int) -> None:
        """Subtransaction ``subxid`` of ``xid`` aborted: the rows of it spilled so far are left out."""
        sp = self.open.get(xid)
        if sp is not None:
            sp.aborted[subxid] = sp.rows

    def discard(self, xid: int) -> None:
        """``xid`` aborted (or restarts from its first segment): its spill file goes."""
        sp = self.open.pop(xid, None)
        if sp is not None:
            sp.delete()

    def discard_all(self) -> None:
        """Every open transaction's spill file goes (the decoder forgets them)."""
        for xid in list(self.open):
            self.discard(xid)

    @property
    def spilled_bytes(self) -> int:
        """Bytes in the open transactions' spill files."""
        return sum(sp.bytes for sp in self.open.values())
