"""What the SQL endpoint runs statements on: one :class:`~..union.UnionReader` per server.

The reader keeps one DuckDB connection (its views over the mirrors' ReadStates live there), and a
DuckDB connection runs one statement at a time, so statements over mirrors are serialized here
(:attr:`Backend.lock`); everything else a session does (startup, authentication, ``SET``/``SHOW``,
catalog answers, sending rows already computed) runs in the session's own thread. A running
statement can be interrupted (a CancelRequest: :meth:`Backend.interrupt`).

Read modes (``SET mooncake.read``): ``latest`` (default; read-your-writes: the reader's barrier
waits until the service has applied every commit made in Postgres before the statement), ``applied``
(what the service has applied now, no wait).
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import pyarrow as pa

from ..union import UnionReader, _ident, check_read_only
from .infoschema import views
from .parsed import Parsed, Parser

READ_MODES = ("latest", "applied")


class Backend:
    """Runs SQL over the mirrors through one ``reader`` (its ``client`` is the service's client)."""

    def __init__(self, reader: UnionReader):
        self.reader = reader
        self.lock = threading.Lock()
        self._running: object | None = None  # the session whose statement holds the lock
        self.parser = Parser()
        self._meta = duckdb.connect()  # information_schema statements run here, off the reader
        self._meta_lock = threading.Lock()

    def run(self, sql: str, params: list[Any] | None = None, read: str = "latest", owner: object = None) -> pa.Table:
        """The Arrow result of one read statement (``params``: values for ``$1…``). Raises what the
        reader raises (``ReadOnlyError``, DuckDB errors, ``TimeoutError``)."""
        with self.lock:
            self._running = owner
            try:
                lsn = None
                if read == "applied":
                    client = self.reader.client
                    lsn = client.status().get("applied_lsn") if client is not None else None
                if params:
                    return self.reader.query(sql, lsn=lsn, params=params)
                return self.reader.query(sql, lsn=lsn)
            finally:
                self._running = None

    def interrupt(self, owner: object) -> bool:
        """Interrupt ``owner``'s running statement (DuckDB's ``interrupt``); False when it runs none."""
        if self._running is owner and owner is not None:
            self.reader.con.interrupt()
            return True
        return False

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

    def type_hints(self, parsed: Parsed, names: list[str]) -> dict[str, str]:
        """Result column name -> source Postgres type name, for the columns that are a mirror's column
        as it is (a plain column reference, or a ``*``'s column; ``names``: the result's columns), so
        ``jsonb``/``uuid``/``json``/``varchar`` columns get their own type OIDs (:mod:`.types`). A name
        two such columns share with different types gets none."""
        source = getattr(self.reader, "source_types", None)
        if source is None or parsed.names is None:
            return {}
        by_lower = {v.lower(): v for v in getattr(self.reader, "states", {})}  # the parse tree folds names
        types = {t: source(by_lower.get(t, t)) for t in set(parsed.tables.values())}
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
