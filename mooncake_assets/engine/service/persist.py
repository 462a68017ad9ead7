"""When and how a service persists its mirrors (``maintenance: auto``), and what a failed persist does.

:meth:`PersistScheduler.tick` (from the stream thread, twice a second) flushes a table whose buffer
reached ``flush_rows``/``flush_bytes`` and, in ``auto`` mode, starts a persist in a worker thread
when a table is big or has waited ``persist_interval_s``; background maintenance (index merge,
compaction, snapshot expiry: ``engine/compaction``) is ticked too. A persist holds the service lock
only to take the buffer, to swap the files written from it in and to commit
(:meth:`PersistScheduler.persist_unlocked`): the Parquet write and the upload run without it.
A storage or catalog failure keeps everything in the buffer, staging and the slot and is retried
with a backoff (``faults``, shown by ``status``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .. import storage
from ..compaction import BackgroundMaintenance
from ..faults import fault
from ..heap import release_unused
from ..table.memslice import BadRowError
from ..table.mirror import MirrorTable
from .errors import MooncakeError
from .parts import SchedulerHost

__all__ = ["PersistFault", "PersistScheduler"]

log = logging.getLogger("mooncake.service")


class PersistFault(MooncakeError):
    """A persist failed on storage or the catalog; the table keeps its data and is retried (see
    :meth:`PersistScheduler._persist`)."""


#: a persist whose unlocked flush and upload took long enough for ``flush_rows`` / this many rows to
#: arrive gives them a second such round before the commit flushes the rest under the lock (10k rows
#: at the default flush_rows: tens of milliseconds of locked work on a busy machine)
SECOND_ROUND_SHARE = 20


class PersistScheduler:
    """The persists and background maintenance of one service's mirrors. ``svc``: the
    :class:`~.service.ReplicatorService` as a :class:`~.parts.SchedulerHost` (its lock, registry,
    config and stream loop)."""

    def __init__(self, svc: SchedulerHost) -> None:
        self.svc = svc
        self.reg = svc.reg
        self.lock = svc.lock
        self.config = svc.config
        self.faults: dict[str, storage.Backoff] = {}  # table -> failed persists, retried with backoff
        self._persisting: dict[str, threading.Thread] = {}  # table -> its running auto persist
        # maintenance: auto — index merge, compaction, snapshot expiry in worker threads (engine/compaction)
        self.background = BackgroundMaintenance(self.lock, self.config.policy)

    def close(self) -> None:
        """Stop background maintenance and wait (up to 10 s each) for running persists."""
        self.background.stop()
        for th in list(self._persisting.values()):
            th.join(timeout=10)

    def tick(self) -> None:
        """One scheduling round over every mirror (stream thread, about twice a second; takes the lock):
        mark when a table became dirty, flush a buffer past ``flush_rows``/``flush_bytes``, and in
        ``auto`` mode start a persist (big, or dirty for ``persist_interval_s``; not while one runs or a
        fault's backoff is due) and tick background maintenance. A failure goes to
        :meth:`maintenance_failed`."""
        s = self.config
        with self.lock:
            now = time.time()
            for t in list(self.reg.tables.values()):
                if t.dirty_since is None and t.is_dirty():  # its changes wait for a persist from now on
                    t.dirty_since = now  # (persist clears it; status warns past warn_persist_age_s)
                if t.error:
                    continue
                try:
                    rows, nbytes = t.mem.flushable()  # (not what a persist in progress writes)
                    big = rows >= s.flush_rows or nbytes >= s.flush_bytes
                    if s.maintenance == "auto":
                        fault = self.faults.get(t.name)
                        if fault is not None and not fault.due():
                            if big:
                                t.flush()  # local staging only; the persist waits for its backoff
                        elif self._persist_running(t):
                            if big:
                                t.flush()  # bounded memory meanwhile; the running persist or the next takes it
                        elif big or (t.is_dirty() and time.time() - t.last_persist >= s.persist_interval_s):
                            self._start_persist(t)
                        if t.name not in self.faults:
                            self.background.tick(t)
                    elif big:
                        t.flush()
                except Exception as e:
                    self.maintenance_failed(t, e)

    def maintenance_failed(self, t: MirrorTable, e: Exception) -> None:
        """What a failed flush/persist of the service's own maintenance does (caller holds the lock): a
        storage fault was recorded with its backoff (``PersistFault``) and a stopped/dropped table says
        so itself (``MooncakeError``); an undecodable buffered row stops the table at its LSN; anything
        else stops the table with the error."""
        if isinstance(e, (PersistFault, MooncakeError)):
            return
        if isinstance(e, BadRowError):
            self.svc.stream.stop_table(t, e, e.lsn)
            return
        log.error("table %s: maintenance failed", t.name, exc_info=e)
        t.error = f"maintenance: {type(e).__name__}: {e}"

    def _persist(
        self, t: MirrorTable, uploaded: dict[str, str] | None = None, save_index: bool = True
    ) -> dict[str, Any]:
        """``t.persist(uploaded, save_index=save_index)`` (:meth:`MirrorTable.persist`). A storage or
        catalog failure (unreachable endpoint, missing bucket, rejected credentials, lost catalog
        connection) keeps everything in the buffer, local staging and the slot (nothing is confirmed
        past ``t.flush_lsn``), is recorded with a backoff shown by ``status``, and raises
        ``PersistFault`` (a MooncakeError) saying what happened. Other errors propagate."""
        try:
            res = t.persist(uploaded, save_index=save_index)
        except Exception as e:
            self._persist_failed(t, e)
        if self.faults.pop(t.name, None) is not None:
            log.warning("table %s: persisted again after a storage fault", t.name)
        release_unused()  # (the persist's Arrow tables, delete files and index copies are freed)
        return res

    def _persist_failed(self, t: MirrorTable, e: Exception) -> None:
        """Record a failed persist (caller holds the lock): storage/catalog faults get a backoff and raise
        ``PersistFault``; anything else is re-raised."""
        cfg = storage.warehouse_store(self.config)
        endpoint = cfg.describe() if cfg is not None else None
        err = storage.classify(e, location=self.config.warehouse_uri, endpoint=endpoint, what=f"persist of {t.name}")
        if err is None and not getattr(e, "retryable", False):
            raise e
        fault = self.faults.setdefault(t.name, storage.Backoff())
        fault.failed(err or e)
        log.warning("table %s: %s", t.name, fault.describe())
        raise PersistFault(
            f"table {t.name}: {fault.describe()}; its changes stay in the buffer, local "
            "staging and the replication slot until a persist succeeds"
        ) from e

    def persist(self, t: MirrorTable, uploaded: dict[str, str] | None = None) -> dict[str, Any]:
        """A persist of ``t`` by the caller holding the lock (a consistent cut, :func:`.cut.take_cut`):
        :meth:`_persist`."""
        return self._persist(t, uploaded)

    def persist_failed(self, t: MirrorTable, e: Exception) -> None:
        """Record a failed upload or persist (caller holds the lock): :meth:`_persist_failed`."""
        self._persist_failed(t, e)

    def persist_unlocked(self, t: MirrorTable, save_index: bool = True) -> dict[str, Any]:
        """A persist that holds the service lock only to take the buffer, to swap the written files in
        and to commit: the buffered rows are written to Parquet (:meth:`MirrorTable.write_frozen`, a
        fraction of a second per 200k rows, several times that on a loaded machine) and the staged
        files copied to the warehouse (the slow part, seconds on S3) without it, so the replication
        thread keeps applying and readers keep reading meanwhile. When that took long enough for
        ``flush_rows`` / :data:`SECOND_ROUND_SHARE` more rows to arrive, they get a second such round,
        so that the flush the commit does under the lock (everything applied must be in it) is small.
        ``save_index`` False (the service's own persists): the FileIndex is saved only when due
        (:meth:`MirrorTable.persist`). Call WITHOUT
        holding the lock. Raises like :meth:`_persist` (``MooncakeError`` for a stopped or dropped
        table)."""
        uploaded: dict[str, str] = {}
        self._flush_and_upload(t, uploaded)
        with self.lock:
            again = t.mem.flushable()[0] >= max(1, self.config.flush_rows // SECOND_ROUND_SHARE)
        if again:
            self._flush_and_upload(t, uploaded)
        fault("persist:unlocked")  # (jitter: a schema switch may land between the upload and the commit)
        with self.lock:
            if self.reg.tables.get(t.name) is not t or t.error:
                raise MooncakeError(f"table {t.name} was dropped or stopped while it was being persisted")
            return self._persist(t, uploaded, save_index)

    def _flush_and_upload(self, t: MirrorTable, uploaded: dict[str, str]) -> None:
        """One round of :meth:`persist_unlocked`: take the buffer (lock), write it (no lock), swap the
        files in (lock), copy every staged file not in ``uploaded`` to the warehouse (no lock) and add
        them to it (name → location)."""
        with self.lock:
            self._check_live(t)
            frozen = t.begin_flush()
        fault("persist:write")  # (the buffer taken, its Parquet file not written: the stream applies meanwhile)
        try:
            written = t.write_frozen(frozen)
        except BaseException:
            with self.lock:
                t.mem.unfreeze(frozen)  # the rows stay buffered for the next flush
            raise
        with self.lock:
            try:
                self._check_live(t)
            except MooncakeError:
                t.mem.unfreeze(frozen)
                if written is not None:
                    t.disk.discard(written)
                raise
            if t.finish_flush(frozen, written) is None:  # the buffer changed under the write
                t.flush()
            todo, schemas = t.upload_plan()
        todo = [(name, path) for name, path in todo if name not in uploaded]
        try:
            uploaded.update(t.upload(todo, schemas))
        except Exception as e:
            with self.lock:
                self._persist_failed(t, e)

    def _check_live(self, t: MirrorTable) -> None:
        """Raise ``MooncakeError`` when ``t`` was dropped or is stopped by an error (caller holds the lock)."""
        if self.reg.tables.get(t.name) is not t:
            raise MooncakeError(f"table {t.name} was dropped")
        if t.error:
            raise MooncakeError(f"table {t.name} is stopped by an error, so it is not flushed or persisted: {t.error}")

    def _persist_running(self, t: MirrorTable) -> bool:
        th = self._persisting.get(t.name)
        return th is not None and th.is_alive()

    def _start_persist(self, t: MirrorTable) -> None:
        """Run :meth:`persist_unlocked` for ``t`` in a worker thread (``maintenance: auto``)."""

        def work() -> None:
            try:
                self.persist_unlocked(t, save_index=False)
            except Exception as e:
                with self.lock:
                    self.maintenance_failed(t, e)

        th = threading.Thread(target=work, name=f"mooncake-persist-{t.name}", daemon=True)
        self._persisting[t.name] = th
        th.start()
