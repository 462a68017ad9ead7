"""The source's current WAL position, over one kept connection the service's status and waits share.

:class:`SourcePosition` asks ``pg_current_wal_lsn()`` (PostgreSQL docs, "System Administration
Functions": the current write-ahead log write location) for ``status`` (lag, ``source_lsn``) and for
:meth:`~.service.ReplicatorService.wait_lsn`, which refuses an LSN past it at once: no commit the
source has made ends there, so waiting would only time out. It also runs the service's other small
catalog look-ups on the same connection (:meth:`query`). Calls from several threads take turns (one
lock); a failed call drops the connection and keeps its first line as :attr:`error`.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from ..lsn import Lsn
from ..pg.slot import current_wal_lsn

__all__ = ["AHEAD_OF_SOURCE", "SourcePosition"]

#: the words of the one-line refusal of an LSN past the source's current WAL position; the command
#: line finds them in the service's message (exit 2)
AHEAD_OF_SOURCE = "is ahead of the source's current WAL position"


class SourcePosition:
    """``pg_current_wal_lsn()`` of the source ``dsn`` over one kept connection (autocommit, 3 s connect
    timeout). ``error``: why the source was not reachable at the last look (None when it was);
    ``seen``: the highest position seen (a WAL position only moves forward)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.error: str | None = None
        self.seen = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def current(self) -> int | None:
        """The source's current WAL position, or None when it cannot be asked (:attr:`error` says why)."""
        try:
            with self._lock:
                lsn = int(Lsn.parse(current_wal_lsn(self._connection())))
        except psycopg.Error as e:
            self._fail(e)
            return None
        self.error = None
        self.seen = max(self.seen, lsn)
        return lsn

    def query(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]] | None:
        """The rows of one small catalog query on the kept connection; None when there is no open
        connection (the last look failed, or none was made yet) or the query fails."""
        with self._lock:
            if self._conn is None or self._conn.closed:
                return None
            try:
                return list(self._conn.execute(sql, params).fetchall())
            except psycopg.Error:
                return None

    def refuse_ahead(self, lsn: int) -> None:
        """``ValueError`` (one line, :data:`AHEAD_OF_SOURCE`, both LSNs) when ``lsn`` is past the source's
        current WAL position; asks the source only when ``lsn`` is past every position seen so far;
        refuses nothing when the source cannot be asked (the caller then waits as before)."""
        if lsn <= self.seen:
            return
        src = self.current()
        if src is not None and lsn > src:
            raise ValueError(
                f"LSN {Lsn(lsn)} {AHEAD_OF_SOURCE} {Lsn(src)} (pg_current_wal_lsn()); pick an LSN at or below it"
            )

    def close(self) -> None:
        """Close the kept connection (the next call opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
        return self._conn

    def _fail(self, e: psycopg.Error) -> None:
        with self._lock:
            self._conn = None
        self.error = (str(e).strip().splitlines() or [type(e).__name__])[0]
