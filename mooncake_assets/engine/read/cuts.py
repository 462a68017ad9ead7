"""Reading consistent cuts: which cuts the warehouse holds, and SQL over every table at one cut.

A cut (``engine/iceberg/cuts.py``) is a tag ``lsn-X-Y`` on each mirrored table's snapshot at one
Postgres LSN. The read is of the persisted cut only — no service is asked, no in-memory row is
read — through PyIceberg's scan at the tag's snapshot (``table.scan(snapshot_id=…)``, which applies
deletion vectors and position deletes), each table registered in DuckDB under its mirror name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table.snapshots import Snapshot

from ..iceberg.cuts import cut_tag, cuts_of, parse_cut_tag
from ..lsn import Lsn
from ..table.changes import SUMMARY_FLUSH_LSN
from .sandbox import confine
from .union import check_read_only

__all__ = ["CutInfo", "list_cuts", "query_cut", "read_snapshot"]


@dataclass
class CutInfo:
    """One cut across tables: ``tag``, ``lsn``, ``timestamp_ms`` (the newest commit time of its snapshots,
    epoch ms: the cut was taken at or just after it), ``tables``: mirror name -> tagged snapshot id."""

    tag: str
    lsn: Lsn
    timestamp_ms: int = 0
    tables: dict[str, int] = field(default_factory=dict)


def list_cuts(catalog: Catalog, namespace: str) -> list[CutInfo]:
    """Every cut of the tables of ``namespace``, oldest LSN first (each table loaded once)."""
    by_tag: dict[str, CutInfo] = {}
    for ident in catalog.list_tables(namespace):
        name = ident[-1]
        md = catalog.load_table(ident).metadata
        for c in cuts_of(md):
            info = by_tag.setdefault(c.tag, CutInfo(c.tag, c.lsn))
            info.tables[name] = c.snapshot_id
            info.timestamp_ms = max(info.timestamp_ms, c.timestamp_ms)
    return sorted(by_tag.values(), key=lambda c: c.lsn)


def query_cut(
    catalog: Catalog, namespace: str, cut: str, sql: str, tables: list[str] | None = None
) -> tuple[pa.Table, CutInfo]:
    """Run ``sql`` (SELECT/EXPLAIN only: ``ReadOnlyError`` otherwise) over every table of ``namespace``
    at the cut ``cut`` (its tag ``lsn-X-Y`` or its LSN ``X/Y``), each visible by its mirror name.
    ``tables``: only these mirrors (default: every table having the cut). Returns (rows, the cut).
    Raises ``ValueError`` for a ``cut`` that is neither, ``LookupError`` when no table has the cut (or a
    named table lacks it)."""
    lsn = parse_cut_tag(cut)
    if lsn is None:
        raise ValueError(f"{cut!r} is not a cut: expected an LSN X/Y or a tag lsn-X-Y")
    tag = cut_tag(lsn)
    con = duckdb.connect()
    confine(con)  # the cut's rows are registered Arrow tables: the statement opens no file (sandbox.py)
    try:
        check_read_only(sql, con)
        used = referenced_tables(sql, con)  # None: read every table (a statement DuckDB cannot serialize)
        info = CutInfo(tag, lsn)
        without: list[str] = []  # mirrors of the namespace the cut does not hold
        for ident in catalog.list_tables(namespace):
            name = ident[-1]
            if tables is not None and name not in tables:
                continue
            tbl = catalog.load_table(ident)
            ref = tbl.metadata.refs.get(tag)
            if ref is None:
                if tables is not None:
                    raise LookupError(f"table {name} has no cut {tag} (taken before it was mirrored, or expired)")
                without.append(name)
                continue
            snap = tbl.metadata.snapshot_by_id(ref.snapshot_id)
            info.tables[name] = ref.snapshot_id
            info.timestamp_ms = max(info.timestamp_ms, snap.timestamp_ms if snap else 0)
            if used is None or name.lower() in used:  # a table the SQL does not name is never read
                con.register(name, tbl.scan(snapshot_id=ref.snapshot_id).to_arrow())
        if not info.tables:
            raise LookupError(f"no table has the cut {tag} (see `mooncake list-cuts`)")
        try:
            return con.execute(sql).to_arrow_table(), info
        except duckdb.CatalogException as e:
            _not_in_cut(e, without, info)
            raise
    finally:
        con.close()


def referenced_tables(sql: str, con: duckdb.DuckDBPyConnection) -> set[str] | None:
    """The lower-cased names of every table ``sql`` reads (each ``BASE_TABLE`` of DuckDB's parse tree,
    ``json_serialize_sql``: FROM clauses, joins, subqueries and CTEs alike; a CTE's own name counts too,
    which only reads a table more than needed). None when DuckDB cannot serialize the statement (EXPLAIN,
    a parse error): then the caller must read every table."""
    try:
        row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    except duckdb.Error:
        return None
    doc = json.loads(row[0]) if row else {"error": True}
    if doc.get("error"):
        return None
    names: set[str] = set()
    stack: list[object] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE" and isinstance(node.get("table_name"), str):
                names.add(node["table_name"].lower())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def read_snapshot(
    catalog: Catalog, namespace: str, name: str, lsn: int | None = None, columns: list[str] | None = None
) -> tuple[pa.Table, Lsn]:
    """Every row of the mirror ``name`` in one persisted snapshot, and the LSN that snapshot is at.

    ``lsn`` None: the table's current snapshot (its LSN: summary ``mooncake.flush-lsn``); else the
    newest snapshot whose ``mooncake.flush-lsn`` is ``lsn``, or the snapshot of the cut tag
    ``lsn-X-Y`` — exactly the snapshots the change feed (``engine/table/changes.py``) accepts as
    cuts, so the returned LSN can start a later feed. ``columns``: only these (default all). Read
    through PyIceberg's scan at the snapshot (deletion vectors and position deletes applied; Iceberg
    spec "Scan Planning"), no service asked; top-level ``large_string``/``large_binary`` columns come
    back as ``string``/``binary``, the types the change feed's rows have. Raises ``LookupError`` (one line) when the table has no
    such snapshot (none yet, or it expired)."""
    tbl = catalog.load_table((namespace, name))
    md = tbl.metadata
    chosen = None
    if lsn is None:
        chosen = md.current_snapshot()
        if chosen is None:
            raise LookupError(f"table {name} has no persisted snapshot yet (run `mooncake persist {name}`)")
    else:
        at_lsn = [s for s in md.snapshots if _flush_lsn(s) == lsn]
        if at_lsn:  # the newest snapshot at that LSN (a compaction keeps its parent's LSN and rows)
            chosen = max(at_lsn, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
        elif (ref := md.refs.get(cut_tag(lsn))) is not None:
            chosen = md.snapshot_by_id(ref.snapshot_id)
        if chosen is None:
            raise LookupError(f"table {name} has no retained snapshot at LSN {Lsn(lsn)}")
    at = Lsn(lsn) if lsn is not None else _flush_lsn(chosen)
    if at is None:
        raise LookupError(f"table {name}: its current snapshot records no {SUMMARY_FLUSH_LSN}")
    scan = tbl.scan(snapshot_id=chosen.snapshot_id, selected_fields=tuple(columns) if columns else ("*",))
    return _small_types(scan.to_arrow()), at


def _small_types(table: pa.Table) -> pa.Table:
    """``table`` with top-level large_string/large_binary columns cast to string/binary."""
    small = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    fields = [f.with_type(small.get(f.type, f.type)) for f in table.schema]
    return table if all(f.type == g.type for f, g in zip(fields, table.schema)) else table.cast(pa.schema(fields))


def _flush_lsn(snapshot: Snapshot) -> Lsn | None:
    text = snapshot.summary.additional_properties.get(SUMMARY_FLUSH_LSN) if snapshot.summary else None
    return Lsn.parse(text) if text else None


def _not_in_cut(e: duckdb.CatalogException, without: list[str], info: CutInfo) -> None:
    """``LookupError`` naming the mirror when DuckDB's "Table with name X does not exist" is a mirror
    that exists but is not in the cut (a cut of some tables, or one taken before it was mirrored)."""
    msg = str(e).lower()  # DuckDB names are case-insensitive; it echoes the name as the SQL spelt it
    for name in without:
        if f"table with name {name.lower()} does not exist" in msg:
            raise LookupError(
                f"table {name} is not in the cut {info.tag} (the cut holds {', '.join(sorted(info.tables))}: "
                f"it was taken of some tables, or before {name} was mirrored, or {name}'s tag expired)"
            ) from None
