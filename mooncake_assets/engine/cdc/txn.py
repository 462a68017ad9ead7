"""Assemble pgoutput messages into committed transactions, in commit order.

Plain transactions arrive as ``Begin, changes…, Commit``. With protocol version 2 and
``streaming 'on'`` a transaction larger than the walsender's ``logical_decoding_work_mem`` arrives
in chunks before it commits (PG docs, "Logical Streaming Replication Protocol" / "Logical Replication
Message Flow"): ``Stream Start(xid, first) … Stream Stop`` repeated, possibly interleaved with other
streamed transactions' chunks and with whole plain transactions, then ``Stream Commit(xid)`` or
``Stream Abort(xid, subxid)``. Inside a chunk every data message carries the xid of the
(sub)transaction that made the change, so aborting a subtransaction (``ROLLBACK TO SAVEPOINT``)
drops exactly the changes tagged with that subxid; Postgres sends one Stream Abort per aborted
subtransaction that had streamed changes (nested ones included). A Stream Start with
``first_segment`` for an xid already buffered restarts it (the server re-streams a transaction from
its beginning after a reconnect).

A malformed Insert, Update, Delete or Relation inside a transaction whose relation OID can be read
(:func:`~.pgoutput.message_relation`; also a row whose tuple width disagrees with its Relation) does not
raise: it becomes a :class:`~.pgoutput.BadMessage` on the transaction (``Transaction.bad``; a Stream
Abort of its subtransaction drops it with the changes), and the transaction still assembles. The
service stops only that table, at the commit LSN. Any other malformed message (Begin, Commit, an
unknown type byte, a message too short to hold its OID, one outside any transaction) raises.

Memory: a streamed transaction is buffered whole until its commit (it is applied atomically); the
caller may watch :attr:`TransactionAssembler.buffered_changes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ..lsn import Lsn
from .pgoutput import (
    BadMessage,
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    cut_after_relation,
    message_relation,
    parse_message,
)

__all__ = ["Change", "Transaction", "TransactionAssembler", "ProtocolError", "BadMessageError"]


class ProtocolError(ValueError):
    """The message sequence breaks the pgoutput protocol (permanent for this stream position; a
    bug or a corrupted stream: reconnecting from the slot's confirmed position is the remedy)."""


class BadMessageError(ValueError):
    """A table stopped by a :class:`~.pgoutput.BadMessage` of one of its transactions (the one-line
    message names table, relation, the XLogData and commit LSNs, what was wrong and the remedy)."""


@dataclass(slots=True)
class Change:
    """One row change of a committed transaction.

    ``kind``: ``'insert'`` (``new``), ``'update'`` (``new``; ``old``/``old_kind`` when sent),
    ``'delete'`` (``old``, ``old_kind``), ``'truncate'``. ``old_kind``: ``'K'`` old key columns only
    (other columns NULL in ``old``), ``'O'`` whole old row (replica identity full), ``None``.
    A TRUNCATE is one Change for the whole statement: ``truncate_oids`` lists every table it
    truncated (route by it), ``relation_oid`` is the first of them.
    ``lsn``: WAL position of the XLogData that carried the change (informational).
    ``relation``: the Relation message in effect when the change was decoded (its columns give the
    tuple's shape; a DDL inside the transaction shows up as a different Relation on later changes).
    """

    kind: Literal["insert", "update", "delete", "truncate"]
    relation_oid: int
    new: TupleData | None = None
    old: TupleData | None = None
    old_kind: str | None = None
    truncate_oids: list[int] = field(default_factory=list)
    truncate_cascade: bool = False
    truncate_restart_identity: bool = False
    lsn: int = 0
    relation: Relation | None = None


@dataclass(slots=True)
class Transaction:
    """A committed transaction. ``commit_lsn``: LSN of its commit record (pgoutput's Commit "commit
    LSN"; the LSN every change is stamped with); ``end_lsn``: end of the commit record (the position
    to confirm to the slot once it is durable: the server resends transactions whose commit LSN is
    at or after the confirmed position). ``commit_time``: aware UTC datetime. ``bad``: the malformed
    row messages of the transaction (:class:`~.pgoutput.BadMessage`, in arrival order): their
    relations' changes in ``changes`` are incomplete, so the service stops those tables."""

    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: datetime
    changes: list[Change]
    streamed: bool = False
    origin: str | None = None
    bad: list[BadMessage] = field(default_factory=list)


@dataclass(slots=True)
class _Open:
    xid: int
    final_lsn: int
    changes: list[Change] = field(default_factory=list)
    origin: str | None = None
    bad: list[BadMessage] = field(default_factory=list)


@dataclass(slots=True)
class _Streamed:
    xid: int
    tagged: list[tuple[int, Change]] = field(default_factory=list)
    bad: list[BadMessage] = field(default_factory=list)


class TransactionAssembler:
    """Feed it every pgoutput message in arrival order; it returns the transactions each message
    completes.

    ``relations``: oid → latest :class:`~.pgoutput.Relation` seen (kept from streamed chunks too, even
    if that transaction later aborts: the schema it describes is current). ``types``: oid →
    :class:`~.pgoutput.Type`. ``in_stream``: True between Stream Start and Stream Stop (pass it to
    :func:`~.pgoutput.parse_message`, or use :meth:`feed_payload`).
    """

    def __init__(self) -> None:
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self.in_stream = False
        #: fault injection (``faults.corrupt_relation``): Insert/Update/Delete payloads of this relation
        #: OID are cut after their OID before parsing (a truncated message); None: off
        self.fault_corrupt_oid: int | None = None
        self.fault_corrupt_short = False  # ... cut inside the OID instead (no table can be named)
        self._current: _Open | None = None
        self._stream_xid: int | None = None
        self._streams: dict[int, _Streamed] = {}
        self._handlers: dict[type, Callable[[Any, int], list[Transaction]]] = {
            Insert: self._on_insert,
            Update: self._on_update,
            Delete: self._on_delete,
            Truncate: self._on_truncate,
            Relation: self._on_relation,
            Type: self._on_type,
            Begin: self._on_begin,
            Commit: self._on_commit,
            Origin: self._on_origin,
            Message: self._on_message,
            StreamStart: self._on_stream_start,
            StreamStop: self._on_stream_stop,
            StreamCommit: self._on_stream_commit,
            StreamAbort: self._on_stream_abort,
        }

    # -- state for observers ------------------------------------------------------------------------
    @property
    def in_transaction(self) -> bool:
        """True between Begin and Commit of a plain transaction."""
        return self._current is not None

    @property
    def open_streams(self) -> list[int]:
        """xids of streamed transactions buffered and not yet committed or aborted."""
        return list(self._streams)

    @property
    def buffered_changes(self) -> int:
        """Changes held for transactions not yet committed (plain and streamed)."""
        n = len(self._current.changes) if self._current else 0
        return n + sum(len(s.tagged) for s in self._streams.values())

    @property
    def idle(self) -> bool:
        """Nothing in flight: no open plain transaction, no buffered stream."""
        return self._current is None and not self._streams and not self.in_stream

    # -- feeding -------------------------------------------------------------------------------------
    def feed_payload(self, payload: bytes | memoryview, wal_lsn: int) -> list[Transaction]:
        """Parse one XLogData payload (with the right ``in_stream``) and :meth:`feed` it. A malformed
        Insert/Update/Delete/Relation of a readable relation OID inside a transaction becomes a
        :class:`~.pgoutput.BadMessage` of it (module docstring); any other malformed message raises
        ``ValueError`` naming the XLogData's LSN."""
        if self.fault_corrupt_oid is not None:
            cut = cut_after_relation(payload, self.in_stream, self.fault_corrupt_oid, self.fault_corrupt_short)
            payload = cut or payload
        try:
            msg = parse_message(payload, self.in_stream)
        except ValueError as e:
            at = message_relation(payload, self.in_stream)
            text = f"{e} (XLogData at LSN {Lsn(wal_lsn)})"
            if at is None or not self._in_txn():
                raise ValueError(text) from None
            self._mark(BadMessage(at[1], wal_lsn, chr(payload[0]), text, at[0] or 0))
            return []
        if isinstance(msg, (Insert, Update, Delete)):
            width = self._width_error(msg)
            if width is not None:
                text = f"{width} (XLogData at LSN {Lsn(wal_lsn)})"
                self._mark(BadMessage(msg.relation_oid, wal_lsn, chr(payload[0]), text, msg.xid or 0))
                return []
        return self.feed(msg, wal_lsn)

    def _width_error(self, msg: Insert | Update | Delete) -> str | None:
        """A row tuple whose width is not its Relation's (the compiled decoder's check, same text)."""
        rel = self.relations.get(msg.relation_oid)
        if rel is None:
            return None
        want = len(rel.columns)
        nnew = len(msg.new) if not isinstance(msg, Delete) else 0
        nold = len(msg.old) if not isinstance(msg, Insert) and msg.old is not None else 0
        if (nnew and nnew != want) or (nold and nold != want):
            kind = "I" if isinstance(msg, Insert) else "U" if isinstance(msg, Update) else "D"
            return f"pgoutput: {kind!r} tuple of relation {msg.relation_oid} has {nnew or nold} columns, its Relation message {want}"
        return None

    def _in_txn(self) -> bool:
        return self.in_stream or self._current is not None

    def _mark(self, bad: BadMessage) -> None:
        """Record ``bad`` on the open transaction (plain: tagged with its xid; or the stream chunk's:
        ``bad.xid`` is the message's own)."""
        if self.in_stream:
            self._streams[self._stream_xid].bad.append(bad)  # type: ignore[index]
        else:
            assert self._current is not None
            self._current.bad.append(BadMessage(bad.relation_oid, bad.lsn, bad.kind, bad.error, self._current.xid))

    def feed(self, msg: PgOutputMessage, wal_lsn: int) -> list[Transaction]:
        """Consume one message; return the transactions it completes (0 or 1), in commit order.
        ``wal_lsn``: the XLogData's WAL start, recorded on changes. Raises :class:`ProtocolError` for
        a message out of place (a change outside any transaction, a Begin inside one, …)."""
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise ProtocolError(f"unexpected message {type(msg).__name__}") from None
        return handler(msg, wal_lsn)

    # -- handlers (one per message class) ----------------------------------------------------------------
    def _append(self, msg: Insert | Update | Delete | Truncate, change: Change) -> None:
        if self.in_stream:
            # in_stream is True only between Stream Start and Stream Stop, which set and clear _stream_xid
            st = self._streams[self._stream_xid]  # type: ignore[index]
            st.tagged.append((msg.xid if msg.xid is not None else st.xid, change))
        elif self._current is not None:
            self._current.changes.append(change)
        else:
            raise ProtocolError(f"{type(msg).__name__} for relation {change.relation_oid} outside any transaction")

    def _on_insert(self, msg: Insert, lsn: int) -> list[Transaction]:
        self._append(
            msg,
            Change(
                "insert",
                msg.relation_oid,
                msg.new,
                None,
                None,
                [],
                False,
                False,
                lsn,
                self.relations.get(msg.relation_oid),
            ),
        )
        return []

    def _on_update(self, msg: Update, lsn: int) -> list[Transaction]:
        self._append(
            msg,
            Change(
                "update",
                msg.relation_oid,
                msg.new,
                msg.old,
                msg.old_kind,
                [],
                False,
                False,
                lsn,
                self.relations.get(msg.relation_oid),
            ),
        )
        return []

    def _on_delete(self, msg: Delete, lsn: int) -> list[Transaction]:
        self._append(
            msg,
            Change(
                "delete",
                msg.relation_oid,
                None,
                msg.old,
                msg.old_kind,
                [],
                False,
                False,
                lsn,
                self.relations.get(msg.relation_oid),
            ),
        )
        return []

    def _on_truncate(self, msg: Truncate, lsn: int) -> list[Transaction]:
        oids = list(msg.relation_oids)
        first = oids[0] if oids else 0
        self._append(
            msg,
            Change(
                "truncate",
                first,
                None,
                None,
                None,
                oids,
                msg.cascade,
                msg.restart_identity,
                lsn,
                self.relations.get(first),
            ),
        )
        return []

    def _on_relation(self, msg: Relation, lsn: int) -> list[Transaction]:
        self.relations[msg.oid] = msg
        return []

    def _on_type(self, msg: Type, lsn: int) -> list[Transaction]:
        self.types[msg.oid] = msg
        return []

    def _on_begin(self, msg: Begin, lsn: int) -> list[Transaction]:
        if self._current is not None:
            raise ProtocolError(f"Begin of xid {msg.xid} while xid {self._current.xid} is open")
        if self.in_stream:
            raise ProtocolError(f"Begin of xid {msg.xid} inside the stream of xid {self._stream_xid}")
        self._current = _Open(msg.xid, msg.final_lsn)
        return []

    def _on_commit(self, msg: Commit, lsn: int) -> list[Transaction]:
        cur = self._current
        if cur is None:
            raise ProtocolError(f"Commit at {msg.commit_lsn:X} without a Begin")
        self._current = None
        return [
            Transaction(cur.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, cur.changes, False, cur.origin, cur.bad)
        ]

    def _on_origin(self, msg: Origin, lsn: int) -> list[Transaction]:
        if self._current is not None:
            self._current.origin = msg.name
        return []

    def _on_message(self, msg: Message, lsn: int) -> list[Transaction]:
        return []  # logical decoding messages are not row changes

    def _on_stream_start(self, msg: StreamStart, lsn: int) -> list[Transaction]:
        if self.in_stream:
            raise ProtocolError(f"Stream Start of xid {msg.xid} inside the stream of xid {self._stream_xid}")
        if self._current is not None:
            raise ProtocolError(f"Stream Start of xid {msg.xid} inside plain transaction {self._current.xid}")
        if msg.first_segment:
            self._streams[msg.xid] = _Streamed(msg.xid)  # a restart of a known xid begins afresh
        elif msg.xid not in self._streams:
            raise ProtocolError(
                f"Stream Start of xid {msg.xid} continues a stream whose first segment was never received"
            )
        self.in_stream = True
        self._stream_xid = msg.xid
        return []

    def _on_stream_stop(self, msg: StreamStop, lsn: int) -> list[Transaction]:
        if not self.in_stream:
            raise ProtocolError("Stream Stop outside a stream")
        self.in_stream = False
        self._stream_xid = None
        return []

    def _on_stream_commit(self, msg: StreamCommit, lsn: int) -> list[Transaction]:
        if self.in_stream:
            raise ProtocolError(f"Stream Commit of xid {msg.xid} inside a stream chunk")
        st = self._streams.pop(msg.xid, None)
        if st is None:
            raise ProtocolError(f"Stream Commit of xid {msg.xid}, which was never streamed")
        changes = [c for _, c in st.tagged]
        return [Transaction(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, changes, True, None, st.bad)]

    def _on_stream_abort(self, msg: StreamAbort, lsn: int) -> list[Transaction]:
        if msg.subxid == msg.xid:
            self._streams.pop(msg.xid, None)
        else:
            st = self._streams.get(msg.xid)
            if st is not None:
                sub = msg.subxid
                st.tagged = [tc for tc in st.tagged if tc[0] != sub]
                st.bad = [b for b in st.bad if b.xid != sub]
        return []

    def reset(self) -> None:
        """Forget in-flight transactions (after a reconnect the server resends them whole).
        Keeps the relation and type caches."""
        self._current = None
        self._streams.clear()
        self.in_stream = False
        self._stream_xid = None
