"""Column-wise decoding of Postgres's text output into Arrow values.

Values arrive from Postgres in its **text output format** (pgoutput tuple data in text mode, and
``COPY … (FORMAT csv)`` for the initial copy). :func:`decode_text_columns` turns them into Arrow
column by column: one ``pa.array`` of strings per column, then vectorized ``pyarrow.compute`` casts,
to the Arrow types of :mod:`..pg.schema` (each column's :class:`~..pg.schema.ColumnSpec`). The sessions that
produce the text (the walsender of :class:`~.stream.ReplicationConnection` and the copy transaction
of :func:`~.copy.initial_copy`) pin the output settings the decoder relies on
(``engine/pg/conninfo.py``: ``OUTPUT_SETTINGS``): ``DateStyle=ISO``, ``TimeZone=UTC``,
``IntervalStyle=postgres``, ``bytea_output=hex``, ``extra_float_digits=3``, ``lc_monetary=C``,
``search_path=pg_catalog`` (reg* types print schema-qualified names). Values that cannot be
represented raise :class:`~.schema.ColumnValueError` (a ``ValueError``) naming the column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..pg.schema import DATE_INFINITY, MONEY, TIMESTAMP_INFINITY, ColumnSpec, ColumnValueError

__all__ = ["decode_text_columns", "decode_text_column", "civil_from_days", "ewkb_srid_suspect"]


# -- decoding -----------------------------------------------------------------------------------------


def decode_text_columns(
    columns: Sequence[ColumnSpec], data: Sequence[Any], *, column_major: bool = False
) -> pa.RecordBatch:
    """Decode Postgres text-format values into one RecordBatch (schema: ``TableSchema.arrow_schema``
    of these columns, without metadata).

    ``data``: row-major (``[[v_col0, v_col1, …], …]``, the default) or, with ``column_major=True``,
    one sequence per column (``[[v_row0, v_row1, …], …]``, or a ``pa.Array``/``pa.ChunkedArray`` of
    strings per column). A value is ``str``, UTF-8 ``bytes`` (as pgoutput's TupleData carries them), or
    ``None`` for SQL NULL.

    Conversion is vectorized per column (``pyarrow.compute``); the only per-value Python is the
    fallback for rare dates/timestamps Arrow's parser rejects (BC, ``infinity``, years > 9999,
    second-precision zone offsets), taken only when the vectorized cast fails.

    Raises ``ValueError`` naming the column for a value that cannot be represented or parsed.
    """
    if not column_major:
        if len(data) == 0:
            cols_data: list[Any] = [[] for _ in columns]
        else:
            n = len(columns)
            if any(len(r) != n for r in data):
                bad = next(len(r) for r in data if len(r) != n)
                raise ValueError(f"a row has {bad} values, expected {n} columns")
            cols_data = [[r[i] for r in data] for i in range(n)]
    else:
        cols_data = list(data)
        if len(cols_data) != len(columns):
            raise ValueError(f"got {len(cols_data)} columns of values, expected {len(columns)}")
    arrays, errors = [], []
    for spec, vals in zip(columns, cols_data):  # every column that fails is named, not just the first
        try:
            arrays.append(decode_text_column(spec, vals))
        except ValueError as e:
            errors.append((spec.name, str(e)))
    if errors:
        raise ColumnValueError("; ".join(m for _, m in errors), [c for c, _ in errors])
    schema = pa.schema([pa.field(c.name, c.arrow_type, nullable=not c.not_null) for c in columns])
    if not arrays:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _as_string_array(values: Any, spec: ColumnSpec) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        if values.type == pa.string():
            return values
        if values.type in (pa.large_string(), pa.binary(), pa.large_binary(), pa.null()):
            try:
                return values.cast(pa.string())
            except pa.ArrowInvalid as e:
                raise ValueError(f"column {spec.name}: value is not valid UTF-8 ({e})") from None
        raise ValueError(f"column {spec.name}: expected text values, got an Arrow {values.type} array")
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"column {spec.name}: value is not valid UTF-8 text ({e})") from None


def decode_text_column(spec: ColumnSpec, values: Any) -> pa.Array:
    """Decode one column of Postgres text values (sequence of ``str``/``bytes``/``None`` or a string
    ``pa.Array``) to ``spec.arrow_type``. Raises ``ValueError`` naming the column on bad values."""
    arr = _as_string_array(values, spec)
    t = spec.arrow_type
    try:
        if spec.kind == "composite":
            return _decode_composite(arr, spec)
        if spec.kind == "hstore":
            return _decode_hstore(arr, spec)
        if spec.kind == "wkb":
            return _decode_wkb(arr, spec)
        if pa.types.is_string(t):
            return arr
        if pa.types.is_boolean(t):
            return _decode_bool(arr, spec)
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return _cast(arr, t, spec)
        if pa.types.is_list(t):
            return _decode_array(arr, spec)
        if pa.types.is_decimal(t):
            if spec.type_oid == MONEY:  # '-$1,234.56' (lc_monetary=C) -> '-1234.56'
                arr = pc.replace_substring(pc.replace_substring(arr, "$", ""), ",", "")
            return _decode_decimal(arr, t, spec)
        if pa.types.is_binary(t):
            return _decode_bytea(arr, spec)
        if pa.types.is_date32(t):
            return _decode_date(arr, spec)
        if pa.types.is_timestamp(t):
            return _decode_timestamp(arr, t, spec)
        if pa.types.is_time64(t):
            return _decode_time(arr, spec)
    except ValueError:
        raise
    except pa.ArrowException as e:  # defensive: a cast we did not anticipate
        raise ValueError(f"column {spec.name} ({spec.type_name}): {e}") from None
    raise ValueError(f"column {spec.name}: no decoder for Arrow type {t}")


def _bad_value(arr: pa.Array, ok: pa.Array | None) -> str:
    """First value of ``arr`` where ``ok`` is false (for messages)."""
    if ok is None:
        return "?"
    idx = pc.index(ok, False).as_py()
    return repr(arr[idx].as_py()) if idx is not None and idx >= 0 else "?"


def _cast(arr: pa.Array, t: pa.DataType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid as e:
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot decode a value as {t}: {e}") from None


def _decode_bool(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    is_t = pc.equal(arr, "t")
    ok = pc.or_(is_t, pc.equal(arr, "f"))
    if pc.all(ok).as_py() is False:
        raise ValueError(f"column {spec.name} (boolean): value {_bad_value(arr, ok)} is not 't' or 'f'")
    return is_t


def _decode_decimal(arr: pa.Array, t: pa.DataType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid:
        for v in arr.to_pylist():
            if v is None:
                continue
            try:
                pc.cast(pa.array([v]), t)
            except pa.ArrowInvalid as e:
                why = (
                    f"{spec.type_name} is mirrored as {t}, which has no NaN (unconstrained numeric is "
                    "mirrored exactly as text; see docs/types.md)"
                    if v == "NaN"
                    else str(e)
                )
                raise ValueError(
                    f"column {spec.name} ({spec.type_name}): value {v!r} cannot be represented as {t} ({why})"
                ) from None
        raise


_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


def _unhex(arr: pa.Array, skip: int) -> tuple[pa.Array, int | None]:
    """Hex texts (a string array; each value's first ``skip`` characters are not hex, e.g. bytea's
    ``\\x``) -> the bytes they spell, vectorized over the array's offsets/data buffers with numpy.

    Returns ``(binary array, None)``, NULLs kept; or ``(None, i)`` where ``i`` is the index of the
    first value that is shorter than ``skip``, has an odd number of hex digits or a non-hex digit.
    Both cases of hex digits are accepted."""
    n = len(arr)
    if n == 0:
        return pa.array([], pa.binary()), None
    validity, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.zeros(0, np.uint8)
    valid = np.ones(n, dtype=bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    hex_len = np.where(valid, lengths - skip, 0)
    bad = (hex_len < 0) | ((hex_len & 1) == 1)
    if bad.any():
        return None, int(np.flatnonzero(bad)[0])
    total = int(hex_len.sum())
    out_starts = np.concatenate(([0], np.cumsum(hex_len)[:-1]))
    src = np.repeat(starts + skip - out_starts, hex_len) + np.arange(total, dtype=np.int64)
    nib = _HEX_LUT[data[src]]
    if total and nib.max() == 255:
        pos = int(np.flatnonzero(nib == 255)[0])
        return None, int(np.searchsorted(out_starts, pos, side="right") - 1)
    out = (nib[0::2] << 4) | nib[1::2]
    new_offsets = np.concatenate(([0], np.cumsum(hex_len // 2))).astype(np.int32)
    if validity is not None and arr.offset:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(
        pa.binary(),
        n,
        [validity, pa.py_buffer(new_offsets.tobytes()), pa.py_buffer(out.tobytes())],
        null_count=arr.null_count,
    ), None


def _decode_bytea(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """``'\\x0a1b…'`` (``bytea_output = hex``) → bytes, vectorized (:func:`_unhex`)."""
    n = len(arr)
    if n == 0:
        return pa.array([], pa.binary())
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.zeros(0, np.uint8)
    valid = np.ones(n, dtype=bool) if arr.null_count == 0 else arr.is_valid().to_numpy(zero_copy_only=False)
    starts, lengths = offsets[:-1], np.diff(offsets)
    vstarts, vlens = starts[valid], lengths[valid]
    bad = (vlens < 2) | ((vlens & 1) == 1)
    if not bad.any() and len(vstarts):
        bad = (data[vstarts] != ord("\\")) | (data[vstarts + 1] != ord("x"))
    if bad.any():
        i = int(np.flatnonzero(valid)[np.flatnonzero(bad)[0]])
        raise ValueError(
            f"column {spec.name} (bytea): value {arr[i].as_py()[:40]!r} is not in hex "
            "format ('\\x…'); the session needs bytea_output=hex"
        )
    out, bad_at = _unhex(arr, 2)
    if out is None:
        raise ValueError(f"column {spec.name} (bytea): value {arr[bad_at].as_py()[:40]!r} has a non-hex digit")
    return out


# Fallback parsing of dates/timestamps (proleptic Gregorian, any year, BC, infinity) -------------

_TS_RE = re.compile(
    r"^(\d{4,})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?$"
)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    y -= m <= 2
    era = y // 400  # floor division (the C original truncates and adjusts)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(days: int) -> tuple[int, int, int]:
    """Proleptic Gregorian ``(year, month, day)`` of ``days`` since 1970-01-01, astronomical years (year
    0 is 1 BC); the inverse of :func:`_days_from_civil`, any year, integer arithmetic only. Both are
    H. Hinnant's ``days_from_civil``/``civil_from_days`` ("chrono-Compatible Low-Level Date
    Algorithms") with floor division for Python."""
    z = days + 719_468
    era = z // 146_097  # floor division (the C original truncates and adjusts)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)
    return y, m, d


