"""Which source tables a set of glob patterns picks, and the mirror name each one gets.

Used by the sources file (``mooncake.yaml``: ``schemas``/``tables``/``exclude``, read by
``mooncake sync``) and by the replicator service's table discovery (``engine/service/discovery.py``),
so both pick the same tables under the same names.

Patterns follow ``fnmatch`` rules (``*``, ``?``, ``[abc]``), case-sensitive, matched against the
names as the Postgres catalogs spell them. Candidate tables (:func:`list_source_tables`) are the
ordinary and partitioned tables (``pg_class.relkind`` ``r``/``p``; not partitions, temporary or
unlogged tables) outside the system schemas (PostgreSQL docs, "pg_class", "pg_namespace").
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .names import asset_key_part

__all__ = ["TablePattern", "TableSelection", "list_source_tables", "mirror_name", "SOURCE_TABLES_SQL"]

#: every table that could be mirrored: ``(schema, table, oid)``, sorted by schema and table
SOURCE_TABLES_SQL = (
    "SELECT n.nspname, c.relname, c.oid::int8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relpersistence = 'p' "
    "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%' "
    "ORDER BY 1, 2"
)


@dataclass(frozen=True)
class TablePattern:
    """One ``schema.table`` glob pattern (``fnmatch`` rules, case-sensitive, matched against the names
    as the Postgres catalogs spell them; a pattern without a dot is ``public.<pattern>``; double quotes
    group a part that holds a dot)."""

    text: str
    schema: str
    table: str

    @staticmethod
    def parse(text: str) -> TablePattern:
        quoted, cut = False, -1
        for i, ch in enumerate(text):
            if ch == '"':
                quoted = not quoted
            elif ch == "." and not quoted:
                cut = i
                break
        schema, table = ("public", text) if cut < 0 else (text[:cut], text[cut + 1 :])

        def unq(s: str) -> str:
            return s[1:-1].replace('""', '"') if len(s) >= 2 and s[0] == s[-1] == '"' else s

        return TablePattern(text, unq(schema.strip()), unq(table.strip()))

    def matches(self, schema: str, table: str) -> bool:
        return fnmatch.fnmatchcase(schema, self.schema) and fnmatch.fnmatchcase(table, self.table)


@dataclass(frozen=True)
class TableSelection:
    """``schemas`` (whole schemas, glob patterns), ``tables`` and ``exclude`` (``schema.table``
    patterns, :class:`TablePattern`): what a source mirrors."""

    schemas: Sequence[str] = ()
    tables: Sequence[TablePattern] = ()
    exclude: Sequence[TablePattern] = ()

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> TableSelection:
        """From ``{"schemas": [...], "tables": [...], "exclude": [...]}`` (pattern texts; missing: none)."""
        d = d or {}
        return TableSelection(
            tuple(d.get("schemas") or ()),
            tuple(TablePattern.parse(t) for t in d.get("tables") or ()),
            tuple(TablePattern.parse(t) for t in d.get("exclude") or ()),
        )

    def to_dict(self) -> dict[str, list[str]]:
        return {
            "schemas": list(self.schemas),
            "tables": [p.text for p in self.tables],
            "exclude": [p.text for p in self.exclude],
        }

    def __bool__(self) -> bool:
        return bool(self.schemas or self.tables)

    def pick(self, tables: Iterable[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
        """``(the (schema, table) pairs of tables that the patterns pick, in order, the patterns that
        match none of tables)``, each unmatched one labelled ``schemas: X``, ``tables: X`` or
        ``exclude: X`` (an exclude pattern that excludes nothing is reported too)."""
        tables = list(tables)
        include = [(f"schemas: {s}", TablePattern(s, s, "*")) for s in self.schemas]
        include += [(f"tables: {p.text}", p) for p in self.tables]
        unmatched = [label for label, p in include if not any(p.matches(*t) for t in tables)]
        picked = [t for t in tables if any(p.matches(*t) for _, p in include)]
        unmatched += [f"exclude: {p.text}" for p in self.exclude if not any(p.matches(*t) for t in picked)]
        return [t for t in picked if not any(p.matches(*t) for p in self.exclude)], unmatched


def list_source_tables(conn: Any) -> list[tuple[str, str, int]]:
    """Every table of the source database that could be mirrored, ``(schema, table, oid)`` sorted by
    schema and table (:data:`SOURCE_TABLES_SQL`; ``conn``: an open psycopg connection). One catalog
    query; reads no table data."""
    return [(s, t, int(o)) for s, t, o in conn.execute(SOURCE_TABLES_SQL).fetchall()]


def mirror_name(schema: str, table: str) -> str:
    """The mirror name of source table ``schema.table``: ``table`` for schema ``public``, else
    ``<schema>__<table>``; parts that are not ``[A-Za-z0-9_]`` are mapped as asset key parts are
    (``Sales Data`` → ``Sales_Data_<hash>``), and the name is cut to 63 characters keeping a hash."""
    name = asset_key_part(table) if schema == "public" else f"{asset_key_part(schema)}__{asset_key_part(table)}"
    if name[0].isdigit():
        name = "t_" + name
    if len(name) > 63:
        name = name[:54] + "_" + hashlib.sha1(f"{schema}.{table}".encode()).hexdigest()[:8]
    return name
