"""The replicator service: the single writer of every mirrored table (DESIGN.md §2, §6).

One logical replication slot and one publication serve every table of a state directory. A
background thread reads pgoutput messages, assembles committed transactions (streamed ones
included) and applies them in commit order; Arrow Flight actions (``flight.py``) call into this
object for control and reads. Every method that touches table state holds ``self.lock``.

Registry: ``<state>/tables.json`` — slot and publication names and, per table, its source, delete
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

from ...config import Settings
from ..cdc import (ReplicationConnection, TransactionAssembler, UnsupportedTypeError, describe_table,
                   initial_copy, parse_message)
from .. import storage
from ..iceberg import IcebergMirrorTable, make_catalog
from ..compaction import BackgroundMaintenance, policy_for
from ..table.mirror import MirrorTable, lsn_str, parse_lsn
from ..cdc.types import CatalogNotCurrent, catalog_columns, column_signature, describe_mirrored, resolve_column
from ..faults import fault
from ..table.memslice import BadRowError
from ..table.schema_change import CatalogLookupError, SchemaChangeError, on_relation
from ..pg.conninfo import connect_error, scrub
from ..pg.names import InvalidName, case_collision, check_mirror_name, resolve_table
from ..private import write_private

log = logging.getLogger("mooncake.service")

NAMESPACE = "mooncake"
PG_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c extra_float_digits=3 -c bytea_output=hex -c IntervalStyle=postgres"


def with_options(dsn: str) -> str:
    """``dsn`` with the session settings that pin every value's text form (see table/keys.py)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    d = conninfo_to_dict(dsn)
    d["options"] = (d.get("options", "") + " " + PG_OPTIONS).strip()
    return make_conninfo(**d)


def _refuse_nan_decimals(conn, schema) -> None:
    """Refuse a table whose ``numeric(p,s)`` columns (mapped to decimal128, which has no NaN) hold
    ``NaN`` now: one scan of the table, only when it has such columns; the error names every such
    column and the create-table options that get past them (``MooncakeError``)."""
    from psycopg import sql

    from ..cdc.types import column_option_hint

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


class MooncakeError(Exception):
    """A user-facing failure with a one-line message (bad table, bad DSN, unknown mirror...)."""