def _parse_rare(value: str, spec: ColumnSpec, unit: str) -> int:
    """One date ('D', days) or timestamp ('us') in Postgres ISO output → int since the Unix epoch."""
    inf = DATE_INFINITY if unit == "D" else TIMESTAMP_INFINITY
    if value == "infinity":
        return inf
    if value == "-infinity":
        return -inf
    m = _TS_RE.match(value)
    if not m:
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse {value!r}")
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    if m[12]:
        y = 1 - y  # 1 BC is year 0
    days = _days_from_civil(y, mo, d)
    if unit == "D":
        if not -DATE_INFINITY < days < DATE_INFINITY:
            raise ValueError(f"column {spec.name} ({spec.type_name}): {value!r} is outside date32's range")
        return days
    secs = days * 86400 + int(m[4] or 0) * 3600 + int(m[5] or 0) * 60 + int(m[6] or 0)
    if m[8]:
        off = int(m[9]) * 3600 + int(m[10] or 0) * 60 + int(m[11] or 0)
        secs -= off if m[8] == "+" else -off
    us = secs * 1_000_000 + int((m[7] or "0").ljust(6, "0"))
    if not -TIMESTAMP_INFINITY < us < TIMESTAMP_INFINITY:
        raise ValueError(
            f"column {spec.name} ({spec.type_name}): {value!r} is outside the range of "
            "Arrow timestamp[us] (int64 microseconds since 1970)"
        )
    return us


