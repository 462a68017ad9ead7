"""PostgreSQL frontend/backend protocol 3.0: message framing (both directions).

Source: the PostgreSQL manual, chapter "Frontend/Backend Protocol", sections "Message Formats" and
"Message Data Types". Every message after the startup packet is one type byte, an ``Int32`` length
that counts itself but not the type byte, then the body. The startup packet, ``SSLRequest``,
``GSSENCRequest`` and ``CancelRequest`` have no type byte: an ``Int32`` length, then an ``Int32``
code (protocol version or request code). All integers are big-endian; strings are NUL-terminated
and UTF-8 here (``client_encoding`` is always ``UTF8``).

The server builds backend messages with the ``*_msg`` functions (each returns the framed bytes)
and reads frontend messages with :class:`Reader` (one per connection, over a socket file).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

PROTOCOL_3_0 = 196608  # 3 << 16 | 0
SSL_REQUEST = 80877103  # 1234 << 16 | 5679
GSSENC_REQUEST = 80877104  # 1234 << 16 | 5680
CANCEL_REQUEST = 80877102  # 1234 << 16 | 5678
MAX_STARTUP = 10_000  # a startup packet longer than this is refused (the server's own limit)
MAX_MESSAGE = 1 << 30  # a frontend message longer than 1 GiB is refused


class ProtocolError(Exception):
    """The peer broke the framing (bad length, unknown startup code, truncated message): the
    connection is closed after an ``08P01`` (protocol_violation) ErrorResponse when one can be sent."""


class ConnectionClosed(Exception):
    """The peer closed the connection (EOF where a message should start)."""


@dataclass
class Startup:
    """A packet without a type byte: ``kind`` is ``startup`` (``params``: user, database, options…),
    ``ssl``, ``gssenc`` or ``cancel`` (``pid``/``key`` of the session to cancel)."""

    kind: str
    params: dict[str, str]
    pid: int = 0
    key: int = 0


def _read_exact(f: BinaryIO, n: int) -> bytes:
    buf = f.read(n)
    if buf is None or len(buf) < n:
        if not buf:
            raise ConnectionClosed()
        raise ProtocolError(f"connection closed in the middle of a message ({len(buf)} of {n} bytes)")
    return buf


def read_startup(f: BinaryIO) -> Startup:
    """Read one untyped packet ("Message Flow / Start-up"): StartupMessage, SSLRequest, GSSENCRequest
    or CancelRequest. ``ProtocolError`` for another protocol version or a bad length."""
    (length,) = struct.unpack("!i", _read_exact(f, 4))
    if length < 8 or length > MAX_STARTUP:
        raise ProtocolError(f"invalid startup packet length {length}")
    body = _read_exact(f, length - 4)
    (code,) = struct.unpack("!i", body[:4])
    if code == SSL_REQUEST:
        return Startup("ssl", {})
    if code == GSSENC_REQUEST:
        return Startup("gssenc", {})
    if code == CANCEL_REQUEST:
        if len(body) != 12:
            raise ProtocolError("invalid CancelRequest length")
        pid, key = struct.unpack("!ii", body[4:12])
        return Startup("cancel", {}, pid, key)
    if code >> 16 != 3:
        raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: server supports 3.0")
    parts = body[4:].split(b"\x00")
    params: dict[str, str] = {}
    for i in range(0, len(parts) - 1, 2):
        if not parts[i]:
            break
        params[parts[i].decode()] = parts[i + 1].decode()
    return Startup("startup", params)


def read_message(f: BinaryIO) -> tuple[bytes, bytes]:
    """One typed frontend message: (type byte, body). ``ConnectionClosed`` at EOF."""
    head = f.read(5)
    if not head:
        raise ConnectionClosed()
    if len(head) < 5:
        raise ProtocolError("truncated message header")
    kind = head[:1]
    (length,) = struct.unpack("!i", head[1:])
    if length < 4 or length > MAX_MESSAGE:
        raise ProtocolError(f"invalid message length {length}")
    return kind, _read_exact(f, length - 4) if length > 4 else b""


class Body:
    """A cursor over one message body: NUL-terminated strings, Int16/Int32, byte runs."""

    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def cstr(self) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolError("unterminated string in message")
        s = self.data[self.pos : end].decode()
        self.pos = end + 1
        return s

    def int16(self) -> int:
        (v,) = struct.unpack("!h", self.take(2))
        return int(v)

    def int32(self) -> int:
        (v,) = struct.unpack("!i", self.take(4))
        return int(v)

    def byte(self) -> bytes:
        return self.take(1)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtocolError("message shorter than its fields")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def rest(self) -> bytes:
        b = self.data[self.pos :]
        self.pos = len(self.data)
        return b


# -- backend messages ("Message Formats") ------------------------------------------------------
def msg(kind: bytes, body: bytes = b"") -> bytes:
    """Frame one backend message: type byte, Int32 length (body + 4), body."""
    return kind + struct.pack("!i", len(body) + 4) + body


def _cstr(s: str) -> bytes:
    return s.encode() + b"\x00"


def auth_ok() -> bytes:
    return msg(b"R", struct.pack("!i", 0))


def auth_sasl(mechanisms: list[str]) -> bytes:
    """AuthenticationSASL (code 10): the mechanisms offered, each NUL-terminated, then a NUL."""
    return msg(b"R", struct.pack("!i", 10) + b"".join(_cstr(m) for m in mechanisms) + b"\x00")


def auth_sasl_continue(data: bytes) -> bytes:
    return msg(b"R", struct.pack("!i", 11) + data)


def auth_sasl_final(data: bytes) -> bytes:
    return msg(b"R", struct.pack("!i", 12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return msg(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    return msg(b"K", struct.pack("!ii", pid, key))


def ready_for_query(status: bytes) -> bytes:
    """ReadyForQuery: ``status`` is ``b"I"`` (idle), ``b"T"`` (in a transaction block) or ``b"E"`` (failed one)."""
    return msg(b"Z", status)


@dataclass(frozen=True)
class Field:
    """One RowDescription column: name, type OID, ``typlen`` (-1 varlena), ``typmod`` (-1 none)."""

    name: str
    oid: int
    typlen: int = -1
    typmod: int = -1


def row_description(fields: list[Field]) -> bytes:
    """RowDescription: per field name, table OID 0, attnum 0, type OID, typlen, typmod, format 0 (text)."""
    parts = [struct.pack("!h", len(fields))]
    for f in fields:
        parts.append(_cstr(f.name) + struct.pack("!ihihih", 0, 0, f.oid, f.typlen, f.typmod, 0))
    return msg(b"T", b"".join(parts))


def data_row(values: list[str | None]) -> bytes:
    """DataRow in text format: per column an Int32 length (-1 for NULL) and its UTF-8 bytes."""
    parts = [struct.pack("!h", len(values))]
    for v in values:
        if v is None:
            parts.append(b"\xff\xff\xff\xff")
        else:
            b = v.encode()
            parts.append(struct.pack("!i", len(b)) + b)
    return msg(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return msg(b"C", _cstr(tag))


def empty_query() -> bytes:
    return msg(b"I")


def parse_complete() -> bytes:
    return msg(b"1")


def bind_complete() -> bytes:
    return msg(b"2")


def close_complete() -> bytes:
    return msg(b"3")


def no_data() -> bytes:
    return msg(b"n")


def portal_suspended() -> bytes:
    return msg(b"s")


def copy_out_response(columns: int) -> bytes:
    """CopyOutResponse: overall format 0 (text), the column count, each column's format 0."""
    return msg(b"H", struct.pack("!bh", 0, columns) + struct.pack(f"!{columns}h", *([0] * columns)))


def copy_data(data: bytes) -> bytes:
    return msg(b"d", data)


def copy_done() -> bytes:
    return msg(b"c")


def parameter_description(oids: list[int]) -> bytes:
    return msg(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!i", o) for o in oids))


def _fields(kind: bytes, severity: str, code: str, message: str, detail: str | None, hint: str | None) -> bytes:
    body = b"S" + _cstr(severity) + b"V" + _cstr(severity) + b"C" + _cstr(code) + b"M" + _cstr(message)
    if detail:
        body += b"D" + _cstr(detail)
    if hint:
        body += b"H" + _cstr(hint)
    return msg(kind, body + b"\x00")


def error_response(
    code: str, message: str, detail: str | None = None, hint: str | None = None, fatal: bool = False
) -> bytes:
    """ErrorResponse ("Error and Notice Message Fields"): severity (S, V), SQLSTATE (C), message (M),
    optional detail (D) and hint (H)."""
    return _fields(b"E", "FATAL" if fatal else "ERROR", code, message, detail, hint)


def notice_response(message: str, code: str = "00000") -> bytes:
    return _fields(b"N", "NOTICE", code, message, None, None)
