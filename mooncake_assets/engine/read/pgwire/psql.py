"""psql's catalog queries answered from the mirrors' list (see :mod:`.catalog`'s docstring)."""

from __future__ import annotations

import re
from typing import Any

import duckdb

from .backend import Backend
from .catalog import TABLE_OID_BASE, Result
from .protocol import Field
from .sqltext import code_only, split_top, top_level
from .types import BOOL, TEXT, TYPE_NAMES, TYPLEN, fields, text_values, type_oid

_PATTERN = re.compile(r"relname\s+OPERATOR\(pg_catalog\.~\)\s+'((?:[^']|'')*)'", re.I)
_OID_EQ = re.compile(r"\boid\s*=\s*'(\d+)'", re.I)
_ATTRELID = re.compile(r"attrelid\s*=\s*'(\d+)'", re.I)


def _matches(pattern: str | None, name: str) -> bool:
    if pattern is None:
        return True
    try:
        return (
            re.fullmatch(pattern.replace("''", "'").strip("^$"), name) is not None
            or re.search(pattern, name) is not None
        )
    except re.error:
        return False


def _top_level_from(sql: str) -> int:
    """The offset of the first ``FROM`` of ``sql`` outside parentheses and literals (len when none)."""
    for i, _ch, depth in top_level(sql):
        if (
            depth == 0
            and sql[i : i + 4].upper() == "FROM"
            and not sql[i - 1 : i].isalnum()
            and not (sql[i + 4 : i + 5].isalnum() or sql[i + 4 : i + 5] == "_")
        ):
            return i
    return len(sql)


def item_name(item: str) -> str:
    """A select-list item's output name as Postgres gives it (``FigureColname``): its alias, a column
    reference's last name, a function's name, ``case``, a scalar subquery's first column, else
    ``?column?``."""
    item = item.strip()
    m = re.search(r'\s+AS\s+("(?:[^"]|"")*"|\w+)\s*$', item, re.I)
    if m:
        a = m.group(1)
        return a[1:-1].replace('""', '"') if a.startswith('"') else a.lower()
    if re.fullmatch(r"[\w.]+", item):
        return item.rsplit(".", 1)[-1].lower()
    if re.match(r"\(\s*SELECT\b", item, re.I):
        inner = item[item.index("(") + 1 : item.rindex(")")]
        names = select_names(inner)
        return names[0] if names else "?column?"
    if re.match(r"CASE\b", item, re.I):
        return "case"
    m = re.match(r"(?:\w+\.)*(\w+)\s*\(", item)
    return m.group(1).lower() if m else "?column?"


def select_names(sql: str) -> list[str]:
    """The output column names of a ``SELECT … FROM`` statement's select list (text level: psql's
    catalog queries are Postgres-only SQL that DuckDB does not parse)."""
    m = re.match(r"\s*SELECT\s+(?:DISTINCT\s+)?", sql, re.I)
    if not m:
        return []
    body = sql[m.end() :]
    return [item_name(x) for x in split_top(body[: _top_level_from(body)]) if x.strip()]


def _answer(sql: str, rows: list[dict[str, str | None]], types: dict[str, int] | None = None) -> Result:
    """A result with exactly the columns ``sql`` selects, each row's value by column name (a name not
    in the row: NULL), so psql finds every column it reads by position."""
    names = select_names(sql) or ["?column?"]
    out = [Field(n, (types or {}).get(n, TEXT)) for n in names]
    return Result(f"SELECT {len(rows)}", out, [[r.get(n) for n in names] for r in rows])


_CATALOG = re.compile(
    r"\bpg_catalog\.pg_\w+|\b(?:FROM|JOIN)\s+pg_(?:type|class|namespace|attribute|index|proc|roles?|database"
    r"|settings|am|description|constraint|enum|range|inherits|extension)\b",
    re.I,
)
_FILLED = re.compile(r"\bpg_(?:class|attribute|namespace|type)\b", re.I)
_NSP_PATTERN = re.compile(r"nspname\s+OPERATOR\(pg_catalog\.~\)\s+'((?:[^']|'')*)'", re.I)
_RELKINDS = re.compile(r"relkind\s+IN\s*\(([^)]*)\)", re.I)


def _in_public(sql: str) -> bool:
    m = _NSP_PATTERN.search(sql)
    return m is None or _matches(m.group(1), "public")


