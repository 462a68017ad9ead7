"""Relation messages of a mirrored table: recognise a schema change at the LSN where it shows up.

pgoutput sends a Relation message (columns: name, type oid, typmod, key flag) before the first change
of a table in a session and again after anything invalidated the table's cache entry (an ``ALTER
TABLE``, but also harmless events such as an index build). A DDL is not itself in the stream: the
changed Relation arrives right before the first row change made under the new schema, so the first
commit LSN that carries it is where the mirror sees the change (no row of the table changed between
the DDL and that point, so the two are the same state of the table).

:func:`on_relation` runs for every change before it is applied. The fast path is one identity check
(the assembler keeps one Relation object until a new message replaces it). When the columns equal the
mirror's (name, declared type oid, typmod, in order) the tuple-to-column map is refreshed and nothing
else happens. Otherwise, with a ``catalog`` to look the table up in, the change is planned
(:func:`.evolution.plan_schema_change`) and the table evolves at that LSN (``MirrorTable.evolve``);
a change that cannot be followed raises :class:`SchemaChangeError`, which the service turns into an
error of that table only (list-tables shows it; the slot is held at the table's flush LSN so a resume
after a fix replays everything from there).
"""

from __future__ import annotations

from typing import Any

from ..lsn import Lsn
from .evolution import CatalogLookupError, SchemaChangeError, plan_schema_change

__all__ = ["SchemaChangeError", "CatalogLookupError", "on_relation", "describe_change", "type_text"]


#: format_type names of the built-in types a Relation message may name (others: "type oid N").
_TYPE_NAMES = {
    16: "boolean",
    17: "bytea",
    18: '"char"',
    19: "name",
    20: "bigint",
    21: "smallint",
    23: "integer",
    25: "text",
    26: "oid",
    114: "json",
    142: "xml",
    650: "cidr",
    700: "real",
    701: "double precision",
    790: "money",
    829: "macaddr",
    869: "inet",
    1042: "character",
    1043: "character varying",
    1082: "date",
    1083: "time without time zone",
    1114: "timestamp without time zone",
    1184: "timestamp with time zone",
    1186: "interval",
    1266: "time with time zone",
    1560: "bit",
    1562: "bit varying",
    1700: "numeric",
    2950: "uuid",
    3614: "tsvector",
    3802: "jsonb",
    1007: "integer[]",
    1009: "text[]",
    1016: "bigint[]",
    600: "point",
    3904: "int4range",
}


def type_text(oid: int, typmod: int) -> str:
    """A readable name for a (type oid, typmod) pair as a Relation message gives them."""
    name = _TYPE_NAMES.get(oid, f"type oid {oid}")
    if typmod >= 0:
        if oid in (1042, 1043):
            return f"{name}({typmod - 4})"
        if oid == 1700 and typmod >= 4:
            t = typmod - 4
            return f"numeric({(t >> 16) & 0xFFFF},{((t & 0x7FF) ^ 1024) - 1024})"
        if oid in (1083, 1114, 1184, 1266):
            return f"{name} ({typmod})"
    return name


def describe_change(table: Any, rel: Any, lsn: int) -> str:
    """One line naming the table, every column that changed and how, and the LSN."""
    return (
        f"table {table.name} (source {table.source}): schema change at LSN {Lsn(lsn)}: "
        + _change_parts(table, rel)
        + f" — this table stopped (the others go on) and holds the replication slot "
        f"at its flush LSN {Lsn(table.flush_lsn)}, so nothing is lost. To resume: re-create the mirror (drop-table, "
        "then create-table: a fresh copy)"
    )


def _change_parts(table: Any, rel: Any) -> str:
    """How the Relation's columns differ from the mirror's: "column x (text) was added; …"."""
    old = [(c.name, c.decl_oid, c.decl_typmod, c.type_name) for c in table.schema.columns]
    new = [(c.name, c.type_oid, c.typmod) for c in rel.columns]
    old_names = [o[0] for o in old]
    new_names = [n[0] for n in new]
    removed = [o for o in old if o[0] not in new_names]
    added = [n for n in new if n[0] not in old_names]
    parts = []
    if (
        len(removed) == 1
        and len(added) == 1
        and (removed[0][1], removed[0][2]) == (added[0][1], added[0][2])
        and old_names.index(removed[0][0]) == new_names.index(added[0][0])
    ):
        parts.append(f"column {removed[0][0]} was renamed to {added[0][0]}")
        removed, added = [], []
    for o in removed:
        parts.append(f"column {o[0]} ({o[3]}) was dropped")
    for n in added:
        parts.append(f"column {n[0]} ({type_text(n[1], n[2])}) was added")
    by_new = {n[0]: n for n in new}
    for name, oid, typmod, tname in old:
        now = by_new.get(name)
        if now is not None and (now[1], now[2]) != (oid, typmod):
            parts.append(f"column {name} changed type from {tname} to {type_text(now[1], now[2])}")
    if not parts:
        kept = [n for n in new_names if n in old_names]
        if kept != [n for n in old_names if n in new_names]:
            parts.append("the columns were reordered")
        else:
            parts.append("the columns changed")
    return "; ".join(parts)


