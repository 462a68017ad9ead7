"""What the SQL endpoint reads from a statement's DuckDB parse tree (``json_serialize_sql``): the
statement with ``public.`` qualifiers dropped, the output column names Postgres would give, and
which select-list items are plain column references (for their source type OIDs).

- **Schema ``public``**: mirrors are shown as tables of schema ``public`` (:mod:`.psql`), so
  ``public.t``, ``"public"."T"``, ``db.public.t`` and ``public.t.col`` name what ``t``/``t.col``
  name; DuckDB has no such schema, so the qualifiers are cut out of the text at the places the
  parse tree gives (byte offsets of the table and column references).
- **Column names** follow Postgres's ``FigureColname`` (``src/backend/parser/parse_target.c``): an
  alias; a column reference's last name; a function call's name as written (``count(*)`` ->
  ``count``, ``pg_catalog.now()`` -> ``now``); a cast's argument's name, else its type's name
  (``'1'::int`` -> ``int4``); ``CASE`` -> ``case``, ``coalesce``, ``ARRAY[…]``
  -> ``array``, ``EXISTS`` -> ``exists``, a scalar subquery -> its column's name; anything else
  (operators, constants, parameters) ``?column?``. Unquoted identifiers are folded to lower case,
  as Postgres folds them. A set operation (``UNION``…) takes its first branch's names.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import duckdb

_IDENT = r'(?:"(?:[^"]|"")*"|[A-Za-z_\x80-\uffff][\w$\x80-\uffff]*)'
_QUALIFIER = re.compile(rf"\s*{_IDENT}\s*\.\s*")
_FUNC = re.compile(rf"(?:{_IDENT}\s*\.\s*)*({_IDENT})\s*\(")
_NO_LOCATION = 2**63
_CAST_NAMES = {
    "INTEGER": "int4",
    "BIGINT": "int8",
    "SMALLINT": "int2",
    "TINYINT": "int2",
    "VARCHAR": "text",
    "BOOLEAN": "bool",
    "DOUBLE": "float8",
    "FLOAT": "float4",
    "DECIMAL": "numeric",
    "DATE": "date",
    "TIME": "time",
    "TIMESTAMP": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "INTERVAL": "interval",
    "UUID": "uuid",
    "BLOB": "bytea",
    "HUGEINT": "numeric",
}
#: a type name as written after ``::`` -> pg_type.typname (Postgres names a cast column so)
_TYPNAMES = {
    "int": "int4",
    "integer": "int4",
    "bigint": "int8",
    "smallint": "int2",
    "boolean": "bool",
    "real": "float4",
    "float": "float8",
    "double": "float8",
    "decimal": "numeric",
    "character": "bpchar",
    "char": "bpchar",
}
_NODE_NAMES = {
    "CASE_EXPR": "case",
    "OPERATOR_COALESCE": "coalesce",
    "ARRAY_CONSTRUCTOR": "array",
}


@dataclass
class Parsed:
    """One statement as :func:`parse` reads it. ``sql``: the text to run (``public.`` qualifiers cut);
    ``names``: per select-list item its Postgres output name (None: not a SELECT DuckDB parses);
    ``columns``: per item the ``(qualifier, column)`` of a plain column reference, else None;
    ``star``: indexes of ``*`` items (each expands to several columns); ``tables``: alias or name ->
    table name of the FROM clause's base tables (lower case); ``information_schema``: the
    ``information_schema`` views it reads (``tables``, ``columns``…), whose references ``sql`` names
    ``__mc_is_<view>`` (answered from the mirrors: :mod:`.infoschema`)."""

    sql: str
    names: list[str] | None = None
    columns: list[tuple[str | None, str] | None] = field(default_factory=list)
    star: list[int] = field(default_factory=list)
    tables: dict[str, str] = field(default_factory=dict)
    information_schema: set[str] = field(default_factory=set)

    def output_names(self, n: int) -> list[str] | None:
        """The names of a result of ``n`` columns, or None when they cannot be placed (no names, or a
        ``*`` count that does not fit): items before a single ``*`` count from the left, items after it
        from the right; a ``*``'s own columns keep their names (Postgres's are the same)."""
        if self.names is None:
            return None
        if not self.star:
            return self.names if len(self.names) == n else None
        if len(self.star) > 1:
            return None
        at = self.star[0]
        after = len(self.names) - at - 1
        if at + after > n:
            return None
        return self.names[:at] + [""] * (n - at - after) + self.names[at + 1 :]


def _fold(name: str, sql: bytes, loc: int | None = None) -> str:
    """Postgres's case folding of an identifier DuckDB kept as written: lower case unless quoted."""
    if f'"{name}"'.encode() in sql:
        return name
    return name.lower()


def _text_at(sql: bytes, loc: Any) -> str:
    if not isinstance(loc, int) or loc >= _NO_LOCATION or loc >= len(sql):
        return ""
    return sql[loc : loc + 400].decode(errors="ignore")


def _unquote(ident: str) -> str:
    if ident.startswith('"'):
        return ident[1:-1].replace('""', '"')
    return ident.lower()


