"""The table registry of a state directory: ``<state>/tables.json`` and the mirrors it opens.

The registry document holds the slot and publication names (``admin_publication`` when the tables
are mirrored through an administrator's publication) and, per mirror, its source, delete format,
state (``copying`` / ``ready`` / ``error``), source oid, column signature and key, column options,
a lasting error and the last scheduled verify. :class:`TableRegistry` keeps it with the open
:class:`~mooncake_assets.engine.table.mirror.MirrorTable` objects: by name (``tables``), by source
oid (``by_oid``: where the stream routes a change), and those being copied (``copying``) with their
progress.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from os import PathLike
from typing import Any, cast

import psycopg
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.types import StringType

from .. import storage
from ..compaction import cleanup_after_restore
from ..iceberg import IcebergMirrorTable
from ..lsn import Lsn
from ..pg.catalog import describe_mirrored
from ..pg.conninfo import with_options
from ..private import write_private
from ..read.missing import explain_missing
from ..table.mirror import MirrorTable
from .board import EpochLock
from .config import ServiceConfig
from .errors import MooncakeError

__all__ = ["NAMESPACE", "TableRegistry", "default_names"]

log = logging.getLogger("mooncake.service")

NAMESPACE = "mooncake"  # the Iceberg namespace of every mirror


def default_names(state_dir: str | PathLike[str]) -> dict[str, str]:
    """``{"slot", "publication"}``: the names a new state directory's registry gives its replication
    slot and its own publication (``mooncake_<hash of the state dir>``)."""
    h = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return {"slot": f"mooncake_{h}", "publication": f"mooncake_{h}"}


class TableRegistry:
    """The registry document (``doc``, saved to ``path``) and the open mirrors of one state directory.

    ``lock`` is the service lock: callers hold it around every change of ``tables``, ``by_oid``,
    ``copying`` and ``doc`` (the methods below that take it say so)."""

    def __init__(self, config: ServiceConfig, catalog: Catalog, lock: EpochLock) -> None:
        self.config = config
        self.dsn = config.dsn
        self.catalog = catalog
        self.lock = lock
        self.path = config.state_dir / "tables.json"
        self.doc = self._load()
        self.tables: dict[str, MirrorTable] = {}
        self.by_oid: dict[int, MirrorTable] = {}
        self.copying: dict[int, dict[str, Any]] = {}  # oid -> {"table", "copy_lsn", "queue": [...]}
        self.progress: dict[str, dict[str, Any]] = {}  # name -> the running copy's {"rows", "bytes", "total_rows"}

    def restore(self, clean_start: bool) -> None:
        """Open every ``ready`` mirror from its Iceberg table (retrying storage and catalog blips); a
        mirror whose copy was interrupted is dropped (create-table copies it again). Caller holds the
        lock."""
        for name, meta in list(self.doc["tables"].items()):
            if meta.get("state") != "ready":
                log.warning(
                    "table %s was being copied when the service stopped: its partial copy is dropped; "
                    "create-table copies it again",
                    name,
                )
                self.drop_iceberg(name)
                self.doc["tables"].pop(name)
                self.doc.setdefault("interrupted", {})[name] = {"source": meta.get("source")}  # for a read of it
                self.save()
                continue
            storage.retry_call(
                functools.partial(self.open_table, name, meta, clean_start),
                storage.RESTORE_POLICY,
                what=f"restoring table {name} from the warehouse",
            )  # S3/catalog blips

    def mark_error(self, name: str, error: str) -> None:
        """Keep ``error`` with mirror ``name`` across restarts (nothing brings its changes back). Caller
        holds the lock."""
        if name in self.doc["tables"]:
            self.doc["tables"][name]["error"] = error
            self.save()

    def _load(self) -> dict[str, Any]:
        if self.path.exists():
            return cast(dict[str, Any], json.loads(self.path.read_text()))
        return {**default_names(self.config.state_dir), "tables": {}}

    def save(self) -> None:
        """Write the registry document to ``<state>/tables.json`` (owner-only, replaced atomically:
        ``engine/private.write_private``)."""
        write_private(self.path, json.dumps(self.doc, indent=1))

    @property
    def slot(self) -> str:
        """The logical replication slot's name (``tables.json`` ``slot``)."""
        return cast(str, self.doc["slot"])

    @property
    def publication(self) -> str:
        """The publication the stream reads: the administrator's (``ServiceConfig.publication``) or the
        service's own (``registry["publication"]``)."""
        return self.config.publication or cast(str, self.doc["publication"])

    @property
    def own_publication(self) -> bool:
        """True when the service keeps the publication itself (adds and removes tables)."""
        return not self.config.publication

    def check_publication_setting(self) -> None:
        """Mirrors created through one publication cannot switch to another under the running slot
        (the other one might not publish them): MooncakeError naming both."""
        recorded = self.doc.get("admin_publication")
        if self.doc["tables"] and recorded != self.config.publication:
            have = f"publication {recorded}" if recorded else f"the service's own publication {self.doc['publication']}"
            want = (
                f"publication {self.config.publication}" if self.config.publication else "the service's own publication"
            )
            raise MooncakeError(
                f"the mirrors of {self.config.state_dir} are fed by {have}, not {want}: start mooncake "
                "with the publication they were created with (--publication), or drop them first"
            )

    def ident(self, name: str) -> str:
        """The Iceberg identifier of mirror ``name`` (``mooncake.<name>``)."""
        return f"{NAMESPACE}.{name}"

    def open_table(self, name: str, meta: dict[str, Any], clean_start: bool) -> MirrorTable:
        """Open the ready mirror ``name`` from its registry entry ``meta`` and its Iceberg table after a
        restart (``clean_start``: the last run stopped cleanly) and route its source oid to it. Catalog,
        storage and source errors propagate (:meth:`restore` retries them with
        ``storage.RESTORE_POLICY``)."""
        ice = IcebergMirrorTable.load(self.catalog, self.ident(name))
        # the columns the mirror was built with, as of its last persist (a change made while the service
        # was down, or not persisted yet, shows up again at its LSN in the replayed stream)
        cols, key, hash_ids = meta.get("columns"), meta.get("key"), None
        prop = ice.table.metadata.properties.get("mooncake.columns")
        if prop:
            saved = json.loads(prop)
            cols, key, hash_ids = saved["columns"], saved["key"], saved.get("hash_field_ids")
        # a saved type dropped since (an enum migration) reads as the current one when both are strings
        ice_schema = ice.table.schema()
        text_ids = {f.field_id for f in ice_schema.fields if isinstance(f.field_type, StringType)}
        # a column whose type is gone and cannot be read as its current one stops this table only
        arrow = schema_to_pyarrow(ice_schema, include_field_ids=False)
        field_types = {f.field_id: arrow.field(f.name).type for f in ice_schema.fields}
        unresolved: list[str] = []
        with psycopg.connect(with_options(self.dsn)) as conn:
            schema = describe_mirrored(
                conn,
                meta["source"],
                cols,
                key,
                column_types=meta.get("column_types"),
                exclude=meta.get("exclude"),
                text_field_ids=text_ids,
                field_types=field_types,
                unresolved=unresolved,
                oid=meta.get("oid"),
            )
        cast(Any, schema).hash_field_ids = hash_ids  # an extra attribute: MirrorTable reads it with getattr
        t = MirrorTable(name, meta["source"], schema, ice, self.config.state_dir / "tables" / name)
        t.restore()
        # leftovers of a run the restart interrupted: unused index blocks, compaction outputs, warehouse orphans
        t.last_cleanup = cleanup_after_restore(t, interrupted=not clean_start)
        t.error = meta.get("error") or t.error  # e.g. its slot was gone (see StreamLoop.ensure_slot)
        if schema.source_gone and not t.error:  # dropped while the service was down
            t.error = (
                f"table {name}: source table {meta['source']} was dropped (found gone at a restart), so its changes "
                f"are no longer sent: the mirror is stopped at LSN {Lsn(t.applied_lsn)}; drop the mirror (drop-table)"
            )
            log.error("%s", t.error)
            self.mark_error(name, t.error)
        if unresolved and not t.error:
            t.error = (
                f"{unresolved[0]} at LSN {Lsn(t.flush_lsn)}: the mirror is stopped there (its persisted rows "
                f"stay readable); drop-table {name} and create it again"
            )
            log.error("%s", t.error)
        self.tables[name] = t
        first = self.by_oid.get(schema.oid)
        if first is not None and first is not t:  # made before mirrors were one per source (see create_table)
            t.error = t.error or (
                f"table {name}: {meta['source']} is mirrored as {first.name} too (an older version "
                f"allowed that); its changes now go to {first.name} only, so {name} no longer "
                f"follows it, and either may have missed changes before: drop-table {name}, then "
                f"`mooncake verify {first.name}`"
            )
            log.error("%s", t.error)
        else:
            self.by_oid[schema.oid] = t
        return t

    def drop_iceberg(self, name: str) -> None:
        """Drop mirror ``name``'s Iceberg table and purge its files; a table that is already gone, or any
        error doing so, is ignored (undo of a create-table that failed)."""
        try:
            IcebergMirrorTable.load(self.catalog, self.ident(name)).drop()
        except Exception:
            pass

    def table(self, name: str) -> MirrorTable:
        """The open mirror ``name``; ``MooncakeError`` naming it when there is none."""
        t = self.tables.get(name)
        if t is None:
            raise MooncakeError(explain_missing(name, self.brief_status()))
        return t

    def brief_status(self) -> dict[str, Any]:
        """What :func:`~..read.missing.explain_missing` needs of ``status``, from the registry alone:
        ``tables`` (name, source, state ``ready``/``error``/``copying``, applied LSN, error, copy
        progress) and ``interrupted`` (initial copies a service stop interrupted)."""
        tables: list[dict[str, Any]] = [
            {
                "name": n,
                "source": t.source,
                "state": "error" if t.error else "ready",
                "applied_lsn": str(Lsn(t.applied_lsn)),
                "error": t.error,
            }
            for n, t in self.tables.items()
        ]
        return {"tables": tables + self.copying_status(), "interrupted": self.interrupted()}

    def copying_status(self) -> list[dict[str, Any]]:
        """The ``status`` entries of the initial copies running now: ``name``, ``source``, ``state``
        ``copying``, ``error`` None and ``progress`` (rows copied so far, as :attr:`progress` has it)."""
        return [
            {
                "name": cp["table"].name,
                "source": cp["table"].source,
                "state": "copying",
                "error": None,
                "progress": self.progress.get(cp["table"].name),
            }
            for cp in self.copying.values()
        ]

    def interrupted(self) -> list[dict[str, Any]]:
        """The initial copies a service stop interrupted (dropped at the next start), until create-table
        makes a mirror of that name again: ``name``, ``source``."""
        return [{"name": n, **m} for n, m in (self.doc.get("interrupted") or {}).items()]

    def refuse_second_mirror(self, dst: str, src: str, oid: int | None = None) -> None:
        """One mirror per source table: the stream routes a source's changes by its OID to one mirror, so
        a second one would take them from the first (which would then stay ``ready`` and wrong).
        Raises ``MooncakeError`` naming the existing mirror. Caller holds the lock."""
        for name, meta in self.doc["tables"].items():
            if meta.get("source") == src or (oid is not None and meta.get("oid") == oid):
                raise MooncakeError(
                    f"{src} is already mirrored as {name}; a source table has one mirror (query "
                    f"{name}, or drop-table {name} before mirroring it as {dst})"
                )
        for cp in self.copying.values():
            t = cp["table"]
            if t.source == src or (oid is not None and t.schema.oid == oid):
                raise MooncakeError(f"{src} is being mirrored as {t.name} (copying now); a source table has one mirror")

    def record_verify(self, name: str, res: dict[str, Any]) -> None:
        """Keep the scheduled verify's result of ``name`` (status shows it; the registry keeps it across
        restarts). A mismatch shows the table as ``error`` until a later check matches."""
        with self.lock:
            meta = self.doc["tables"].get(name)
            if meta is None or name not in self.tables:
                return
            prev = (meta.get("last_verify") or {}).get("result")
            if prev == "mismatch" and res["result"] in ("skipped", "error"):  # only a match clears a mismatch
                meta["last_verify"] = {**meta["last_verify"], "last_attempt": res}
            else:
                meta["last_verify"] = res
            self.save()
        if res["result"] == "mismatch":
            log.error("%s", res["detail"])
        elif res["result"] == "match" and prev == "mismatch":
            log.warning("table %s matches its source again at LSN %s", name, res["lsn"])
