"""The replicator service: the single writer of every mirrored table (DESIGN.md §2, §6).

One logical replication slot and one publication serve every table of a state directory. A
background thread reads pgoutput messages, assembles committed transactions (streamed ones
included) and applies them in commit order; Arrow Flight actions (``flight.py``) call into this
object for control and reads. Every method that touches table state holds ``self.lock``.

Publication (``engine/pg/publication.py``): the service's own (default; it adds and removes each
mirrored table) or the one an administrator created (``ServiceConfig.publication``, never altered). The
stream thread polls the publication's members every ``ServiceConfig.publication_check_s`` seconds: a mirrored
table that left it stops with an error naming table, publication and LSN (pgoutput just stops
sending its changes, so the mirror would otherwise go stale while looking healthy).

Registry: ``<state>/tables.json`` — slot and publication names (``admin_publication`` when the
tables are mirrored through an administrator's publication) and, per table, its source, delete
format and state (``copying`` / ``ready`` / ``error``).
"""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import shlex
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pyarrow as pa
from psycopg import sql
import pyarrow.parquet as pq

from .config import ServiceConfig
from ..cdc import (ReplicationConnection, TableSchema, TransactionAssembler, describe_table,
                   initial_copy, parse_message)
from ..cdc.generated import GeneratedColumns
from .. import storage
from .lag import LagTracker
from ..iceberg import IcebergMirrorTable, make_catalog
from ..compaction import BackgroundMaintenance
from ..table.mirror import MirrorTable, lsn_str, parse_lsn
from ..cdc.types import (CatalogNotCurrent, catalog_columns, column_option_hint, column_options, column_signature,
                         describe_mirrored, resolve_column)
from ..faults import fault
from ..table.memslice import BadRowError
from ..table.schema_change import CatalogLookupError, SchemaChangeError, on_relation
from ..pg import preflight
from ..pg import publication as pubs
from ..pg.conninfo import OUTPUT_SETTINGS, connect_error, scrub, source_label, with_options
from ..pg.session import LazyConnection
from ..pg.names import InvalidName, TableName, case_collision, check_mirror_name, format_name, resolve_table
from ..private import write_private
from ..timefmt import utc_now
from .verifier import Verifier

log = logging.getLogger("mooncake.service")

NAMESPACE = "mooncake"


def _refuse_nan_decimals(conn, schema) -> None:
    """Refuse a table whose ``numeric(p,s)`` columns (mapped to decimal128, which has no NaN) hold
    ``NaN`` now: one scan of the table, only when it has such columns; the error names every such
    column and the create-table options that get past them (``MooncakeError``)."""

    def is_decimal(c):
        t = c.arrow_type
        while pa.types.is_list(t):
            t = t.value_type
        return pa.types.is_decimal(t) and c.type_oid != 790 and (c.element is None or c.element.type_oid != 790)

    cols = [c for c in schema.columns if is_decimal(c)]
    if not cols:
        return
    tests = [sql.SQL("bool_or('NaN'::numeric = {})").format(sql.Identifier(c.name)) if c.element is None else
             sql.SQL("bool_or('NaN'::numeric = ANY({}))").format(sql.Identifier(c.name)) for c in cols]
    q = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(tests), sql.Identifier(schema.schema, schema.name))
    row = conn.execute(q).fetchone()
    bad = [c for c, hit in zip(cols, row) if hit]
    if bad:
        raise MooncakeError(
            f"table {schema.qualified_name}: column(s) " + ", ".join(f"{c.name} ({c.type_name})" for c in bad)
            + " hold 'NaN', which the Iceberg decimal they map to cannot hold; " + column_option_hint([c.name for c in bad]))


