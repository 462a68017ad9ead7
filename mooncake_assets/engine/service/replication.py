"""The replication stream of a service: receive, assemble, apply, confirm.

One thread (:meth:`StreamLoop.ensure_stream`) reads pgoutput messages from the state directory's
slot, assembles committed transactions (streamed ones included, :class:`~..cdc.TransactionAssembler`)
and applies them to the mirrors in commit order (``apply_batch`` → ``_apply_txn``); changes of a
table being copied are queued for the copy (``registry.copying``). After each batch it tells the
source what is applied and what is durable (``send_status``: the slot is confirmed only up to
:meth:`StreamLoop.durable_lsn`), runs the persist scheduler's tick twice a second and checks every
``ServiceConfig.publication_check_s`` seconds that each mirrored table is still published (a table
that left the publication stops with an error naming table, publication and LSN: pgoutput just stops
sending its changes). A lost stream is reconnected with backoff; the slot resends what was not
confirmed. A change a table cannot take stops that table only (:meth:`StreamLoop.stop_table`); so does
a malformed row message of one relation (a :class:`~..cdc.pgoutput.BadMessage` of its transaction:
:meth:`StreamLoop.stop_bad`). A message that cannot be attributed to a table (a malformed Begin or
Commit, an unknown type byte, one too short to hold its relation OID) fails the stream: it reconnects
with backoff, ``stream_error`` is set until the stream has applied past the point where it failed (or
caught up), and ``status`` shows every table of the service ``retrying`` meanwhile.
"""

from __future__ import annotations

import gc
import logging
import os
import shlex
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg

from ..cdc import ReplicationConnection, TransactionAssembler
from ..cdc.columnar import ChangeRun, ColumnarBatch, ColumnarTransaction, columnar_transaction
from ..cdc.pgoutput import BadMessage
from ..cdc.spill import SpillError
from ..cdc.txn import BadMessageError, Change, Transaction
from ..faults import corrupt_relation, fault
from ..lsn import Lsn
from ..pg import publication as pubs
from ..pg.catalog import missing_relations
from ..pg.conninfo import OUTPUT_SETTINGS, with_options
from ..pg.names import format_name
from ..pg.schema import column_options
from ..pg.slot import slot_exists
from ..table.mirror import MirrorTable
from ..table.schema_change import CatalogLookupError, SchemaChangeError
from ..timefmt import utc_now
from .apply_items import apply_item, generated_work, long_runs
from .errors import MooncakeError
from .lag import LagTracker
from .memory import format_size
from .native_batch import apply_native_batch, attach_spill, native_decoder, read_native_batch
from .parts import StreamHost

if TYPE_CHECKING:
    from ..cdc.native import NativeDecoder
    from .registry import TableRegistry

__all__ = ["StreamLoop", "tune_gc", "apply_item", "long_runs"]

log = logging.getLogger("mooncake.service")

#: set to a path, the replication thread runs under cProfile (timed by its own CPU time) and writes its
#: stats there when it ends (the service's shutdown): ``scripts/profile_service_loop.py --cprofile``
PROFILE_ENV = "MOONCAKE_STREAM_PROFILE"