def _tables(backend: Backend, sql: str) -> list[tuple[int, str]]:
    m = _PATTERN.search(sql)
    pattern = m.group(1) if m else None
    names = backend.mirrors()
    if not _in_public(sql):
        return []
    return [(TABLE_OID_BASE + i, n) for i, n in enumerate(names) if _matches(pattern, n)]


def _by_oid(backend: Backend, oid: int) -> str | None:
    names = backend.mirrors()
    i = oid - TABLE_OID_BASE
    return names[i] if 0 <= i < len(names) else None


_RELATION: dict[str, str | None] = {
    "relchecks": "0",
    "relkind": "r",
    "relhasindex": "f",
    "relhasrules": "f",
    "relhastriggers": "f",
    "relrowsecurity": "f",
    "relforcerowsecurity": "f",
    "relhasoids": "f",
    "relispartition": "f",
    "array_to_string": "",
    "reloptions": "",
    "reltablespace": "0",
    "case": "",
    "reloftype": "",
    "relpersistence": "p",
    "relreplident": "d",
    "amname": "parquet",
}


def catalog_answer(sql: str, backend: Backend, params: list[Any] | None = None) -> Result | None:
    """The answer to a psql catalog query over ``pg_catalog`` (None when ``sql`` reads no
    ``pg_catalog.`` relation, nor one of its common relations unqualified, as psycopg's ``TypeInfo``
    reads ``pg_type``). Every answer has the columns the query selects (:func:`_answer`). A query of
    another shape over ``pg_class``/``pg_attribute``/``pg_namespace``/``pg_type`` (SQLAlchemy's
    reflection; ``params``: its bound values) runs over the mirrors' catalog tables
    (:meth:`.Backend.pg_catalog`); when DuckDB cannot run it, it gets no rows."""
    code = code_only(sql)
    if not _CATALOG.search(code):
        return None
    low = code.lower()
    if "pg_catalog.pg_class c" in low and '"name"' in low and (kinds := _RELKINDS.search(code)):  # \dt, \d, \di…
        listed = "'r'" in kinds.group(1) or "'p'" in kinds.group(1)
        rows: list[dict[str, str | None]] = [
            {
                "Schema": "public",
                "Name": n,
                "Type": "table",
                "Owner": "mooncake",
                "Persistence": "permanent",
                "Access method": "parquet",
            }
            for _, n in (_tables(backend, code) if listed else [])
        ]
        return _answer(code, rows)
    if low.lstrip().startswith("select c.oid,") and "n.nspname" in low and "c.relname" in low:  # \d NAME lookup
        rows = [{"oid": str(oid), "nspname": "public", "relname": n} for oid, n in _tables(backend, code)]
        return _answer(code, rows, {"oid": 26, "nspname": 19, "relname": 19})
    if "c.relchecks" in low and (m := _OID_EQ.search(code)):  # \d NAME: the relation's details
        found = _by_oid(backend, int(m.group(1))) is not None
        return _answer(code, [_RELATION] if found else [])
    if "from pg_catalog.pg_attribute a" in low and (m := _ATTRELID.search(code)):  # \d NAME: columns
        return _columns(backend, code, int(m.group(1)))
    if "from pg_catalog.pg_namespace n" in low and '"name"' in low:  # \dn
        rows = [{"Name": "public", "Owner": "mooncake"}] if _in_public(code) else []
        return _answer(code, rows)
    if _FILLED.search(code):
        try:
            table = backend.pg_catalog(sql, params)
        except (duckdb.Error, ValueError):
            return _answer(code, [])
        return Result(f"SELECT {table.num_rows}", fields(table.schema), text_values(table))
    return _answer(code, [])


def _columns(backend: Backend, sql: str, oid: int) -> Result:
    table = _by_oid(backend, oid)
    if table is None:
        return _answer(sql, [], {"attnotnull": BOOL})
    rows: list[dict[str, str | None]] = []
    schema = backend.schema(table)
    source = backend.source_types(table)  # the source column's type, as the mirror keeps it
    for f in schema:
        t_oid = type_oid(f.type, source.get(f.name))
        rows.append(
            {
                "attname": f.name,
                "format_type": source.get(f.name) or TYPE_NAMES.get(t_oid, "text"),
                "attnotnull": "f",
                "attidentity": "",
                "attgenerated": "",
                "attstorage": "p" if t_oid in TYPLEN else "x",
                "attcompression": "",
            }
        )
    return _answer(sql, rows, {"attnotnull": BOOL})
