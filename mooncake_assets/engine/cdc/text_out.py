"""PostgreSQL's text output of Arrow values: what the source would print for a decoded value.

The inverse of :func:`~.types.decode_text_columns` for the types it maps to Arrow scalars and lists,
under the sessions' pinned output settings (``DateStyle=ISO``, ``TimeZone=UTC``,
``extra_float_digits=3``, ``bytea_output=hex``). Values are printed from their storage integers, never
through Python ``datetime`` (which cannot hold ``infinity`` or years outside 1..9999):

==========================  ======================================================================
Arrow type                  text
==========================  ======================================================================
bool                        ``t`` / ``f``
int*, decimal               digits (a decimal keeps its scale)
float16/32/64               :func:`float_text` (Postgres's ``float4out``/``float8out``)
date32/64                   ``2024-01-31``, ``0044-03-15 BC``, ``infinity``, ``-infinity``
timestamp[tz=UTC]           ``2024-01-31 12:00:00.5`` (``+00`` with a time zone)
time32/64                   ``12:00:00.5``
binary                      ``\\x0aff``
list                        array text ``{1,NULL,"a b"}`` (elements quoted when they must be)
struct (composite)          record text ``(1,,"a b")``
map (hstore)                hstore text ``"k"=>"v", "n"=>NULL``
string                      as is
==========================  ======================================================================

Sources: the Postgres manual, "Date/Time Output" (ISO style), "Floating-Point Types"
(``extra_float_digits``), "Array Value Input" and "Composite Type Input and Output Syntax" (quoting;
the server's ``array_out``/``record_out``), the hstore module's "External Representation". Used by
the query renderer (:mod:`mooncake_assets.engine.read.render`) and by the rebuild of an index from
data files (:mod:`mooncake_assets.engine.table.key_text`).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, cast

import numpy as np
import pyarrow as pa

from ..pg.schema import DATE_INFINITY, TIMESTAMP_INFINITY
from .decode import civil_from_days

__all__ = [
    "TextColumn",
    "float_text",
    "date_text",
    "time_text",
    "timestamp_text",
    "array_elem",
    "record_field",
    "hstore_str",
    "scale_to_us",
]


def float_text(x: float, single: bool = False) -> str:
    """Postgres's text of a ``real`` (``single``) or ``double precision`` value with
    ``extra_float_digits`` > 0: the shortest digits that round-trip, in fixed notation when the decimal
    exponent is in [-4, 6) (real) or [-4, 15) (double), else ``1.5e+15``; ``NaN``, ``Infinity``,
    ``-Infinity``, ``0``, ``-0``."""
    v = np.float32(x) if single else np.float64(x)
    if v != v:
        return "NaN"
    if np.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "-0" if np.signbit(v) else "0"
    sci = np.format_float_scientific(v, unique=True, trim="-")
    mant, exp_s = sci.split("e")
    exp = int(exp_s)
    sign = "-" if mant.startswith("-") else ""
    digits = mant.lstrip("-").replace(".", "")
    if -4 <= exp < (6 if single else 15):
        if exp >= 0:
            whole, frac = digits[: exp + 1].ljust(exp + 1, "0"), digits[exp + 1 :]
        else:
            whole, frac = "0", "0" * (-exp - 1) + digits
        return sign + whole + ("." + frac if frac else "")
    body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


_US_PER_DAY = 86_400_000_000


def date_text(days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix ``""`` or ``" BC"``) as Postgres's ISO DateStyle prints it."""
    y, m, d = civil_from_days(days)
    if y <= 0:
        return f"{1 - y:04d}-{m:02d}-{d:02d}", " BC"
    return f"{y:04d}-{m:02d}-{d:02d}", ""


def time_text(us: int) -> str:
    s, frac = divmod(us, 1_000_000)
    h, rem = divmod(s, 3600)
    mi, se = divmod(rem, 60)
    out = f"{h:02d}:{mi:02d}:{se:02d}"
    if frac:
        out += ("." + f"{frac:06d}").rstrip("0")
    return out


def scale_to_us(unit: str) -> tuple[int, int]:
    """(multiply, divide) turning a value of ``unit`` into microseconds."""
    return {"s": (1_000_000, 1), "ms": (1000, 1), "us": (1, 1), "ns": (1, 1000)}[unit]


def timestamp_text(us: int, tz: bool, iso_t: bool = False) -> str:
    if us >= TIMESTAMP_INFINITY:
        return "infinity"
    if us <= -TIMESTAMP_INFINITY:
        return "-infinity"
    days, rest = divmod(us, _US_PER_DAY)
    date, era = date_text(days)
    sep = "T" if iso_t else " "
    zone = ("+00:00" if iso_t else "+00") if tz else ""
    return f"{date}{sep}{time_text(rest)}{zone}{era}"


