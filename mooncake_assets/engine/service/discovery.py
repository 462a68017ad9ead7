"""Table discovery: the running service mirrors new source tables its patterns pick, by itself.

A sources file (``mooncake.yaml``) selects tables by glob patterns (``schemas``, ``tables``,
``exclude``; :class:`~..pg.patterns.TableSelection`). With ``discover_interval_s`` > 0
(:class:`~.config.ServiceConfig`) a worker thread of the service looks every that many seconds — the
first look right after the start — at the source's catalog: one ``pg_class``/``pg_namespace`` query
(:func:`~..pg.patterns.list_source_tables`) over a kept connection; no table data is read. Each table
the patterns pick that no mirror follows (by oid, and by its qualified name) is mirrored under
:func:`~..pg.patterns.mirror_name` through the service's own create-table
(:meth:`~.provision.TableProvisioner.create_table`): the same pre-flight checks, publication
membership and initial copy at a temporary slot's exported snapshot, the changes that arrive during
the copy queued and applied after it. The service stays the one writer of every mirror; a
``create-table``/``sync`` racing a look is refused by the registry's one-mirror-per-source check
(the loser sees the table mirrored and says nothing more).

A table that cannot be mirrored (no ``SELECT`` privilege, not in an administrator's publication, a
mirror name taken, …) is kept as a *failed* table: ``status``/``list-tables`` show it with state
``error`` and the one-line reason of the refusal, never ``ready``, and it is tried again after
:func:`retry_after_s` seconds (``ServiceConfig.discover_retry_s``; the reason fixed: mirrored then). Patterns that match no table are
kept (``unmatched``), logged when they change and shown by ``status``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg

from ..pg.conninfo import scrub
from ..pg.names import format_name
from ..pg.patterns import TableSelection, list_source_tables, mirror_name
from ..timefmt import utc_now
from .errors import MooncakeError
from .parts import DiscoveryHost

__all__ = ["TableDiscovery", "retry_after_s"]

log = logging.getLogger("mooncake.discovery")


def retry_after_s(interval_s: float) -> float:
    """Seconds before a table that failed to be mirrored is tried again: ``max(60, 10 * interval_s)``
    (a refusal such as a missing privilege is fixed by a person, not by the next look)."""
    return max(60.0, 10.0 * interval_s)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class TableDiscovery:
    """The discovery worker of one service (``svc``: the :class:`~.service.ReplicatorService` as a
    :class:`~.parts.DiscoveryHost`: its ``lock``, ``reg``, ``dsn`` and ``create_table``).
    ``selection``: the patterns; ``interval_s``: seconds between looks (0: never; :meth:`start` does
    nothing); ``retry_s``: seconds before a failed table is tried again (None: :func:`retry_after_s`)."""

    def __init__(
        self, svc: DiscoveryHost, selection: TableSelection, interval_s: float, retry_s: float | None = None
    ) -> None:
        self.svc = svc
        self.selection = selection
        self.interval_s = float(interval_s) if selection else 0.0
        self.retry_s = retry_after_s(self.interval_s) if retry_s is None else float(retry_s)
        self.failed: dict[int, dict[str, Any]] = {}  # source oid -> {name, source, error, at, tried}
        self.unmatched: list[str] = []
        self.last_look: str | None = None
        self.look_error: str | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the worker thread (a no-op when discovery is off or it runs)."""
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mooncake-discovery", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the worker (waits up to 10 s: a look in an initial copy finishes or is undone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except Exception as e:  # never let the thread die: the next look tries again
                log.exception("table discovery failed: %s", e)
            self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ one look
    def _source_tables(self) -> list[tuple[str, str, int]] | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.svc.dsn, autocommit=True, connect_timeout=5)
            rows = list_source_tables(self._conn)
            self.look_error = None
            return rows
        except psycopg.Error as e:
            self._conn = None
            self.look_error = scrub(_first_line(e))
            return None

    def look(self) -> list[str]:
        """One look at the source's catalog: mirror each picked table no mirror follows. Returns the
        names of the mirrors it created (the failed tables are in :attr:`failed`)."""
        self._reload()
        rows = self._source_tables()
        if rows is None:
            return []
        self.last_look = utc_now()
        picked, unmatched = self.selection.pick([(s, t) for s, t, _ in rows])
        if unmatched != self.unmatched:
            for u in unmatched:
                log.warning("table discovery: %s matches no table", u)
        self.unmatched = unmatched
        oid_of = {(s, t): o for s, t, o in rows}
        todo = [(s, t, oid_of[(s, t)]) for s, t in picked]
        for oid in set(self.failed) - {o for _, _, o in todo}:  # gone, or no longer picked
            self.failed.pop(oid)
        made = []
        for schema, table, oid in todo:
            if self._stop.is_set():
                break
            if self._mirror_one(schema, table, oid):
                made.append(mirror_name(schema, table))
        return made

    def _reload(self) -> None:
        """Take the patterns the service's ``discover_reload`` hands over (the sources file was edited);
        a table no longer picked keeps its mirror (drop-table drops it)."""
        reload = getattr(self.svc.config, "discover_reload", None)
        patterns = reload() if reload is not None else None
        if patterns is None:
            return
        selection = TableSelection.from_dict(dict(patterns))
        if selection.to_dict() != self.selection.to_dict():
            log.info("table discovery: patterns now %s", selection.to_dict())
            self.selection = selection

    def _followed(self, oid: int, qualified: str) -> str | None:
        """None when a mirror (ready, stopped or copying) follows source ``oid``; else why not:
        ``""`` (nothing follows it) or the refusal when a mirror of a table of that name exists."""
        reg = self.svc.reg
        with self.svc.lock:
            if oid in reg.copying:
                return None
            for meta in reg.doc["tables"].values():
                if meta.get("oid") == oid or (meta.get("oid") is None and meta.get("source") == qualified):
                    return None
            for name, meta in reg.doc["tables"].items():
                if meta.get("source") == qualified:
                    return (
                        f"{qualified} was created again (oid {oid}) while mirror {name} follows the table it "
                        f"replaced: drop-table {name} and it is mirrored again"
                    )
        return ""

    def _mirror_one(self, schema: str, table: str, oid: int) -> bool:
        """Mirror ``schema.table`` (``oid``) unless a mirror follows it or it failed less than
        :func:`retry_after_s` ago; True when it was mirrored here."""
        qualified, dst = format_name(schema, table), mirror_name(schema, table)
        why = self._followed(oid, qualified)
        if why is None:
            self.failed.pop(oid, None)
            return False
        prev = self.failed.get(oid)
        if prev is not None and time.time() - prev["tried"] < self.retry_s:
            return False
        if why:
            self._fail(oid, dst, qualified, why)
            return False
        log.info("table discovery: %s is picked and not mirrored: mirroring it as %s", qualified, dst)
        try:
            res = self.svc.create_table(dst, qualified)
        except Exception as e:
            if self._followed(oid, qualified) is None:  # a create-table or sync of it won the race
                self.failed.pop(oid, None)
                return False
            self._fail(
                oid,
                dst,
                qualified,
                _first_line(e) if isinstance(e, MooncakeError) else f"{type(e).__name__}: {_first_line(e)}",
            )
            return False
        self.failed.pop(oid, None)
        log.info(
            "table discovery: mirrored %s as %s: %s rows copied at LSN %s", qualified, dst, res["rows"], res["copy_lsn"]
        )
        return True

    def _fail(self, oid: int, dst: str, qualified: str, error: str) -> None:
        prev = self.failed.get(oid)
        error = scrub(error)
        if prev is None or prev["error"] != error:
            log.error("table discovery: cannot mirror %s as %s: %s", qualified, dst, error)
        self.failed[oid] = {"name": dst, "source": qualified, "error": error, "at": utc_now(), "tried": time.time()}

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any] | None:
        """``status``' ``discovery`` field: None when discovery is off, else ``interval_s``,
        ``patterns`` (the selection's pattern texts), ``last_look`` (UTC, ISO 8601, or None),
        ``look_error`` (the source could not be read: one line, or None), ``unmatched`` (labels of the
        patterns matching no table) and ``failed`` (per table that could not be mirrored: ``name``,
        ``source``, ``state`` ``"error"``, ``error``, ``at``: when it was last tried)."""
        if self.interval_s <= 0:
            return None
        return {
            "interval_s": self.interval_s,
            "patterns": self.selection.to_dict(),
            "last_look": self.last_look,
            "look_error": self.look_error,
            "unmatched": list(self.unmatched),
            "failed": [
                {"name": f["name"], "source": f["source"], "state": "error", "error": f["error"], "at": f["at"]}
                for f in list(self.failed.values())
            ],
        }
