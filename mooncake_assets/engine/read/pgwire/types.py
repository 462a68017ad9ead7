"""Result columns as the wire shows them: a Postgres type OID per Arrow column, values in text format.

OIDs are the fixed ones of ``pg_type.dat`` (:mod:`mooncake_assets.engine.pg.schema` names them); the
values are Postgres's text output as :mod:`mooncake_assets.engine.read.render` prints it (bool ``t``/``f``,
numeric with its scale, ``infinity``, array and record text, bytea hex). A DuckDB result carries no
Postgres type of its own: the OID comes from the Arrow type (``int4``/``int8``/``numeric``/``timestamptz``
/``text[]``…); a string column is ``text`` unless the caller knows the source column's type
(``hints``: a column name -> the mirrored column's Postgres type name, such as ``jsonb`` or ``uuid``,
read from the ``pg_type`` field metadata the mirror writes).

=====================  ======================  ==================================
Arrow                  OID                     note
=====================  ======================  ==================================
bool                   16 bool
int8/int16             21 int2
int32 / uint16         23 int4
int64 / uint32         20 int8
uint64, decimal        1700 numeric            (DuckDB's HUGEINT arrives as decimal(38,0))
float16/float32        700 float4
float64                701 float8
string, large_string   25 text                 (hints: json 114, jsonb 3802, uuid 2950, varchar 1043…)
binary                 17 bytea
date32/date64          1082 date
time                   1083 time
timestamp              1114 timestamp
timestamp with tz      1184 timestamptz
duration, interval     1186 interval           (text: Postgres's ``postgres`` IntervalStyle)
list of X              X's array type          (1000 bool[], 1007 int4[], 1009 text[]…; else 1009)
struct                 2249 record
map                    25 text (hstore text)
=====================  ======================  ==================================
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..render import text_rows
from .protocol import Field

BOOL, BYTEA, INT8, INT2, INT4, TEXT, JSON, FLOAT4, FLOAT8 = 16, 17, 20, 21, 23, 25, 114, 700, 701
VARCHAR, BPCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = 1043, 1042, 1082, 1083, 1114, 1184, 1186, 1700
UUID, JSONB, RECORD, NAME, OID, CHAR, TIMETZ = 2950, 3802, 2249, 19, 26, 18, 1266

#: element OID -> its array type's OID (pg_type.dat ``typarray``)
ARRAY_OF = {
    BOOL: 1000,
    BYTEA: 1001,
    CHAR: 1002,
    NAME: 1003,
    INT2: 1005,
    INT4: 1007,
    TEXT: 1009,
    BPCHAR: 1014,
    VARCHAR: 1015,
    INT8: 1016,
    FLOAT4: 1021,
    FLOAT8: 1022,
    OID: 1028,
    TIMESTAMP: 1115,
    DATE: 1182,
    TIME: 1183,
    TIMESTAMPTZ: 1185,
    INTERVAL: 1187,
    NUMERIC: 1231,
    TIMETZ: 1270,
    UUID: 2951,
    JSON: 199,
    JSONB: 3807,
    RECORD: 2287,
}
#: fixed-width types' ``typlen`` (RowDescription); others are -1 (varlena)
TYPLEN = {
    BOOL: 1,
    INT2: 2,
    INT4: 4,
    INT8: 8,
    FLOAT4: 4,
    FLOAT8: 8,
    DATE: 4,
    TIME: 8,
    TIMESTAMP: 8,
    TIMESTAMPTZ: 8,
    INTERVAL: 16,
    UUID: 16,
    OID: 4,
}
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

#: source type names (``format_type`` text, its head) whose values are strings in the mirror -> OID
NAMED = {
    "json": JSON,
    "jsonb": JSONB,
    "uuid": UUID,
    "character varying": VARCHAR,
    "varchar": VARCHAR,
    "character": BPCHAR,
    "bpchar": BPCHAR,
    "name": NAME,
    "interval": INTERVAL,
    "time with time zone": TIMETZ,
    "timetz": TIMETZ,
}


def type_oid(t: pa.DataType, hint: str | None = None) -> int:
    """The Postgres type OID for Arrow type ``t`` (module table); ``hint`` a source type name."""
    if pa.types.is_boolean(t):
        return BOOL
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return INT2
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return INT4
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return INT8
    if pa.types.is_uint64(t) or pa.types.is_decimal(t):
        return NUMERIC
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FLOAT4
    if pa.types.is_floating(t):
        return FLOAT8
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if hint:
            base = hint.split("(")[0].strip().lower()
            return NAMED.get(base, TEXT)
        return TEXT
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return BYTEA
    if pa.types.is_date(t):
        return DATE
    if pa.types.is_time(t):
        return TIME
    if pa.types.is_timestamp(t):
        return TIMESTAMPTZ if t.tz else TIMESTAMP
    if pa.types.is_duration(t) or pa.types.is_interval(t):
        return INTERVAL
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        elem_hint = hint[:-2] if hint and hint.endswith("[]") else None
        inner = t.value_type
        while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
            inner = inner.value_type  # Postgres's array types cover every number of dimensions
            elem_hint = elem_hint[:-2] if elem_hint and elem_hint.endswith("[]") else elem_hint
        return ARRAY_OF.get(type_oid(inner, elem_hint), 1009)
    if pa.types.is_struct(t):
        return RECORD
    return TEXT


def fields(schema: pa.Schema, hints: dict[str, str] | None = None) -> list[Field]:
    """RowDescription fields of a result ``schema`` (``hints``: column name -> source type name)."""
    out = []
    for f in schema:
        oid = type_oid(f.type, (hints or {}).get(f.name))
        out.append(Field(f.name, oid, TYPLEN.get(oid, -1)))
    return out


def _interval_text(months: int, days: int, us: int) -> str:
    """Postgres's ``postgres`` IntervalStyle: ``1 year 2 mons 3 days 04:05:06.5``; ``00:00:00`` for zero."""
    parts = []
    y, m = divmod(abs(months), 12)
    sign = "-" if months < 0 else ""
    if y:
        parts.append(f"{sign}{y} year{'s' if y != 1 else ''}")
    if m:
        parts.append(f"{sign}{m} mon{'s' if m != 1 else ''}")
    if days:
        parts.append(f"{days} day{'s' if abs(days) != 1 else ''}")
    if us or not parts:
        neg = us < 0
        us = abs(us)
        h, rest = divmod(us, 3_600_000_000)
        mi, rest = divmod(rest, 60_000_000)
        s, frac = divmod(rest, 1_000_000)
        t = f"{'-' if neg else ''}{h:02d}:{mi:02d}:{s:02d}" + (f".{frac:06d}".rstrip("0") if frac else "")
        parts.append(t)
    return " ".join(parts)


def _interval_column(col: pa.ChunkedArray) -> pa.Array:
    """An interval/duration column as Postgres interval text."""
    out: list[str | None] = []
    t = col.type
    for v in col.to_pylist():
        if v is None:
            out.append(None)
        elif pa.types.is_duration(t):
            out.append(
                _interval_text(0, 0, int(v.total_seconds() * 1_000_000) if hasattr(v, "total_seconds") else int(v))
            )
        else:  # MonthDayNano
            out.append(_interval_text(v.months, v.days, v.nanoseconds // 1000))
    return pa.array(out, pa.string())


def text_values(table: pa.Table) -> list[list[str | None]]:
    """Rows of Postgres text values (None for NULL) of a result table."""
    cols: list[Any] = []
    changed = False
    for c in table.columns:
        if pa.types.is_duration(c.type) or pa.types.is_interval(c.type):
            cols.append(_interval_column(c))
            changed = True
        elif pa.types.is_dictionary(c.type):
            cols.append(c.cast(c.type.value_type))
            changed = True
        else:
            cols.append(c)
    if changed:
        table = pa.table(cols, names=table.column_names)
    return text_rows(table)[1]