def tune_gc() -> None:
    """Keep Python's cyclic GC off the apply loop's back: everything alive now (imported modules,
    restored tables) is frozen out of its scans and young objects are collected less often. The
    loop allocates a few objects per change; with the default settings, collections walking every
    imported module made it about 2x slower (``mooncake bench``, ingest). Called when a stream starts."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


class StreamLoop:
    """The replication thread of one service and the LSNs it keeps (``applied_lsn``: every commit
    below it is applied; ``confirmed_lsn``: what the slot was told is durable). ``svc``: the
    :class:`~.service.ReplicatorService` it belongs to, seen as a :class:`~.parts.StreamHost` (its
    lock, registry, generated columns, source catalog and persist scheduler)."""

    def __init__(self, svc: StreamHost) -> None:
        self.svc = svc
        self.reg = svc.reg
        self.lock = svc.lock
        self.config = svc.config
        self.dsn = svc.config.dsn
        self.applied_lsn = 0
        self.confirmed_lsn = 0
        self._want_reply = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.repl: ReplicationConnection | None = None
        self.stream_error: str | None = None
        self._error_applied = 0  # applied_lsn when the stream last failed (stream_error clears past it)
        self.stream_faults: list[
            dict[str, str]
        ] = []  # the last few lost streams: {"at", "error"} (status reports them)
        self.lag = LagTracker()  # when the source's WAL passed each position (lag_seconds)
        self._pub_conn: psycopg.Connection[Any] | None = None  # the publication poll's connection (stream thread)
        self.pub_seen: dict[str, int] = {}  # table -> LSN at which it was last seen published
        self.spilled_txns = 0  # transactions applied from a spill file (engine/cdc/spill.py) since the start
        # the loop's work since the start (status: stream_counts): iterations, reads that got data, transactions
        self.counts = {"reads": 0, "batches": 0, "transactions": 0}

    @property
    def running(self) -> bool:
        """Is the replication thread alive?"""
        return bool(self._thread and self._thread.is_alive())

    def request_stop(self) -> None:
        """Tell the replication thread to stop after its current batch (the service stops)."""
        self._stop.set()

    def halt(self) -> None:
        """Stop the replication thread and close its connection (the last mirror was dropped)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if self.repl:
            self.repl.close()
            self.repl = None

    def close(self) -> None:
        """Stop the thread (the service stops): join it, close the stream and the publication poll's
        connection; errors on the way are ignored."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if self.repl:
            try:
                self.repl.close()
            except Exception:
                pass
        if self._pub_conn is not None:
            try:
                self._pub_conn.close()
            except Exception:
                pass

    def ensure_slot(self) -> None:
        """Create the state directory's slot when the source has none. A slot that was dropped under
        existing mirrors lost what it held past their flush LSNs: each of them is stopped (and stays
        stopped across restarts) with an error saying so."""
        if not slot_exists(self.dsn, self.reg.slot):
            rc = ReplicationConnection(with_options(self.dsn))
            try:
                start_lsn, _ = rc.create_slot(self.reg.slot, export_snapshot=False)
            finally:
                rc.close()
            with self.lock:  # the slot was dropped under mirrors: what it held after their flush LSNs is gone
                for t in self.reg.tables.values():
                    if not t.error:
                        t.error = (
                            f"table {t.name}: replication slot {self.reg.slot} was gone (dropped while the service "
                            f"was down?), so the changes after its flush LSN {Lsn(t.flush_lsn)} up to LSN "
                            f"{Lsn(start_lsn)}, where a new slot starts, are lost; re-create the mirror "
                            "(drop-table, then create-table)"
                        )
                        log.error("%s", t.error)
                        self.reg.doc["tables"].get(t.name, {})["error"] = t.error  # still stopped after a restart
                self.reg.save()

    def ensure_stream(self) -> None:
        """Start the replication thread (after :meth:`ensure_slot`) unless it runs."""
        if self._thread and self._thread.is_alive():
            return
        self.ensure_slot()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mooncake-replication", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        prof_path = os.environ.get(PROFILE_ENV)
        if not prof_path:
            self._run_streams()
            return
        import cProfile  # a measurement aid (scripts/profile_service_loop.py --cprofile), off by default

        prof = cProfile.Profile(time.thread_time)  # this thread's CPU time, not the wall clock
        try:
            prof.runcall(self._run_streams)
        finally:
            prof.dump_stats(prof_path)

    def _run_streams(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._stream_once()
                backoff = 0.5
            except Exception as e:  # reconnect with backoff; never confirm past what is durable
                self.stream_error = f"{type(e).__name__}: {e}"
                self._error_applied = self.applied_lsn
                self.stream_faults = (
                    self.stream_faults + [{"at": utc_now(), "error": self.stream_error.splitlines()[0]}]
                )[-10:]
                log.error("replication stream failed (%s); reconnecting in %.1fs", self.stream_error, backoff)
                try:
                    if self.repl:
                        self.repl.close()
                except Exception:
                    pass
                self.repl = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _stream_once(self) -> None:
        fault("stream:start")  # (jitter: a restarted service streams late, the source's catalogs move on meanwhile)
        tune_gc()
        self.repl = ReplicationConnection(with_options(self.dsn))
        self.repl.start(self.reg.slot, [self.reg.publication], 0, streaming=True)
        assembler = TransactionAssembler()
        decoder = native_decoder(self.config.decoder, self.repl)
        memory = self.svc.memory
        if decoder is not None:  # open transactions past the budget's share spill to <state>/spill
            attach_spill(decoder, self.config.state_dir / "spill", memory)
        memory.decoder = decoder if decoder is not None else assembler
        ctxns: list[ColumnarTransaction | ColumnarBatch] = []
        log.info("replication stream started (%s decoder)", "compiled" if decoder is not None else "reference")
        if decoder is None:  # (docs/monitoring.md, "The memory budget": only the compiled decoder spills)
            log.warning(
                "the reference decoder does not spill: an open transaction is held in memory whole, "
                "outside the memory budget of %s (decoder: native spills past %s)",
                format_size(memory.limit),
                format_size(memory.spill_bytes()),
            )
        last_status = 0.0
        last_maint = 0.0
        last_pub = 0.0
        last_relieve = 0.0
        pub_every = float(self.config.publication_check_s)  # 0: off
        while not self._stop.is_set():
            msgs: list[tuple[int, memoryview]] = []
            ctxns = []
            if os.environ.get("MOONCAKE_FAULTS"):  # (tests: engine/faults.py, corrupt_relation)
                dec = decoder if decoder is not None else assembler
                dec.fault_corrupt_oid, dec.fault_corrupt_short = corrupt_relation()
            if memory.backpressure:  # over budget after flushing: read nothing until usage drops
                self._stop.wait(0.05)
                got = False
            elif decoder is not None:  # the compiled path (engine/service/native_batch.py)
                seen = self.repl.messages_read
                ctxns = read_native_batch(self.repl, decoder, 0.05)
                got = self.repl.messages_read != seen
            else:
                msgs = self.repl.read(timeout=0.05)
                got = bool(msgs)
            self.lag.record(self.repl.server_wal_end)
            if got:
                fault("stream:apply")  # (jitter: the apply loop behind the source)
            n = 0
            if decoder is not None:
                n = apply_native_batch(self, ctxns, decoder)
            elif msgs:
                n = self.apply_batch(msgs, assembler)
            counts = self.counts
            counts["reads"] += 1
            counts["batches"] += got
            counts["transactions"] += n
            # the memory budget: committed buffers flush early, backpressure past it; an idle stream
            # checks once a second (an initial copy grows a buffer without the stream reading)
            if got or memory.backpressure or time.monotonic() - last_relieve >= 1.0:
                last_relieve = time.monotonic()
                with self.lock:
                    memory.relieve(self.reg.tables.values(), on_error=self.svc.persister.maintenance_failed)
            idle = decoder.idle if decoder is not None else assembler.idle
            if idle and self.repl.server_wal_end > self.applied_lsn:
                with self.lock:
                    self.applied_lsn = self.repl.server_wal_end
                    for t in self.reg.tables.values():
                        if not t.error:
                            t.applied_lsn = max(t.applied_lsn, self.applied_lsn)
            if self.stream_error is not None and (
                self.applied_lsn > self._error_applied or (idle and 0 < self.repl.server_wal_end <= self.applied_lsn)
            ):  # past the point where the last stream failed (or caught up with the server): healthy again
                self.stream_error = None
            now = time.time()
            # after every applied batch, tell the source what is applied (pg_stat_replication's write_lsn
            # then agrees with list-tables' lag: one small message per batch); when idle, once a second
            if self._want_reply.is_set() or got or now - last_status > 1.0:
                self.send_status(reply=self._want_reply.is_set())
                self._want_reply.clear()
                last_status = now
            if now - last_maint > 0.5:
                self.svc.persister.tick()
                last_maint = now
            if pub_every > 0 and now - last_pub > pub_every:
                self._check_published()
                last_pub = time.time()

    def _check_published(self) -> None:
        """Stop every mirrored table that is no longer in the publication (an administrator dropped it
        from the publication, dropped the publication, or the table itself): pgoutput sends nothing
        about it, its changes just stop coming. Polled from the stream thread (catalog reads on a
        connection of its own, without the service lock); a failed poll is retried next time."""
        with self.lock:
            watched = [t for t in self.reg.tables.values() if not t.error]
        if not watched:
            return
        try:
            if self._pub_conn is None or self._pub_conn.closed or self._pub_conn.broken:
                self._pub_conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                self._pub_conn.execute("SET lock_timeout = '500ms'; SET statement_timeout = '10s'")
            lsn, present = pubs.published_oids(self._pub_conn, self.reg.publication, [t.schema.oid for t in watched])
            missing = [t for t in watched if present is None or t.schema.oid not in present]
            gone: set[int] = set()
            if missing:
                gone = missing_relations(self._pub_conn, [t.schema.oid for t in missing])
        except psycopg.Error as e:
            log.warning(
                "could not check publication %s (%s); checking again later",
                self.reg.publication,
                str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
            )
            self._pub_conn = None
            return
        with self.lock:
            for t in watched:
                if self.reg.tables.get(t.name) is not t or t.error:
                    continue  # dropped or stopped meanwhile
                if not any(m is t for m in missing):
                    self.pub_seen[t.name] = lsn
                    continue
                self._left_publication(
                    t, lsn, "publication" if present is None else "table" if t.schema.oid in gone else "member"
                )

    def _left_publication(self, t: MirrorTable, noticed: int, what: str) -> None:
        """Stop ``t``, which left the publication (caller holds the lock). ``what``: ``member`` (taken
        out of it), ``publication`` (the publication is gone), ``table`` (the source table is gone).
        The stop LSN is the last one at which the table was seen published (its changes up to there
        were sent) — never below the flush boundary the mirror can still be read at."""
        seen = self.pub_seen.get(t.name, t.applied_lsn)
        stop = max(t.flushed_lsn, min(t.applied_lsn, seen))
        q = t.schema.qualified_name
        cause = {
            "member": f"was removed from publication {self.reg.publication}",
            "publication": f"is no longer published: publication {self.reg.publication} does not exist",
            "table": "was dropped",
        }[what]
        if what == "table":
            remedy = "drop the mirror (drop-table)"
        elif self.reg.own_publication:
            remedy = "re-create the mirror (drop-table, then create-table, which publishes it again)"
        else:
            remedy = (
                "have an administrator publish it again ("
                + (
                    pubs.add_table_sql(self.reg.publication, t.schema.schema, t.schema.name)
                    if what == "member"
                    else f"CREATE PUBLICATION {format_name(self.reg.publication)} FOR TABLE {q};"
                )
                + "), then re-create the mirror (drop-table, then create-table)"
            )
        t.error = (
            f"table {t.name}: source table {q} {cause} (noticed at LSN {Lsn(noticed)}, last seen published at "
            f"LSN {Lsn(seen)}), so its changes are no longer sent: the mirror is stopped at LSN {Lsn(stop)}; "
            f"{remedy}"
        )
        t.applied_lsn = stop
        log.error("%s", t.error)
        if t.name in self.reg.doc["tables"]:  # still stopped after a restart (nothing brings its changes back)
            self.reg.doc["tables"][t.name]["error"] = t.error
            self.reg.save()

    def generated_session(self) -> psycopg.Connection[Any]:
        """The generated-columns session (engine/cdc/generated.py): the walsender's output settings
        (``OUTPUT_SETTINGS``: its values parse and print as the stream's), autocommit, and a short
        ``lock_timeout`` (its catalog reads never hold up the user's DDL: a timeout is an
        ``OperationalError``, and the batch is read again)."""
        conn = psycopg.connect(with_options(self.dsn, OUTPUT_SETTINGS), autocommit=True)
        conn.execute("SET lock_timeout = '2s'")
        return conn

    def apply_batch(self, msgs: list[tuple[int, memoryview]], assembler: TransactionAssembler) -> int:
        """Apply one batch read from the stream (``msgs``: ``(wal_start, payload)`` pairs); returns the
        number of transactions it completed. Parsing and assembling, and the batch's generated columns
        (one source round trip per table that has them, :class:`~..cdc.generated.GeneratedColumns`),
        happen outside ``self.lock`` (only this thread changes the assembler); the mirrors' schemas are
        read under it, and the transactions applied under it (:meth:`_apply_txn`). A table whose
        generated columns cannot be computed stops (the others go on); errors: ``ProtocolError``,
        ``psycopg.OperationalError`` (the source cannot be asked: the caller reconnects and the slot
        resends the batch)."""
        txns = [txn for wal_start, payload in msgs for txn in assembler.feed_payload(payload, wal_start)]
        if not txns:
            return 0
        with self.lock:
            todo, schemas, first = generated_work(self.reg, txns)
        # a table created after this read gets no change of this batch: they were sent before its copy's
        # consistent point (its temporary slot is made after it is registered)
        failed = self.svc.generated.fill(todo, schemas) if todo else {}
        with self.lock:
            self.stop_generated(failed, first)
            for txn in txns:
                self._apply_txn(txn, assembler)
        return len(txns)

    def stop_generated(self, failed: dict[int, Exception], first: dict[int, int]) -> None:
        """Stop the tables whose generated columns could not be computed (``GeneratedColumns.fill``'s
        ``{oid: error}``; ``first``: oid -> first commit LSN of the batch; the caller holds the lock)."""
        for oid, e in failed.items():
            cp = self.reg.copying.get(oid)
            t = cp["table"] if cp is not None else self.reg.by_oid.get(oid)
            if t is not None and not t.error:
                self.stop_table(t, e, first[oid])

    def _apply_txn(self, txn: Transaction, assembler: TransactionAssembler | NativeDecoder) -> None:
        """Apply one committed transaction to its tables (caller holds the lock): change by change or
        as columnar runs (``ServiceConfig.apply_mode``; same results). Per item (a change or a run) of a
        table being copied: queued for the copy when at or after its consistent point; of a mirrored
        table: the Relation in effect checked (a schema change shows up here), then applied; a failing
        item stops only its table (:meth:`stop_table`)."""
        mode = self.config.apply_mode
        items: list[Change] | list[ChangeRun]
        if mode == "run" or (mode == "auto" and long_runs(txn.changes, self.config.apply_run_min_rows)):
            items = columnar_transaction(txn).runs
        else:
            items = txn.changes
        touched: set[MirrorTable] = set()
        skip = self.stop_bad(txn.commit_lsn, txn.bad) if txn.bad else set()
        for item in items:
            oids = item.truncate_oids if item.kind == "truncate" else [item.relation_oid]
            for oid in oids:
                if oid in skip:
                    continue  # its table stopped at this commit (a malformed message of it)
                cp = self.reg.copying.get(oid)
                if cp is not None:
                    if txn.commit_lsn >= cp["copy_lsn"]:
                        cp["queue"].append((txn.commit_lsn, txn.end_lsn, item, assembler.relations.get(oid), txn.xid))
                    continue
                t = self.reg.by_oid.get(oid)
                if t is None or txn.commit_lsn < t.applied_lsn or t.error:
                    continue  # not mirrored, applied already (durable before a restart, or in memory
                    #           before a reconnect resent it), or stopped by an error
                try:
                    apply_item(
                        t, oid, item, assembler.relations.get(oid), txn.commit_lsn, txn.xid, self.svc.source_catalog
                    )
                except Exception as e:  # a bad change stops only its table; its slot position is held
                    self.stop_table(t, e, txn.commit_lsn)
                touched.add(t)
        for t in touched:
            t.last_change_lsn = max(t.last_change_lsn, txn.commit_lsn)
        self.applied_lsn = max(self.applied_lsn, txn.end_lsn)
        for t in self.reg.tables.values():
            if not t.error:  # a stopped table stays at the commit that failed
                t.applied_lsn = max(t.applied_lsn, self.applied_lsn)

    def stop_bad(self, commit_lsn: int, bad: list[BadMessage]) -> set[int]:
        """Stop the tables of a transaction's malformed row messages (``bad``; the caller holds the lock
        and applies the rest of the transaction without the returned relation OIDs), each at
        ``commit_lsn`` with the error of :func:`bad_message_stops`: its applied LSN stays below the
        commit and the slot is held at its flush LSN, so a restart reads the transaction again."""
        for t, e in bad_message_stops(self.reg, commit_lsn, bad):
            self.stop_table(t, e, commit_lsn)
        return {b.relation_oid for b in bad}

    def stop_table(self, t: MirrorTable, e: Exception, lsn: int) -> None:
        """Stop one table after a change it cannot take (the others go on). ``lsn``: the commit being
        applied; a row found undecodable later (``BadRowError``) names its own commit. The table's
        applied LSN stays below that commit and ``durable_lsn`` holds the slot at its flush LSN, so a
        restart replays everything from there."""
        lsn = getattr(e, "lsn", lsn)
        t.error = (
            str(e)
            if isinstance(e, (SchemaChangeError, CatalogLookupError, SpillError, BadMessageError))
            else f"table {t.name}: change at LSN {Lsn(lsn)} failed: {type(e).__name__}: {e}"
        )
        cols = getattr(e, "columns", None)
        if cols:  # a value the column's mapping cannot hold (numeric NaN in a decimal column, …)
            now = column_options([c for c in t.schema.column_types if c not in cols], t.schema.excluded)
            redo = f"mooncake create-table {t.name} {shlex.quote(t.source)}" + (f" {now}" if now else "")
            t.error += (
                f"; this table stopped (the others go on) and holds the replication slot at its flush LSN; "
                f"to resume, re-create it with the column(s) mirrored as text: mooncake drop-table {t.name}, "
                f"then {redo} {column_options(cols)} (or leave them out: {column_options(exclude=cols)})"
            )
        t.applied_lsn = min(t.applied_lsn, lsn)
        log.error("%s", t.error)

    def durable_lsn(self) -> int:
        """The LSN the slot may be confirmed to: min over tables of what is durable in Iceberg."""
        lsn = self.applied_lsn
        for t in self.reg.tables.values():
            if t.is_dirty() or t.error:  # a stopped table holds the slot where its durable state ends
                lsn = min(lsn, t.flush_lsn)
        for cp in self.reg.copying.values():
            lsn = min(lsn, cp["copy_lsn"])
        return lsn

    def send_status(self, reply: bool = False) -> None:
        """Send a Standby Status Update: written = ``applied_lsn``, flushed = applied = ``confirmed_lsn``,
        raised to :meth:`durable_lsn` first (the slot may drop WAL below it). ``reply``: ask the server
        to answer at once. Called from the stream thread. Source: PostgreSQL docs, "Streaming Replication
        Protocol" (Standby status update, ``r``)."""
        with self.lock:
            durable = self.durable_lsn()
        if durable > self.confirmed_lsn:
            self.confirmed_lsn = durable
        assert self.repl is not None  # called from the stream thread, which holds its connection
        self.repl.send_status(self.applied_lsn, self.confirmed_lsn, self.confirmed_lsn, reply=reply)

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        """Block until every commit with commit_lsn < ``lsn`` is applied (read-your-writes barrier); with
        no mirror at all (no stream runs) return at once. Returns the applied LSN.

        Raises ``TimeoutError`` naming both LSNs."""
        deadline = time.time() + timeout_s
        while self.applied_lsn < lsn:
            if self.stream_error is None and (self._thread is None or not self._thread.is_alive()):
                if not self.reg.tables and not self.reg.copying:  # no mirror: none has anything to wait for
                    return self.applied_lsn  # (a read then names the mirrors it lacks, engine/read/missing.py)
                raise MooncakeError("replication is not running (no mirrored table?)")
            if time.time() > deadline:
                raise TimeoutError(
                    f"timed out after {timeout_s:g}s waiting for LSN {Lsn(lsn)}; "
                    f"applied up to {Lsn(self.applied_lsn)}"
                    + (f" (stream error: {self.stream_error})" if self.stream_error else "")
                )
            self._want_reply.set()
            time.sleep(0.01)
        return self.applied_lsn


