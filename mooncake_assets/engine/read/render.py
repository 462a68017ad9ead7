"""Query results as text, the way ``psql`` shows them (``mooncake query --format table|csv|json``).

Values are rendered from their Arrow columns, never through Python ``datetime`` (which cannot hold
``infinity`` or years outside 1..9999):

========================  =====================================  ==================================
Arrow type                table / csv (Postgres's text output)   json
========================  =====================================  ==================================
null (any type)           empty (csv: an empty field, as psql)   ``null``
bool                      ``t`` / ``f``                          ``true`` / ``false``
int*, decimal             digits (decimal keeps its scale)       a JSON number (exact digits)
float                     shortest round-trip text, ``NaN``,     a JSON number; ``"NaN"``,
                          ``Infinity``, ``-Infinity``            ``"Infinity"``, ``"-Infinity"``
date                      ``2024-01-31``, ``0044-03-15 BC``,     the same text as a string
                          ``infinity``, ``-infinity``
timestamp                 ``2024-01-31 12:00:00.5``              ``"2024-01-31T12:00:00.5"``
timestamp (tz=UTC)        ``2024-01-31 12:00:00.5+00``           ``"2024-01-31T12:00:00.5+00:00"``
time                      ``12:00:00.5``                         the same text as a string
binary                    ``\\x0aff`` (bytea_output=hex)          the same text as a string
list                      Postgres array text ``{1,NULL,"a b"}``  a JSON array
string                    as is                                  a JSON string
========================  =====================================  ==================================

The timestamp sentinels are the ones the decoder stores for Postgres's ``infinity``/``-infinity``
(:data:`~mooncake_assets.engine.cdc.schema.TIMESTAMP_INFINITY`, ``DATE_INFINITY``); the JSON forms
follow Postgres's ``to_json`` (ISO 8601 with ``T``). Sources: the Postgres manual, "Date/Time Output"
(ISO style), "Array Value Input" (quoting), and psql's aligned output format.
"""
from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pyarrow as pa

from ..cdc.schema import DATE_INFINITY, TIMESTAMP_INFINITY

_US_PER_DAY = 86_400_000_000