def array_elem(text: str | None) -> str:
    """One element of Postgres array text (``array_out``): NULL bare, quoted when it needs to be."""
    if text is None:
        return "NULL"
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n\r\v\f'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def record_field(text: str | None) -> str:
    """One field of Postgres record text (``record_out``): NULL empty; quoted when empty or holding
    ``"``, ``\\``, ``(``, ``)``, ``,`` or white space, with ``"`` and ``\\`` doubled inside quotes."""
    if text is None:
        return ""
    if text == "" or any(c in text for c in '"\\(),') or any(c.isspace() for c in text):
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    return text


def hstore_str(text: str) -> str:
    """A key or value of hstore text (``hstore_out``): always quoted, ``"`` and ``\\`` backslash-escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_list(t: pa.DataType) -> bool:
    return cast(bool, pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


class TextColumn:
    """Prints one Arrow column's values from their storage values (:meth:`storage`): ints for
    dates, times and timestamps, a list of element storage values for a list, a tuple of field storage
    values for a struct, a list of ``(key, item)`` storage values for a map, Arrow's Python value
    otherwise. Children (elements, fields, map entries) are of the same class; subclasses override
    :meth:`float_text`."""

    def __init__(self, typ: pa.DataType):
        self.type = typ
        kind = type(self)
        self.child = kind(typ.value_type) if _is_list(typ) else None
        self.fields = (
            [(typ.field(i).name, kind(typ.field(i).type)) for i in range(typ.num_fields)]
            if pa.types.is_struct(typ)
            else None
        )
        self.entry = (kind(typ.key_type), kind(typ.item_type)) if pa.types.is_map(typ) else None

    # -- storage values: ints for dates/times/timestamps, so no datetime overflow ------------------
    def storage(self, arr: pa.Array) -> list[Any]:
        """The storage values of one Arrow array (a chunk), None for NULL."""
        t = self.type
        if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
            width = pa.int32() if (pa.types.is_date32(t) or pa.types.is_time32(t)) else pa.int64()
            return cast("list[Any]", arr.view(width).to_pylist())
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
                assert self.entry is not None  # not a list (child is None), so a map
                flat = list(zip(self.entry[0].storage(arr.keys), self.entry[1].storage(arr.items)))
            return [flat[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(arr))]
        if self.fields is not None:
            valid = arr.is_valid().to_pylist()
            cols = [c.storage(arr.field(i)) for i, (_, c) in enumerate(self.fields)]
            return [tuple(col[i] for col in cols) if valid[i] else None for i in range(len(arr))]
        return cast("list[Any]", arr.to_pylist())

    def text(self, v: Any) -> str | None:
        """Postgres's text output of one storage value (None for NULL)."""
        if v is None:
            return None
        t = self.type
        if pa.types.is_boolean(t):
            return "t" if v else "f"
        if pa.types.is_floating(t):
            return self.float_text(v, pa.types.is_float32(t) or pa.types.is_float16(t))
        if pa.types.is_decimal(t):
            return f"{Decimal(v):f}"
        if pa.types.is_timestamp(t):
            m, d = scale_to_us(t.unit)
            us = v if abs(v) >= TIMESTAMP_INFINITY else v * m // d
            return timestamp_text(us, t.tz is not None)
        if pa.types.is_date(t):
            days = v if pa.types.is_date32(t) else v // 86_400_000
            if days >= DATE_INFINITY:
                return "infinity"
            if days <= -DATE_INFINITY:
                return "-infinity"
            date, era = date_text(days)
            return date + era
        if pa.types.is_time(t):
            m, d = scale_to_us(t.unit)
            return time_text(v * m // d)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return "\\x" + bytes(v).hex()
        if self.child is not None:
            c = self.child
            nested = c.child is not None  # an inner dimension: its braces are not quoted
            return (
                "{"
                + ",".join(
                    ("NULL" if x is None else cast(str, c.text(x))) if nested else array_elem(c.text(x)) for x in v
                )
                + "}"
            )
        if self.fields is not None:
            return "(" + ",".join(record_field(c.text(x)) for (_, c), x in zip(self.fields, v)) + ")"
        if self.entry is not None:
            kc, vc = self.entry
            return ", ".join(
                f"{hstore_str(cast(str, kc.text(k)))}=>{'NULL' if x is None else hstore_str(cast(str, vc.text(x)))}"
                for k, x in v  # cast: text() is None only for None, and hstore keys are never NULL
            )
        if isinstance(v, (dict, list)):
            return json.dumps(v, default=str)
        return str(v)

    def float_text(self, v: float, single: bool) -> str:
        """The text of one float (Postgres's: :func:`float_text`)."""
        return float_text(v, single)
