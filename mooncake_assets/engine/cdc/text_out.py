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
string                      as is
==========================  ======================================================================

Sources: the Postgres manual, "Date/Time Output" (ISO style), "Floating-Point Types"
(``extra_float_digits``), "Array Value Input" (quoting). Used by the query renderer
(:mod:`mooncake_assets.engine.read.render`) and by the rebuild of an index from data files
(:mod:`mooncake_assets.engine.table.key_text`).
"""
from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pyarrow as pa

from .types import DATE_INFINITY, TIMESTAMP_INFINITY

__all__ = ["TextColumn", "float_text", "date_text", "time_text", "timestamp_text", "array_elem", "scale_to_us"]

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
            whole, frac = digits[: exp + 1].ljust(exp + 1, "0"), digits[exp + 1:]
        else:
            whole, frac = "0", "0" * (-exp - 1) + digits
        return sign + whole + ("." + frac if frac else "")
    body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


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


def date_text(days: int) -> tuple[str, str]:
    """(``YYYY-MM-DD``, era suffix ``""`` or ``" BC"``) as Postgres's ISO DateStyle prints it."""
    y, m, d = _civil(days)
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
    """One element of Postgres array text: NULL bare, quoted when it needs to be."""
    if text is None:
        return "NULL"
    if text == "" or text.upper() == "NULL" or any(c in text for c in '{},"\\ \t\n\r\v\f'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


class TextColumn:
    """Prints one Arrow column's values: :meth:`storage` gives the values to print (ints for dates, times
    and timestamps), :meth:`text` the text of one of them. Subclasses override :meth:`float_text`."""

    def __init__(self, typ: pa.DataType):
        self.type = typ
        if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
            self.child = type(self)(typ.value_type)
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
            return "{" + ",".join(array_elem(self.child.text(x)) if self.child.child is None
                                  else ("NULL" if x is None else self.child.text(x)) for x in v) + "}"
        if isinstance(v, (dict, list)):
            return json.dumps(v, default=str)
        return str(v)

    def float_text(self, v: float, single: bool) -> str:
        """The text of one float (Postgres's: :func:`float_text`)."""
        return float_text(v, single)
