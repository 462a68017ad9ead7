"""Query results as text, the way ``psql`` shows them (``mooncake query --format table|csv|json``).

Values are rendered from their Arrow columns, never through Python ``datetime`` (which cannot hold
``infinity`` or years outside 1..9999):

========================  =====================================  ==================================
Arrow type                table / csv (Postgres's text output)   json
========================  =====================================  ==================================
null (any type)           empty (csv: an empty field, as psql)   ``null``
bool                      ``t`` / ``f``                          ``true`` / ``false``
int*, decimal             digits (decimal keeps its scale)       a JSON number (exact digits)
float                     Postgres's digits (-1), ``NaN``,       a JSON number; ``"NaN"``,
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
(:data:`~mooncake_assets.engine.pg.schema.TIMESTAMP_INFINITY`, ``DATE_INFINITY``); the JSON forms
follow Postgres's ``to_json`` (ISO 8601 with ``T``). Sources: the Postgres manual, "Date/Time Output"
(ISO style), "Array Value Input" and "Composite Type Input and Output Syntax" (quoting; the server's
``array_out``/``record_out``), the hstore module's "External Representation", and psql's aligned
output format.
"""

from __future__ import annotations

import json
import unicodedata
from decimal import Decimal
from typing import Any, cast

import pyarrow as pa

from ..cdc.text_out import TextColumn
from ..cdc.text_out import float_text as _pg_float_text
from ..cdc.text_out import scale_to_us as _scale_to_us
from ..cdc.text_out import timestamp_text as _timestamp_text
from ..pg.schema import TIMESTAMP_INFINITY


def _float_text(x: float, single: bool) -> str:
    """Postgres's text of a float (``-1``, ``0.1``, ``1e+300``, ``NaN``, ``-Infinity``): as psql prints it."""
    return _pg_float_text(x, single)


class _Column(TextColumn):
    """Renders one Arrow column's values (:class:`~..cdc.text_out.TextColumn`) as Postgres prints them
    (floats too: ``-1``, not Python's ``-1.0``); and as JSON."""

    def __init__(self, typ: pa.DataType):
        super().__init__(typ)
        self.numeric = pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)

    def float_text(self, v: float, single: bool) -> str:
        return _float_text(v, single)

    def json(self, v: Any) -> str:
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
        # children are of type(self) (TextColumn builds them so): _Column
        if self.child is not None:
            return "[" + ",".join(cast(_Column, self.child).json(x) for x in v) + "]"
        if self.fields is not None:
            return (
                "{"
                + ", ".join(f"{json.dumps(n)}: {cast(_Column, c).json(x)}" for (n, c), x in zip(self.fields, v))
                + "}"
            )
        if self.entry is not None:
            kc, vc = self.entry
            return "{" + ", ".join(f"{json.dumps(kc.text(k))}: {cast(_Column, vc).json(x)}" for k, x in v) + "}"
        return json.dumps(self.text(v))


def _columns(table: pa.Table) -> list[tuple[str, _Column, list[Any]]]:
    out = []
    for name, col in zip(table.column_names, table.columns):
        c = _Column(col.type)
        vals: list[Any] = []
        for chunk in col.chunks:
            vals.extend(c.storage(chunk))
        out.append((name, c, vals))
    return out


def _text_rows(cols: list[tuple[str, _Column, list[Any]]], n: int) -> list[list[str | None]]:
    return [[c.text(vals[i]) for _, c, vals in cols] for i in range(n)]


def text_rows(table: pa.Table) -> tuple[list[str], list[list[str | None]]]:
    """(column names, rows of Postgres text values, None for NULL)."""
    cols = _columns(table)
    return [n for n, _, _ in cols], _text_rows(cols, table.num_rows)


def display_width(text: str) -> int:
    """Terminal columns of ``text``: 2 for East Asian wide and fullwidth characters, 0 for combining
    marks, 1 otherwise (Unicode UAX #11; what psql's ``PQdsplen`` counts for UTF-8)."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def to_table(table: pa.Table) -> str:
    """psql's aligned format (``\\pset format aligned``, border 1): headers centred (the odd space
    on the right), numbers right-aligned, text left-aligned, NULL empty, a value with line breaks on
    several lines with ``+`` where it continues, widths in terminal columns (:func:`display_width`),
    ``(N rows)``; never cut to a terminal's width."""
    cols = _columns(table)
    names, rows = [n for n, _, _ in cols], _text_rows(cols, table.num_rows)
    numeric = [c.numeric for _, c, _ in cols]
    cells = [[("" if v is None else v).split("\n") for v in r] for r in rows]
    widths = [
        max([display_width(n)] + [display_width(line) for r in cells for line in r[i]]) for i, n in enumerate(names)
    ]
    last = len(names) - 1

    def pad(text: str, width: int, right: bool) -> str:
        fill = " " * (width - display_width(text))
        return fill + text if right else text + fill

    def centred(text: str, width: int) -> str:
        room = width - display_width(text)
        return " " * (room // 2) + text + " " * (room - room // 2)

    lines = [
        " " + " | ".join(centred(n, w) for n, w in zip(names, widths)) + " ",
        "-" + "-+-".join("-" * w for w in widths) + "-",
    ]
    for r in cells:
        for k in range(max(len(c) for c in r)):
            out = " "
            for i, (c, w) in enumerate(zip(r, widths)):
                text = c[k] if k < len(c) else ""
                more = k < len(c) - 1  # this value goes on below: psql's "+"
                if i < last:
                    out += pad(text, w, numeric[i]) + ("+" if more else " ") + "| "
                elif k >= len(c):
                    pass  # the last column's value ended above: psql prints nothing more on the line
                elif more or numeric[i]:
                    out += pad(text, w, numeric[i]) + ("+" if more else "")
                else:
                    out += text
            lines.append(out)
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
    rows = [
        "{" + ", ".join(f"{k}: {c.json(vals[i])}" for k, (_, c, vals) in zip(keys, cols)) + "}"
        for i in range(table.num_rows)
    ]
    return "[" + ", ".join(rows) + "]\n"


#: ``--format`` name -> renderer: an Arrow table (a query's result) -> the whole output text, ending in
#: a newline (module docstring: the value forms of each).
FORMATS = {"table": to_table, "csv": to_csv, "json": to_json}