def _name(e: dict[str, Any], sql: bytes) -> str:
    """An unaliased select-list item's Postgres name (module docstring)."""
    cls, kind = e.get("class"), e.get("type")
    if cls == "COLUMN_REF":
        return _fold(e["column_names"][-1], sql)
    if cls in ("FUNCTION", "WINDOW", "AGGREGATE"):
        m = _FUNC.match(_text_at(sql, e.get("query_location")))
        return _unquote(m.group(1)) if m else "?column?"
    if cls == "CAST":
        child = _name(e["child"], sql)
        if child != "?column?":
            return child
        text = _text_at(sql, e.get("query_location"))
        m = re.match(r"::\s*(?:pg_catalog\s*\.\s*)?(\w+)", text)
        if m:
            return _TYPNAMES.get(m.group(1).lower(), m.group(1).lower())
        if not re.match(r"CAST\s*\(", text, re.I):
            return "?column?"  # no cast in the text: DuckDB's own (``true`` is one)
        tid = e.get("cast_type", {}).get("id", "")
        return _CAST_NAMES.get(tid, tid.lower() or "?column?")
    if cls == "SUBQUERY":
        if e.get("subquery_type") == "EXISTS":
            return "exists"
        if e.get("subquery_type") == "SCALAR":
            inner = _select_names(e["subquery"]["node"], sql)
            return inner[0] if inner and inner[0] else "?column?"
        return "?column?"
    if cls == "COLLATE":
        return _name(e["child"], sql)
    return _NODE_NAMES.get(str(kind), "?column?")


def _select_names(node: dict[str, Any], sql: bytes) -> list[str] | None:
    if node.get("type") == "SET_OPERATION_NODE":
        return _select_names(node["left"], sql)
    if node.get("type") != "SELECT_NODE":
        return None
    out = []
    for e in node.get("select_list", []):
        alias = e.get("alias")
        out.append(_fold(alias, sql) if alias else _name(e, sql))
    return out


def _walk(node: Any, cuts: list[tuple[int, int, str]], tables: dict[str, str], sql: bytes) -> None:
    """Collect the ``public.`` qualifiers to cut (byte ranges) and the base tables."""
    if isinstance(node, list):
        for x in node:
            _walk(x, cuts, tables, sql)
        return
    if not isinstance(node, dict):
        return
    loc = node.get("query_location")
    if node.get("type") == "BASE_TABLE" and node.get("table_name"):
        name = str(node["table_name"]).lower()
        schema = str(node.get("schema_name", "")).lower()
        parts = 2 if node.get("catalog_name") else 1
        if schema == "information_schema":
            end = _cut(sql, loc, parts, [])
            m = re.compile(_IDENT).match(_text_at(sql, end)) if end else None
            if m and isinstance(loc, int):
                cuts.append((loc, end + len(m.group(0).encode()), f"__mc_is_{name}"))
            return
        tables[str(node.get("alias") or name).lower()] = name
        if schema == "public":
            _cut(sql, loc, parts, cuts)
    elif node.get("class") == "COLUMN_REF":
        names = node.get("column_names", [])
        if len(names) >= 3 and str(names[-3]).lower() == "public":
            _cut(sql, loc, len(names) - 2, cuts)
    for v in node.values():
        if isinstance(v, (dict, list)):
            _walk(v, cuts, tables, sql)


def _cut(sql: bytes, loc: Any, parts: int, cuts: list[tuple[int, int, str]]) -> int:
    """Add the byte range of the ``parts`` qualifiers at ``loc`` to ``cuts``; returns its end (0: none)."""
    text = _text_at(sql, loc)
    pos = 0
    for _ in range(parts):
        m = _QUALIFIER.match(text, pos)
        if not m:
            return 0
        pos = m.end()
    if not (parts and pos):
        return 0
    end = int(loc) + len(text[:pos].encode())
    cuts.append((int(loc), end, ""))
    return end


def _columns(node: dict[str, Any]) -> tuple[list[tuple[str | None, str] | None], list[int]]:
    while node.get("type") == "SET_OPERATION_NODE":
        node = node["left"]
    cols: list[tuple[str | None, str] | None] = []
    star: list[int] = []
    for i, e in enumerate(node.get("select_list", [])):
        if e.get("class") == "COLUMN_REF":
            names = [str(n) for n in e["column_names"]]
            cols.append((names[-2].lower() if len(names) >= 2 else None, names[-1]))
        else:
            cols.append(None)
        if e.get("class") in ("STAR", "COLUMNS"):
            star.append(i)
    return cols, star


class Parser:
    """Parses statements on its own DuckDB connection (never the reader's: a parse does not wait for
    another client's running statement), one at a time, keeping the last ``keep`` answers."""

    def __init__(self, keep: int = 512):
        self._con = duckdb.connect()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Parsed] = OrderedDict()
        self._keep = keep

    def parse(self, sql: str) -> Parsed:
        """The :class:`Parsed` form of ``sql`` (``Parsed(sql)`` when DuckDB cannot parse it: then
        DuckDB's own error reports it when the statement runs)."""
        with self._lock:
            got = self._cache.get(sql)
            if got is not None:
                self._cache.move_to_end(sql)
                return got
            try:
                row = self._con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
                doc = json.loads(row[0]) if row else {"error": True}
            except duckdb.Error:
                doc = {"error": True}
        got = _from_doc(sql, doc)
        with self._lock:
            self._cache[sql] = got
            if len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return got


def _from_doc(sql: str, doc: dict[str, Any]) -> Parsed:
    statements = doc.get("statements") or []
    if doc.get("error") or len(statements) != 1:
        return Parsed(sql)
    raw = sql.encode()
    cuts: list[tuple[int, int, str]] = []
    tables: dict[str, str] = {}
    _walk(statements, cuts, tables, raw)
    views = {text[len("__mc_is_") :] for _, _, text in cuts if text}
    for a, b, text in sorted(set(cuts), reverse=True):
        raw = raw[:a] + text.encode() + raw[b:]
    node = statements[0]["node"]
    names = _select_names(node, sql.encode())
    cols, star = _columns(node) if names is not None else ([], [])
    return Parsed(raw.decode(), names, cols, star, tables, views)
