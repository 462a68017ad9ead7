"""pgoutput logical replication messages, protocol versions 1 and 2 (streaming of large transactions).

Follows the PostgreSQL documentation, chapter "Streaming Replication Protocol", section
"Logical Replication Message Formats" (PG 15: §55.9). Integers are big-endian. ``String`` is
NUL-terminated UTF-8. LSNs are ``Int64``; timestamps are ``Int64`` microseconds since
2000-01-01 00:00 UTC and are returned as aware ``datetime`` in UTC.

=====  ==============  ======================================================================
byte   message         layout after the type byte ([xid] = Int32 xid, only inside a stream)
=====  ==============  ======================================================================
B      Begin           Int64 final LSN, Int64 commit time, Int32 xid
C      Commit          Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
O      Origin          Int64 commit LSN on the origin, String name
R      Relation        [xid] Int32 oid, String namespace, String name, Int8 replica identity,
                       Int16 ncols, per column: Int8 flags (1 = key), String name, Int32 type
                       oid, Int32 typmod
Y      Type            [xid] Int32 oid, String namespace, String name
I      Insert          [xid] Int32 oid, 'N', TupleData
U      Update          [xid] Int32 oid, optional ('K' | 'O', TupleData), 'N', TupleData
D      Delete          [xid] Int32 oid, 'K' | 'O', TupleData
T      Truncate        [xid] Int32 nrels, Int8 options (1 CASCADE, 2 RESTART IDENTITY), Int32 oids
M      Message         [xid] Int8 flags (1 transactional), Int64 LSN, String prefix, Int32 n, n bytes
S      Stream Start    Int32 xid, Int8 first segment (1 = first)
E      Stream Stop     (nothing)
c      Stream Commit   Int32 xid, Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
A      Stream Abort    Int32 xid (top level), Int32 subxid (== xid when the whole xact aborts)
=====  ==============  ======================================================================

TupleData: Int16 ncols, then per column one of ``'n'`` (NULL), ``'u'`` (unchanged TOASTed value,
not sent), ``'t'`` Int32 n + n bytes of text, ``'b'`` Int32 n + n bytes of binary.

Malformed or unknown messages raise ``ValueError`` saying what was expected and what was found.
The decoders (:class:`~.txn.TransactionAssembler`, the compiled ``NativeDecoder``) turn a malformed
Insert, Update, Delete or Relation whose relation OID can be read, inside a transaction, into a
:class:`BadMessage` of that transaction instead (:func:`message_relation`): only that table stops.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = [
    "TupleData",
    "RelationColumn",
    "Begin",
    "Commit",
    "Origin",
    "Relation",
    "Type",
    "Insert",
    "Update",
    "Delete",
    "Truncate",
    "Message",
    "StreamStart",
    "StreamStop",
    "StreamCommit",
    "StreamAbort",
    "PgOutputMessage",
    "BadMessage",
    "message_relation",
    "cut_after_relation",
    "parse_message",
    "pg_time_to_datetime",
    "PG_EPOCH",
    "TRUNCATE_CASCADE",
    "TRUNCATE_RESTART_IDENTITY",
]

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")  # final lsn, time, xid
_COMMIT = struct.Struct(">BQQq")  # flags, commit lsn, end lsn, time
_STREAM_COMMIT = struct.Struct(">IBQQq")  # xid, flags, commit lsn, end lsn, time
_STREAM_ABORT = struct.Struct(">II")
_STREAM_START = struct.Struct(">IB")
_COLUMN_TAIL = struct.Struct(">Ii")  # type oid, typmod


def pg_time_to_datetime(us: int) -> datetime:
    """Microseconds since 2000-01-01 UTC → aware ``datetime`` (UTC)."""
    return PG_EPOCH + timedelta(microseconds=us)


class TupleData:
    """One row image of a data message: per column a kind and a value.

    ``kinds``: str, one character per column: ``'n'`` NULL, ``'u'`` unchanged TOAST (value not sent),
    ``'t'`` text, ``'b'`` binary. ``data``: list, the raw value per column, ``bytes`` for
    ``'t'``/``'b'`` and ``None`` otherwise (ready for :func:`~.types.decode_text_columns`, which takes
    UTF-8 bytes, once ``'u'`` columns are filled in). ``values``: the ``(kind, value)`` pairs
    (a new list per access); indexing and iteration give the same pairs.
    """

    __slots__ = ("kinds", "data")

    def __init__(self, kinds: str, data: list[bytes | None]):
        self.kinds = kinds
        self.data = data

    @property
    def values(self) -> list[tuple[str, bytes | None]]:
        return list(zip(self.kinds, self.data))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[str, bytes | None]:
        return self.kinds[i], self.data[i]

    def __iter__(self) -> Iterator[tuple[str, bytes | None]]:
        return zip(self.kinds, self.data)

    @property
    def has_unchanged_toast(self) -> bool:
        """True when some column is ``'u'`` (its value must come from the old row)."""
        return "u" in self.kinds

    def texts(self) -> list[str | None]:
        """Values decoded as UTF-8 text (``None`` for NULL and unchanged TOAST)."""
        return [None if v is None else v.decode() for v in self.data]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TupleData) and self.kinds == other.kinds and self.data == other.data

    # unhashable (mutable, compared by value); typeshed declares object.__hash__ a method, not Optional
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TupleData({self.kinds!r}, {self.data!r})"


@dataclass(slots=True)
class RelationColumn:
    """A column of a Relation message. ``flags`` bit 1: part of the replica identity key."""

    flags: int
    name: str
    type_oid: int
    typmod: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)


@dataclass(slots=True)
class Begin:
    final_lsn: int
    commit_time: datetime
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(slots=True)
class Origin:
    origin_lsn: int
    name: str


@dataclass(slots=True)
class Relation:
    """Schema of a relation as pgoutput sends it before its first change (and after a DDL).
    ``replica_identity``: ``'d'``, ``'f'``, ``'i'`` or ``'n'``; under ``'f'`` every column is flagged key."""

    xid: int | None
    oid: int
    namespace: str
    name: str
    replica_identity: str
    columns: list[RelationColumn]


@dataclass(slots=True)
class Type:
    xid: int | None
    oid: int
    namespace: str
    name: str


@dataclass(slots=True)
class Insert:
    xid: int | None
    relation_oid: int
    new: TupleData


@dataclass(slots=True)
class Update:
    """``old_kind``: ``'K'`` (old key columns only, the key changed), ``'O'`` (whole old row, replica
    identity full) or ``None`` (no old image sent)."""

    xid: int | None
    relation_oid: int
    old_kind: str | None
    old: TupleData | None
    new: TupleData


@dataclass(slots=True)
class Delete:
    xid: int | None
    relation_oid: int
    old_kind: str
    old: TupleData


@dataclass(slots=True)
class Truncate:
    xid: int | None
    relation_oids: list[int]
    options: int

    @property
    def cascade(self) -> bool:
        return bool(self.options & TRUNCATE_CASCADE)

    @property
    def restart_identity(self) -> bool:
        return bool(self.options & TRUNCATE_RESTART_IDENTITY)


@dataclass(slots=True)
class Message:
    """A logical decoding message (``pg_logical_emit_message``), sent with ``messages 'true'``."""

    xid: int | None
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(slots=True)
class StreamAbort:
    """``subxid == xid``: the whole streamed transaction aborted; otherwise only that subtransaction."""

    xid: int
    subxid: int


PgOutputMessage = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)


@dataclass(frozen=True, slots=True)
class BadMessage:
    """A malformed (or unexpected) row message of one relation inside a transaction: the decoders
    record it on the transaction instead of raising, and the service stops only that relation's table
    at the transaction's commit LSN. ``relation_oid``; ``lsn``: WAL start of the XLogData that carried
    it; ``kind``: its type byte (``'I'``, ``'U'``, ``'D'`` or ``'R'``); ``error``: what was wrong (the
    decoder's one-line message, naming that LSN). ``xid`` (inside a stream: the (sub)transaction of the
    message, so that a Stream Abort of that subtransaction drops the marker with its changes; else the
    transaction's xid)."""

    relation_oid: int
    lsn: int
    kind: str
    error: str
    xid: int = 0


#: the type bytes of the messages a :class:`BadMessage` can stand for
RELATION_MESSAGES = b"IUDR"


def message_relation(buf: bytes | bytearray | memoryview, in_stream: bool) -> tuple[int | None, int] | None:
    """``(xid, relation OID)`` of an Insert, Update, Delete or Relation payload when the bytes reach that
    far (``xid``: the leading xid inside a stream, else None); None for any other message or one too
    short to hold its OID (such a message cannot be attributed to a table)."""
    if not buf or buf[0] not in RELATION_MESSAGES:
        return None
    pos = 5 if in_stream else 1
    if len(buf) < pos + 4:
        return None
    xid = _U32.unpack_from(buf, 1)[0] if in_stream else None
    return xid, _U32.unpack_from(buf, pos)[0]


def cut_after_relation(
    buf: bytes | bytearray | memoryview, in_stream: bool, oid: int, short: bool = False
) -> bytes | None:
    """Fault injection (``faults.corrupt_relation``): an Insert/Update/Delete of relation ``oid`` cut
    right after its OID (a malformed message of that relation), or with ``short`` in the middle of the
    OID (one no table can be named for); None for any other message."""
    if not buf or buf[0] not in b"IUD":
        return None
    got = message_relation(buf, in_stream)
    if got is None or got[1] != oid:
        return None
    return bytes(buf[: (5 if in_stream else 1) + (2 if short else 4)])


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.find(b"\0", pos)
    if end < 0:
        raise ValueError(f"pgoutput: expected a NUL-terminated string at offset {pos}, found none")
    return buf[pos:end].decode(), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[TupleData, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    kinds = bytearray(n)
    values: list[bytes | None] = [None] * n
    unpack = _I32.unpack_from
    for i in range(n):
        k = buf[pos]
        pos += 1
        kinds[i] = k
        if k == 0x74 or k == 0x62:  # 't', 'b'
            (ln,) = unpack(buf, pos)
            pos += 4
            values[i] = buf[pos : pos + ln]
            pos += ln
            if pos > len(buf):
                raise ValueError(f"pgoutput: column {i} value runs past the end of the message")
        elif k != 0x6E and k != 0x75:  # 'n', 'u'
            raise ValueError(f"pgoutput: expected a column kind 'n', 'u', 't' or 'b', found {chr(k)!r}")
    return TupleData(kinds.decode("ascii"), values), pos


def parse_message(buf: bytes | bytearray | memoryview, in_stream: bool = False) -> PgOutputMessage:
    """Parse one pgoutput message (the payload of an XLogData ``'w'`` message).

    ``in_stream``: True between Stream Start and Stream Stop, where Relation, Type, Insert, Update,
    Delete, Truncate and Message carry a leading ``Int32`` xid (the (sub)transaction that made the
    change). Raises ``ValueError`` for an unknown type byte or a truncated message.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    if not buf:
        raise ValueError("pgoutput: empty message")
    t = buf[0]
    try:
        return _PARSERS[t](buf, in_stream)
    except KeyError:
        raise ValueError(
            f"pgoutput: unknown message type {chr(t)!r} (0x{t:02x}); expected one of "
            f"{''.join(sorted(chr(k) for k in _PARSERS))}"
        ) from None
    except (struct.error, IndexError) as e:
        raise ValueError(f"pgoutput: truncated {chr(t)!r} message ({len(buf)} bytes): {e}") from None


def _xid(buf: bytes, in_stream: bool) -> tuple[int | None, int]:
    if in_stream:
        return _U32.unpack_from(buf, 1)[0], 5
    return None, 1


def _p_begin(buf: bytes, in_stream: bool) -> Begin:
    lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
    return Begin(lsn, pg_time_to_datetime(ts), xid)


def _p_commit(buf: bytes, in_stream: bool) -> Commit:
    flags, lsn, end, ts = _COMMIT.unpack_from(buf, 1)
    return Commit(flags, lsn, end, pg_time_to_datetime(ts))


def _p_origin(buf: bytes, in_stream: bool) -> Origin:
    (lsn,) = _U64.unpack_from(buf, 1)
    name, _ = _string(buf, 9)
    return Origin(lsn, name)


def _p_relation(buf: bytes, in_stream: bool) -> Relation:
    xid, pos = _xid(buf, in_stream)
    (oid,) = _U32.unpack_from(buf, pos)
    nsp, pos = _string(buf, pos + 4)
    name, pos = _string(buf, pos)
    ident = chr(buf[pos])
    (n,) = _I16.unpack_from(buf, pos + 1)
    pos += 3
    cols = []
    for _ in range(n):
        flags = buf[pos]
        cname, pos = _string(buf, pos + 1)
        typ, typmod = _COLUMN_TAIL.unpack_from(buf, pos)
        pos += 8
        cols.append(RelationColumn(flags, cname, typ, typmod))
    return Relation(xid, oid, nsp or "pg_catalog", name, ident, cols)


def _p_type(buf: bytes, in_stream: bool) -> Type:
    xid, pos = _xid(buf, in_stream)
    (oid,) = _U32.unpack_from(buf, pos)
    nsp, pos = _string(buf, pos + 4)
    name, _ = _string(buf, pos)
    return Type(xid, oid, nsp, name)


def _p_insert(buf: bytes, in_stream: bool) -> Insert:
    xid, pos = _xid(buf, in_stream)
    (oid,) = _U32.unpack_from(buf, pos)
    if buf[pos + 4] != 0x4E:  # 'N'
        raise ValueError(f"pgoutput: Insert expected 'N' before the new tuple, found {chr(buf[pos + 4])!r}")
    new, _ = _tuple(buf, pos + 5)
    return Insert(xid, oid, new)


def _p_update(buf: bytes, in_stream: bool) -> Update:
    xid, pos = _xid(buf, in_stream)
    (oid,) = _U32.unpack_from(buf, pos)
    pos += 4
    old_kind = old = None
    k = buf[pos]
    if k == 0x4B or k == 0x4F:  # 'K', 'O'
        old_kind = chr(k)
        old, pos = _tuple(buf, pos + 1)
        k = buf[pos]
    if k != 0x4E:
        raise ValueError(f"pgoutput: Update expected 'N' before the new tuple, found {chr(k)!r}")
    new, _ = _tuple(buf, pos + 1)
    return Update(xid, oid, old_kind, old, new)


def _p_delete(buf: bytes, in_stream: bool) -> Delete:
    xid, pos = _xid(buf, in_stream)
    (oid,) = _U32.unpack_from(buf, pos)
    k = buf[pos + 4]
    if k != 0x4B and k != 0x4F:
        raise ValueError(f"pgoutput: Delete expected 'K' or 'O' before the old tuple, found {chr(k)!r}")
    old, _ = _tuple(buf, pos + 5)
    return Delete(xid, oid, chr(k), old)


def _p_truncate(buf: bytes, in_stream: bool) -> Truncate:
    xid, pos = _xid(buf, in_stream)
    (n,) = _I32.unpack_from(buf, pos)
    options = buf[pos + 4]
    oids = list(struct.unpack_from(f">{n}I", buf, pos + 5))
    return Truncate(xid, oids, options)


def _p_message(buf: bytes, in_stream: bool) -> Message:
    # The xid is present only for a transactional message decoded inside a stream.
    xid, pos = _xid(buf, in_stream)
    flags = buf[pos]
    (lsn,) = _U64.unpack_from(buf, pos + 1)
    prefix, pos = _string(buf, pos + 9)
    (n,) = _I32.unpack_from(buf, pos)
    return Message(xid, bool(flags & 1), lsn, prefix, buf[pos + 4 : pos + 4 + n])


def _p_stream_start(buf: bytes, in_stream: bool) -> StreamStart:
    xid, first = _STREAM_START.unpack_from(buf, 1)
    return StreamStart(xid, first == 1)


def _p_stream_stop(buf: bytes, in_stream: bool) -> StreamStop:
    return StreamStop()


def _p_stream_commit(buf: bytes, in_stream: bool) -> StreamCommit:
    xid, flags, lsn, end, ts = _STREAM_COMMIT.unpack_from(buf, 1)
    return StreamCommit(xid, flags, lsn, end, pg_time_to_datetime(ts))


def _p_stream_abort(buf: bytes, in_stream: bool) -> StreamAbort:
    xid, sub = _STREAM_ABORT.unpack_from(buf, 1)
    return StreamAbort(xid, sub)


_PARSERS: dict[int, Callable[[bytes, bool], PgOutputMessage]] = {
    ord("B"): _p_begin,
    ord("C"): _p_commit,
    ord("O"): _p_origin,
    ord("R"): _p_relation,
    ord("Y"): _p_type,
    ord("I"): _p_insert,
    ord("U"): _p_update,
    ord("D"): _p_delete,
    ord("T"): _p_truncate,
    ord("M"): _p_message,
    ord("S"): _p_stream_start,
    ord("E"): _p_stream_stop,
    ord("c"): _p_stream_commit,
    ord("A"): _p_stream_abort,
}
