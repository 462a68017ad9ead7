"""SQL over the mirrors' persisted Iceberg snapshots: each table's current snapshot (what is committed to
the warehouse, no in-memory or staged rows), or every table at one consistent cut (its tag
``lsn-X-Y``, :mod:`..iceberg.cuts`).

Used by the SQL endpoint's ``SET mooncake.read = 'persisted'`` and ``SET mooncake.as_of_lsn``
(docs/sql-server.md). A snapshot is immutable, so its rows (PyIceberg's scan at the snapshot id,
deletion vectors and position deletes applied: ``table.scan(snapshot_id=…).to_arrow()``) are kept
in a small LRU cache keyed by (table, snapshot id), bounded in bytes; a statement reads only the
tables it names (DuckDB's parse tree, :class:`~.union.StatementInfo`), each registered under its
mirror name on the connection the caller gives.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog

from ..iceberg.cuts import cut_tag, parse_cut_tag
from .union import StatementInfo, _raise_refused

__all__ = ["CutMissing", "SnapshotReader"]

DEFAULT_BUDGET = 256 << 20  # bytes of snapshot rows kept between statements


class CutMissing(LookupError):
    """No table has the cut asked for, or a table a statement names lacks it (taken before the table
    was mirrored, or expired)."""


class SnapshotReader:
    """Reads mirrors at their Iceberg snapshots. ``catalog``: makes the warehouse's catalog (called once,
    on first use); ``namespace``: the mirrors' namespace; ``budget``: bytes of rows cached.
    Thread-safe: the catalog and the cache are used under one lock, statements run on the caller's
    connections."""

    def __init__(self, catalog: Callable[[], Catalog], namespace: str, budget: int = DEFAULT_BUDGET):
        self._make_catalog = catalog
        self._catalog: Catalog | None = None
        self.namespace = namespace
        self.budget = budget
        self._cache: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self._make_catalog()
        return self._catalog

    @staticmethod
    def tag(cut: str) -> str:
        """The cut tag ``cut`` names (``lsn-X-Y`` or ``X/Y``); ``ValueError`` for anything else."""
        lsn = parse_cut_tag(cut.strip())
        if lsn is None:
            raise ValueError(f"{cut!r} is not a cut: expected an LSN X/Y or a tag lsn-X-Y")
        return cut_tag(lsn)

    def check_cut(self, cut: str) -> str:
        """The tag of ``cut`` when some mirror has it; ``ValueError`` (not a cut) or ``CutMissing`` (no
        table has it: never taken, or expired)."""
        tag = self.tag(cut)
        with self._lock:
            cat = self.catalog()
            for ident in cat.list_tables(self.namespace):
                if tag in cat.load_table(ident).metadata.refs:
                    return tag
        raise CutMissing(f"no table has the cut {tag} (see `mooncake list-cuts`)")

    def query(
        self, con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None, cut: str | None = None
    ) -> pa.Table:
        """Run ``sql`` (SELECT/EXPLAIN only, else ``ReadOnlyError``) on ``con`` over the tables it names, at
        their current snapshot (``cut`` None) or at the cut ``cut``. ``CutMissing`` when a named mirror
        lacks the cut (:class:`CutMissing`); a name that is no mirror is left to DuckDB (its "does not exist" error)."""
        info = StatementInfo(sql, con)
        _raise_refused(info.refused)
        tag = self.tag(cut) if cut is not None else None
        tables = self._tables(info.tables if info.parsed else None, tag)
        for name, rows in tables.items():
            con.register(name, rows)
        try:
            cur = con.execute(sql, params) if params else con.execute(sql)
            return cur.to_arrow_table()
        finally:
            for name in tables:
                con.unregister(name)

    def _tables(self, wanted: set[str] | None, tag: str | None) -> dict[str, pa.Table]:
        """Mirror name -> its rows at ``tag`` (None: the current snapshot), for the mirrors whose
        lower-cased name is in ``wanted`` (None: all)."""
        out: dict[str, pa.Table] = {}
        with self._lock:
            cat = self.catalog()
            for ident in cat.list_tables(self.namespace):
                name = ident[-1]
                if wanted is not None and name.lower() not in wanted:
                    continue
                tbl = cat.load_table(ident)
                if tag is None:
                    snap = tbl.metadata.current_snapshot_id
                else:
                    ref = tbl.metadata.refs.get(tag)
                    if ref is None:
                        raise CutMissing(f"table {name} has no cut {tag} (taken before it was mirrored, or expired)")
                    snap = ref.snapshot_id
                if snap is None:  # nothing committed yet: no rows, the table's columns
                    out[name] = tbl.scan().to_arrow()
                    continue
                key = (name, snap)
                rows = self._cache.get(key)
                if rows is None:
                    rows = tbl.scan(snapshot_id=snap).to_arrow()
                    self._keep(key, rows)
                else:
                    self._cache.move_to_end(key)
                out[name] = rows
        return out

    def _keep(self, key: tuple[str, int], rows: pa.Table) -> None:
        if rows.nbytes > self.budget:
            return
        self._cache[key] = rows
        total = sum(t.nbytes for t in self._cache.values())
        while total > self.budget and self._cache:
            _, old = self._cache.popitem(last=False)
            total -= old.nbytes
