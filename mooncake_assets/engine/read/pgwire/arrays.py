"""Array parameters (``WHERE id = ANY(%s)`` with a Python list): Postgres's array text and binary
input forms, as Python lists for DuckDB.

Sources: the PostgreSQL manual, "Arrays / Array Value Input" (text: ``{1,2,NULL}``, elements
double-quoted when they hold ``{}",\\`` or spaces, backslash escapes inside quotes, unquoted
``NULL`` is a null, nested braces for more dimensions) and ``array_send``/``array_recv``
(``src/backend/utils/adt/arrayfuncs.c``; binary: Int32 ndim, Int32 has-nulls flag, Int32 element
OID, per dimension Int32 length and Int32 lower bound, then per element an Int32 length, -1 for
NULL, and the element's binary form).

psycopg sends a list of ints/floats/bools with its array type (``int2[]`` 1005, ``int8[]`` 1016…)
and a list of strings untyped (OID 0) in text form: such a parameter is read as a ``text[]`` when
the statement uses it as ``ANY($n)``/``ALL($n)``/``SOME($n)``.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from .catalog import SqlError

#: array type OID -> element type OID (pg_type.dat ``typelem``)
ELEMENT_OF = {
    1000: 16,
    1001: 17,
    1005: 21,
    1007: 23,
    1016: 20,
    1021: 700,
    1022: 701,
    1231: 1700,
    1009: 25,
    1015: 1043,
    1182: 1082,
    1183: 1083,
    1115: 1114,
    1185: 1184,
    2951: 2950,
    1028: 26,
}


def uses_as_array(sql: str, n: int) -> bool:
    """True when ``$n`` appears in ``sql`` as ``ANY($n)``, ``ALL($n)`` or ``SOME($n)``."""
    return re.search(rf"\b(?:ANY|ALL|SOME)\s*\(\s*\${n}(?!\d)\s*\)", sql, re.I) is not None


def parse_text(s: str) -> list[Any]:
    """The elements of an array's text form (strings; None for NULL; a list per nested dimension).
    ``SqlError 22P02`` for a malformed one."""
    s = s.strip()
    if s.startswith("[") and "=" in s:
        s = s[s.index("=") + 1 :].strip()  # explicit bounds ("[0:1]={a,b}") are dropped
    value, end = _parse(s, 0)
    if s[end:].strip():
        raise SqlError("22P02", f'malformed array literal: "{s}"')
    return value


def _parse(s: str, i: int) -> tuple[list[Any], int]:
    if i >= len(s) or s[i] != "{":
        raise SqlError("22P02", f'malformed array literal: "{s}"', 'Array value must start with "{".')
    out: list[Any] = []
    i += 1
    while i < len(s):
        c = s[i]
        if c == "}":
            return out, i + 1
        if c in ", \t\n":
            i += 1
        elif c == "{":
            sub, i = _parse(s, i)
            out.append(sub)
        elif c == '"':
            buf, i = [], i + 1
            while i < len(s) and s[i] != '"':
                if s[i] == "\\" and i + 1 < len(s):
                    i += 1
                buf.append(s[i])
                i += 1
            out.append("".join(buf))
            i += 1
        else:
            j = i
            while j < len(s) and s[j] not in ",}":
                j += 1
            word = s[i:j].strip()
            out.append(None if word.upper() == "NULL" else word)
            i = j
    raise SqlError("22P02", f'malformed array literal: "{s}"')


def decode_binary(data: bytes, element: Any) -> list[Any]:
    """A binary-format array (module docstring) as nested lists; ``element(oid, bytes)`` decodes one
    element."""
    ndim, _, elem_oid = struct.unpack_from("!iii", data)
    dims = [struct.unpack_from("!ii", data, 12 + 8 * k)[0] for k in range(ndim)]
    pos = 12 + 8 * ndim
    flat: list[Any] = []
    for _ in range(_product(dims)):
        (n,) = struct.unpack_from("!i", data, pos)
        pos += 4
        if n < 0:
            flat.append(None)
        else:
            flat.append(element(elem_oid, data[pos : pos + n]))
            pos += n
    return _nest(flat, dims) if dims else []


def _product(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out if dims else 0


def _nest(flat: list[Any], dims: list[int]) -> list[Any]:
    if len(dims) == 1:
        return flat
    step = _product(dims[1:])
    return [_nest(flat[k * step : (k + 1) * step], dims[1:]) for k in range(dims[0])]


def convert(values: list[Any], f: Any) -> list[Any]:
    """``values`` (nested lists of strings/None) with ``f`` applied to each non-null element."""
    return [convert(v, f) if isinstance(v, list) else (None if v is None else f(v)) for v in values]


def dimensions(value: list[Any] | None) -> int:
    """How many dimensions a (nested) list has: 1 for a flat or empty one (or None)."""
    if not value:
        return 1
    return 1 + max((dimensions(v) for v in value if isinstance(v, list)), default=0)