def _decode_date(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, pa.date32())
    except pa.ArrowInvalid:
        pass  # rare values: BC, infinity, years > 9999
    vals = [None if v is None else _parse_rare(v, spec, "D") for v in arr.to_pylist()]
    return pa.array(vals, pa.int32()).view(pa.date32())


def _decode_timestamp(arr: pa.Array, t: pa.TimestampType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid:
        pass  # rare values: BC, infinity, years > 9999, LMT offsets with seconds
    vals = [None if v is None else _parse_rare(v, spec, "us") for v in arr.to_pylist()]
    return pa.array(vals, pa.int64()).view(t)


def _decode_time(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    joined = pc.binary_join_element_wise("1970-01-01 ", arr, "")
    try:
        ts = pc.cast(joined, pa.timestamp("us"))
    except pa.ArrowInvalid:
        bad = next(
            (
                v
                for v in arr.to_pylist()
                if v is not None and not re.match(r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?$", v)
            ),
            None,
        )
        if bad is not None and bad.startswith("24:00:00"):
            raise ValueError(
                f"column {spec.name} ({spec.type_name}): value {bad!r} cannot be represented "
                "as Arrow time64 (its range is [00:00, 24:00))"
            ) from None
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse time value {bad!r}") from None
    return pc.cast(ts, pa.time64("us"))


# Arrays -------------------------------------------------------------------------------------------
#
# Postgres's array text output (``array_out``): ``{e1,e2,…}``, nested braces per dimension
# (``{{1,2},{3,4}}``), an optional ``[lo:hi]…=`` prefix when a lower bound is not 1, unquoted ``NULL``
# for a NULL element; an element is double-quoted when it is empty, equals ``NULL`` (any case), or
# holds braces, quotes, backslashes, the delimiter or white space, and inside quotes ``"`` and ``\``
# are backslash-escaped. The delimiter is ``,`` for every type we map (only ``box`` uses ``;``).

_ARRAY_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|([{},])|([^{},"]+)', re.S)
_UNESCAPE = re.compile(r"\\(.)", re.S)
_ARRAY_TOKENS: dict[str, re.Pattern[str]] = {",": _ARRAY_TOKEN}

#: one array value parsed (:func:`_parse_array_text`): per dimension a list, element texts (None for
#: NULL) at the innermost one
_ArrayNode: TypeAlias = list["_ArrayNode | str | None"]


def _array_token(delim: str) -> re.Pattern[str]:
    if delim not in _ARRAY_TOKENS:
        d = re.escape(delim)
        _ARRAY_TOKENS[delim] = re.compile(r'"((?:[^"\\]|\\.)*)"|([{}]|' + d + r")|([^{}" + d + r'"]+)', re.S)
    return _ARRAY_TOKENS[delim]


def _parse_array_text(text: str, spec: ColumnSpec) -> _ArrayNode:
    """One array value's text -> nested Python lists of element texts (None for NULL)."""
    if text.startswith("["):
        raise ValueError(
            f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has explicit "
            "lower bounds, which a list cannot keep"
        )
    stack: list[_ArrayNode] = []
    root: _ArrayNode | None = None
    delim = spec.delim or ","
    for m in _array_token(delim).finditer(text):
        quoted, punct, bare = m.group(1), m.group(2), m.group(3)
        if punct == "{":
            node: _ArrayNode = []
            if stack:
                stack[-1].append(node)
            elif root is not None:
                break  # text after the outer array
            else:
                root = node
            stack.append(node)
        elif punct == "}":
            if not stack:
                break
            stack.pop()
        elif punct == delim:
            continue
        elif not stack:
            break
        elif quoted is not None:
            stack[-1].append(_UNESCAPE.sub(r"\1", quoted))
        else:
            stack[-1].append(None if bare == "NULL" else bare)
    else:
        if root is not None and not stack:
            return root
    raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse array value {text[:60]!r}")


def _decode_array(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """Array texts -> ``list<…>`` nested ``spec.ndims`` times; elements decoded column-wise (one
    vectorized :func:`decode_text_column` over every element of every value)."""
    nd = spec.ndims
    element = spec.element
    assert element is not None  # an array column's spec carries its element's (catalog._TypeResolver)
    offsets: list[list[int]] = [[0] for _ in range(nd)]
    flat: list[str | None] = []
    valid: list[bool] = []

    def add(node: _ArrayNode, level: int, text: str) -> None:
        if level == nd - 1:
            leaves = [x for x in node if not isinstance(x, list)]
            if len(leaves) != len(node):
                raise ValueError(
                    f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has more "
                    f"than the column's {nd} dimension(s)"
                )
            flat.extend(leaves)
        else:
            for child in node:
                if not isinstance(child, list):
                    raise ValueError(
                        f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has "
                        f"fewer than the column's {nd} dimensions"
                    )
                add(child, level + 1, text)
        offsets[level].append(offsets[level][-1] + len(node))

    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            offsets[0].append(offsets[0][-1])
            continue
        valid.append(True)
        add(_parse_array_text(v, spec), 0, v)
    out: pa.Array = decode_text_column(element, flat)
    types = [spec.arrow_type]
    for _ in range(nd - 1):
        types.append(types[-1].value_type)
    for level in reversed(range(nd)):
        mask = pa.array([not x for x in valid]) if level == 0 and not all(valid) else None
        out = pa.ListArray.from_arrays(pa.array(offsets[level], pa.int32()), out, type=types[level], mask=mask)
    return out


# Composite types, hstore, PostGIS ---------------------------------------------------------------------
#
# ``record_out``: ``(f1,f2,…)``; a NULL field is empty; a field is double-quoted when it is empty or
# holds ``"``, ``\``, ``(``, ``)``, ``,`` or white space, and inside quotes ``"`` and ``\`` are doubled.
# ``hstore_out``: ``"k"=>"v", "k2"=>NULL``; keys and values are always quoted, ``"`` and ``\``
# backslash-escaped. PostGIS ``geometry_out``/``geography_out``: hex EWKB (PostGIS's extended WKB:
# type flags 0x80000000 Z, 0x40000000 M, 0x20000000 SRID follows).

_RECORD_FIELD = re.compile(r'"((?:[^"\\]|\\.|"")*)"|([^,()"\\]*)', re.S)
_RECORD_UNESCAPE = re.compile(r'\\(.)|""', re.S)


def _parse_record_text(text: str, n: int, spec: ColumnSpec) -> list[str | None]:
    """One composite value's text -> its ``n`` field texts (None for NULL)."""
    if len(text) < 2 or text[0] != "(" or text[-1] != ")":
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse composite value {text[:60]!r}")
    out: list[str | None] = []
    pos, end = 1, len(text) - 1
    while True:
        m = _RECORD_FIELD.match(text, pos)
        assert m is not None  # its unquoted alternative matches the empty string
        quoted, bare = m.group(1), m.group(2)
        if quoted is not None:
            out.append(_RECORD_UNESCAPE.sub(lambda x: x.group(1) if x.group(1) is not None else '"', quoted))
        else:
            out.append(bare if bare else None)
        pos = m.end()
        if pos >= end:
            break
        if text[pos] != ",":
            raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse composite value {text[:60]!r}")
        pos += 1
    if len(out) != n:
        raise ValueError(
            f"column {spec.name} ({spec.type_name}): composite value {text[:60]!r} has {len(out)} "
            f"fields, the type has {n} (was the type altered? that is not followed)"
        )
    return out


def _decode_composite(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """Composite texts -> ``struct``; each field decoded column-wise by its own decoder."""
    fields = spec.fields
    assert fields is not None  # a composite column's spec carries its fields' (catalog._TypeResolver)
    n = len(fields)
    cols: list[list[str | None]] = [[] for _ in range(n)]
    valid: list[bool] = []
    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            for c in cols:
                c.append(None)
            continue
        valid.append(True)
        for c, x in zip(cols, _parse_record_text(v, n, spec)):
            c.append(x)
    children = [decode_text_column(f, c) for f, c in zip(fields, cols)]
    mask = pa.array([not x for x in valid]) if not all(valid) else None
    return pa.StructArray.from_arrays(children, fields=list(spec.arrow_type), mask=mask)


_HSTORE_PAIR = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*=>\s*(?:"((?:[^"\\]|\\.)*)"|(NULL))\s*(,|$)', re.S)


def _decode_hstore(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """hstore texts -> ``map<string, string>`` (a NULL value stays NULL; keys in Postgres's order)."""
    offsets, keys, vals, valid = [0], [], [], []
    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            offsets.append(offsets[-1])
            continue
        valid.append(True)
        pos = 0
        while pos < len(v):
            m = _HSTORE_PAIR.match(v, pos)
            if m is None or m.end() == pos:
                if v[pos:].strip() == "":
                    break
                raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse hstore value {v[:60]!r}")
            keys.append(_UNESCAPE.sub(r"\1", m.group(1)))
            vals.append(None if m.group(3) else _UNESCAPE.sub(r"\1", m.group(2)))
            pos = m.end()
        offsets.append(len(keys))
    mask = pa.array([not x for x in valid]) if not all(valid) else None
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()),
        pa.array(keys, pa.string()),
        pa.array(vals, pa.string()),
        type=spec.arrow_type,
        mask=mask,
    )


_ISO_DIMS = {(False, False): 0, (True, False): 1000, (False, True): 2000, (True, True): 3000}


def _ewkb_walk(b: bytes, pos: int, out: bytearray, spec: ColumnSpec) -> int:
    """Copy one EWKB geometry at ``b[pos:]`` into ``out`` as ISO WKB; returns the end position.

    The layout is WKB's (OGC 06-103r4, Simple Feature Access part 1, §8.2 "Well-known Binary
    Representation for Geometry"; ISO/IEC 13249-3 for the Z/M codes): a byte order (1 little, 0 big
    endian), a uint32 geometry type, then the coordinates (points: ``dims`` doubles; linestrings: a
    count then points; polygons: rings of points; multi*/collections: a count then whole geometries).
    PostGIS's EWKB (liblwgeom's ``lwin_wkb.c``/``lwout_wkb.c``) puts flags in the type's top bits:
    ``0x80000000`` has Z, ``0x40000000`` has M, ``0x20000000`` an SRID (uint32) follows the type. ISO
    WKB codes the same as ``base + 1000`` (Z), ``+ 2000`` (M), ``+ 3000`` (ZM) and carries no SRID; the
    nested geometries of a collection are rewritten the same way. Raises ``ValueError`` for a geometry
    type it does not know, ``IndexError``/``struct.error`` for a truncated value."""
    import struct

    bo = b[pos]
    f = "<" if bo == 1 else ">"
    (t,) = struct.unpack_from(f + "I", b, pos + 1)
    pos += 5
    if t & 0x20000000:
        pos += 4
    z, m = bool(t & 0x80000000), bool(t & 0x40000000)
    base = t & 0x0FFFFFFF
    if base >= 1000:  # already ISO-coded
        d, base = divmod(base, 1000)
        z, m = z or d in (1, 3), m or d in (2, 3)
    dims = 2 + z + m
    out += bytes([bo]) + struct.pack(f + "I", base + _ISO_DIMS[(z, m)])
    if base == 1:  # point
        n = dims * 8
    elif base in (2, 8):  # linestring, circularstring
        (k,) = struct.unpack_from(f + "I", b, pos)
        n = 4 + k * dims * 8
    elif base in (3, 17):  # polygon, triangle: rings of points
        (rings,) = struct.unpack_from(f + "I", b, pos)
        p = pos + 4
        for _ in range(rings):
            (k,) = struct.unpack_from(f + "I", b, p)
            p += 4 + k * dims * 8
        n = p - pos
    elif base in (4, 5, 6, 7, 9, 10, 11, 12, 15, 16):  # collections of geometries
        (k,) = struct.unpack_from(f + "I", b, pos)
        out += b[pos : pos + 4]
        pos += 4
        for _ in range(k):
            pos = _ewkb_walk(b, pos, out, spec)
        return pos
    else:
        raise ValueError(f"column {spec.name} ({spec.type_name}): EWKB geometry type {base} is not known")
    out += b[pos : pos + n]
    return pos + n


def ewkb_srid_suspect(srid: int) -> Callable[[str], bool]:
    """A cheap test of one hex EWKB text (PostGIS ``geometry_out``) for a column whose values must have
    SRID ``srid`` (``ColumnSpec.srid``): a callable ``str -> bool``, False only when the text's header
    is little-endian and carries exactly that SRID (``srid`` 0: no SRID flag), the way
    :func:`_decode_wkb` decides. True means "decode it to know" (the buffered row is then decoded at once,
    and a wrong SRID raises there): it never rejects a value itself."""
    want = srid.to_bytes(4, "little").hex()

    def suspect(v: str) -> bool:
        if len(v) < 10 or not v.startswith("01"):
            return True
        try:
            has_srid = bool(int(v[8:10], 16) & 0x20)  # the type's top byte (little-endian: its last)
        except ValueError:
            return True
        return has_srid != bool(srid) or (bool(srid) and v[10:18].lower() != want)

    return suspect


def _decode_wkb(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """PostGIS hex EWKB texts (``geometry_out``/``geography_out``) -> ISO WKB bytes (what
    ``ST_AsBinary`` returns; OGC 06-103r4 §8.2 and ISO/IEC 13249-3, see :func:`_ewkb_walk` for the
    EWKB flags). The hex is decoded for the whole array at once (:func:`_unhex`), the headers one value
    at a time. Every value must have the column's SRID (``spec.srid``: the declared one, else 0 for
    geometry, 4326 for geography): a WKB holds none, so another one would be lost — that raises
    ``ValueError`` naming the column, as does a value that is not hex EWKB."""
    import struct

    raw, bad = _unhex(arr, 0)
    if raw is None:
        raise ValueError(f"column {spec.name} ({spec.type_name}): value {arr[bad].as_py()[:40]!r} is not hex EWKB")
    out: list[bytes | None] = []
    for i, b in enumerate(raw.to_pylist()):
        if b is None:
            out.append(None)
            continue
        try:
            f = "<" if b[0] == 1 else ">"
            (t,) = struct.unpack_from(f + "I", b, 1)
            srid = struct.unpack_from(f + "I", b, 5)[0] if t & 0x20000000 else 0
        except (IndexError, struct.error):
            raise ValueError(
                f"column {spec.name} ({spec.type_name}): value {arr[i].as_py()[:40]!r} is not hex EWKB"
            ) from None
        if srid != spec.srid:
            raise ValueError(
                f"column {spec.name} ({spec.type_name}): a value has SRID {srid}, the column's "
                f"is {spec.srid} and WKB carries none (declare the column's SRID, e.g. "
                f"geometry(Geometry,{srid}), or mirror it as hex EWKB text with --column-type "
                f"{spec.name}=text)"
            )
        if not t & 0xC0000000 and (t & 0x0FFFFFFF) < 1000:  # 2D: only the top header differs
            out.append(b[:1] + struct.pack(f + "I", t & 0x0FFFFFFF) + b[9 if t & 0x20000000 else 5 :])
            continue
        buf = bytearray()
        try:
            end = _ewkb_walk(b, 0, buf, spec)
        except (IndexError, struct.error):
            raise ValueError(
                f"column {spec.name} ({spec.type_name}): value {arr[i].as_py()[:40]!r} is not valid EWKB"
            ) from None
        if end != len(b):
            raise ValueError(f"column {spec.name} ({spec.type_name}): value {arr[i].as_py()[:40]!r} is not valid EWKB")
        out.append(bytes(buf))
    return pa.array(out, pa.binary())
