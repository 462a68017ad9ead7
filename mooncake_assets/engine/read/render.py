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
struct (composite)        Postgres record text ``(1,,"a b")``     a JSON object of the fields
map (hstore)              hstore text ``"k"=>"v", "n"=>NULL``     a JSON object ``{"k": "v"}``
string                    as is                                  a JSON string
========================  =====================================  ==================================

The timestamp sentinels are the ones the decoder stores for Postgres's ``infinity``/``-infinity``
(:data:`~mooncake_assets.engine.cdc.schema.TIMESTAMP_INFINITY`, ``DATE_INFINITY``); the JSON forms
follow Postgres's ``to_json`` (ISO 8601 with ``T``). Sources: the Postgres manual, "Date/Time Output"
(ISO style), "Array Value Input" and "Composite Type Input and Output Syntax" (quoting; the server's
``array_out``/``record_out``), the hstore module's "External Representation", and psql's aligned
output format.
"""
from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pyarrow as pa

from ..cdc.decode import civil_from_days
from ..cdc.schema import DATE_INFINITY, TIMESTAMP_INFINITY

_US_PER_DAY = 86_400_000_000


def _date_text(days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix ``""`` or ``" BC"``) as Postgres's ISO DateStyle prints it."""
    y, m, d = civil_from_days(days)
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
    """One element of Postgres array text (``array_out``): NULL bare, quoted when it needs to be."""
    if text is None:
        return "NULL"
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n\r\v\f'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def _record_field(text: str | None) -> str:
    """One field of Postgres record text (``record_out``): NULL empty; quoted when empty or holding
    ``"``, ``\\``, ``(``, ``)``, ``,`` or white space, with ``"`` and ``\\`` doubled inside quotes."""
    if text is None:
        return ""
    if text == "" or any(c in text for c in '"\\(),') or any(c.isspace() for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    return text


def _hstore_str(text: str) -> str:
    """A key or value of hstore text (``hstore_out``): always quoted, ``"`` and ``\\`` backslash-escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


class _Column:
    """Renders one Arrow column's values from their storage values (:meth:`storage`): ints for
    dates, times and timestamps, a list of element storage values for a list, a tuple of field storage
    values for a struct, a list of ``(key, item)`` storage values for a map, Arrow's Python value
    otherwise."""

    def __init__(self, typ: pa.DataType):
        self.type = typ
        self.numeric = (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ))
        self.child = _Column(typ.value_type) if _is_list(typ) else None
        self.fields = ([(typ.field(i).name, _Column(typ.field(i).type)) for i in range(typ.num_fields)]
                       if pa.types.is_struct(typ) else None)
        self.entry = (_Column(typ.key_type), _Column(typ.item_type)) if pa.types.is_map(typ) else None

    # -- storage values: ints for dates/times/timestamps, so no datetime overflow ------------------
    def storage(self, arr: pa.Array) -> list:
        """The storage values of one Arrow array (a chunk), None for NULL."""
        t = self.type
        if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
            width = pa.int32() if (pa.types.is_date32(t) or pa.types.is_time32(t)) else pa.int64()
            return arr.view(width).to_pylist()
        if self.child is not None or self.entry is not None:
            if pa.types.is_fixed_size_list(t):
                k = t.list_size
                offsets = [(arr.offset + i) * k for i in range(len(arr) + 1)]
            else:
                offsets = arr.offsets.to_pylist()
            valid = arr.is_valid().to_pylist()
            if self.child is not None:
                flat = self.child.storage(arr.values)
            else:  # map: the storage values of its keys and items, paired
                flat = list(zip(self.entry[0].storage(arr.keys), self.entry[1].storage(arr.items)))
            return [flat[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(arr))]
        if self.fields is not None:
            valid = arr.is_valid().to_pylist()
            cols = [c.storage(arr.field(i)) for i, (_, c) in enumerate(self.fields)]
            return [tuple(col[i] for col in cols) if valid[i] else None for i in range(len(arr))]
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
            c = self.child
            nested = c.child is not None  # an inner dimension: its braces are not quoted
            return "{" + ",".join(("NULL" if x is None else c.text(x)) if nested else _array_elem(c.text(x))
                                  for x in v) + "}"
        if self.fields is not None:
            return "(" + ",".join(_record_field(c.text(x)) for (_, c), x in zip(self.fields, v)) + ")"
        if self.entry is not None:
            kc, vc = self.entry
            return ", ".join(f"{_hstore_str(kc.text(k))}=>{'NULL' if x is None else _hstore_str(vc.text(x))}"
                             for k, x in v)
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
        if self.fields is not None:
            return "{" + ", ".join(f"{json.dumps(n)}: {c.json(x)}" for (n, c), x in zip(self.fields, v)) + "}"
        if self.entry is not None:
            kc, vc = self.entry
            return "{" + ", ".join(f"{json.dumps(kc.text(k))}: {vc.json(x)}" for k, x in v) + "}"
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


def _text_rows(cols: list[tuple[str, _Column, list]], n: int) -> list[list[str | None]]:
    return [[c.text(vals[i]) for _, c, vals in cols] for i in range(n)]


def text_rows(table: pa.Table) -> tuple[list[str], list[list[str | None]]]:
    """(column names, rows of Postgres text values, None for NULL)."""
    cols = _columns(table)
    return [n for n, _, _ in cols], _text_rows(cols, table.num_rows)


def to_table(table: pa.Table) -> str:
    """psql's aligned format: centred headers, numbers right-aligned, NULL empty, ``(N rows)``;
    never cut to a terminal's width."""
    cols = _columns(table)
    names, rows = [n for n, _, _ in cols], _text_rows(cols, table.num_rows)
    numeric = [c.numeric for _, c, _ in cols]
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


#: ``--format`` name -> renderer: an Arrow table (a query's result) -> the whole output text, ending in
#: a newline (module docstring: the value forms of each).
FORMATS = {"table": to_table, "csv": to_csv, "json": to_json}