def tune_gc() -> None:
    """Keep Python's cyclic GC off the apply loop's back: everything alive now (imported modules,
    restored tables) is frozen out of its scans and young objects are collected less often. The
    loop allocates a few objects per change; with the default settings, collections walking every
    imported module made it about 2x slower (``mooncake bench``, ingest). Called when a stream starts."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 50)


def default_names(state_dir) -> dict:
    """``{"slot", "publication"}``: the names a new state directory's registry gives its replication
    slot and its own publication (``mooncake_<hash of the state dir>``)."""
    h = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return {"slot": f"mooncake_{h}", "publication": f"mooncake_{h}"}


class MooncakeError(Exception):
    """A user-facing failure with a one-line message (bad table, bad DSN, unknown mirror...)."""


class ReplicatorService:
    """Owns the mirrored tables of one state directory. ``start()`` restores them and begins streaming."""

    def __init__(self, config: ServiceConfig):
        self.config = config
        self.dsn = config.dsn
        self.lock = threading.RLock()
        self.tables: dict[str, MirrorTable] = {}
        self.by_oid: dict[int, MirrorTable] = {}
        self.copying: dict[int, dict] = {}        # oid -> {"table", "copy_lsn", "queue": [...]}
        self.progress: dict[str, dict] = {}
        self.catalog = make_catalog(config.catalog_uri, config.warehouse_uri, **storage.catalog_properties(config))
        self.storage_hints = storage.storage_hints(config)  # s3 endpoint etc. for union readers (no secrets)
        self.faults: dict[str, storage.Backoff] = {}  # table -> failed persists, retried with backoff
        self._persisting: dict[str, threading.Thread] = {}  # table -> its running auto persist
        self.source_catalog = SourceCatalog(self.dsn, visible_wait_s=config.catalog_wait_s)
        # STORED generated columns that the source's pgoutput does not send (Postgres < 18), computed on
        # the source for each applied batch (engine/cdc/generated.py), in a session printing values as
        # the walsender does
        self.generated = GeneratedColumns(self._generated_session)
        self.registry_path = config.state_dir / "tables.json"
        self.registry = self._load_registry()
        self.applied_lsn = 0
        self.confirmed_lsn = 0
        self._want_reply = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.repl: ReplicationConnection | None = None
        self.stream_error: str | None = None
        self.stream_faults: list[dict] = []  # the last few lost streams: {"at", "error"} (status reports them)
        self.relations: dict[int, object] = {}
        self._clean_start = False
        self.lag = LagTracker()  # when the source's WAL passed each position (lag_seconds)
        self._pub_conn = None                        # the publication poll's connection (stream thread)
        self._pub_seen: dict[str, int] = {}          # table -> LSN at which it was last seen published
        # maintenance: auto — index merge, compaction, snapshot expiry in worker threads (engine/compaction)
        self.background = BackgroundMaintenance(self.lock, self.config.policy)
        self._source_error: str | None = None     # why the source was not reachable at the last look
        self.verifier = Verifier(self, config.verify_interval_s)  # the scheduled check of every mirror

    # ------------------------------------------------------------------ registry
    def _load_registry(self) -> dict:
        if self.registry_path.exists():
            return json.loads(self.registry_path.read_text())
        return {**default_names(self.config.state_dir), "tables": {}}

    def _save_registry(self) -> None:
        write_private(self.registry_path, json.dumps(self.registry, indent=1))

    @property
    def slot(self) -> str:
        return self.registry["slot"]

    @property
    def publication(self) -> str:
        """The publication the stream reads: the administrator's (``ServiceConfig.publication``) or the
        service's own (``registry["publication"]``)."""
        return self.config.publication or self.registry["publication"]

    @property
    def own_publication(self) -> bool:
        """True when the service keeps the publication itself (adds and removes tables)."""
        return not self.config.publication

    def _check_publication_setting(self) -> None:
        """Mirrors created through one publication cannot switch to another under the running slot
        (the other one might not publish them): MooncakeError naming both."""
        recorded = self.registry.get("admin_publication")
        if self.registry["tables"] and recorded != self.config.publication:
            have = f"publication {recorded}" if recorded else f"the service's own publication {self.registry['publication']}"
            want = f"publication {self.config.publication}" if self.config.publication else "the service's own publication"
            raise MooncakeError(f"the mirrors of {self.config.state_dir} are fed by {have}, not {want}: start mooncake "
                                "with the publication they were created with (--publication), or drop them first")

    def _ident(self, name: str) -> str:
        return f"{NAMESPACE}.{name}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Restore every ready table from Iceberg and start the replication thread."""
        mark = self.config.state_dir / "service.clean-stop"  # written by stop(): the last run ended cleanly
        self._clean_start = mark.exists()
        mark.unlink(missing_ok=True)
        self._check_publication_setting()
        with self.lock:
            for name, meta in list(self.registry["tables"].items()):
                if meta.get("state") != "ready":
                    log.warning("table %s was being copied when the service stopped; copying again", name)
                    self._drop_iceberg(name)
                    self.registry["tables"].pop(name)
                    self._save_registry()
                    continue
                storage.retry_call(lambda: self._open_table(name, meta), storage.RESTORE_POLICY,
                                   what=f"restoring table {name} from the warehouse")  # S3/catalog blips
        if self.registry["tables"] or self.copying:
            self._ensure_stream()
        self.verifier.start()

    def _open_table(self, name: str, meta: dict) -> MirrorTable:
        ice = IcebergMirrorTable.load(self.catalog, self._ident(name))
        # the columns the mirror was built with, as of its last persist (a change made while the service
        # was down, or not persisted yet, shows up again at its LSN in the replayed stream)
        cols, key, hash_ids = meta.get("columns"), meta.get("key"), None
        prop = ice.table.metadata.properties.get("mooncake.columns")
        if prop:
            saved = json.loads(prop)
            cols, key, hash_ids = saved["columns"], saved["key"], saved.get("hash_field_ids")
        with psycopg.connect(with_options(self.dsn)) as conn:
            schema = describe_mirrored(conn, meta["source"], cols, key, column_types=meta.get("column_types"),
                                       exclude=meta.get("exclude"))
        schema.hash_field_ids = hash_ids
        t = MirrorTable(name, meta["source"], schema, ice, self.config.state_dir / "tables" / name)
        t.restore(interrupted=not self._clean_start)
        t.error = meta.get("error") or t.error  # e.g. its slot was gone (see _ensure_slot)
        self.tables[name] = t
        first = self.by_oid.get(schema.oid)
        if first is not None and first is not t:  # made before mirrors were one per source (see create_table)
            t.error = t.error or (f"table {name}: {meta['source']} is mirrored as {first.name} too (an older version "
                                  f"allowed that); its changes now go to {first.name} only, so {name} no longer "
                                  f"follows it, and either may have missed changes before: drop-table {name}, then "
                                  f"`mooncake verify {first.name}`")
            log.error("%s", t.error)
        else:
            self.by_oid[schema.oid] = t
        return t

    def _drop_iceberg(self, name: str) -> None:
        try:
            IcebergMirrorTable.load(self.catalog, self._ident(name)).drop()
        except Exception:
            pass

    def stop(self) -> None:
        self._stop.set()
        self.verifier.stop()
        self.background.stop()
        for th in list(self._persisting.values()):
            th.join(timeout=10)
        if self._thread:
            self._thread.join(timeout=10)
        if self.repl:
            try:
                self.repl.close()
            except Exception:
                pass
        self.source_catalog.close()
        self.generated.close()
        try:  # the next start knows this run was not interrupted (a SIGKILL never gets here)
            (self.config.state_dir / "service.clean-stop").write_text(utc_now())
        except OSError:
            pass
        if self._pub_conn is not None:
            try:
                self._pub_conn.close()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ replication
    def _ensure_slot(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            row = c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
        if row is None:
            rc = ReplicationConnection(with_options(self.dsn))
            try:
                start_lsn, _ = rc.create_slot(self.slot, export_snapshot=False)
            finally:
                rc.close()
            with self.lock:  # the slot was dropped under mirrors: what it held after their flush LSNs is gone
                for t in self.tables.values():
                    if not t.error:
                        t.error = (f"table {t.name}: replication slot {self.slot} was gone (dropped while the service "
                                   f"was down?), so the changes after its flush LSN {lsn_str(t.flush_lsn)} up to LSN "
                                   f"{lsn_str(start_lsn)}, where a new slot starts, are lost; re-create the mirror "
                                   "(drop-table, then create-table)")
                        log.error("%s", t.error)
                        self.registry["tables"].get(t.name, {})["error"] = t.error  # still stopped after a restart
                self._save_registry()

    def _ensure_stream(self) -> None:
        if self._thread and self._thread.is_alive():
            return
        self._ensure_slot()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mooncake-replication", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._stream_once()
                backoff = 0.5
            except Exception as e:  # reconnect with backoff; never confirm past what is durable
                self.stream_error = f"{type(e).__name__}: {e}"
                self.stream_faults = (self.stream_faults + [{"at": utc_now(),
                                                             "error": self.stream_error.splitlines()[0]}])[-10:]
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
        self.repl.start(self.slot, [self.publication], 0, streaming=True)
        assembler = TransactionAssembler()
        self.stream_error = None
        last_status = 0.0
        last_maint = 0.0
        last_pub = 0.0
        pub_every = float(self.config.publication_check_s)  # 0: off
        while not self._stop.is_set():
            msgs = self.repl.read(timeout=0.05)
            self.lag.record(self.repl.server_wal_end)
            if msgs:
                fault("stream:apply")  # (jitter: the apply loop behind the source)
            if msgs:
                self._apply_batch(msgs, assembler)
            idle = assembler.idle
            if idle and self.repl.server_wal_end > self.applied_lsn:
                with self.lock:
                    self.applied_lsn = self.repl.server_wal_end
                    for t in self.tables.values():
                        if not t.error:
                            t.applied_lsn = max(t.applied_lsn, self.applied_lsn)
            now = time.time()
            # after every applied batch, tell the source what is applied (pg_stat_replication's write_lsn
            # then agrees with list-tables' lag: one small message per batch); when idle, once a second
            if self._want_reply.is_set() or msgs or now - last_status > 1.0:
                self._send_status(reply=self._want_reply.is_set())
                self._want_reply.clear()
                last_status = now
            if now - last_maint > 0.5:
                self._auto_maintenance()
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
            watched = [t for t in self.tables.values() if not t.error]
        if not watched:
            return
        try:
            if self._pub_conn is None or self._pub_conn.closed or self._pub_conn.broken:
                self._pub_conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                self._pub_conn.execute("SET lock_timeout = '500ms'; SET statement_timeout = '10s'")
            lsn, present = pubs.published_oids(self._pub_conn, self.publication, [t.schema.oid for t in watched])
            missing = [t for t in watched if present is None or t.schema.oid not in present]
            gone = set()
            if missing:
                gone = {r[0] for r in self._pub_conn.execute(
                    "SELECT o FROM unnest(%s::oid[]) o WHERE NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = o)",
                    ([t.schema.oid for t in missing],)).fetchall()}
        except psycopg.Error as e:
            log.warning("could not check publication %s (%s); checking again later", self.publication,
                        str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            self._pub_conn = None
            return
        with self.lock:
            for t in watched:
                if self.tables.get(t.name) is not t or t.error:
                    continue  # dropped or stopped meanwhile
                if not any(m is t for m in missing):
                    self._pub_seen[t.name] = lsn
                    continue
                self._left_publication(t, lsn, "publication" if present is None else
                                       "table" if t.schema.oid in gone else "member")

    def _left_publication(self, t: MirrorTable, noticed: int, what: str) -> None:
        """Stop ``t``, which left the publication (caller holds the lock). ``what``: ``member`` (taken
        out of it), ``publication`` (the publication is gone), ``table`` (the source table is gone).
        The stop LSN is the last one at which the table was seen published (its changes up to there
        were sent) — never below the flush boundary the mirror can still be read at."""
        seen = self._pub_seen.get(t.name, t.applied_lsn)
        stop = max(t.flushed_lsn, min(t.applied_lsn, seen))
        q = t.schema.qualified_name
        cause = {"member": f"was removed from publication {self.publication}",
                 "publication": f"is no longer published: publication {self.publication} does not exist",
                 "table": "was dropped"}[what]
        if what == "table":
            remedy = "drop the mirror (drop-table)"
        elif self.own_publication:
            remedy = "re-create the mirror (drop-table, then create-table, which publishes it again)"
        else:
            remedy = (f"have an administrator publish it again ("
                      + (pubs.add_table_sql(self.publication, t.schema.schema, t.schema.name) if what == "member" else
                         f"CREATE PUBLICATION {format_name(self.publication)} FOR TABLE {q};")
                      + "), then re-create the mirror (drop-table, then create-table)")
        t.error = (f"table {t.name}: source table {q} {cause} (noticed at LSN {lsn_str(noticed)}, last seen published at "
                   f"LSN {lsn_str(seen)}), so its changes are no longer sent: the mirror is stopped at LSN {lsn_str(stop)}; "
                   f"{remedy}")
        t.applied_lsn = stop
        log.error("%s", t.error)
        if t.name in self.registry["tables"]:  # still stopped after a restart (nothing brings its changes back)
            self.registry["tables"][t.name]["error"] = t.error
            self._save_registry()

    def _generated_session(self) -> psycopg.Connection:
        """The generated-columns session (engine/cdc/generated.py): the walsender's output settings
        (``OUTPUT_SETTINGS``: its values parse and print as the stream's), autocommit, and a short
        ``lock_timeout`` (its catalog reads never hold up the user's DDL: a timeout is an
        ``OperationalError``, and the batch is read again)."""
        conn = psycopg.connect(with_options(self.dsn, OUTPUT_SETTINGS), autocommit=True)
        conn.execute("SET lock_timeout = '2s'")
        return conn

    def _apply_batch(self, msgs: list, assembler) -> int:
        """Apply one batch read from the stream (``msgs``: ``(wal_start, payload)`` pairs); returns the
        number of transactions it completed. Parsing and assembling, and the batch's generated columns
        (one source round trip per table that has them, :class:`~..cdc.generated.GeneratedColumns`),
        happen outside ``self.lock`` (only this thread changes the assembler); the mirrors' schemas are
        read under it, and the transactions applied under it (:meth:`_apply_txn`). A table whose
        generated columns cannot be computed stops (the others go on); errors: ``ProtocolError``,
        ``psycopg.OperationalError`` (the source cannot be asked: the caller reconnects and the slot
        resends the batch)."""
        txns = [txn for wal_start, payload in msgs
                for txn in assembler.feed(parse_message(payload, assembler.in_stream), wal_start)]
        if not txns:
            return 0
        with self.lock:
            todo, schemas, first = self._generated_work(txns)
        # a table created after this read gets no change of this batch: they were sent before its copy's
        # consistent point (its temporary slot is made after it is registered)
        failed = self.generated.fill(todo, schemas) if todo else {}
        with self.lock:
            for oid, e in failed.items():
                cp = self.copying.get(oid)
                t = cp["table"] if cp is not None else self.by_oid.get(oid)
                if t is not None and not t.error:
                    self._stop_table(t, e, first[oid])
            for txn in txns:
                self._apply_txn(txn, assembler)
        return len(txns)

    def _generated_work(self, txns: list) -> tuple[list, dict, dict]:
        """The changes of ``txns`` whose generated columns are to be computed (caller holds the lock):
        those of mirrored tables (being copied or not) whose live schema has generated columns, unless
        :meth:`_apply_txn` will skip them (applied already, table stopped, before the copy's consistent
        point). Returns ``(changes, {oid: schema}, {oid: first commit LSN})``."""
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
                    cp = self.copying.get(oid)
                    t = cp["table"] if cp is not None else self.by_oid.get(oid)
                    hit = gen_schema[oid] = ((t, cp) if t is not None and any(c.generated for c in t.schema.columns)
                                             else None)
                if hit is None:
                    continue
                t, cp = hit
                if (lsn < cp["copy_lsn"]) if cp is not None else (lsn < t.applied_lsn or t.error):
                    continue
                todo.append(ch)
                schemas[oid] = t.schema
                first.setdefault(oid, lsn)
        return todo, schemas, first

    def _apply_txn(self, txn, assembler) -> None:
        touched = set()
        for ch in txn.changes:
            oids = ch.truncate_oids if ch.kind == "truncate" else [ch.relation_oid]
            for oid in oids:
                cp = self.copying.get(oid)
                if cp is not None:
                    if txn.commit_lsn >= cp["copy_lsn"]:
                        cp["queue"].append((txn.commit_lsn, txn.end_lsn, ch, assembler.relations.get(oid), txn.xid))
                    continue
                t = self.by_oid.get(oid)
                if t is None or txn.commit_lsn < t.applied_lsn or t.error:
                    continue  # not mirrored, applied already (durable before a restart, or in memory
                    #           before a reconnect resent it), or stopped by an error
                try:
                    if ch.kind != "truncate":  # the Relation in effect: a schema change shows up here
                        on_relation(t, oid, ch.relation or assembler.relations[oid], txn.commit_lsn, self.source_catalog,
                                    xid=txn.xid)
                    t.apply(ch if ch.kind != "truncate" else _Truncate(oid), txn.commit_lsn)
                except Exception as e:  # a bad change stops only its table; its slot position is held
                    self._stop_table(t, e, txn.commit_lsn)
                touched.add(t)
        for t in touched:
            t.last_change_lsn = max(t.last_change_lsn, txn.commit_lsn)
        self.applied_lsn = max(self.applied_lsn, txn.end_lsn)
        for t in self.tables.values():
            if not t.error:  # a stopped table stays at the commit that failed
                t.applied_lsn = max(t.applied_lsn, self.applied_lsn)

    def _stop_table(self, t: MirrorTable, e: Exception, lsn: int) -> None:
        """Stop one table after a change it cannot take (the others go on). ``lsn``: the commit being
        applied; a row found undecodable later (``BadRowError``) names its own commit. The table's
        applied LSN stays below that commit and ``durable_lsn`` holds the slot at its flush LSN, so a
        restart replays everything from there."""
        lsn = getattr(e, "lsn", lsn)
        t.error = (str(e) if isinstance(e, (SchemaChangeError, CatalogLookupError)) else
                   f"table {t.name}: change at LSN {lsn_str(lsn)} failed: {type(e).__name__}: {e}")
        cols = getattr(e, "columns", None)
        if cols:  # a value the column's mapping cannot hold (numeric NaN in a decimal column, …)
            now = column_options([c for c in t.schema.column_types if c not in cols], t.schema.excluded)
            redo = f"mooncake create-table {t.name} {shlex.quote(t.source)}" + (f" {now}" if now else "")
            t.error += (f"; this table stopped (the others go on) and holds the replication slot at its flush LSN; "
                        f"to resume, re-create it with the column(s) mirrored as text: mooncake drop-table {t.name}, "
                        f"then {redo} {column_options(cols)} (or leave them out: {column_options(exclude=cols)})")
        t.applied_lsn = min(t.applied_lsn, lsn)
        log.error("%s", t.error)

    def durable_lsn(self) -> int:
        """The LSN the slot may be confirmed to: min over tables of what is durable in Iceberg."""
        lsn = self.applied_lsn
        for t in self.tables.values():
            if t.is_dirty() or t.error:  # a stopped table holds the slot where its durable state ends
                lsn = min(lsn, t.flush_lsn)
        for cp in self.copying.values():
            lsn = min(lsn, cp["copy_lsn"])
        return lsn

    def _send_status(self, reply: bool = False) -> None:
        with self.lock:
            durable = self.durable_lsn()
        if durable > self.confirmed_lsn:
            self.confirmed_lsn = durable
        self.repl.send_status(self.applied_lsn, self.confirmed_lsn, self.confirmed_lsn, reply=reply)

    def _auto_maintenance(self) -> None:
        s = self.config
        with self.lock:
            now = time.time()
            for t in list(self.tables.values()):
                if t.dirty_since is None and t.is_dirty():  # its changes wait for a persist from now on
                    t.dirty_since = now                     # (persist clears it; status warns past warn_persist_age_s)
                if t.error:
                    continue
                try:
                    big = t.mem.live_rows >= s.flush_rows or t.mem.nbytes >= s.flush_bytes
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
                    self._maintenance_failed(t, e)

    def _maintenance_failed(self, t: MirrorTable, e: Exception) -> None:
        """What a failed flush/persist of the service's own maintenance does (caller holds the lock): a
        storage fault was recorded with its backoff (``_PersistFault``) and a stopped/dropped table says
        so itself (``MooncakeError``); an undecodable buffered row stops the table at its LSN; anything
        else stops the table with the error."""
        if isinstance(e, (_PersistFault, MooncakeError)):
            return
        if isinstance(e, BadRowError):
            self._stop_table(t, e, e.lsn)
            return
        log.error("table %s: maintenance failed", t.name, exc_info=e)
        t.error = f"maintenance: {type(e).__name__}: {e}"

    def _persist(self, t: MirrorTable, uploaded: dict | None = None) -> dict:
        """``t.persist()``; a storage or catalog failure (unreachable endpoint, missing bucket, rejected
        credentials, lost catalog connection) keeps everything in the buffer, local staging and the slot
        (nothing is confirmed past ``t.flush_lsn``), is recorded with a backoff shown by ``status``, and
        raises ``_PersistFault`` (a MooncakeError) saying what happened. Other errors propagate."""
        try:
            res = t.persist(uploaded)
        except Exception as e:
            self._persist_failed(t, e)
        if self.faults.pop(t.name, None) is not None:
            log.warning("table %s: persisted again after a storage fault", t.name)
        return res

    def _persist_failed(self, t: MirrorTable, e: Exception) -> None:
        """Record a failed persist (caller holds the lock): storage/catalog faults get a backoff and raise
        ``_PersistFault``; anything else is re-raised."""
        cfg = storage.warehouse_store(self.config)
        endpoint = cfg.describe() if cfg is not None else None
        err = storage.classify(e, location=self.config.warehouse_uri, endpoint=endpoint, what=f"persist of {t.name}")
        if err is None and not getattr(e, "retryable", False):
            raise e
        fault = self.faults.setdefault(t.name, storage.Backoff())
        fault.failed(err or e)
        log.warning("table %s: %s", t.name, fault.describe())
        raise _PersistFault(f"table {t.name}: {fault.describe()}; its changes stay in the buffer, local "
                            "staging and the replication slot until a persist succeeds") from e

    def persist_unlocked(self, t: MirrorTable) -> dict:
        """A persist that holds the service lock only to flush and to commit: the staged files are copied
        to the warehouse (the slow part, seconds on S3) without it, so the replication thread keeps
        applying and readers keep reading meanwhile. Call WITHOUT holding the lock. Raises like
        :meth:`_persist` (``MooncakeError`` for a stopped or dropped table)."""
        with self.lock:
            if self.tables.get(t.name) is not t:
                raise MooncakeError(f"table {t.name} was dropped")
            if t.error:
                raise MooncakeError(f"table {t.name} is stopped by an error, so it is not flushed or persisted: "
                                    f"{t.error}")
            t.flush()
            todo, schemas = t.upload_plan()
        try:
            uploaded = t.upload(todo, schemas)
        except Exception as e:
            with self.lock:
                self._persist_failed(t, e)
        fault("persist:unlocked")  # (jitter: a schema switch may land between the upload and the commit)
        with self.lock:
            if self.tables.get(t.name) is not t or t.error:
                raise MooncakeError(f"table {t.name} was dropped or stopped while it was being persisted")
            return self._persist(t, uploaded)

    def _persist_running(self, t: MirrorTable) -> bool:
        th = self._persisting.get(t.name)
        return th is not None and th.is_alive()

    def _start_persist(self, t: MirrorTable) -> None:
        """Run :meth:`persist_unlocked` for ``t`` in a worker thread (``maintenance: auto``)."""
        def work():
            try:
                self.persist_unlocked(t)
            except Exception as e:
                with self.lock:
                    self._maintenance_failed(t, e)

        th = threading.Thread(target=work, name=f"mooncake-persist-{t.name}", daemon=True)
        self._persisting[t.name] = th
        th.start()

    # ------------------------------------------------------------------ control API
    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        """Block until every commit with commit_lsn < ``lsn`` is applied (read-your-writes barrier).

        Raises ``TimeoutError`` naming both LSNs."""
        deadline = time.time() + timeout_s
        while self.applied_lsn < lsn:
            if self.stream_error is None and (self._thread is None or not self._thread.is_alive()):
                raise MooncakeError("replication is not running (no mirrored table?)")
            if time.time() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:g}s waiting for LSN {lsn_str(lsn)}; "
                                   f"applied up to {lsn_str(self.applied_lsn)}"
                                   + (f" (stream error: {self.stream_error})" if self.stream_error else ""))
            self._want_reply.set()
            time.sleep(0.01)
        return self.applied_lsn

    def table(self, name: str) -> MirrorTable:
        t = self.tables.get(name)
        if t is None:
            raise MooncakeError(f"no mirrored table named {name!r} (see `mooncake list-tables`)")
        return t

    def create_table(self, dst: str, src: str, delete_format: str = "deletion-vectors",
                     column_types: dict | None = None, exclude: list | None = None, **kw) -> dict:
        """Mirror Postgres table ``src`` as ``dst``: publication, consistent initial copy, then CDC.

        ``column_types``: column -> ``"text"`` (mirror it as Postgres's exact text whatever its type);
        ``exclude``: columns left out of the mirror. Both are recorded with the mirror (registry) and
        apply across restarts. The result's ``text_columns``: ``[name, type]`` of the columns mirrored
        as their exact text (no structured mapping, or asked for).

        First the pre-flight checks of ``src`` (:func:`~..pg.preflight.table_checks`, and the slot and
        WAL sender checks) run; any error among them is raised before anything is changed, with the
        statement that fixes it. Then a table without a key gets ``REPLICA IDENTITY FULL`` (only when
        the role owns it; else the check asked an administrator to set it), the table goes into the
        service's own publication (never into an administrator's: it must be in it already), and
        the copy runs. ``publication`` (keyword, from the CLI): the publication the caller expects;
        a running service with another one refuses.

        Errors (``MooncakeError``, one line, nothing left half-created): a failed check, missing table,
        a column that cannot be mirrored exactly (every such column named, with the options that get
        past them), a ``numeric(p,s)`` column holding ``NaN`` (idem), a name already in use, an
        unreachable Postgres."""
        column_types = dict(column_types or {})
        exclude = list(exclude or [])
        if delete_format not in ("deletion-vectors", "position-deletes"):
            raise MooncakeError(f"delete_format must be deletion-vectors or position-deletes, not {delete_format!r}")
        if "publication" in kw and (kw["publication"] or None) != self.config.publication:
            raise MooncakeError(f"the running service reads {'publication ' + self.config.publication if self.config.publication else 'its own publication'}"
                                f", not {'publication ' + kw['publication'] if kw['publication'] else 'its own'}: stop it "
                                "(mooncake stop) and run the command again")
        self._check_publication_setting()
        try:  # a missing bucket, rejected credentials or a dead endpoint: one clear line, nothing created
            storage.check_warehouse(self.config.warehouse_uri, storage.warehouse_store(self.config))
        except storage.StorageError as e:
            raise MooncakeError(str(e)) from None
        try:
            check_mirror_name(dst)
        except InvalidName as e:
            raise MooncakeError(str(e)) from None
        with self.lock:
            if dst in self.tables or dst in self.registry["tables"]:
                raise MooncakeError(f"a mirrored table named {dst!r} already exists")
            same = [n for n in list(self.tables) + list(self.registry["tables"]) if n.lower() == dst.lower()]
            if same:
                raise MooncakeError(f"mirror name {dst!r} differs from the existing mirror {same[0]!r} only in case; "
                                    "mirror names must differ in more than case")
            self._refuse_second_mirror(dst, src)
        t0 = time.time()
        try:
            conn = psycopg.connect(with_options(self.dsn), autocommit=True)
        except psycopg.OperationalError as e:
            raise MooncakeError(f"cannot connect to Postgres: {connect_error(e)}") from None
        created_pub = added_pub = False
        ice = None
        cp = None
        try:
            try:  # parsed and found as Postgres does (parse_ident, to_regclass); kept in its quoted form
                src_oid, src_name = resolve_table(conn, src)
            except InvalidName as e:
                raise MooncakeError(str(e)) from None
            src = str(src_name)
            # nothing is changed before it passes; the schema it read (with the column options) is mirrored
            schema = self._preflight(conn, src_name, src_oid, column_types, exclude)
            clash = case_collision(c.name for c in schema.columns)
            if clash:
                raise MooncakeError(f'table {src}: columns "{clash[0]}" and "{clash[1]}" differ only in case, which '
                                    "union reads (DuckDB) cannot tell apart; rename one of them on the source")
            _refuse_nan_decimals(conn, schema)
            with self.lock:  # the same table under another name (search_path, quoting, a concurrent create)
                self._refuse_second_mirror(dst, src, schema.oid)
            todo = [] if schema.has_primary_key or schema.key_columns else preflight.identity_todo(conn, schema)
            if todo:
                # the pre-flight check passed, so the role owns the table(s): set FULL on the table and,
                # for a partitioned one, on each partition (they log their own old rows)
                for t in todo:
                    conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(t.ident()))
                schema = describe_table(conn, src, column_types=column_types, exclude=exclude)
            ident = self._ident(dst)
            try:
                self.catalog.create_namespace_if_not_exists(NAMESPACE)
            except Exception:
                pass
            if self.catalog.table_exists(ident):  # not in the registry: left by a create that was killed
                log.warning("table %s: dropping the Iceberg table an interrupted create-table left", dst)
                self._drop_iceberg(dst)
            import shutil
            shutil.rmtree(self.config.state_dir / "tables" / dst, ignore_errors=True)
            ice = IcebergMirrorTable.create(self.catalog, ident, schema.arrow_schema(),
                                            delete_format=delete_format,
                                            properties={"mooncake.source": src})
            table = MirrorTable(dst, src, schema, ice, self.config.state_dir / "tables" / dst)
            with self.lock:
                cp = {"table": table, "copy_lsn": 0, "queue": []}  # queue all until the copy LSN is known
                self.copying[schema.oid] = cp
                self.progress[dst] = {"rows": 0, "bytes": 0, "total_rows": _estimate_rows(conn, schema.oid)}
            if self.own_publication:
                done = pubs.add_table(conn, self.publication, schema.schema, schema.name, schema.oid)
                created_pub, added_pub = done == "created", done == "added"
            # (an administrator's publication is only read: the pre-flight check found the table in it)
            if self.own_publication and conn.info.server_version >= 180000 and any(c.generated for c in schema.columns):
                # Postgres 18 sends stored generated columns itself when the publication asks
                conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(
                    sql.Identifier(self.publication)))
            self._ensure_slot()
            # a temporary slot exports the snapshot of the copy; its consistent point splits copy and stream
            tmp = ReplicationConnection(with_options(self.dsn))
            try:
                tmp_slot = f"mooncake_copy_{uuid.uuid4().hex[:8]}"
                copy_lsn, snap = tmp.create_slot(tmp_slot, export_snapshot=True, temporary=True)
                with self.lock:
                    cp["copy_lsn"] = copy_lsn
                self._ensure_stream()
                try:
                    rows = self._copy(table, schema, snap)
                except ValueError as e:  # a value its column's mapping cannot hold: name the way past it
                    if not getattr(e, "columns", None):
                        raise
                    from ..cdc.types import column_option_hint

                    raise MooncakeError(f"table {src}: initial copy: {e}; {column_option_hint(e.columns)}") from None
            finally:
                tmp.close()
            with self.lock:
                self.copying.pop(schema.oid, None)
                table.applied_lsn = max(copy_lsn, self.applied_lsn)
                table.flushed_lsn = copy_lsn
                table.flush_lsn = 0
                if table.error:  # stopped while copying (its generated columns could not be computed)
                    raise MooncakeError(table.error)
                # changes that arrived during the copy, in commit order
                for commit_lsn, end_lsn, ch, rel, xid in cp["queue"]:
                    if commit_lsn < copy_lsn:
                        continue  # in the copy's snapshot
                    if ch.kind != "truncate":
                        on_relation(table, ch.relation_oid, ch.relation or rel, commit_lsn, self.source_catalog, xid=xid)
                    table.apply(ch if ch.kind != "truncate" else _Truncate(schema.oid), commit_lsn)
                    table.last_change_lsn = max(table.last_change_lsn, commit_lsn)
                self.tables[dst] = table
                self.by_oid[schema.oid] = table
                table.applied_lsn = max(table.applied_lsn, self.applied_lsn)
                # persist the copy: the flush LSN is the copy's consistent point unless more was applied
                table.flush_lsn = 0
                table.persist()
                self.registry["tables"][dst] = {"source": src, "delete_format": delete_format, "state": "ready",
                                                "oid": schema.oid, "columns": column_signature(schema),
                                                "key": list(schema.key_columns),
                                                **({"column_types": column_types} if column_types else {}),
                                                **({"exclude": exclude} if exclude else {})}
                self.registry["admin_publication"] = self.config.publication
                self._pub_seen[dst] = copy_lsn
                self._save_registry()
                self.progress.pop(dst, None)
            return {"table": dst, "source": src, "rows": rows, "copy_lsn": lsn_str(copy_lsn),
                    "seconds": round(time.time() - t0, 3), "key": schema.key_columns,
                    "replica_identity": schema.replica_identity,
                    "text_columns": [[c.name, c.type_name] for c in schema.columns if c.as_text],
                    "excluded": exclude}
        except BaseException:
            with self.lock:
                if cp is not None:
                    self.copying.pop(cp["table"].schema.oid, None)
                self.tables.pop(dst, None)
                self.progress.pop(dst, None)
                self.registry["tables"].pop(dst, None)
            if ice is not None:
                self._drop_iceberg(dst)
            try:
                if created_pub:
                    pubs.drop(conn, self.publication)
                elif added_pub:
                    pubs.remove_table(conn, self.publication, cp["table"].schema.schema, cp["table"].schema.name)
            except Exception:
                pass
            import shutil
            shutil.rmtree(self.config.state_dir / "tables" / dst, ignore_errors=True)
            raise
        finally:
            conn.close()

    def _preflight(self, conn, src: TableName, oid: int, column_types: dict | None = None,
                   exclude: list | None = None) -> TableSchema:
        """The pre-flight checks create-table runs before it changes anything (slots, WAL senders,
        wal_level and the table's own checks, with its column options) on the table ``src`` (``oid``,
        as ``resolve_table`` found it). Returns the table's schema as the checks read it (with the
        column options); raises MooncakeError with every error and its fix, one line."""
        checks = [c for c in preflight.server_checks(conn, self.slot)
                  if c.subject in ("wal_level", "replication slots", "WAL senders")]
        table, schema = preflight.table_checks(conn, src, oid, publication=self.config.publication,
                                               own_publication=self.registry["publication"],
                                               column_types=column_types, exclude=exclude)
        errors = [c for c in checks + table if c.level == "error"]
        if errors:
            raise MooncakeError(f"cannot mirror {src}: " + " | ".join(c.sentence() for c in errors))
        assert schema is not None  # table_checks reads it unless one of its checks failed
        return schema

    def _refuse_second_mirror(self, dst: str, src: str, oid: int | None = None) -> None:
        """One mirror per source table: the stream routes a source's changes by its OID to one mirror, so
        a second one would take them from the first (which would then stay ``ready`` and wrong).
        Raises ``MooncakeError`` naming the existing mirror. Caller holds the lock."""
        for name, meta in self.registry["tables"].items():
            if meta.get("source") == src or (oid is not None and meta.get("oid") == oid):
                raise MooncakeError(f"{src} is already mirrored as {name}; a source table has one mirror (query "
                                    f"{name}, or drop-table {name} before mirroring it as {dst})")
        for cp in self.copying.values():
            t = cp["table"]
            if t.source == src or (oid is not None and t.schema.oid == oid):
                raise MooncakeError(f"{src} is being mirrored as {t.name} (copying now); a source table has one "
                                    "mirror")

    def _copy(self, table: MirrorTable, schema, snapshot: str) -> int:
        """Initial copy at the exported snapshot into Parquet files (≤ 1M rows each) with IndexBlocks."""
        total = 0
        with psycopg.connect(with_options(self.dsn)) as c:
            writer, path, n, hashes = None, None, 0, []

            def close():
                nonlocal writer, path, n, hashes
                if writer is not None:
                    writer.close()
                    import numpy as np
                    table.add_copied_file(path, n, np.concatenate(hashes))
                writer, path, n, hashes = None, None, 0, []

            for rb, key_text in initial_copy(c, schema, snapshot, text_columns=table.key_names,
                                             progress=lambda r, b: self.progress.get(table.name, {}).update(rows=r, bytes=b)):
                if writer is None:
                    path = table.dir / "staging" / f"{uuid.uuid4().hex}.parquet"
                    writer = pq.ParquetWriter(path, table.arrow_schema, compression="zstd")
                writer.write_batch(rb, row_group_size=128 * 1024)
                hashes.append(table.hasher.hash_columns(key_text))
                n += rb.num_rows
                total += rb.num_rows
                if n >= 1_000_000:
                    close()
            close()
        return total

    def drop_table(self, name: str) -> dict:
        """Stop mirroring ``name``: remove it from the service's own publication (an administrator's is
        left as it is), drop its Iceberg table and local state; drop the slot (and the own
        publication) when it was the last table."""
        with self.lock:
            t = self.table(name)
            self.tables.pop(name)
            if self.by_oid.get(t.schema.oid) is t:
                self.by_oid.pop(t.schema.oid)
            meta = self.registry["tables"].pop(name, None) or {}
            self._save_registry()
            last = not self.registry["tables"]
            # a state dir made before mirrors were one per source may hold two of one source: the source
            # leaves the publication only with its last mirror
            shared = [n for n, m in self.registry["tables"].items()
                      if m.get("source") == t.source or (meta.get("oid") is not None and m.get("oid") == meta.get("oid"))]
        with psycopg.connect(self.dsn, autocommit=True) as c:
            if self.own_publication and not shared:  # an administrator's publication is never altered
                pubs.remove_table(c, self.publication, t.schema.schema, t.schema.name)
            if last:
                self._stop.set()
                if self._thread:
                    self._thread.join(timeout=10)
                if self.repl:
                    self.repl.close()
                    self.repl = None
                if self.own_publication:
                    pubs.drop(c, self.publication)
                self.registry.pop("admin_publication", None)
                self._save_registry()
                for _ in range(50):
                    try:
                        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                                  (self.slot,))
                        break
                    except psycopg.Error:
                        time.sleep(0.1)
        self._drop_iceberg(name)
        import shutil
        shutil.rmtree(t.dir, ignore_errors=True)
        return {"dropped": name, "slot_dropped": last}

    def _source_lsn(self) -> int | None:
        """``pg_current_wal_lsn()`` of the source over a kept connection (None when unreachable; the
        reason is kept in ``_source_error``)."""
        try:
            if getattr(self, "_status_conn", None) is None or self._status_conn.closed:
                self._status_conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
            text = self._status_conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            self._source_error = None
            return parse_lsn(text)
        except psycopg.Error as e:
            self._status_conn = None
            self._source_error = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return None

    def record_verify(self, name: str, res: dict) -> None:
        """Keep the scheduled verify's result of ``name`` (status shows it; the registry keeps it across
        restarts). A mismatch shows the table as ``error`` until a later check matches."""
        with self.lock:
            meta = self.registry["tables"].get(name)
            if meta is None or name not in self.tables:
                return
            prev = (meta.get("last_verify") or {}).get("result")
            if prev == "mismatch" and res["result"] in ("skipped", "error"):  # only a match clears a mismatch
                meta["last_verify"] = {**meta["last_verify"], "last_attempt": res}
            else:
                meta["last_verify"] = res
            self._save_registry()
        if res["result"] == "mismatch":
            log.error("%s", res["detail"])
        elif res["result"] == "match" and prev == "mismatch":
            log.warning("table %s matches its source again at LSN %s", name, res["lsn"])

    def _warnings(self, t: MirrorTable, src_lsn: int | None, now: float) -> list[str]:
        """What status warns about for one table: no persist for longer than ``warn_persist_age_s``,
        more WAL held in the slot than ``warn_slot_wal_bytes`` (its unpersisted changes: from its flush
        LSN to the source's current LSN)."""
        s, out = self.config, []
        if t.dirty_since is not None and s.warn_persist_age_s and not t.error:
            age = now - t.dirty_since
            if age > s.warn_persist_age_s:
                why = ("maintenance is dagster: the Dagster assets persist it (is the sensor running?)"
                       if s.maintenance == "dagster" else "see its maintenance and the service log")
                out.append(f"no persist for {age:.0f}s (warn_persist_age_s {s.warn_persist_age_s:g}) with changes "
                           f"waiting; {why}")
        if src_lsn is not None and s.warn_slot_wal_bytes and (t.is_dirty() or t.error):
            held = max(0, src_lsn - t.flush_lsn)
            if held > s.warn_slot_wal_bytes:
                out.append(f"holds {held:,} bytes of WAL in slot {self.slot} (warn_slot_wal_bytes "
                           f"{s.warn_slot_wal_bytes:,}): its changes since LSN {lsn_str(t.flush_lsn)} are not persisted")
        return out

    def status(self) -> dict:
        """The ``list-tables --json`` document (DESIGN.md §8) plus service-level fields.

        Lag (``lag_bytes``: the source's ``pg_current_wal_lsn()`` minus the table's applied LSN;
        ``lag_seconds``: time since the oldest unapplied commit, see :mod:`.lag`) is taken from one
        moment and without the service lock: the applied LSNs are read right after the source's
        position, not after waiting for the apply thread to finish its batch (which would read 0).
        Per table also: ``verify`` (the last scheduled verify: ``result``, ``lsn``, ``at``, ``detail``…;
        a ``mismatch`` shows the table as ``error``), ``warnings`` (list of one-line texts). Service
        level: ``maintenance`` (auto or dagster), ``source`` (the DSN without its password),
        ``source_reachable`` and ``source_error``, ``verify_interval_s``."""
        src_lsn = self._source_lsn()
        now = time.time()
        applied = {name: t.applied_lsn for name, t in list(self.tables.items())}  # ints: no lock needed
        if src_lsn is not None:
            self.lag.record(src_lsn, now)
        with self.lock:
            tables = []
            for name, meta in self.registry["tables"].items():
                t = self.tables.get(name)
                if t is None:
                    continue
                st = t.stats()
                fault = self.faults.get(name)
                st["state"] = "error" if t.error else ("retrying" if fault else "ready")
                st["error"] = scrub(t.error or (fault.describe() if fault else None))
                ver = meta.get("last_verify")
                st["verify"] = dict(ver) if ver else None
                if ver and ver.get("result") == "mismatch" and not t.error:  # wrong, though it still applies
                    st["state"], st["error"] = "error", scrub(ver.get("detail"))
                st["warnings"] = self._warnings(t, src_lsn, now)
                a = applied.get(name, t.applied_lsn)
                st["lag_bytes"] = max(0, src_lsn - a) if src_lsn is not None else None
                st["lag_seconds"] = round(self.lag.seconds(a, now), 3) if src_lsn is not None and src_lsn > a else 0.0
                st["maintenance"] = dict(getattr(t, "last_maintenance", None) or {})
                if name in self.background.errors:
                    st["maintenance"]["error"] = self.background.errors[name]
                tables.append(st)
            for oid, cp in self.copying.items():
                t = cp["table"]
                tables.append({"name": t.name, "source": t.source, "state": "copying", "error": None,
                               "progress": self.progress.get(t.name)})
            return {"tables": tables, "applied_lsn": lsn_str(self.applied_lsn),
                    "source_lsn": lsn_str(src_lsn) if src_lsn is not None else None,
                    "confirmed_lsn": lsn_str(self.confirmed_lsn), "slot": self.slot,
                    "publication": self.publication, "stream_error": scrub(self.stream_error),
                    "stream_faults": [{**f, "error": scrub(f["error"])} for f in self.stream_faults],
                    "streaming": bool(self._thread and self._thread.is_alive()),
                    "maintenance": self.config.maintenance, "source": source_label(self.dsn),
                    "source_reachable": src_lsn is not None, "source_error": scrub(self._source_error),
                    "verify_interval_s": self.config.verify_interval_s}

    def maintenance(self, op: str, name: str, **kw) -> dict:
        if op in ("merge_index", "compact"):
            # the heavy part runs without the service lock: only snapshot and swap take it (engine/compaction)
            with self.lock:
                t = self.table(name)
            return getattr(t, op)(lock=self.lock, policy=self.config.policy(name), **kw)
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
                raise MooncakeError(f"table {name} is stopped by an error, so it is not flushed or persisted: {t.error}")
            try:
                if op == "flush":
                    return t.flush()
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None
            if op == "merge_index":
                return t.merge_index(**kw)
            if op == "compact":
                return t.compact(**kw)
        raise MooncakeError(f"unknown maintenance operation {op!r}")

    def read_state(self, name: str, lsn: int | None = None) -> tuple[dict, pa.Table]:
        with self.lock:
            t = self.table(name)
            try:
                rs, mem = t.read_state(lsn)
            except BadRowError as e:  # a buffered value that cannot be decoded stops the table
                self._stop_table(t, e, e.lsn)
                raise MooncakeError(t.error) from None
            rs["schema"] = [f.name for f in t.arrow_schema]
            fields = t.read_fields()
            if fields:  # files of older schemas: readers resolve columns by field id
                rs["fields"] = fields
            rs["storage"] = self.storage_hints
            return rs, mem