def _check_identity(table: Any, rel: Any, lsn: int) -> None:
    """The key the mirror locates rows by must still be what UPDATE/DELETE old tuples carry."""
    _check_identity_of(table.name, table.source, table.schema.key_columns, rel, lsn)


def _check_identity_of(name: str, source: str, key_columns: list[str], rel: Any, lsn: int) -> None:
    ident = rel.replica_identity
    if ident == "f":
        return
    if not key_columns:  # keyed by the whole row: needs REPLICA IDENTITY FULL
        raise SchemaChangeError(
            f"table {name} (source {source}): at LSN {Lsn(lsn)} its replica identity changed "
            f"from FULL to {'NOTHING' if ident == 'n' else 'DEFAULT' if ident == 'd' else 'USING INDEX'}; "
            "a table without a primary key is mirrored by whole rows and needs REPLICA IDENTITY FULL"
        )
    flagged = [c.name for c in rel.columns if c.is_key]
    if ident == "n" or (flagged and sorted(flagged) != sorted(key_columns)):
        raise SchemaChangeError(
            f"table {name} (source {source}): at LSN {Lsn(lsn)} its replica identity key "
            f"became ({', '.join(flagged) or 'nothing'}) but the mirror locates rows by "
            f"({', '.join(key_columns)})"
        )


def on_relation(table: Any, rel_oid: int, rel: Any, lsn: int, catalog: Any = None, xid: int | None = None) -> None:
    """Check the Relation in effect for a change of ``table`` (a MirrorTable) at commit ``lsn`` of
    transaction ``xid``; refresh the tuple-to-column map when it is new. A changed column list evolves
    the table when ``catalog`` (``columns(table_oid, xid) -> [CatalogColumn]``, read once the source
    shows ``xid`` committed; ``resolve(name, oid, typmod, ndims) -> ColumnSpec``) is given. Raises
    :class:`SchemaChangeError` for a change the mirror cannot follow (or any change without
    ``catalog``), :class:`CatalogLookupError` when the catalogs could not be read."""
    seen = table.__dict__.setdefault("_relations_seen", {})
    if seen.get(rel_oid) is rel and rel_oid in table._relmap:
        return
    mine = [(c.name, c.decl_oid, c.decl_typmod) for c in table.schema.columns]
    excluded = set(getattr(table.schema, "excluded", None) or ())  # create-table --exclude-column
    sig = [(c.name, c.type_oid, c.typmod) for c in rel.columns if c.name not in excluded]
    if sig != mine:
        if catalog is None:
            raise SchemaChangeError(describe_change(table, rel, lsn))

        try:
            columns = catalog.columns(table.schema.oid, xid=xid)
        except Exception as e:
            what = _change_parts(table, rel)
            raise CatalogLookupError(
                f"table {table.name} (source {table.source}): schema change at LSN {Lsn(lsn)} ({what}): the "
                f"source's catalogs gave no trustworthy answer ({type(e).__name__}: {str(e).splitlines()[0]}), so "
                "what older rows read in the changed columns is unknown — this table stopped (the others go on) "
                f"and holds the replication slot at its flush LSN {Lsn(table.flush_lsn)}, so nothing is lost; to "
                "resume, restart the service (the change is replayed and looked up again)"
            ) from None
        change = plan_schema_change(
            table.schema,
            sig,
            columns,
            catalog.resolve,
            lsn,
            table.next_field_id,
            table=table.name,
            format_version=getattr(table.iceberg, "format_version", 3),
        )
        _check_identity_of(table.name, table.source, change.key_columns, rel, lsn)
        if not change.is_noop():
            table.evolve(change)
    _check_identity(table, rel, lsn)
    table.column_map(rel_oid, [c.name for c in rel.columns])
    seen[rel_oid] = rel
