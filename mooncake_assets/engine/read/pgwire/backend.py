"""What the SQL endpoint runs statements on: a small pool of :class:`~..union.UnionReader` s.

A reader keeps one DuckDB connection (its views over the mirrors' ReadStates live there), and a
DuckDB connection runs one statement at a time, so a statement over mirrors takes a reader from the
pool for its duration; with ``size`` readers (``make_reader`` builds the others, on first need, over
cursors of one DuckDB database so they share its memory limit) as many statements run at once, and a
slow one on one connection does not hold up a fast one on another. Everything else a session does
(startup, authentication, ``SET``/``SHOW``, catalog answers, sending rows already computed) runs in
the session's own thread. A running or waiting statement can be interrupted (a CancelRequest:
:meth:`Backend.interrupt`; DuckDB's ``interrupt`` on the connection it runs on).

Read modes (``SET mooncake.read``): ``latest`` (default; read-your-writes: the reader's barrier
waits, at most the session's ``mooncake.max_wait``, until the service has applied every commit made
in Postgres before the statement), ``applied`` (what the service has applied now, no wait) and
``persisted`` (each table's current Iceberg snapshot only: :class:`~..snapshots.SnapshotReader`,
when the server has the warehouse's catalog). ``SET mooncake.as_of_lsn`` reads every table at one
consistent cut, through the same snapshot reader.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

from ..sandbox import confine
from ..snapshots import SnapshotReader
from ..union import UnionReader, _ident, check_read_only
from .catalog import READ_MODES, SqlError
from .infoschema import views
from .parsed import Parsed, Parser
from .pgcatalog import SCHEMA as CATALOG_SCHEMA
from .pgcatalog import CatalogTables
from .pgcatalog import rewrite as rewrite_catalog

__all__ = ["READ_MODES", "Backend", "Canceled"]


class Canceled(Exception):
    """A statement canceled (CancelRequest) before it got a reader: SQLSTATE 57014."""


class Backend:
    """Runs SQL over the mirrors through a pool of readers: ``reader`` (its ``client`` is the service's
    client) and up to ``size - 1`` more made by ``make_reader`` (None: ``reader`` only, statements one at
    a time). ``snapshots``: reads persisted snapshots and cuts (None: those modes are refused);
    ``max_wait``: seconds a read waits for read-your-writes unless the session says otherwise."""

    def __init__(
        self,
        reader: UnionReader,
        make_reader: Callable[[], UnionReader] | None = None,
        size: int = 1,
        snapshots: SnapshotReader | None = None,
        max_wait: float | None = None,
    ):
        self.reader = reader
        self.make_reader = make_reader
        self.size = max(1, size if make_reader is not None else 1)
        self.snapshots = snapshots
        self.max_wait = reader.wait_timeout if max_wait is None else max_wait
        reader.confine = True  # users' statements run on the readers: confined to the data roots (sandbox.py)
        self._free: list[UnionReader] = [reader]
        self._all: list[UnionReader] = [reader]
        self._made = 1
        self._cond = threading.Condition()
        self._running: dict[int, Any] = {}  # id(session) -> the DuckDB connection its statement runs on
        self._waiting: dict[int, bool] = {}  # id(session) -> canceled while waiting for a reader
        self._types: dict[str, dict[str, str]] = {}  # mirror -> column -> source type, as last read
        self.parser = Parser()
        self._meta = duckdb.connect()  # information_schema and pg_catalog statements run here, off the readers
        confine(self._meta)  # they read registered Arrow tables only: no file (sandbox.py)
        self._meta_lock = threading.Lock()
        self._catalog = CatalogTables(self.mirrors, self.schema, self.source_types)
        self._catalog_installed = False
        self._snap_db = duckdb.connect() if snapshots is not None else None
        if self._snap_db is not None:
            confine(self._snap_db)  # a cut's rows are registered Arrow tables (cuts.py): no file

    def run(
        self,
        sql: str,
        params: list[Any] | None = None,
        read: str = "latest",
        owner: object = None,
        max_wait: float | None = None,
        cut: str | None = None,
    ) -> pa.Table:
        """The Arrow result of one read statement (``params``: values for ``$1…``; ``read``: a read mode;
        ``max_wait``: seconds the read-your-writes barrier may wait; ``cut``: a cut tag, read instead of
        the mode). Raises what the reader raises (``ReadOnlyError``, DuckDB errors, ``TimeoutError``),
        ``SqlError`` 0A000 for a snapshot read on a server without the catalog, :class:`Canceled`."""
        if cut is not None or read == "persisted":
            return self._run_snapshot(sql, params, owner, cut)
        reader = self._acquire(owner)
        key = id(owner)
        before = reader.wait_timeout
        try:
            if owner is not None:  # a session's statement: a CancelRequest may interrupt it
                with self._cond:
                    self._running[key] = reader.con
            reader.wait_timeout = self.max_wait if max_wait is None else max_wait
            lsn = None
            if read == "applied":
                client = reader.client
                lsn = client.status().get("applied_lsn") if client is not None else None
            out = reader.query(sql, lsn=lsn, params=params) if params else reader.query(sql, lsn=lsn)
            self._remember_types(reader)
            return out
        finally:
            reader.wait_timeout = before
            self._release(key, reader)

    def _run_snapshot(self, sql: str, params: list[Any] | None, owner: object, cut: str | None) -> pa.Table:
        if self.snapshots is None or self._snap_db is None:
            what = "mooncake.as_of_lsn" if cut is not None else "mooncake.read = 'persisted'"
            raise SqlError("0A000", f"{what} needs the warehouse's catalog, which this server was not given")
        con = self._snap_db.cursor()
        key = id(owner)
        if owner is not None:
            with self._cond:
                self._running[key] = con
        try:
            return self.snapshots.query(con, sql, params, cut)
        finally:
            if owner is not None:
                with self._cond:
                    self._running.pop(key, None)
            con.close()

    def _acquire(self, owner: object) -> UnionReader:
        """A free reader (a new one while the pool is below ``size``), else wait for one; ``Canceled``
        when ``owner`` is canceled while it waits."""
        key = id(owner)
        with self._cond:
            while True:
                if self._free:
                    return self._free.pop()
                if self.make_reader is not None and self._made < self.size:
                    self._made += 1
                    break
                self._waiting[key] = False
                self._cond.wait(1.0)
                if self._waiting.pop(key, False):
                    raise Canceled("canceling statement due to user request")
        try:  # made outside the lock: a reader's first use connects to the service and Postgres
            assert self.make_reader is not None  # a slot is made only when there is a maker
            reader = self.make_reader()
            reader.confine = True
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._all.append(reader)
        return reader

    def _release(self, key: int, reader: UnionReader) -> None:
        with self._cond:
            if self._running.get(key) is reader.con:
                self._running.pop(key)
            self._free.append(reader)
            self._cond.notify()

    def _remember_types(self, reader: UnionReader) -> None:
        source = getattr(reader, "source_types", None)
        if source is None:
            return
        for view in list(getattr(reader, "states", {})):
            types = source(view)
            if types:
                self._types[view] = types

    def interrupt(self, owner: object) -> bool:
        """Interrupt ``owner``'s running statement (DuckDB's ``interrupt`` on its connection), or end its
        wait for a reader; False when it runs none."""
        key = id(owner)
        with self._cond:
            con = self._running.get(key)
            if con is None and key in self._waiting:
                self._waiting[key] = True
                self._cond.notify_all()
                return True
        if con is not None and owner is not None:
            con.interrupt()
            return True
        return False

    def readers(self) -> int:
        """How many readers the pool holds now (at most ``size``)."""
        with self._cond:
            return len(self._all)

    def close(self) -> None:
        """Close every reader the pool made (not ``reader``, which its maker closes) and the snapshot
        database."""
        with self._cond:
            made = list(self._all[1:])
        for r in made:
            try:
                r.close()
            except Exception:
                pass
        if self._snap_db is not None:
            self._snap_db.close()

    def mirrors(self) -> list[str]:
        """Names of the mirrored tables that can be read (not still in their initial copy)."""
        client = self.reader.client
        if client is None:
            return sorted(self.reader.states)
        return sorted(t["name"] for t in client.status()["tables"] if t.get("state") != "copying")

    def schema(self, table: str) -> pa.Schema:
        """A mirror's columns (names and Arrow types) as a union read shows them."""
        return self.run(f"SELECT * FROM {_ident(table)} LIMIT 0", read="applied").schema

    def source_types(self, table: str) -> dict[str, str]:
        """A mirror's column name -> its source type (``format_type`` text), once :meth:`schema` or a
        statement read it; {} when the mirror keeps none."""
        if table in self._types:
            return self._types[table]
        source = getattr(self.reader, "source_types", None)
        return source(table) if source is not None else {}

    def information_schema(self, parsed: Parsed, sql: str, params: list[Any] | None, database: str) -> pa.Table:
        """Run ``sql`` (``parsed``'s text, ``information_schema`` views renamed) over the views it reads,
        built from the mirrors (:mod:`.infoschema`), on the backend's own DuckDB connection (the
        reader's is not held while it runs; each mirror's columns are one read of no rows)."""
        names = self.mirrors() if parsed.information_schema & {"tables", "columns"} else []
        tables = views(parsed.information_schema, names, self.schema, self.source_types, database)
        with self._meta_lock:
            check_read_only(sql, self._meta)
            for name, t in tables.items():
                self._meta.register(name, t)
            try:
                cur = self._meta.execute(sql, params) if params else self._meta.execute(sql)
                return cur.to_arrow_table()
            finally:
                for name in tables:
                    self._meta.unregister(name)

    def pg_catalog(self, sql: str, params: list[Any] | None) -> pa.Table:
        """Run ``sql`` (a client's query over ``pg_catalog``) over the mirrors' catalog tables
        (:mod:`.pgcatalog`), on the backend's own DuckDB connection. Raises DuckDB's errors for SQL it
        cannot run (Postgres-only functions or syntax)."""
        text = rewrite_catalog(sql)
        with self._meta_lock:
            if not self._catalog_installed:
                self._catalog.install(self._meta)
                self._catalog_installed = True
            check_read_only(text, self._meta)
            self._catalog.refresh(self._meta, columns="pg_attribute" in text.lower())
            self._meta.execute(f"SET search_path = '{CATALOG_SCHEMA},main'")
            try:
                cur = self._meta.execute(text, params) if params else self._meta.execute(text)
                return cur.to_arrow_table()
            finally:
                self._meta.execute("SET search_path = 'main'")

    def type_hints(self, parsed: Parsed, names: list[str]) -> dict[str, str]:
        """Result column name -> source Postgres type name, for the columns that are a mirror's column
        as it is (a plain column reference, or a ``*``'s column; ``names``: the result's columns), so
        ``jsonb``/``uuid``/``json``/``varchar`` columns get their own type OIDs (:mod:`.types`). A name
        two such columns share with different types gets none."""
        if parsed.names is None:
            return {}
        by_lower = {v.lower(): v for v in self._types}  # the parse tree folds names
        types = {t: self.source_types(by_lower.get(t, t)) for t in set(parsed.tables.values())}
        if not any(types.values()):
            return {}
        out: dict[str, str] = {}
        clash: set[str] = set()

        def put(name: str, t: str | None) -> None:
            if t is None or name in clash:
                return
            if out.setdefault(name, t) != t:
                clash.add(name)
                out.pop(name)

        placed = parsed.output_names(len(names)) or []
        for i, name in enumerate(names):
            item = _item_at(parsed, i, len(names)) if placed else None
            if item == "*":
                for cols in types.values():
                    put(name, cols.get(name))
            elif isinstance(item, tuple):
                qualifier, col = item
                tables = (
                    [parsed.tables[qualifier]] if qualifier is not None and qualifier in parsed.tables else list(types)
                )
                found = {types[t][col] for t in tables if col in types.get(t, {})}
                put(name, found.pop() if len(found) == 1 else None)
        return out


def _item_at(parsed: Parsed, i: int, n: int) -> tuple[str | None, str] | str | None:
    """The select-list item behind result column ``i`` of ``n``: ``(qualifier, column)`` of a column
    reference, ``"*"`` inside a star's columns, None for any other expression."""
    if not parsed.star:
        return parsed.columns[i] if i < len(parsed.columns) else None
    at = parsed.star[0]
    after = len(parsed.names or []) - at - 1
    if i < at:
        return parsed.columns[i]
    if i >= n - after:
        return parsed.columns[len(parsed.columns) - (n - i)]
    return "*"
