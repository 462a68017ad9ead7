"""A consistent cut: every mirrored table committed to Iceberg at ONE LSN and tagged with it.

Each table is otherwise persisted at its own LSN, so no external engine could read several tables at
one Postgres point. :func:`take_cut` fixes that:

1. per table, without the service lock but for its flush: the buffer is flushed and the staged files
   are uploaded (the slow part; replication keeps applying meanwhile);
2. then, holding the lock for the rest (the stream applies whole batches of transactions under it,
   so every table is at a transaction boundary): ``L`` is the stream's ``applied_lsn``; each table
   flushes what arrived since step 1 and commits its persist at ``L`` (snapshot summary
   ``mooncake.flush-lsn = L``), or commits nothing when it has nothing new — its current snapshot
   already holds exactly its state at ``L``, since nothing changed after its flush LSN;
3. each table's current snapshot gets the tag ``lsn-X-Y`` (``engine/iceberg/cuts.py``).

Replication waits only for step 2 and 3 (the rows that arrived during the uploads, and one small
metadata commit per table).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..iceberg.cuts import cut_tag
from ..lsn import Lsn
from ..table.mirror import MirrorTable
from .errors import MooncakeError

if TYPE_CHECKING:
    from .persist import PersistScheduler

__all__ = ["take_cut"]


def _tables(sched: PersistScheduler, names: list[str] | None) -> list[MirrorTable]:
    """The tables of the cut (caller holds the lock): ``names`` or every mirror that is not being copied.
    Raises ``MooncakeError`` for an unknown or stopped table (it cannot reach the cut's LSN)."""
    reg = sched.reg
    if names is None:
        names = list(reg.tables)
    out = []
    for name in names:
        t = reg.tables.get(name)
        if t is None:
            raise MooncakeError(f"no mirrored table {name!r} (still being copied?)")
        if t.error:
            raise MooncakeError(f"table {name} is stopped by an error, so it cannot be part of a cut: {t.error}")
        out.append(t)
    if not out:
        raise MooncakeError("no mirrored table to cut")
    return out


def _pre_upload(sched: PersistScheduler, tables: list[MirrorTable]) -> dict[str, dict[str, str]]:
    """Step 1: flush each table and upload its staged files, the lock held only for the flush. Returns
    table -> uploaded files (name -> location) for its persist. Upload failures raise like a persist's."""
    uploaded: dict[str, dict[str, str]] = {}
    for t in tables:
        with sched.lock:
            t.flush()
            todo, schemas = t.upload_plan()
        try:
            uploaded[t.name] = t.upload(todo, schemas)
        except Exception as e:
            with sched.lock:
                sched.persist_failed(t, e)
    return uploaded


def take_cut(sched: PersistScheduler, names: list[str] | None = None) -> dict[str, Any]:
    """Commit every table of the cut (``names``, default all mirrors) at one LSN and tag each snapshot
    (module docstring). Call WITHOUT holding the lock.

    Returns ``{"lsn": "X/Y", "tag": "lsn-X-Y", "seconds", "tables": {name: {"snapshot_id",
    "committed" (a new snapshot, or the current one tagged), "flush_lsn"}}}``. Raises ``MooncakeError``
    for a stopped/unknown table, a table ahead of the stream (restored past what the stream has
    applied: retry once it caught up) or when nothing is applied yet; ``PersistFault`` when storage or
    the catalog fails (nothing is tagged then; tables committed before the failure keep their snapshot).
    """
    t0 = time.time()
    with sched.lock:
        tables = _tables(sched, names)
    uploaded = _pre_upload(sched, tables)
    out: dict[str, Any] = {}
    with sched.lock:
        lsn = sched.svc.stream.applied_lsn
        if lsn == 0:
            raise MooncakeError("replication has applied nothing yet; take the cut once it streams")
        for t in tables:
            if sched.reg.tables.get(t.name) is not t or t.error:
                raise MooncakeError(f"table {t.name} was dropped or stopped while the cut was taken")
            if t.applied_lsn != lsn:
                raise MooncakeError(
                    f"table {t.name} is at LSN {Lsn(t.applied_lsn)}, the stream at {Lsn(lsn)}: not at one "
                    "point yet (the service is catching up after a restart); retry in a moment"
                )
        tag = cut_tag(lsn)
        for t in tables:
            before = t.iceberg.table.metadata.current_snapshot()
            sched.persist(t, uploaded.get(t.name))
            snap = t.iceberg.refresh().table.metadata.current_snapshot()
            if snap is None:  # a persist at flush LSN 0 always commits, so a table has a snapshot here
                raise MooncakeError(f"table {t.name} has no snapshot to tag")
            age_s = sched.config.policy(t.name).cut_max_age_s
            t.iceberg.tag(tag, snap.snapshot_id, max_ref_age_ms=int(age_s * 1000) if age_s > 0 else None)
            out[t.name] = {
                "snapshot_id": snap.snapshot_id,
                "committed": before is None or before.snapshot_id != snap.snapshot_id,
                "flush_lsn": str(Lsn(t.flush_lsn)),
            }
    return {"lsn": str(Lsn(lsn)), "tag": tag, "seconds": round(time.time() - t0, 3), "tables": out}
