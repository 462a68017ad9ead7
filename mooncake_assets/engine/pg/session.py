"""A source connection opened on first use and re-opened after it broke (shared by the service's
catalog lookups and the generated-columns session)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

__all__ = ["LazyConnection"]


class LazyConnection:
    """One psycopg connection made by ``connect()`` (a callable, called with no arguments) when it is
    first needed and again whenever the previous one is closed or broken (``conn.closed``,
    ``conn.broken``). Not thread-safe: one thread uses it (``close`` may come from another at stop).

    ``get()`` -> the open connection (errors of ``connect()``, e.g. ``psycopg.OperationalError``, as
    raised); ``close()`` closes it (never raises) so that the next ``get()`` opens a new one."""

    def __init__(self, connect: Callable[[], psycopg.Connection]):
        self._connect = connect
        self._conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        c = self._conn
        if c is None or c.closed or c.broken:
            self.close()
            c = self._conn = self._connect()
        return c

    def close(self) -> None:
        c, self._conn = self._conn, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass
