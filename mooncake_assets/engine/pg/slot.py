"""The replication slot of a state directory, and the source's WAL position, as SQL.

The slot itself is created over a replication connection (``CREATE_REPLICATION_SLOT``, see
:class:`~mooncake_assets.engine.cdc.stream.ReplicationConnection`); what is asked or done over a
normal connection is here (PG docs, "System Administration Functions: Replication Management
Functions", ``pg_replication_slots``).
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

__all__ = ["current_wal_lsn", "drop_slot", "slot_exists"]


def slot_exists(dsn: str, slot: str) -> bool:
    """Does the source have a replication slot named ``slot``? One short connection to ``dsn``
    (autocommit) reads the ``pg_replication_slots`` view (PG docs, "System Views:
    pg_replication_slots"); a connection failure raises ``psycopg.OperationalError``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone() is not None


def drop_slot(conn: psycopg.Connection[Any], slot: str, tries: int = 50, pause_s: float = 0.1) -> bool:
    """Drop the slot ``slot`` if it exists (``pg_drop_replication_slot``). It cannot be dropped while
    a walsender still holds it (the stream just closed): tried ``tries`` times, ``pause_s`` apart.
    Returns whether the statement succeeded (also when there was no such slot); False after the last
    try (the slot is still active, or the role may not drop it). ``conn`` must be in autocommit mode
    (a failed statement would otherwise abort its transaction). PG docs, "Replication Management
    Functions": ``pg_drop_replication_slot`` fails on an active slot."""
    for _ in range(tries):
        try:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            return True
        except psycopg.Error:
            time.sleep(pause_s)
    return False


def current_wal_lsn(conn: psycopg.Connection[Any]) -> str:
    """The source's current WAL write position, ``pg_current_wal_lsn()`` (PG docs, "Backup Control
    Functions"), as its ``pg_lsn`` text ``X/Y`` (hex high/low 32 bits; ``engine.lsn.Lsn.parse`` reads
    it). Raises ``psycopg`` errors as they come (e.g. on a standby during recovery)."""
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None  # a SELECT of one function call returns one row
    return str(row[0])