_MESSAGE_KINDS = {"I": "Insert", "U": "Update", "D": "Delete", "R": "Relation"}


def bad_message_stops(
    reg: TableRegistry, commit_lsn: int, bad: list[BadMessage]
) -> list[tuple[MirrorTable, BadMessageError]]:
    """The tables a transaction's malformed row messages (``bad``, committed at ``commit_lsn``) stop, each
    with its one-line error naming table, relation, the XLogData and commit LSNs, what was wrong, the
    flush LSN the slot is held at and the remedy. Relations not mirrored, tables stopped already and
    commits a table has applied (resent after a reconnect) or a copy has below its consistent point are
    passed over."""
    out: list[tuple[MirrorTable, BadMessageError]] = []
    for b in bad:
        cp = reg.copying.get(b.relation_oid)
        t = cp["table"] if cp is not None else reg.by_oid.get(b.relation_oid)
        if t is None or t.error or any(t is u for u, _ in out):
            continue
        if commit_lsn < (cp["copy_lsn"] if cp is not None else t.applied_lsn):
            continue
        out.append(
            (
                t,
                BadMessageError(
                    f"table {t.name}: malformed {_MESSAGE_KINDS.get(b.kind, b.kind)} message of relation "
                    f"{b.relation_oid} ({t.source}) at LSN {Lsn(b.lsn)} in the transaction committed at LSN "
                    f"{Lsn(commit_lsn)}: {b.error}; this table stopped (the others go on) and holds the "
                    f"replication slot at its flush LSN {Lsn(t.flush_lsn)}; restart the service (mooncake stop, "
                    "then mooncake start) to read it again from there, and if it stops at the same LSN again, "
                    "re-create the mirror (drop-table, then create-table)"
                ),
            )
        )
    return out
