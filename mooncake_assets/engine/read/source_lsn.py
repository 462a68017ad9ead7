"""The source's current WAL position for the read-your-writes barrier, over one kept connection.

A reader asks Postgres for ``pg_current_wal_lsn()`` before each query (PostgreSQL docs, "System
Administration Functions", backup control functions) and waits until the service has applied it.
Opening a connection per query would cost more than the query; :class:`SourceLsn` keeps one.
"""

from __future__ import annotations

from typing import Any, cast

import psycopg


class SourceLsn:
    """``pg_current_wal_lsn()`` of ``dsn`` over one kept autocommit connection, opened on first use;
    a broken one is replaced once per call. Not thread-safe (one reader, one thread)."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self._pg: psycopg.Connection[Any] | None = None

    def current(self) -> str:
        """The source's current LSN as ``X/Y`` text. Raises ``psycopg.OperationalError`` when Postgres
        cannot be reached (after one reconnect)."""
        for attempt in (0, 1):
            if self._pg is None or self._pg.closed:
                self._pg = psycopg.connect(self.dsn, autocommit=True)
            try:
                return cast(tuple[str], self._pg.execute("SELECT pg_current_wal_lsn()::text").fetchone())[0]
            except (psycopg.OperationalError, psycopg.InterfaceError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the kept connection (a later :meth:`current` opens a new one)."""
        if self._pg is not None:
            try:
                self._pg.close()
            except psycopg.Error:
                pass
            self._pg = None
