"""The replicator service: the single writer of every mirrored table of a state directory.

One logical replication slot and one publication serve every table of a state directory; Arrow Flight
actions (``flight.py``) call into :class:`ReplicatorService` for control and reads. The service is
composed of four parts that share its lock (``lock``: every change of table state holds it):

- :class:`~.registry.TableRegistry` (``reg``): ``<state>/tables.json`` and the open mirrors;
- :class:`~.replication.StreamLoop` (``stream``): the replication thread (receive, apply, confirm,
  the publication check);
- :class:`~.persist.PersistScheduler` (``persister``): flushes, persists and background maintenance;
- :class:`~.provision.TableProvisioner` (``provisioner``): create-table and drop-table;
  :class:`~.chunked.ChunkedCopies` (``chunked``): create-table with a copy cut into chunks for workers.

Publication (``engine/pg/publication.py``): the service's own (default; it adds and removes each
mirrored table) or the one an administrator created (``ServiceConfig.publication``, never altered).
Everything the service runs with comes in one :class:`~.config.ServiceConfig`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import pyarrow as pa

from .. import storage
from ..cdc.generated import GeneratedColumns
from ..compaction import compact, merge_index
from ..iceberg import make_catalog
from ..lsn import Lsn
from ..pg.catalog import SourceCatalog
from ..pg.conninfo import scrub, source_label, with_options  # noqa: F401 (with_options: re-exported)
from ..pg.names import TableName
from ..pg.patterns import TableSelection
from ..table.change_keys import run_plan
from ..table.changes import feed_sources, persisted_cut, plan_changes
from ..table.memslice import BadRowError
from ..table.mirror import MirrorTable
from ..table.read_state import ReadState
from ..timefmt import utc_now
from .board import EpochLock
from .chunked import ChunkedCopies
from .config import ServiceConfig
from .cut import take_cut
from .discovery import TableDiscovery
from .errors import MooncakeError
from .memory import MemoryBudget
from .persist import PersistScheduler
from .provision import TableProvisioner
from .registry import NAMESPACE, TableRegistry, default_names
from .replication import StreamLoop, tune_gc
from .source_position import SourcePosition
from .verifier import Verifier

__all__ = ["MooncakeError", "NAMESPACE", "ReplicatorService", "default_names", "tune_gc"]

log = logging.getLogger("mooncake.service")


#: seconds wait_lsn waits before it asks the source whether the LSN is past its WAL position at all
AHEAD_CHECK_AFTER_S = 0.05


class ReplicatorService:
    """Owns the mirrored tables of one state directory. ``start()`` restores them and begins streaming."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.dsn = config.dsn
        # the service lock; its epoch and the board let warm readers skip a round trip (board.py)
        self.lock = EpochLock()
        self.catalog = make_catalog(config.catalog_uri, config.warehouse_uri, **storage.catalog_properties(config))
        self.storage_hints = storage.storage_hints(config)  # s3 endpoint etc. for union readers (no secrets)
        self.reg = TableRegistry(config, self.catalog, self.lock)
        self.source_catalog = SourceCatalog(self.dsn, visible_wait_s=config.catalog_wait_s)
        # the memory budget (engine/service/memory.py): accounting, early flush, spill size, backpressure
        self.memory = MemoryBudget(cast(int, config.memory_limit))
        self.stream = StreamLoop(self)
        # STORED generated columns that the source's pgoutput does not send (Postgres < 18), computed on
        # the source for each applied batch (engine/cdc/generated.py), in a session printing values as
        # the walsender does
        self.generated = GeneratedColumns(self.stream.generated_session)
        self.persister = PersistScheduler(self)
        self.provisioner = TableProvisioner(self)
        self.chunked = ChunkedCopies(self.provisioner)
        self._clean_start = False
        self.source_position = SourcePosition(self.dsn)  # pg_current_wal_lsn(), one kept connection
        # mirrors whose source table no longer exists (by oid): read-only, their last state kept
        self.source_dropped: set[str] = set()
        self.verifier = Verifier(self, config.verify_interval_s)  # the scheduled check of every mirror
        # new source tables the patterns pick, mirrored as they appear (off without patterns or interval)
        self.discovery = TableDiscovery(
            self,
            TableSelection.from_dict(dict(config.table_patterns)),
            config.discover_interval_s,
            config.discover_retry_s,
        )

    # ------------------------------------------------------------------ the parts' state, by its old names
    @property
    def registry(self) -> dict[str, Any]:
        """The registry document (``tables.json``)."""
        return self.reg.doc

    @property
    def tables(self) -> dict[str, MirrorTable]:
        """Mirror name -> its open :class:`MirrorTable` (ready or stopped; copying ones are in ``copying``)."""
        return self.reg.tables

    @property
    def by_oid(self) -> dict[int, MirrorTable]:
        """Source relation oid -> the mirror the stream routes its changes to."""
        return self.reg.by_oid

    @property
    def copying(self) -> dict[int, dict[str, Any]]:
        """Source relation oid -> the create-table in its initial copy (``table``, ``copy_lsn``, the queue
        of changes that arrive meanwhile)."""
        return self.reg.copying

    @property
    def slot(self) -> str:
        """The name of the state directory's logical replication slot."""
        return self.reg.slot

    @property
    def publication(self) -> str:
        """The publication the stream reads (:attr:`.registry.TableRegistry.publication`)."""
        return self.reg.publication

    @property
    def applied_lsn(self) -> int:
        """Every commit with a commit LSN below this (int) is applied to the mirrors."""
        return self.stream.applied_lsn

    @property
    def faults(self) -> dict[str, storage.Backoff]:
        """Table -> the backoff of its failing persists (storage or catalog faults; ``status`` shows them)."""
        return self.persister.faults

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Restore every ready table from Iceberg and start the replication thread."""
        mark = self.config.state_dir / "service.clean-stop"  # written by stop(): the last run ended cleanly
        self._clean_start = mark.exists()
        mark.unlink(missing_ok=True)
        self.reg.check_publication_setting()
        with self.lock:
            self.reg.restore(self._clean_start)
        if self.reg.doc["tables"] or self.reg.copying:
            self.stream.ensure_stream()
        self.verifier.start()
        self.discovery.start()

    def stop(self) -> None:
        """Stop table discovery, the verifier, maintenance, persists and the stream; mark a clean stop.
        Initial copies running now are recorded as interrupted (``status``' ``interrupted``)."""
        with self.lock:
            if self.reg.copying:
                for cp in self.reg.copying.values():
                    t = cp["table"]
                    self.reg.doc.setdefault("interrupted", {})[t.name] = {"source": t.source}
                self.reg.save()
        self.stream.request_stop()
        self.chunked.close()
        self.discovery.stop()
        self.verifier.stop()
        self.persister.close()
        self.stream.close()
        self.source_catalog.close()
        self.source_position.close()
        self.generated.close()
        try:  # the next start knows this run was not interrupted (a SIGKILL never gets here)
            (self.config.state_dir / "service.clean-stop").write_text(utc_now())
        except OSError:
            pass

    # ------------------------------------------------------------------ control API
    def table(self, name: str) -> MirrorTable:
        """The open mirror ``name`` (``MooncakeError`` when there is none)."""
        return self.reg.table(name)

    def readable_tables(self) -> list[str]:
        """Names of the mirrors a union read can read now, in registry order (those ``status`` lists
        with a state other than ``copying``), without computing their status."""
        return [name for name in self.registry["tables"] if name in self.tables]

    def create_table(
        self,
        dst: str,
        src: str,
        delete_format: str = "deletion-vectors",
        column_types: dict[str, str] | None = None,
        exclude: list[str] | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """Mirror Postgres table ``src`` as ``dst`` (:meth:`.provision.TableProvisioner.create_table`)."""
        return self.provisioner.create_table(dst, src, delete_format, column_types=column_types, exclude=exclude, **kw)

    def drop_table(self, name: str) -> dict[str, Any]:
        """Stop mirroring ``name`` (:meth:`.provision.TableProvisioner.drop_table`)."""
        return self.provisioner.drop_table(name)

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        """Block until every commit below ``lsn`` is applied (:meth:`.replication.StreamLoop.wait_lsn`).
        An ``lsn`` not applied yet is first compared with the source's current WAL position
        (:meth:`.source_position.SourcePosition.refuse_ahead`): one past it is a ``ValueError``. The source
        is asked only for an LSN still not applied after :data:`AHEAD_CHECK_AFTER_S` (a read-your-writes
        barrier is usually met sooner: no extra query on the union read's path)."""
        if lsn > self.stream.applied_lsn:
            try:
                return self.stream.wait_lsn(lsn, min(timeout_s, AHEAD_CHECK_AFTER_S))
            except TimeoutError:
                self.source_position.refuse_ahead(lsn)
        return self.stream.wait_lsn(lsn, timeout_s)

    def durable_lsn(self) -> int:
        """The LSN the slot may be confirmed to (:meth:`.replication.StreamLoop.durable_lsn`)."""
        return self.stream.durable_lsn()

    def persist_unlocked(self, t: MirrorTable) -> dict[str, Any]:
        """Persist ``t``, holding the lock only to take the buffer, swap its files in and commit
        (:meth:`.persist.PersistScheduler.persist_unlocked`)."""
        return self.persister.persist_unlocked(t)

    def cut(self, names: list[str] | None = None) -> dict[str, Any]:
        """A consistent cut: ``names`` (default every live mirror) committed at one LSN, each snapshot
        tagged ``lsn-X-Y`` (:func:`.cut.take_cut`, its result and errors). Call WITHOUT the lock."""
        return take_cut(self.persister, names)

    def record_verify(self, name: str, res: dict[str, Any]) -> None:
        """Keep the scheduled verify's result of ``name`` (:meth:`.registry.TableRegistry.record_verify`)."""
        self.reg.record_verify(name, res)

    def _stop_table(self, t: MirrorTable, e: Exception, lsn: int) -> None:
        self.stream.stop_table(t, e, lsn)

    def maintenance(self, op: str, name: str, **kw: Any) -> dict[str, Any]:
        """Run ``op`` (``flush``, ``persist``, ``merge_index``, ``compact``) on table ``name``; a
        buffered row that cannot be decoded stops the table (``MooncakeError``)."""
        if op in ("merge_index", "compact"):
            # the heavy part runs without the service lock: only snapshot and swap take it (engine/compaction)
            with self.lock:
                t = self.table(name)
            run = merge_index if op == "merge_index" else compact
            return run(t, lock=self.lock, policy=self.config.policy(name), **kw)
        if op == "persist":
            with self.lock:
                t = self.table(name)
            try:
                return self.persist_unlocked(t)
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                with self.lock:
                    self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None
        with self.lock:
            t = self.table(name)
            if t.error and op == "flush":  # its buffer may hold part of the failed transaction
                raise MooncakeError(
                    f"table {name} is stopped by an error, so it is not flushed or persisted: {t.error}"
                )
            try:
                if op == "flush":
                    return t.flush()
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None
            if op == "merge_index":
                return merge_index(t, **kw)
            if op == "compact":
                return compact(t, **kw)
        raise MooncakeError(f"unknown maintenance operation {op!r}")

    def read_state(self, name: str, lsn: int | None = None, known: str | None = None) -> ReadState:
        """The table's :class:`ReadState` at ``lsn`` (None: all applied), with the warehouse's storage
        hints for readers and its ``token``; ``mem`` None when ``known`` is that token
        (:meth:`~..table.mirror.MirrorTable.read_state`).
        Raises :class:`MooncakeError` (the table stops) on an undecodable buffered row."""
        with self.lock.reading():  # changes nothing: the board's epoch stays (an error counts as a change)
            t = self.table(name)
            try:
                return t.read_state(lsn, known, self.storage_hints or None)
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None

    def read_states(
        self, names: list[str], lsn: int | None = None, known: dict[str, str] | None = None
    ) -> list[ReadState]:
        """The :class:`ReadState` of each table in ``names`` at ``lsn`` (None: all applied), taken under
        one hold of the service lock (``known``: name → the token the asker holds, :meth:`read_state`).
        The stream applies a committed transaction to all its tables under
        that lock, so the states of a multi-table read are after the same transactions: a transaction
        that touched two tables is in both or in neither. Raises as :meth:`read_state`."""
        known = known or {}
        with self.lock.reading():
            return [self.read_state(n, lsn, known.get(n)) for n in names]

    def board_applied_lsn(self) -> int:
        """The applied LSN the read board publishes (:mod:`.board`): the stream's."""
        return self.stream.applied_lsn

    def changes(
        self,
        name: str,
        since: int,
        until: int | str | None = None,
        timeout_s: float = 30.0,
        deletes: str = "rows",
        sources: dict[str, Any] | None = None,
    ) -> tuple[Lsn, pa.Table]:
        """The change feed of table ``name`` over ``[since, until)`` (:mod:`..table.changes`; ``until``
        None: everything applied now; ``"persisted"``: the LSN of the table's current Iceberg
        snapshot, a cut that stays valid while that snapshot is retained; ``deletes``: ``rows`` or ``keys``,
        :mod:`..table.change_keys`). An LSN not applied yet is
        first waited for, up to ``timeout_s`` seconds (``TimeoutError`` naming both LSNs), unless it is
        past the source's current WAL position (``ValueError`` at once, :meth:`wait_lsn`); with ``until``
        None nothing is waited for (a ``since`` not applied yet is a ``ValueError``). Returns
        ``(until, feed)``; raises ``ValueError``
        for a range that cannot be served (one line, naming the LSNs that can), :class:`MooncakeError`
        (the table stops) on an undecodable buffered row. The files are read without the lock.
        ``sources``: when given, filled with where the deleted rows came from (:func:`feed_sources`),
        plus ``source`` (the Postgres table) and ``replica_identity`` (its ``pg_class.relreplident``
        as the mirror last saw it: ``d``, ``f``, ``i`` or ``n``), which say why rows were read."""
        target = max(since, until if isinstance(until, int) else 0)
        if until is None:  # the range ends at what is applied now: nothing is waited for
            if since > self.stream.applied_lsn:
                self.source_position.refuse_ahead(since)
        elif target > self.stream.applied_lsn:
            self.wait_lsn(target, timeout_s)
        with self.lock:
            t = self.table(name)
            end = t.applied_lsn if until is None else persisted_cut(t) if until == "persisted" else int(until)
            if until is None and since > end:
                raise ValueError(
                    f"table {name}: LSN {Lsn(since)} is not applied yet (applied up to {Lsn(end)}); a range "
                    "that ends at what is applied now (--no-wait) cannot start after it: leave out --no-wait "
                    "to wait for it"
                )
            try:
                plan = plan_changes(t, since, end, deletes)
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None
            origin = {
                "source": str(TableName(t.schema.schema, t.schema.name)),
                "replica_identity": t.schema.replica_identity,
            }
        feed = run_plan(plan)
        if sources is not None:
            sources.update(feed_sources(plan), **origin)
        return Lsn(end), feed

    # ------------------------------------------------------------------ status
    def _check_source_tables(self) -> None:
        """Mark the mirrors whose source relation is gone (``DROP TABLE`` at the source: Postgres removes
        it from the publication and pgoutput sends nothing, PostgreSQL docs "CREATE PUBLICATION") in
        :attr:`source_dropped`, by looking up their source oids in ``pg_class`` over the status
        connection, and stop them as the stream's publication watch does (``error`` naming drop-table; the
        last state stays readable), so no status shows them ``ready`` meanwhile. A mark is kept (a table
        re-created under the name has another oid). Needs the source reachable; a failed look changes
        nothing."""
        oids = {t.schema.oid: t.name for t in list(self.tables.values()) if t.name not in self.source_dropped}
        if not oids:
            return
        rows = self.source_position.query("SELECT oid::int8 FROM pg_class WHERE oid = ANY(%s)", [list(oids)])
        if rows is None:
            return
        present = {int(r[0]) for r in rows}
        with self.lock:
            for oid, name in oids.items():
                t = self.tables.get(name)
                if oid in present or t is None:
                    continue
                self.source_dropped.add(name)
                if not t.error:  # the stream's publication watch may not have noticed yet: stop it the same way
                    self.stream._left_publication(t, self.stream.applied_lsn, "table")

    def _warnings(self, t: MirrorTable, src_lsn: int | None, now: float) -> list[str]:
        """What status warns about for one table: no persist for longer than ``warn_persist_age_s``,
        more WAL held in the slot than ``warn_slot_wal_bytes`` (its unpersisted changes: from its flush
        LSN to the source's current LSN)."""
        out: list[str]
        s, out = self.config, []
        if t.dirty_since is not None and s.warn_persist_age_s and not t.error:
            age = now - t.dirty_since
            if age > s.warn_persist_age_s:
                why = (
                    "maintenance is dagster: the Dagster assets persist it (is the sensor running?)"
                    if s.maintenance == "dagster"
                    else "see its maintenance and the service log"
                )
                out.append(
                    f"no persist for {age:.0f}s (warn_persist_age_s {s.warn_persist_age_s:g}) with changes "
                    f"waiting; {why}"
                )
        if src_lsn is not None and s.warn_slot_wal_bytes and (t.is_dirty() or t.error):
            held = max(0, src_lsn - t.flush_lsn)
            if held > s.warn_slot_wal_bytes:
                out.append(
                    f"holds {held:,} bytes of WAL in slot {self.slot} (warn_slot_wal_bytes "
                    f"{s.warn_slot_wal_bytes:,}): its changes since LSN {Lsn(t.flush_lsn)} are not persisted"
                )
        return out

    def status(self) -> dict[str, Any]:
        """The ``list-tables --json`` document (``docs/`` describes its fields) plus service-level fields.

        Lag (``lag_bytes``: the source's ``pg_current_wal_lsn()`` minus the table's applied LSN;
        ``lag_seconds``: time since the oldest unapplied commit, see :mod:`.lag`) is taken from one
        moment and without the service lock: the applied LSNs are read right after the source's
        position, not after waiting for the apply thread to finish its batch (which would read 0).
        Per table also: ``verify`` (the last scheduled verify: ``result``, ``lsn``, ``at``, ``detail``…;
        a ``mismatch`` shows the table as ``error``; while the replication stream fails, ``stream_error`` set,
        a table that would be ``ready`` is ``retrying`` with that error: nothing is applied), ``warnings`` (list of one-line texts). Service
        level: ``maintenance`` (auto or dagster), ``source`` (the DSN without its password),
        ``source_reachable`` and ``source_error``, ``verify_interval_s``, ``memory_pool`` (the Arrow pool's
        backend, :func:`.process.select_memory_pool`) and ``arrow_allocated_bytes`` (bytes it holds now),
        ``memory`` (:meth:`.memory.MemoryBudget.status` plus ``spilled``: transactions applied from a
        spill file since the start), ``backpressure`` (the stream has stopped reading: over budget),
        ``stream_counts`` (since the start: ``reads``, the stream loop's iterations; ``batches``, those that
        read data; ``transactions``, transactions applied) and
        ``discovery`` (:meth:`.discovery.TableDiscovery.status`: None when off; its ``failed`` tables are
        not in ``tables``, which lists mirrors only), ``interrupted`` (``name``, ``source``: initial copies a
        service stop interrupted, until create-table makes that mirror again)."""
        src_lsn = self.source_position.current()
        now = time.time()
        applied = {name: t.applied_lsn for name, t in list(self.tables.items())}  # ints: no lock needed
        if src_lsn is not None:
            self.stream.lag.record(src_lsn, now)
            self._check_source_tables()  # after the lag's two reads: its round trip must not come between them
        stream_error = scrub(cast(str, self.stream.stream_error))  # None passes through
        with self.lock:
            tables: list[dict[str, Any]] = []
            for name, meta in self.registry["tables"].items():
                t = self.tables.get(name)
                if t is None:
                    continue
                st = t.stats()
                fault = self.faults.get(name)
                st["state"] = "error" if t.error else ("retrying" if fault else "ready")
                st["error"] = scrub(cast(str, t.error or (fault.describe() if fault else None)))  # None passes through
                ver = meta.get("last_verify")
                st["verify"] = dict(ver) if ver else None
                if ver and ver.get("result") == "mismatch" and not t.error:  # wrong, though it still applies
                    st["state"], st["error"] = "error", scrub(ver.get("detail"))
                if st["state"] == "ready" and stream_error:  # nothing is applied while the stream fails
                    st["state"] = "retrying"
                    st["error"] = f"table {name}: replication stream failing, changes not applied: {stream_error}"
                st["warnings"] = self._warnings(t, src_lsn, now)
                st["source_dropped"] = name in self.source_dropped  # stopped: last state kept, readable
                a = applied.get(name, t.applied_lsn)
                st["lag_bytes"] = max(0, src_lsn - a) if src_lsn is not None else None
                st["lag_seconds"] = (
                    round(self.stream.lag.seconds(a, now), 3) if src_lsn is not None and src_lsn > a else 0.0
                )
                st["maintenance"] = dict(getattr(t, "last_maintenance", None) or {})
                if name in self.persister.background.errors:
                    st["maintenance"]["error"] = self.persister.background.errors[name]
                tables.append(st)
            tables += self.reg.copying_status()
            return {
                "tables": tables,
                "interrupted": self.reg.interrupted(),
                "applied_lsn": str(Lsn(self.stream.applied_lsn)),
                "source_lsn": str(Lsn(src_lsn)) if src_lsn is not None else None,
                "confirmed_lsn": str(Lsn(self.stream.confirmed_lsn)),
                "slot": self.slot,
                "publication": self.publication,
                "stream_error": stream_error,
                "stream_faults": [{**f, "error": scrub(f["error"])} for f in self.stream.stream_faults],
                "streaming": self.stream.running,
                "maintenance": self.config.maintenance,
                "source": source_label(self.dsn),
                "source_reachable": src_lsn is not None,
                "source_error": scrub(cast(str, self.source_position.error)),  # None passes through
                "verify_interval_s": self.config.verify_interval_s,
                "memory_pool": pa.default_memory_pool().backend_name,
                "arrow_allocated_bytes": pa.total_allocated_bytes(),
                "memory": {**self.memory.status(self.reg.tables.values()), "spilled": self.stream.spilled_txns},
                "backpressure": self.memory.backpressure,
                "stream_counts": dict(self.stream.counts),
                "discovery": self.discovery.status(),
                # where the mirrors' data files are: readers confine users' SQL to these (read/sandbox.py)
                "data_roots": [self.config.warehouse_uri, str(self.config.state_dir / "tables")],
            }