class SourceCatalog:
    """The source's catalogs as schema evolution looks them up (``columns``, ``resolve``; see
    :func:`mooncake_assets.engine.table.schema_change.on_relation`), over one lazily opened connection
    that is re-opened (a few tries, with backoff) when it broke.

    A lookup never waits on a lock for long (``lock_timeout`` 500 ms: the user's DDL goes first) and
    retries what can pass: a lost connection or a lock/statement timeout (``OperationalError``, 5
    tries, 0.5–4 s apart) and catalogs that do not show the change's transaction yet
    (:class:`~mooncake_assets.engine.cdc.types.CatalogNotCurrent`: polled for up to ``visible_wait_s``
    seconds — a commit is sent by logical decoding a moment before it is visible, longer while a
    synchronous standby is awaited). What is still failing after that is raised; the caller stops the
    table with an error naming table, column and LSN (never "no catalog rows": that would read as "no
    default"). Fault point ``catalog:lookup`` (:mod:`mooncake_assets.engine.faults`) before every try."""

    def __init__(self, dsn: str, visible_wait_s: float = 60.0):
        self.dsn = dsn
        self.visible_wait_s = visible_wait_s
        self._conn = LazyConnection(self._connect)

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(with_options(self.dsn), autocommit=True)
        # never hold up the user's DDL: the lookups hold no relation locks (pg_get_expr takes one on the
        # table for a moment) and must not wait for one
        conn.execute("SET lock_timeout = '500ms'")
        return conn

    def _call(self, fn, *args, **kw):
        attempt = 0
        waiting_since = None
        pause = 0.01
        while True:
            fault("catalog:lookup")
            try:
                return fn(self._conn.get(), *args, **kw)
            except CatalogNotCurrent as e:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since >= self.visible_wait_s:
                    raise CatalogNotCurrent(e.xid) from None
                if pause >= 0.32:
                    log.warning("schema change lookup: %s; waiting (%.0fs so far)", e, now - waiting_since)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
            except psycopg.OperationalError:
                self._conn.close()
                if attempt == 4:
                    raise
                time.sleep(0.5 * 2 ** attempt)
                attempt += 1

    def columns(self, table_oid: int, xid: int | None = None):
        return self._call(catalog_columns, table_oid, xid)

    def resolve(self, name: str, type_oid: int, typmod: int, ndims: int = 0):
        return self._call(resolve_column, name, type_oid, typmod, ndims)

    def close(self) -> None:
        self._conn.close()


class _PersistFault(MooncakeError):
    """A persist failed on storage or the catalog; the table keeps its data and is retried (see _persist)."""


_NOT_SEEN = object()


class _Truncate:
    kind = "truncate"

    def __init__(self, oid):
        self.relation_oid = oid


def _estimate_rows(conn, oid: int) -> int | None:
    try:
        r = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s", (oid,)).fetchone()
        return max(int(r[0]), 0) if r else None
    except psycopg.Error:
        return None
