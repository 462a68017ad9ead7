"""psql's catalog queries answered from the mirrors' list (see :mod:`.catalog`'s docstring)."""

from __future__ import annotations

import re

from .backend import Backend
from .catalog import TABLE_OID_BASE, Result
from .protocol import Field
from .sqltext import code_only
from .types import BOOL, INTERVAL, TEXT, type_oid

_PATTERN = re.compile(r"relname\s+OPERATOR\(pg_catalog\.~\)\s+'((?:[^']|'')*)'", re.I)
_OID_EQ = re.compile(r"\boid\s*=\s*'(\d+)'", re.I)
_ATTRELID = re.compile(r"attrelid\s*=\s*'(\d+)'", re.I)

#: OID -> format_type text, for ``\d``'s column types
TYPE_NAMES = {
    16: "boolean",
    17: "bytea",
    20: "bigint",
    21: "smallint",
    23: "integer",
    25: "text",
    114: "json",
    700: "real",
    701: "double precision",
    1043: "character varying",
    1082: "date",
    1083: "time without time zone",
    1114: "timestamp without time zone",
    1184: "timestamp with time zone",
    INTERVAL: "interval",
    1700: "numeric",
    2950: "uuid",
    3802: "jsonb",
    2249: "record",
    1000: "boolean[]",
    1005: "smallint[]",
    1007: "integer[]",
    1009: "text[]",
    1016: "bigint[]",
    1021: "real[]",
    1022: "double precision[]",
    1115: "timestamp without time zone[]",
    1182: "date[]",
    1185: "timestamp with time zone[]",
    1231: "numeric[]",
}


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


def _tables(backend: Backend, sql: str) -> list[tuple[int, str]]:
    m = _PATTERN.search(sql)
    pattern = m.group(1) if m else None
    names = backend.mirrors()
    return [(TABLE_OID_BASE + i, n) for i, n in enumerate(names) if _matches(pattern, n)]


def _by_oid(backend: Backend, oid: int) -> str | None:
    names = backend.mirrors()
    i = oid - TABLE_OID_BASE
    return names[i] if 0 <= i < len(names) else None


def catalog_answer(sql: str, backend: Backend) -> Result | None:
    """The answer to a psql catalog query over ``pg_catalog`` (None when ``sql`` reads no
    ``pg_catalog.`` relation)."""
    code = code_only(sql)
    if not re.search(r"\bpg_catalog\.pg_\w+", code, re.I):
        return None
    low = code.lower()
    if "pg_catalog.pg_class c" in low and '"name"' in low and "relkind in" in low:  # \dt, \d
        rows: list[list[str | None]] = [["public", n, "table", "mooncake"] for _, n in _tables(backend, code)]
        return Result(f"SELECT {len(rows)}", [Field(h, TEXT) for h in ("Schema", "Name", "Type", "Owner")], rows)
    if low.lstrip().startswith("select c.oid,") and "n.nspname" in low and "c.relname" in low:  # \d NAME lookup
        rows = [[str(oid), "public", n] for oid, n in _tables(backend, code)]
        return Result(f"SELECT {len(rows)}", [Field("oid", 26, 4), Field("nspname", 19), Field("relname", 19)], rows)
    if "c.relchecks" in low and (m := _OID_EQ.search(code)):  # \d NAME: the relation's details
        if _by_oid(backend, int(m.group(1))) is None:
            return Result("SELECT 0", [Field("relchecks", TEXT)], [])
        names = [
            "relchecks",
            "relkind",
            "relhasindex",
            "relhasrules",
            "relhastriggers",
            "relrowsecurity",
            "relforcerowsecurity",
            "relhasoids",
            "relispartition",
            "reloptions",
            "reltablespace",
            "reloftype",
            "relpersistence",
            "relreplident",
            "amname",
        ]
        row: list[str | None] = ["0", "r", "f", "f", "f", "f", "f", "f", "f", "", "0", "", "p", "d", "parquet"]
        return Result("SELECT 1", [Field(n, TEXT) for n in names], [row])
    if "from pg_catalog.pg_attribute a" in low and (m := _ATTRELID.search(code)):  # \d NAME: columns
        return _columns(backend, int(m.group(1)))
    return Result("SELECT 0", [Field("?column?", TEXT)], [])


def _columns(backend: Backend, oid: int) -> Result:
    table = _by_oid(backend, oid)
    names = ["attname", "format_type", "pg_get_expr", "attnotnull", "attcollation", "attidentity", "attgenerated"]
    out = [Field(n, BOOL if n == "attnotnull" else TEXT) for n in names]
    if table is None:
        return Result("SELECT 0", out, [])
    rows: list[list[str | None]] = []
    for f in backend.schema(table):
        t = TYPE_NAMES.get(type_oid(f.type), "text")
        rows.append([f.name, t, None, "f", None, "", ""])
    return Result(f"SELECT {len(rows)}", out, rows)
