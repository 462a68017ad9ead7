"""Read the rows of one ``COPY … TO STDOUT`` in large blocks instead of one Python object per row.

:func:`copy_blocks` runs a COPY through psycopg's public ``cursor.copy()`` (which sends it and checks
its first result) and then reads the rows with the compiled :class:`~._copyout.CopyOutReader`:
``PQgetCopyData`` in a C loop with the GIL released, rows appended to one buffer, one ``bytes`` per
block. Once the server ends the COPY it collects the command's result itself (``PQgetResult`` until
none is left) and raises the server's error, if any, as psycopg would; psycopg's ``Copy`` then finds
the connection idle and has nothing left to do.

Where the compiled reader cannot run (no psycopg binary libpq, not Linux, a psycopg release outside
:data:`.native.PSYCOPG_RANGE`), the same blocks are gathered from psycopg's row iteration (slower,
same bytes). This module, with :mod:`.native`, is where the engine leans on psycopg's internals:
``PGconn.pgconn_ptr``, the libpq that owns it, and ``psycopg.errors.error_from_result`` for the
server's error; tests/pg/test_ranged_copy.py (``test_block_reader_is_compiled``) fails when a psycopg
release changes them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq, sql

log = logging.getLogger(__name__)

__all__ = ["CopyStopped", "copy_blocks", "block_reader_available"]


class CopyStopped(Exception):
    """A :func:`copy_blocks` was told to stop (its ``stop`` event was set) before the COPY ended."""


def _reader_for(pgconn: Any, prefix: bytes) -> Any | None:
    """A compiled :class:`~._copyout.CopyOutReader` on ``pgconn``, or None where it cannot run."""
    try:
        from ._copyout import CopyOutReader
        from .native import libpq_path

        ptr = getattr(pgconn, "pgconn_ptr", None)
        if not isinstance(ptr, int) or ptr == 0:
            return None
        return CopyOutReader(ptr, libpq_path(), prefix)
    except (ImportError, OSError, RuntimeError) as e:
        log.debug("compiled COPY reader unavailable (%s: %s)", type(e).__name__, e)
        return None


def block_reader_available(conn: psycopg.Connection[Any]) -> bool:
    """Whether :func:`copy_blocks` reads ``conn``'s COPY with the compiled reader."""
    return _reader_for(conn.pgconn, b"") is not None


def copy_blocks(
    conn: psycopg.Connection[Any],
    statement: sql.Composed | sql.SQL,
    *,
    max_bytes: int,
    max_rows: int,
    prefix: bytes = b"",
    stop: threading.Event | None = None,
) -> Iterator[tuple[bytes, int]]:
    """Run ``statement`` (a ``COPY … TO STDOUT``) on ``conn`` and yield ``(block, rows)``: ``block``
    is ``prefix`` followed by ``rows`` whole rows exactly as the server sent them (``max_rows`` rows,
    or as many as first reach ``max_bytes`` bytes, or the COPY's last ones).

    Raises the server's error (a ``psycopg.Error`` subclass, as ``cursor.copy()`` would),
    ``psycopg.OperationalError`` when the connection is lost, :class:`CopyStopped` when ``stop`` is
    set (checked at least every 0.2 s). Closing the generator early cancels the COPY (psycopg's
    ``Copy`` does)."""
    with conn.cursor() as cur, cur.copy(statement) as cp:
        reader = _reader_for(conn.pgconn, prefix)
        if reader is None:
            yield from _psycopg_blocks(cp, max_bytes, max_rows, prefix, stop)
            return
        while True:
            blk = reader.read(max_bytes, max_rows, 0.2)
            if isinstance(blk, bytes):
                n = reader.last_rows
                if reader.ended:
                    _collect_result(conn.pgconn)
                yield blk, n
                continue
            if blk == 0:  # COPY_WAIT
                if stop is not None and stop.is_set():
                    raise CopyStopped("the copy was stopped")
                continue
            if blk == -1:  # COPY_END, every row returned
                _collect_result(conn.pgconn)
                return
            raise psycopg.OperationalError(
                f"connection lost during COPY: {conn.pgconn.error_message.decode(errors='replace').strip()}"
                + (f" (poll errno {reader.os_errno})" if blk == -3 else "")
            )


def _collect_result(pgconn: Any) -> None:
    """The COPY's final result(s), once ``PQgetCopyData`` said -1: raise the server's error if any."""
    err = None
    while (res := pgconn.get_result()) is not None:
        if err is None and res.status != pq.ExecStatus.COMMAND_OK:
            err = pg_errors.error_from_result(res, encoding="utf-8")  # client_encoding UTF8
    if err is not None:
        raise err


def _psycopg_blocks(
    cp: psycopg.Copy, max_bytes: int, max_rows: int, prefix: bytes, stop: threading.Event | None
) -> Iterator[tuple[bytes, int]]:
    """The fallback: the same blocks from psycopg's row-by-row iteration."""
    rows: list[Any] = [prefix]
    size = 0
    for row in cp:
        rows.append(row)
        size += len(row)
        if len(rows) - 1 >= max_rows or size >= max_bytes:
            yield b"".join(rows), len(rows) - 1
            if stop is not None and stop.is_set():
                raise CopyStopped("the copy was stopped")
            rows, size = [prefix], 0
    if len(rows) > 1:
        yield b"".join(rows), len(rows) - 1
