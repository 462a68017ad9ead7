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

import pyarrow as pa

from ..union import UnionReader, _ident

READ_MODES = ("latest", "applied")


class Backend:
    """Runs SQL over the mirrors through one ``reader`` (its ``client`` is the service's client)."""

    def __init__(self, reader: UnionReader):
        self.reader = reader
        self.lock = threading.Lock()
        self._running: object | None = None  # the session whose statement holds the lock

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
