"""Parameters sent in binary format (Bind's format code 1), as Python values.

psycopg sends ints, floats, booleans, bytes, dates and datetimes in binary by default. The layouts
are those of the types' binary send/receive functions in Postgres (big-endian; dates as days and
timestamps as microseconds since 2000-01-01; numeric as base-10000 digits with weight, sign and
display scale; the manual's "Message Data Types" and the ``*send``/``*recv`` functions of
``src/backend/utils/adt``). A type not listed is refused with ``0A000``.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from decimal import Decimal
from typing import Any

from .catalog import SqlError

PG_EPOCH = dt.datetime(2000, 1, 1)
PG_EPOCH_DATE = dt.date(2000, 1, 1)
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def _numeric(b: bytes) -> Decimal | str:
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", b)
    if sign == 0xC000:
        return "NaN"
    if sign in (0xD000, 0xF000):
        return "Infinity" if sign == 0xD000 else "-Infinity"
    digits = struct.unpack_from(f"!{ndigits}H", b, 8)
    value = Decimal(0)
    for i, d in enumerate(digits):
        value += Decimal(d).scaleb(4 * (weight - i))
    if sign == 0x4000:
        value = -value
    return value.quantize(Decimal(1).scaleb(-dscale)) if dscale else value.to_integral_value()


def _date(b: bytes) -> dt.date | str:
    (days,) = struct.unpack("!i", b)
    if days == INT32_MAX:
        return "infinity"
    if days == -INT32_MAX - 1:
        return "-infinity"
    return PG_EPOCH_DATE + dt.timedelta(days=days)


def _timestamp(b: bytes, tz: bool) -> dt.datetime | str:
    (us,) = struct.unpack("!q", b)
    if us == INT64_MAX:
        return "infinity"
    if us == -INT64_MAX - 1:
        return "-infinity"
    t = PG_EPOCH + dt.timedelta(microseconds=us)
    return t.replace(tzinfo=dt.UTC) if tz else t


DECODERS: dict[int, Any] = {
    16: lambda b: b != b"\x00",
    17: bytes,
    20: lambda b: struct.unpack("!q", b)[0],
    21: lambda b: struct.unpack("!h", b)[0],
    23: lambda b: struct.unpack("!i", b)[0],
    26: lambda b: struct.unpack("!I", b)[0],
    700: lambda b: struct.unpack("!f", b)[0],
    701: lambda b: struct.unpack("!d", b)[0],
    25: lambda b: b.decode(),
    1043: lambda b: b.decode(),
    0: lambda b: b.decode(),
    1700: _numeric,
    1082: _date,
    1083: lambda b: (dt.datetime.min + dt.timedelta(microseconds=struct.unpack("!q", b)[0])).time(),
    1114: lambda b: _timestamp(b, False),
    1184: lambda b: _timestamp(b, True),
    2950: lambda b: str(uuid.UUID(bytes=bytes(b))),
}


def decode(oid: int, data: bytes) -> Any:
    """The Python value of one binary-format parameter of type ``oid``."""
    f = DECODERS.get(oid)
    if f is None:
        raise SqlError("0A000", f"binary format for parameters of type OID {oid} is not supported yet: send it as text")
    return f(data)