class ReplicatorService:
    """Owns the mirrored tables of one state directory. ``start()`` restores them and begins streaming."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.dsn = settings.source_dsn()
        self.lock = threading.RLock()
        self.tables: dict[str, MirrorTable] = {}
        self.by_oid: dict[int, MirrorTable] = {}
        self.copying: dict[int, dict] = {}        # oid -> {"table", "copy_lsn", "queue": [...]}
        self.progress: dict[str, dict] = {}
        self.catalog = make_catalog(settings.catalog, settings.warehouse_uri, **storage.catalog_properties(settings))
        self.storage_hints = storage.storage_hints(settings)  # s3 endpoint etc. for union readers (no secrets)
        self.faults: dict[str, storage.Backoff] = {}  # table -> failed persists, retried with backoff
        self._persisting: dict[str, threading.Thread] = {}  # table -> its running auto persist
        self.source_catalog = SourceCatalog(self.dsn, visible_wait_s=getattr(settings, "catalog_wait_s", 60.0))
        self.registry_path = settings.state_dir / "tables.json"
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
        # maintenance: auto — index merge, compaction, snapshot expiry in worker threads (engine/compaction)
        self.background = BackgroundMaintenance(self.lock, lambda name: policy_for(self.settings, name))

    # ------------------------------------------------------------------ registry
    def _load_registry(self) -> dict:
        if self.registry_path.exists():
            return json.loads(self.registry_path.read_text())
        h = hashlib.sha1(str(self.settings.state_dir).encode()).hexdigest()[:10]
        return {"slot": f"mooncake_{h}", "publication": f"mooncake_{h}", "tables": {}}

    def _save_registry(self) -> None:
        write_private(self.registry_path, json.dumps(self.registry, indent=1))

    @property
    def slot(self) -> str:
        return self.registry["slot"]

    @property
    def publication(self) -> str:
        return self.registry["publication"]

    def _ident(self, name: str) -> str:
        return f"{NAMESPACE}.{name}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Restore every ready table from Iceberg and start the replication thread."""
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
        t = MirrorTable(name, meta["source"], schema, ice, self.settings.state_dir / "tables" / name)
        t.restore()
        t.error = meta.get("error") or t.error  # e.g. its slot was gone (see _ensure_slot)
        self.tables[name] = t
        self.by_oid[schema.oid] = t
        return t

    def _drop_iceberg(self, name: str) -> None:
        try:
            IcebergMirrorTable.load(self.catalog, self._ident(name)).drop()
        except Exception:
            pass

    def stop(self) -> None:
        self._stop.set()
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
                self.stream_faults = (self.stream_faults + [{"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
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
        while not self._stop.is_set():
            msgs = self.repl.read(timeout=0.05)
            if msgs:
                fault("stream:apply")  # (jitter: the apply loop behind the source)
                with self.lock:
                    for wal_start, payload in msgs:
                        msg = parse_message(payload, assembler.in_stream)
                        for txn in assembler.feed(msg, wal_start):
                            self._apply_txn(txn, assembler)
            idle = assembler.idle
            if idle and self.repl.server_wal_end > self.applied_lsn:
                with self.lock:
                    self.applied_lsn = self.repl.server_wal_end
                    for t in self.tables.values():
                        if not t.error:
                            t.applied_lsn = max(t.applied_lsn, self.applied_lsn)
            now = time.time()
            if self._want_reply.is_set() or now - last_status > 1.0:
                self._send_status(reply=self._want_reply.is_set())
                self._want_reply.clear()
                last_status = now
            if now - last_maint > 0.5:
                self._auto_maintenance()
                last_maint = now

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
                touched.add(t.name)
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
            opts = dict(t.schema.column_types)
            keep = " ".join(f"--column-type {shlex.quote(c + '=text')}" for c in opts if c not in cols)
            excl = " ".join(f"--exclude-column {shlex.quote(c)}" for c in t.schema.excluded)
            redo = f"mooncake create-table {t.name} {shlex.quote(t.source)}" + "".join(f" {x}" for x in (keep, excl) if x)
            t.error += (f"; this table stopped (the others go on) and holds the replication slot at its flush LSN; "
                        f"to resume, re-create it with the column(s) mirrored as text: mooncake drop-table {t.name}, "
                        f"then {redo} " + " ".join(f"--column-type {shlex.quote(c + '=text')}" for c in cols)
                        + " (or leave them out: " + " ".join(f"--exclude-column {shlex.quote(c)}" for c in cols) + ")")
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
        s = self.settings
        with self.lock:
            for t in list(self.tables.values()):
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
        endpoint = (self.storage_hints or {}).get("endpoint")
        err = storage.classify(e, location=self.settings.warehouse_uri, endpoint=endpoint, what=f"persist of {t.name}")
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
                raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for LSN {lsn_str(lsn)}; "
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
                     column_types: dict | None = None, exclude: list | None = None) -> dict:
        """Mirror Postgres table ``src`` as ``dst``: publication, consistent initial copy, then CDC.

        ``column_types``: column -> ``"text"`` (mirror it as Postgres's exact text whatever its type);
        ``exclude``: columns left out of the mirror. Both are recorded with the mirror (registry) and
        apply across restarts. The result's ``text_columns``: ``[name, type]`` of the columns mirrored
        as their exact text (no structured mapping, or asked for).

        Errors (``MooncakeError``, nothing left half-created): missing table, a column that cannot be
        mirrored exactly (every such column named, with the options that get past them), a
        ``numeric(p,s)`` column holding ``NaN`` (idem), a name already in use, an unreachable Postgres."""
        column_types = dict(column_types or {})
        exclude = list(exclude or [])
        if delete_format not in ("deletion-vectors", "position-deletes"):
            raise MooncakeError(f"delete_format must be deletion-vectors or position-deletes, not {delete_format!r}")
        try:  # a missing bucket, rejected credentials or a dead endpoint: one clear line, nothing created
            storage.check_warehouse(self.settings.warehouse_uri, storage.warehouse_s3(self.settings))
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
                _, src_name = resolve_table(conn, src)
                src = str(src_name)
                schema = describe_table(conn, src, column_types=column_types, exclude=exclude)
            except InvalidName as e:
                raise MooncakeError(str(e)) from None
            except (LookupError, UnsupportedTypeError) as e:
                raise MooncakeError(str(e).strip("'\"")) from None
            clash = case_collision(c.name for c in schema.columns)
            if clash:
                raise MooncakeError(f'table {src}: columns "{clash[0]}" and "{clash[1]}" differ only in case, which '
                                    "union reads (DuckDB) cannot tell apart; rename one of them on the source")
            _refuse_nan_decimals(conn, schema)
            if schema.has_primary_key and schema.replica_identity == "n":  # nothing published yet
                raise MooncakeError(f"table {src} has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs would carry "
                                    "no key (and Postgres refuses them once the table is published); set REPLICA "
                                    "IDENTITY DEFAULT (its primary key) or FULL, then create the mirror")
            if not schema.has_primary_key and schema.replica_identity not in ("f", "i"):
                conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(_src_ident(schema)))
                if schema.relkind == "p":  # not inherited: each existing partition logs its own old rows
                    for nsp, rel in conn.execute(
                            "SELECT n.nspname, c.relname FROM pg_partition_tree(%s::oid::regclass) t JOIN pg_class c "
                            "ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.isleaf",
                            (schema.oid,)).fetchall():
                        conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(sql.Identifier(nsp, rel)))
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
            shutil.rmtree(self.settings.state_dir / "tables" / dst, ignore_errors=True)
            ice = IcebergMirrorTable.create(self.catalog, ident, schema.arrow_schema(),
                                            delete_format=delete_format,
                                            properties={"mooncake.source": src})
            table = MirrorTable(dst, src, schema, ice, self.settings.state_dir / "tables" / dst)
            with self.lock:
                cp = {"table": table, "copy_lsn": 0, "queue": []}  # queue all until the copy LSN is known
                self.copying[schema.oid] = cp
                self.progress[dst] = {"rows": 0, "bytes": 0, "total_rows": _estimate_rows(conn, schema.oid)}
            pub_exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)).fetchone()
            member = pub_exists and conn.execute(
                "SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
                "WHERE p.pubname = %s AND r.prrelid = %s", (self.publication, schema.oid)).fetchone()
            if member:
                pass  # left by a create that was killed: keep it
            elif pub_exists:
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(self.publication), _src_ident(schema)))
                added_pub = True
            else:
                conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)")
                             .format(sql.Identifier(self.publication), _src_ident(schema)))
                created_pub = True
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
                # changes that arrived during the copy, in commit order
                for commit_lsn, end_lsn, ch, rel, xid in cp["queue"]:
                    if commit_lsn < copy_lsn:
                        continue  # in the copy's snapshot
                    if ch.kind != "truncate":
                        on_relation(table, ch.relation_oid, ch.relation or rel, commit_lsn, self.source_catalog, xid=xid)
                    table.apply(ch if ch.kind != "truncate" else _Truncate(schema.oid), commit_lsn)
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
                    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.publication)))
                elif added_pub:
                    conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                        sql.Identifier(self.publication), _src_ident(schema)))
            except Exception:
                pass
            import shutil
            shutil.rmtree(self.settings.state_dir / "tables" / dst, ignore_errors=True)
            raise
        finally:
            conn.close()

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
        """Stop mirroring ``name``: remove it from the publication, drop its Iceberg table and local state;
        drop the slot and publication when it was the last table."""
        with self.lock:
            t = self.table(name)
            self.tables.pop(name)
            self.by_oid.pop(t.schema.oid, None)
            self.registry["tables"].pop(name, None)
            self._save_registry()
            last = not self.registry["tables"]
        with psycopg.connect(self.dsn, autocommit=True) as c:
            try:
                c.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    sql.Identifier(self.publication), _src_ident(t.schema)))
            except psycopg.Error:
                pass
            if last:
                self._stop.set()
                if self._thread:
                    self._thread.join(timeout=10)
                if self.repl:
                    self.repl.close()
                    self.repl = None
                c.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(self.publication)))
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
        """``pg_current_wal_lsn()`` of the source over a kept connection (None when unreachable)."""
        try:
            if getattr(self, "_status_conn", None) is None or self._status_conn.closed:
                self._status_conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
            text = self._status_conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            return parse_lsn(text)
        except psycopg.Error:
            self._status_conn = None
            return None

    def status(self) -> dict:
        """The ``list-tables --json`` document (DESIGN.md §8) plus service-level fields."""
        src_lsn = self._source_lsn()
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
                st["lag_bytes"] = max(0, src_lsn - t.applied_lsn) if src_lsn is not None else None
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
                    "streaming": bool(self._thread and self._thread.is_alive())}

    def maintenance(self, op: str, name: str, **kw) -> dict:
        if op in ("merge_index", "compact"):
            # the heavy part runs without the service lock: only snapshot and swap take it (engine/compaction)
            with self.lock:
                t = self.table(name)
            return getattr(t, op)(lock=self.lock, policy=policy_for(self.settings, name), **kw)
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
        self._conn = None

    def _call(self, fn, *args, **kw):
        attempt = 0
        waiting_since = None
        pause = 0.01
        while True:
            fault("catalog:lookup")
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(with_options(self.dsn), autocommit=True)
                    # never hold up the user's DDL: the lookups hold no relation locks (pg_get_expr takes
                    # one on the table for a moment) and must not wait for one
                    self._conn.execute("SET lock_timeout = '500ms'")
                return fn(self._conn, *args, **kw)
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
                self._conn = None
                if attempt == 4:
                    raise
                time.sleep(0.5 * 2 ** attempt)
                attempt += 1

    def columns(self, table_oid: int, xid: int | None = None):
        return self._call(catalog_columns, table_oid, xid)

    def resolve(self, name: str, type_oid: int, typmod: int, ndims: int = 0):
        return self._call(resolve_column, name, type_oid, typmod, ndims)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._conn = None


class _PersistFault(MooncakeError):
    """A persist failed on storage or the catalog; the table keeps its data and is retried (see _persist)."""


class _Truncate:
    kind = "truncate"

    def __init__(self, oid):
        self.relation_oid = oid


def _src_ident(schema) -> sql.Identifier:
    """The source table of a :class:`TableSchema` as SQL (``"schema"."name"``, quoted by psycopg)."""
    return sql.Identifier(schema.schema, schema.name)


def _estimate_rows(conn, oid: int) -> int | None:
    try:
        r = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s", (oid,)).fetchone()
        return max(int(r[0]), 0) if r else None
    except psycopg.Error:
        return None
