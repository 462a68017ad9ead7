"""CTID ranges: a table's heap cut into page ranges that separate connections can copy at one snapshot.

A heap tuple's ``ctid`` is ``(page, offset)`` with offsets counted from 1, so ``'(p,0)'::tid`` sorts
before every tuple on page ``p``: the predicate ``ctid >= '(p0,0)'::tid AND ctid < '(p1,0)'::tid``
selects exactly the tuples on pages ``p0 … p1-1``, and Postgres 14 and later read only those pages
(a TID Range Scan; PG docs, "Using EXPLAIN" / release notes 14, E.14.3.1.4). The ranges of
:func:`plan_ctid_ranges` cover pages ``[0, ∞)`` without overlap: the last one has no upper bound, so
rows on pages the table grew after its size was read (:func:`table_pages`) are still copied. Copied
at one snapshot (PG docs, "Snapshot Synchronization Functions"), the union of the ranges is the table
as that snapshot sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..pg.schema import TableSchema

__all__ = ["CtidRange", "plan_ctid_ranges", "table_pages", "TID_RANGE_SCAN_VERSION"]

#: the first server version (``server_version_num``) with TID Range Scans; before it a ctid range
#: predicate reads the whole table, so ranges only pay off from here on
TID_RANGE_SCAN_VERSION = 140000


@dataclass(frozen=True)
class CtidRange:
    """The heap pages ``start`` (inclusive) to ``end`` (exclusive; None: no upper bound) of a table."""

    start: int
    end: int | None

    def predicate(self) -> sql.Composable:
        """``ctid >= '(start,0)'::tid [AND ctid < '(end,0)'::tid]`` (``TRUE`` for ``[0, ∞)``)."""
        parts = []
        if self.start > 0:
            parts.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.start},0)")))
        if self.end is not None:
            parts.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.end},0)")))
        return sql.SQL(" AND ").join(parts) if parts else sql.SQL("TRUE")

    def __str__(self) -> str:
        return f"pages [{self.start}, {'∞' if self.end is None else self.end})"


def plan_ctid_ranges(pages: int, parts: int, min_pages: int = 1) -> list[CtidRange]:
    """Cut a heap of ``pages`` pages into at most ``parts`` ranges of about equal page counts, each at
    least ``min_pages`` pages (the last may hold more), in page order; the first starts at page 0 and
    the last is open-ended. ``pages <= 0`` (an empty table), ``parts <= 1`` or a heap smaller than two
    ranges of ``min_pages``: the one range ``[0, ∞)``. Pure: no I/O."""
    if pages <= 0 or parts <= 1:
        return [CtidRange(0, None)]
    n = max(1, min(parts, pages // max(1, min_pages)))
    bounds = [i * pages // n for i in range(n)]
    return [CtidRange(b, bounds[i + 1] if i + 1 < n else None) for i, b in enumerate(bounds)]


def table_pages(conn: psycopg.Connection[Any], table: TableSchema) -> int:
    """The heap size of ``table`` in pages: ``pg_relation_size(oid) / current_setting('block_size')``
    (PG docs, "Database Object Management Functions"); 0 for a relation with no heap of its own (a
    partitioned table)."""
    row = conn.execute(
        "SELECT pg_relation_size(%s::oid) / current_setting('block_size')::bigint", (table.oid,)
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0
