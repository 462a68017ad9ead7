"""``information_schema.tables``, ``.columns``, ``.schemata`` and ``.views`` over the mirrors, for the
schema browsers of clients (DBeaver, SQLAlchemy, BI tools) that read them.

Each view is built as an Arrow table with Postgres's columns (the PostgreSQL manual, "The
Information Schema": ``tables``, ``columns``, ``schemata``, ``views``) and the statement runs on
DuckDB over them, so any filter, join or ordering of the client works. Mirrors are base tables of
schema ``public`` in catalog (database) ``database``, not insertable; a column's ``data_type`` and
``udt_name`` come from the source column's type (``format_type`` text the mirror keeps), or from
its Arrow type when the mirror carries none.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pyarrow as pa

from .types import TYPE_NAMES, type_oid

#: format_type name -> pg_type.typname (``udt_name``)
UDT = {
    "integer": "int4",
    "bigint": "int8",
    "smallint": "int2",
    "boolean": "bool",
    "real": "float4",
    "double precision": "float8",
    "character varying": "varchar",
    "character": "bpchar",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz",
    "time without time zone": "time",
    "time with time zone": "timetz",
}
TABLES = [
    "table_catalog",
    "table_schema",
    "table_name",
    "table_type",
    "self_referencing_column_name",
    "reference_generation",
    "user_defined_type_catalog",
    "user_defined_type_schema",
    "user_defined_type_name",
    "is_insertable_into",
    "is_typed",
    "commit_action",
]
COLUMNS = [
    "table_catalog",
    "table_schema",
    "table_name",
    "column_name",
    "ordinal_position",
    "column_default",
    "is_nullable",
    "data_type",
    "character_maximum_length",
    "character_octet_length",
    "numeric_precision",
    "numeric_precision_radix",
    "numeric_scale",
    "datetime_precision",
    "interval_type",
    "interval_precision",
    "character_set_catalog",
    "character_set_schema",
    "character_set_name",
    "collation_catalog",
    "collation_schema",
    "collation_name",
    "domain_catalog",
    "domain_schema",
    "domain_name",
    "udt_catalog",
    "udt_schema",
    "udt_name",
    "scope_catalog",
    "scope_schema",
    "scope_name",
    "maximum_cardinality",
    "dtd_identifier",
    "is_self_referencing",
    "is_identity",
    "identity_generation",
    "identity_start",
    "identity_increment",
    "identity_maximum",
    "identity_minimum",
    "identity_cycle",
    "is_generated",
    "generation_expression",
    "is_updatable",
]
_INTS = {
    "ordinal_position",
    "character_maximum_length",
    "character_octet_length",
    "numeric_precision",
    "numeric_precision_radix",
    "numeric_scale",
    "datetime_precision",
    "interval_precision",
    "maximum_cardinality",
}
SCHEMATA = [
    "catalog_name",
    "schema_name",
    "schema_owner",
    "default_character_set_catalog",
    "default_character_set_schema",
    "default_character_set_name",
    "sql_path",
]
VIEWS = ["table_catalog", "table_schema", "table_name", "view_definition", "check_option", "is_updatable"]


def _table(names: list[str], rows: list[dict[str, object]]) -> pa.Table:
    return pa.table({n: pa.array([r.get(n) for r in rows], pa.int32() if n in _INTS else pa.string()) for n in names})


def column_row(
    database: str, table: str, pos: int, name: str, arrow: pa.DataType, source: str | None
) -> dict[str, object]:
    """One ``information_schema.columns`` row (``source``: the column's ``format_type`` text, if kept)."""
    full = source or TYPE_NAMES.get(type_oid(arrow), "text")
    is_array = full.endswith("[]")
    base = full[:-2] if is_array else full
    m = re.match(r"^([^(]*?)\s*(?:\(([\d,\s]+)\))?(\s+with(?:out)? time zone)?$", base)
    head = ((m.group(1) + (m.group(3) or "")) if m else base).strip()
    mods = [int(x) for x in m.group(2).split(",")] if m and m.group(2) else []
    udt = UDT.get(head, head)
    row: dict[str, object] = {
        "table_catalog": database,
        "table_schema": "public",
        "table_name": table,
        "column_name": name,
        "ordinal_position": pos,
        "is_nullable": "YES",
        "data_type": "ARRAY" if is_array else head,
        "udt_catalog": database,
        "udt_schema": "pg_catalog",
        "udt_name": "_" + udt if is_array else udt,
        "dtd_identifier": str(pos),
        "is_self_referencing": "NO",
        "is_identity": "NO",
        "identity_cycle": "NO",
        "is_generated": "NEVER",
        "is_updatable": "NO",
    }
    if not is_array and head in ("character varying", "character") and mods:
        row["character_maximum_length"] = mods[0]
        row["character_octet_length"] = mods[0] * 4
    if not is_array and head == "numeric":
        row["numeric_precision_radix"] = 10
        if mods:
            row["numeric_precision"], row["numeric_scale"] = mods[0], (mods[1] if len(mods) > 1 else 0)
    ints = {"smallint": 16, "integer": 32, "bigint": 64, "real": 24, "double precision": 53}
    if not is_array and head in ints:
        row["numeric_precision"], row["numeric_precision_radix"] = ints[head], 2
        if head in ("smallint", "integer", "bigint"):
            row["numeric_scale"] = 0
    if not is_array and head.startswith(("timestamp", "time", "date", "interval")):
        row["datetime_precision"] = mods[0] if mods else (0 if head == "date" else 6)
    return row


def views(
    wanted: set[str],
    mirrors: list[str],
    schema: Callable[[str], pa.Schema],
    source_types: Callable[[str], dict[str, str]],
    database: str,
) -> dict[str, pa.Table]:
    """The ``information_schema`` views in ``wanted`` as Arrow tables, by the names
    :mod:`.parsed` gave them (``__mc_is_<view>``); a view not listed in the module docstring is an
    empty table with one column (``?column?``)."""
    out: dict[str, pa.Table] = {}
    for view in wanted:
        if view == "tables":
            rows: list[dict[str, object]] = [
                {
                    "table_catalog": database,
                    "table_schema": "public",
                    "table_name": t,
                    "table_type": "BASE TABLE",
                    "is_insertable_into": "NO",
                    "is_typed": "NO",
                }
                for t in mirrors
            ]
            out[view] = _table(TABLES, rows)
        elif view == "columns":
            rows = []
            for t in mirrors:
                fields = schema(t)
                types = source_types(t)
                rows.extend(
                    column_row(database, t, i + 1, f.name, f.type, types.get(f.name)) for i, f in enumerate(fields)
                )
            out[view] = _table(COLUMNS, rows)
        elif view == "schemata":
            out[view] = _table(
                SCHEMATA, [{"catalog_name": database, "schema_name": "public", "schema_owner": "mooncake"}]
            )
        elif view == "views":
            out[view] = _table(VIEWS, [])
        else:
            out[view] = pa.table({"?column?": pa.array([], pa.string())})
    return {f"__mc_is_{k}": v for k, v in out.items()}