def _civil(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian (year, month, day) of a day count from 1970-01-01 (astronomical years:
    year 0 is 1 BC). The days-to-civil conversion of the proleptic calendar, in integer arithmetic."""
    z = days + 719_468
    era = z // 146_097  # floor division (Python floors; the C original truncates and adjusts)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)
    return y, m, d


def _date_text(days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix ``""`` or ``" BC"``) as Postgres's ISO DateStyle prints it."""
    y, m, d = _civil(days)
    if y <= 0:
        return f"{1 - y:04d}-{m:02d}-{d:02d}", " BC"
    return f"{y:04d}-{m:02d}-{d:02d}", ""


def _time_text(us: int) -> str:
    s, frac = divmod(us, 1_000_000)
    h, rem = divmod(s, 3600)
    mi, se = divmod(rem, 60)
    out = f"{h:02d}:{mi:02d}:{se:02d}"
    if frac:
        out += ("." + f"{frac:06d}").rstrip("0")
    return out


def _scale_to_us(unit: str) -> tuple[int, int]:
    """(multiply, divide) turning a value of ``unit`` into microseconds."""
    return {"s": (1_000_000, 1), "ms": (1000, 1), "us": (1, 1), "ns": (1, 1000)}[unit]


def _timestamp_text(us: int, tz: bool, iso_t: bool = False) -> str:
    if us >= TIMESTAMP_INFINITY:
        return "infinity"
    if us <= -TIMESTAMP_INFINITY:
        return "-infinity"
    days, rest = divmod(us, _US_PER_DAY)
    date, era = _date_text(days)
    sep = "T" if iso_t else " "
    zone = ("+00:00" if iso_t else "+00") if tz else ""
    return f"{date}{sep}{_time_text(rest)}{zone}{era}"


def _float_text(x: float, single: bool) -> str:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return str(np.float32(x)) if single else repr(float(x))


def _array_elem(text: str | None) -> str:
    """One element of Postgres array text: NULL bare, quoted when it needs to be."""
    if text is None:
        return "NULL"
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n\r\v\f'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class _Column:
    """Renders one Arrow column's values (``python`` values are Arrow scalars' storage values)."""

    def __init__(self, typ: pa.DataType):
        self.type = typ
        self.numeric = (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ))
        if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
            self.child = _Column(typ.value_type)
        else:
            self.child = None

    # -- storage values: ints for dates/times/timestamps, so no datetime overflow ------------------
    def storage(self, arr: pa.Array) -> list:
        t = self.type
        if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
            width = pa.int32() if (pa.types.is_date32(t) or pa.types.is_time32(t)) else pa.int64()
            return arr.view(width).to_pylist() if isinstance(arr, pa.Array) else arr.cast(width).to_pylist()
        if self.child is not None:
            out = []
            for i in range(len(arr)):
                if not arr[i].is_valid:
                    out.append(None)
                else:
                    out.append(self.child.storage(arr[i].values))
            return out
        return arr.to_pylist()

    def text(self, v) -> str | None:
        """Postgres's text output of one storage value (None for NULL)."""
        if v is None:
            return None
        t = self.type
        if pa.types.is_boolean(t):
            return "t" if v else "f"
        if pa.types.is_floating(t):
            return _float_text(v, pa.types.is_float32(t) or pa.types.is_float16(t))
        if pa.types.is_decimal(t):
            return f"{Decimal(v):f}"
        if pa.types.is_timestamp(t):
            m, d = _scale_to_us(t.unit)
            us = v if abs(v) >= TIMESTAMP_INFINITY else v * m // d
            return _timestamp_text(us, t.tz is not None)
        if pa.types.is_date(t):
            days = v if pa.types.is_date32(t) else v // 86_400_000
            if days >= DATE_INFINITY:
                return "infinity"
            if days <= -DATE_INFINITY:
                return "-infinity"
            date, era = _date_text(days)
            return date + era
        if pa.types.is_time(t):
            m, d = _scale_to_us(t.unit)
            return _time_text(v * m // d)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return "\\x" + bytes(v).hex()
        if self.child is not None:
            return "{" + ",".join(_array_elem(self.child.text(x)) if self.child.child is None
                                  else ("NULL" if x is None else self.child.text(x)) for x in v) + "}"
        if isinstance(v, (dict, list)):
            return json.dumps(v, default=str)
        return str(v)

    def json(self, v) -> str:
        """The JSON text of one storage value."""
        if v is None:
            return "null"
        t = self.type
        if pa.types.is_boolean(t):
            return "true" if v else "false"
        if pa.types.is_integer(t):
            return str(v)
        if pa.types.is_floating(t):
            s = _float_text(v, pa.types.is_float32(t) or pa.types.is_float16(t))
            return json.dumps(s) if s in ("NaN", "Infinity", "-Infinity") else s
        if pa.types.is_decimal(t):
            return f"{Decimal(v):f}"
        if pa.types.is_timestamp(t):
            m, d = _scale_to_us(t.unit)
            us = v if abs(v) >= TIMESTAMP_INFINITY else v * m // d
            return json.dumps(_timestamp_text(us, t.tz is not None, iso_t=True))
        if self.child is not None:
            return "[" + ",".join(self.child.json(x) for x in v) + "]"
        return json.dumps(self.text(v))


def _columns(table: pa.Table) -> list[tuple[str, _Column, list]]:
    out = []
    for name, col in zip(table.column_names, table.columns):
        c = _Column(col.type)
        vals: list = []
        for chunk in col.chunks:
            vals.extend(c.storage(chunk))
        out.append((name, c, vals))
    return out


def text_rows(table: pa.Table) -> tuple[list[str], list[list[str | None]]]:
    """(column names, rows of Postgres text values, None for NULL)."""
    cols = _columns(table)
    rows = [[c.text(vals[i]) for _, c, vals in cols] for i in range(table.num_rows)]
    return [n for n, _, _ in cols], rows


def to_table(table: pa.Table) -> str:
    """psql's aligned format: centred headers, numbers right-aligned, NULL empty, ``(N rows)``;
    never cut to a terminal's width."""
    names, rows = text_rows(table)
    numeric = [_Column(t).numeric for t in table.schema.types]
    cells = [["" if v is None else v for v in r] for r in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    lines = [" " + " | ".join(n.center(w) for n, w in zip(names, widths)).rstrip(),
             "-" + "-+-".join("-" * w for w in widths) + "-"]
    for r in cells:
        lines.append(" " + " | ".join(v.rjust(w) if num else v.ljust(w)
                                      for v, w, num in zip(r, widths, numeric)).rstrip())
    n = len(rows)
    lines.append(f"({n} row{'' if n == 1 else 's'})")
    return "\n".join(lines) + "\n"


def to_csv(table: pa.Table) -> str:
    """CSV with a header line, as ``psql --csv`` writes it: NULL (and an empty string, as psql does) an
    empty field, fields quoted when they hold ``,``, ``"`` or a line break (quotes doubled)."""
    names, rows = text_rows(table)

    def field(v: str | None) -> str:
        if v is None:
            return ""
        if any(c in v for c in ',"\n\r'):
            return '"' + v.replace('"', '""') + '"'
        return v

    out = [",".join(field(n) for n in names)]
    out.extend(",".join(field(v) for v in r) for r in rows)
    return "\n".join(out) + "\n"


def to_json(table: pa.Table) -> str:
    """A JSON array of one object per row (see the module table for the value forms)."""
    cols = _columns(table)
    keys = [json.dumps(n) for n, _, _ in cols]
    rows = ["{" + ", ".join(f"{k}: {c.json(vals[i])}" for k, (_, c, vals) in zip(keys, cols)) + "}"
            for i in range(table.num_rows)]
    return "[" + ", ".join(rows) + "]\n"


FORMATS = {"table": to_table, "csv": to_csv, "json": to_json}
