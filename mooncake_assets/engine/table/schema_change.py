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
else happens. Any other difference raises :class:`SchemaChangeError`, which the service turns into
an error of that table only (list-tables shows it; the slot is held at the table's flush LSN so a
resume after a fix replays everything from there).

Resuming: re-creating the mirror always works (a fresh copy under the new schema). A restart rebuilds
the mirror with the columns it was built with (``column_signature`` in the registry) and replays from
its flush LSN; in changes committed before the restart read the catalogs, a Relation column the mirror
lacks and the source no longer has (an added column that was dropped again) is ignored, so undoing an
ADD COLUMN and restarting resumes the table with nothing lost. Evolving the Iceberg schema at the change (ADD/DROP/RENAME COLUMN, widening) is not
implemented.
"""
from __future__ import annotations

from typing import Any

__all__ = ["SchemaChangeError", "on_relation", "describe_change", "type_text"]


class SchemaChangeError(ValueError):
    """A source schema change the mirror cannot follow (permanent for this mirror: retrying the same
    WAL gives the same error). The message names table, column(s) and LSN."""


#: format_type names of the built-in types a Relation message may name (others: "type oid N").
_TYPE_NAMES = {
    16: "boolean", 17: "bytea", 18: '"char"', 19: "name", 20: "bigint", 21: "smallint", 23: "integer",
    25: "text", 26: "oid", 114: "json", 142: "xml", 650: "cidr", 700: "real", 701: "double precision",
    790: "money", 829: "macaddr", 869: "inet", 1042: "character", 1043: "character varying", 1082: "date",
    1083: "time without time zone", 1114: "timestamp without time zone", 1184: "timestamp with time zone",
    1186: "interval", 1266: "time with time zone", 1560: "bit", 1562: "bit varying", 1700: "numeric",
    2950: "uuid", 3614: "tsvector", 3802: "jsonb", 1007: "integer[]", 1009: "text[]", 1016: "bigint[]",
    600: "point", 3904: "int4range",
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


def _lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def describe_change(table: Any, rel: Any, lsn: int) -> str:
    """One line naming the table, every column that changed and how, and the LSN."""
    old = [(c.name, c.decl_oid, c.decl_typmod, c.type_name) for c in table.schema.columns]
    new = [(c.name, c.type_oid, c.typmod) for c in rel.columns]
    gone = _gone_columns(table, lsn)
    new = [n for n in new if n[0] not in gone]
    old_names = [o[0] for o in old]
    new_names = [n[0] for n in new]
    removed = [o for o in old if o[0] not in new_names]
    added = [n for n in new if n[0] not in old_names]
    parts = []
    if len(removed) == 1 and len(added) == 1 and (removed[0][1], removed[0][2]) == (added[0][1], added[0][2]) \
            and old_names.index(removed[0][0]) == new_names.index(added[0][0]):
        parts.append(f"column {removed[0][0]} was renamed to {added[0][0]}")
        removed, added = [], []
    for o in removed:
        parts.append(f"column {o[0]} ({o[3]}) was dropped")
    for n in added:
        parts.append(f"column {n[0]} ({type_text(n[1], n[2])}) was added")
    by_new = {n[0]: n for n in new}
    for name, oid, typmod, tname in old:
        n = by_new.get(name)
        if n is not None and (n[1], n[2]) != (oid, typmod):
            parts.append(f"column {name} changed type from {tname} to {type_text(n[1], n[2])}")
    if not parts:
        kept = [n for n in new_names if n in old_names]
        if kept != [n for n in old_names if n in new_names]:
            parts.append("the columns were reordered")
        else:
            parts.append("the columns changed")
    return (f"table {table.name} (source {table.source}): schema change at LSN {_lsn(lsn)}: "
            + "; ".join(parts) + " — the mirror does not follow schema changes yet, so this table stopped (the "
            f"others go on) and holds the replication slot at its flush LSN {_lsn(table.flush_lsn)}, so nothing "
            "is lost. To resume: re-create the mirror (drop-table, then create-table), or, for an added column, "
            "drop it again on the source and restart the service")


class _Gone:
    """Column names that count as gone for a change at ``lsn``: any column not in the source's catalogs
    as read at (re)start, for changes committed before that read (``catalog_lsn``): such a column was
    added and dropped again while the mirror was behind, and its values are gone from the source too.
    A column first seen in a change after that read is a real schema change."""

    def __init__(self, mine: set, current: set | None, catalog_lsn: int, lsn: int):
        self.mine, self.current, self.active = mine, current, current is not None and lsn < catalog_lsn

    def __contains__(self, name: str) -> bool:
        return self.active and name not in self.mine and name not in self.current


def _gone_columns(table: Any, lsn: int) -> _Gone:
    return _Gone({c.name for c in table.schema.columns}, getattr(table.schema, "current_columns", None),
                 getattr(table.schema, "catalog_lsn", 0) or 0, lsn)


def _check_identity(table: Any, rel: Any, lsn: int) -> None:
    """The key the mirror locates rows by must still be what UPDATE/DELETE old tuples carry."""
    ident = rel.replica_identity
    if ident == "f":
        return
    if not table.schema.key_columns:  # keyed by the whole row: needs REPLICA IDENTITY FULL
        raise SchemaChangeError(
            f"table {table.name} (source {table.source}): at LSN {_lsn(lsn)} its replica identity changed "
            f"from FULL to {'NOTHING' if ident == 'n' else 'DEFAULT' if ident == 'd' else 'USING INDEX'}; "
            "a table without a primary key is mirrored by whole rows and needs REPLICA IDENTITY FULL")
    flagged = [c.name for c in rel.columns if c.is_key]
    if ident == "n" or (flagged and sorted(flagged) != sorted(table.schema.key_columns)):
        raise SchemaChangeError(
            f"table {table.name} (source {table.source}): at LSN {_lsn(lsn)} its replica identity key "
            f"became ({', '.join(flagged) or 'nothing'}) but the mirror locates rows by "
            f"({', '.join(table.schema.key_columns)})")


def on_relation(table: Any, rel_oid: int, rel: Any, lsn: int) -> None:
    """Check the Relation in effect for a change of ``table`` (a MirrorTable) at commit ``lsn``; refresh
    the tuple-to-column map when it is new and compatible. Raises :class:`SchemaChangeError`."""
    seen = table.__dict__.setdefault("_relations_seen", {})
    if seen.get(rel_oid) is rel and rel_oid in table._relmap:
        return
    mine = [(c.name, c.decl_oid, c.decl_typmod) for c in table.schema.columns]
    gone = _gone_columns(table, lsn)
    sig = [(c.name, c.type_oid, c.typmod) for c in rel.columns if c.name not in gone]
    if sig != mine:
        raise SchemaChangeError(describe_change(table, rel, lsn))
    _check_identity(table, rel, lsn)
    table.column_map(rel_oid, [c.name for c in rel.columns])
    seen[rel_oid] = rel
