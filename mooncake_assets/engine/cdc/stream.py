"""A logical replication connection over psycopg 3's libpq layer.

psycopg's high-level API refuses replication commands, but a connection opened with
``replication=database`` speaks the replication protocol through ``conn.pgconn`` (PG docs,
"Streaming Replication Protocol", PG 15 §55.4): ``IDENTIFY_SYSTEM``, ``CREATE_REPLICATION_SLOT``,
``DROP_REPLICATION_SLOT`` and ``START_REPLICATION SLOT s LOGICAL lsn (options)``, after which the
connection is in COPY BOTH mode and carries CopyData messages:

=====  ===============================  ============================================================
byte   message                          layout after the type byte
=====  ===============================  ============================================================
w      XLogData (server)                Int64 WAL start, Int64 WAL end, Int64 send time, payload
k      Primary keepalive (server)       Int64 WAL end, Int64 send time, Byte1 reply requested (1)
r      Standby status update (client)   Int64 written + 1, Int64 flushed + 1, Int64 applied + 1,
                                        Int64 client time, Byte1 reply requested
=====  ===============================  ============================================================

(times: µs since 2000-01-01 UTC). The payload of ``w`` is one pgoutput message
(:mod:`.pgoutput`).

The walsender is started with the output settings the text decoder relies on
(:data:`~.types.OUTPUT_SETTINGS`: ISO dates, UTC, hex bytea, exact floats), appended to any
``options`` in the DSN (which may add e.g. ``-c logical_decoding_work_mem=64kB``).

Errors raise :class:`ReplicationError`; ``temporary`` says whether reconnecting can help.
"""

from __future__ import annotations

import os
import re
import select
import struct
import time
from typing import TYPE_CHECKING, NoReturn, TypedDict

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq.abc import PGconn, PGresult

from ..lsn import Lsn
from ..pg.conninfo import OUTPUT_SETTINGS, with_options

if TYPE_CHECKING:
    from .columnar import ColumnarBatch, ColumnarTransaction
    from .native import NativeDecoder, Receiver

__all__ = ["ReplicationConnection", "ReplicationError", "SystemIdentity"]

_XLOG_HDR = struct.Struct(">QQq")  # after 'w': wal start, wal end, send time
_KEEPALIVE = struct.Struct(">QqB")  # after 'k': wal end, send time, reply requested
_STATUS = struct.Struct(">cQQQqB")  # 'r', write, flush, apply, client time, reply
_PG_EPOCH_UNIX_US = 946_684_800_000_000
_SLOT_RE = re.compile(r"^[a-z0-9_]{1,63}$")


def _now_pg_us() -> int:
    return time.time_ns() // 1000 - _PG_EPOCH_UNIX_US


class ReplicationError(RuntimeError):
    """A replication command or the stream failed. ``temporary``: True when reconnecting may help
    (connection lost, server shutting down, slot busy), False when it cannot (missing slot or
    publication, bad options)."""

    def __init__(self, message: str, temporary: bool = False, sqlstate: str | None = None):
        super().__init__(message)
        self.temporary = temporary
        self.sqlstate = sqlstate


def _check_slot_name(name: str) -> str:
    if not _SLOT_RE.match(name):
        raise ValueError(f"replication slot name {name!r} must be 1-63 characters of a-z, 0-9 and _")
    return name


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _result_error(res: PGresult | None, pgconn: PGconn) -> tuple[str, str | None]:
    if res is not None:
        msg = res.error_message.decode(errors="replace").strip()
        code = res.error_field(pq.DiagnosticField.SQLSTATE)
        primary = res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY)
        if primary:
            msg = primary.decode(errors="replace")
        return msg or pgconn.error_message.decode(errors="replace").strip(), code.decode() if code else None
    return pgconn.error_message.decode(errors="replace").strip(), None


def _classify(msg: str, sqlstate: str | None, slot: str | None = None) -> ReplicationError:
    m = re.search(r'replication slot "([^"]+)" does not exist', msg)
    if m:
        return ReplicationError(f"slot {m.group(1)} does not exist ({msg})", False, sqlstate)
    m = re.search(r'replication slot "([^"]+)" already exists', msg)
    if m:
        return ReplicationError(f"slot {m.group(1)} already exists ({msg})", False, sqlstate)
    m = re.search(r'publication "([^"]+)" does not exist', msg)
    if m:
        return ReplicationError(f"publication {m.group(1)} does not exist ({msg})", False, sqlstate)
    if "is active for PID" in msg:
        return ReplicationError(msg + " (another consumer holds the slot)", True, sqlstate)
    temporary = sqlstate is None or sqlstate.startswith(("08", "57", "53"))  # connection, shutdown, resources
    return ReplicationError(msg, temporary, sqlstate)


class SystemIdentity(TypedDict):
    """``IDENTIFY_SYSTEM``'s answer (PG docs, "Streaming Replication Protocol"): ``systemid`` (the
    cluster's system identifier, decimal text), ``timeline``, ``xlogpos`` (the current WAL flush
    position, an LSN as an int), ``dbname`` (the database connected to)."""

    systemid: str
    timeline: int
    xlogpos: int
    dbname: str


class ReplicationConnection:
    """One walsender connection (``replication=database``) for one logical slot.

    ``dsn``: a libpq connection string or URI for the source database; ``options`` in it are kept
    and the decoder's output settings appended. ``status_interval``: seconds between unsolicited
    standby status updates while streaming (keeps ``wal_sender_timeout`` from firing).

    After :meth:`start` only :meth:`read`, :meth:`send_status` and :meth:`close` are allowed.
    Commands block until the server answers (``CREATE_REPLICATION_SLOT`` waits for transactions
    running at that moment to finish). Not thread-safe: one thread drives a connection.

    Attributes: ``server_wal_end`` (LSN, the server's WAL end from the latest keepalive or XLogData),
    ``keepalives`` (keepalives received), ``keepalive_replies`` (replies sent because a keepalive
    asked), ``proto_version`` (1 or 2, set by :meth:`start`), ``streaming_slot`` (the slot while
    streaming, else None), ``pgconn`` (the libpq connection).
    """

    def __init__(self, dsn: str, *, status_interval: float = 10.0, connect_timeout: int = 10):
        params = conninfo_to_dict(with_options(dsn, OUTPUT_SETTINGS))  # a setting the DSN has already: not repeated
        params.setdefault("application_name", "mooncake")
        params.setdefault("connect_timeout", connect_timeout)
        params["replication"] = "database"
        try:
            self._conn = psycopg.connect(make_conninfo("", **params), autocommit=True)
        except psycopg.OperationalError as e:
            raise ReplicationError(f"cannot open a replication connection: {e}".strip(), True) from e
        self.pgconn: PGconn = self._conn.pgconn
        self.status_interval = status_interval
        self.server_wal_end = 0
        self.reply_requested = False
        self.keepalives = 0
        self.keepalive_replies = 0
        self.streaming_slot: str | None = None
        self.proto_version: int | None = None
        self._write_lsn = self._flush_lsn = self._apply_lsn = 0
        self._last_status = 0.0
        self._closed = False
        self._receiver: Receiver | None = None  # the compiled receive loop, made by read_transactions()
        self.messages_read = 0  # XLogData messages read by read_transactions()

    # -- commands -------------------------------------------------------------------------------------
    @property
    def server_version(self) -> int:
        """Server version number, e.g. 150018."""
        return self.pgconn.server_version

    def _command(self, sql: str) -> PGresult:
        if self.streaming_slot is not None:
            raise ReplicationError("the connection is streaming; replication commands are not allowed now")
        if self._closed:
            raise ReplicationError("the replication connection is closed")
        res = self.pgconn.exec_(sql.encode())
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            if self.pgconn.status != pq.ConnStatus.OK:
                raise ReplicationError(f"replication connection lost: {_result_error(res, self.pgconn)[0]}", True)
            raise _classify(*_result_error(res, self.pgconn))
        return res

    @staticmethod
    def _row(res: PGresult) -> dict[str, str | None]:
        """The first row of a command's result: column name -> text (None for NULL)."""
        row: dict[str, str | None] = {}
        for i in range(res.nfields):
            value = res.get_value(0, i)
            row[(res.fname(i) or b"").decode()] = None if value is None else value.decode()
        return row

    @staticmethod
    def _text(row: dict[str, str | None], name: str) -> str:
        """Column ``name`` of a command's row, which the protocol never leaves NULL
        (:class:`ReplicationError` when it is)."""
        value = row.get(name)
        if value is None:
            raise ReplicationError(f"the server's answer has no {name}")
        return value

    def identify_system(self) -> SystemIdentity:
        """``IDENTIFY_SYSTEM`` → ``{'systemid': str, 'timeline': int, 'xlogpos': int (LSN),
        'dbname': str}`` (:class:`SystemIdentity`)."""
        row = self._row(self._command("IDENTIFY_SYSTEM"))
        return {
            "systemid": self._text(row, "systemid"),
            "timeline": int(self._text(row, "timeline")),
            "xlogpos": Lsn.parse(self._text(row, "xlogpos")),
            "dbname": self._text(row, "dbname"),
        }

    def create_slot(self, name: str, export_snapshot: bool = True, temporary: bool = False) -> tuple[int, str | None]:
        """``CREATE_REPLICATION_SLOT name [TEMPORARY] LOGICAL pgoutput EXPORT_SNAPSHOT|NOEXPORT_SNAPSHOT``.

        Returns ``(consistent_point_lsn, snapshot_name)``; ``snapshot_name`` is None unless exported.
        The exported snapshot is valid until the next command on *this* connection (including
        :meth:`start`) or its close: import it first on another connection with
        ``SET TRANSACTION SNAPSHOT`` (:func:`~.copy.initial_copy` does), then start streaming.
        A temporary slot disappears when this connection closes.
        Raises ``ValueError`` for a bad name, :class:`ReplicationError` ("slot x already exists", …).
        """
        _check_slot_name(name)
        snap = "EXPORT_SNAPSHOT" if export_snapshot else "NOEXPORT_SNAPSHOT"
        tmp = " TEMPORARY" if temporary else ""
        row = self._row(self._command(f"CREATE_REPLICATION_SLOT {name}{tmp} LOGICAL pgoutput {snap}"))
        return Lsn.parse(self._text(row, "consistent_point")), row.get("snapshot_name") or None

    def drop_slot(self, name: str, wait: bool = False) -> None:
        """``DROP_REPLICATION_SLOT name [WAIT]``. ``wait``: wait for a consumer that holds the slot to
        let it go instead of failing. Raises :class:`ReplicationError` ("slot x does not exist", "…
        is active for PID n")."""
        _check_slot_name(name)
        self._command(f"DROP_REPLICATION_SLOT {name}{' WAIT' if wait else ''}")

    def start(
        self, slot: str, publications: list[str], start_lsn: int = 0, streaming: bool = True, messages: bool = False
    ) -> None:
        """``START_REPLICATION SLOT slot LOGICAL start_lsn (proto_version 'v', publication_names '…'
        [, streaming 'on'] [, messages 'true'])``.

        ``proto_version`` is 2 with ``streaming 'on'`` on servers >= 14 when ``streaming``, else 1.
        ``start_lsn`` 0 resumes from the slot's confirmed flush position (the server never goes
        before it). Raises :class:`ReplicationError` ("slot x does not exist", "… is active for PID").
        A missing publication is reported by the first :meth:`read` that reaches a change.
        """
        _check_slot_name(slot)
        if not publications:
            raise ValueError("start() needs at least one publication")
        if self.streaming_slot is not None:
            raise ReplicationError(f"already streaming slot {self.streaming_slot}")
        use_stream = streaming and self.server_version >= 140000
        self.proto_version = 2 if use_stream else 1
        pubs = ",".join(_quote_ident(p) for p in publications).replace("'", "''")
        opts = [f"proto_version '{self.proto_version}'", f"publication_names '{pubs}'"]
        if use_stream:
            opts.append("streaming 'on'")
        if messages:
            opts.append("messages 'true'")
        sql = f"START_REPLICATION SLOT {slot} LOGICAL {Lsn(start_lsn)} ({', '.join(opts)})"
        self.pgconn.send_query(sql.encode())
        res = self.pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            err = _classify(*_result_error(res, self.pgconn))
            while self.pgconn.get_result() is not None:
                pass
            raise err
        self.streaming_slot = slot
        self._last_status = time.monotonic()

    # -- streaming ------------------------------------------------------------------------------------
    def read(self, timeout: float, max_messages: int = 10_000) -> list[tuple[int, memoryview]]:
        """Wait up to ``timeout`` seconds for XLogData and return what is available at once:
        ``[(wal_start_lsn, payload), …]`` (at most ``max_messages``; payloads are zero-copy views,
        valid as long as they are referenced). Returns ``[]`` on timeout.

        Keepalives are handled here: :attr:`server_wal_end` is updated (from XLogData too), and a
        keepalive that requests a reply is answered at once with the last positions given to
        :meth:`send_status`; an unsolicited status is also sent every ``status_interval`` seconds.
        Raises :class:`ReplicationError` when the server ends the stream or the connection is lost.
        """
        if self.streaming_slot is None:
            raise ReplicationError("read() before start()")
        out: list[tuple[int, memoryview]] = []
        deadline = time.monotonic() + max(timeout, 0.0)
        pgconn = self.pgconn
        while len(out) < max_messages:
            try:
                nbytes, data = pgconn.get_copy_data(1)
            except psycopg.OperationalError as e:
                raise self._lost(str(e)) from None
            if nbytes > 0:
                kind = data[0]
                if kind == 0x77:  # 'w'
                    start, end, _ = _XLOG_HDR.unpack_from(data, 1)
                    if end > self.server_wal_end:
                        self.server_wal_end = end
                    out.append((start, data[25:]))
                elif kind == 0x6B:  # 'k'
                    self.keepalives += 1
                    end, _, reply = _KEEPALIVE.unpack_from(data, 1)
                    if end > self.server_wal_end:
                        self.server_wal_end = end
                    if reply:
                        self.reply_requested = True
                        self._send_status(False)
                        self.keepalive_replies += 1
                continue
            if nbytes == -1:  # the server ended COPY: collect the error
                self._end_of_copy()
            if nbytes < -1:
                raise self._lost(pgconn.error_message.decode(errors="replace"))
            # nothing buffered
            if out:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = min(remaining, max(self.status_interval - (time.monotonic() - self._last_status), 0.01))
            try:
                r, _, _ = select.select([pgconn.socket], [], [], wait)
            except (OSError, ValueError) as e:
                raise self._lost(str(e)) from None
            if r:
                try:
                    pgconn.consume_input()
                except psycopg.OperationalError as e:
                    raise self._lost(str(e)) from None
            self._maybe_status()
        self._maybe_status()
        return out

    def read_transactions(
        self, decoder: NativeDecoder, timeout: float, max_messages: int = 10_000, take: bool = True
    ) -> list[ColumnarTransaction | ColumnarBatch]:
        """The compiled path's :meth:`read`: wait up to ``timeout`` seconds for XLogData, feed what is
        available at once (at most ``max_messages``) to ``decoder`` (a :class:`~.native.NativeDecoder`)
        inside the C receive loop (:class:`~.native.Receiver`: libpq's ``PQgetCopyData`` on this
        connection, no Python object per message) and return the
        :class:`~.columnar.ColumnarTransaction` objects completed (a decoder with ``batch``: one
        :class:`~.columnar.ColumnarBatch` of them, the spilled ones on their own). Returns ``[]`` on
        timeout and when the messages read completed no transaction (:attr:`messages_read` counts
        XLogData); with ``take=False`` always ``[]``, the completed transactions left in the decoder
        for a later ``decoder.take()`` (a read batch of several reads taken at once).

        Keepalives, :attr:`server_wal_end`, status updates and errors as :meth:`read`; a decoder error
        (``ProtocolError``, ``ValueError``) propagates, nothing of an open transaction emitted."""
        from .native import READ_END, READ_LOST, receiver_for

        if self.streaming_slot is None:
            raise ReplicationError("read_transactions() before start()")
        rx = self._receiver
        if rx is None:
            rx = self._receiver = receiver_for(self.pgconn)
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            remaining = deadline - time.monotonic()
            wait = remaining
            if self.status_interval:
                wait = min(remaining, max(self.status_interval - (time.monotonic() - self._last_status), 0.01))
            before, keep = rx.messages, rx.keepalives
            rc = rx.read(decoder, wait, max_messages)
            self.keepalives += rx.keepalives - keep
            self.messages_read += rx.messages - before
            if rx.wal_end > self.server_wal_end:
                self.server_wal_end = rx.wal_end
            if rc == READ_END:
                self._end_of_copy()
            elif rc == READ_LOST:
                raise self._lost(self.pgconn.error_message.decode(errors="replace"))
            elif rc < 0:
                raise self._lost(f"poll() failed: {os.strerror(rx.os_errno)}")
            if rx.reply_requested:
                rx.reply_requested = False
                self.reply_requested = True
                self._send_status(False)
                self.keepalive_replies += 1
            self._maybe_status()
            if rc > 0 or time.monotonic() >= deadline:
                return decoder.take() if take else []

    def _end_of_copy(self) -> NoReturn:
        """The server ended COPY: collect its error and raise it (:meth:`read` and :meth:`read_transactions`);
        ``ReplicationError`` classified by its SQLSTATE (PG docs, "Streaming Replication Protocol")."""
        pgconn = self.pgconn
        res = pgconn.get_result()
        msg, code = _result_error(res, pgconn)
        while pgconn.get_result() is not None:
            pass
        self.streaming_slot = None
        raise _classify(msg or "the server ended the replication stream", code)

    def _lost(self, detail: str) -> ReplicationError:
        slot = self.streaming_slot
        self.streaming_slot = None
        return ReplicationError(f"replication connection lost while streaming slot {slot}: {detail.strip()}", True)

    def _maybe_status(self) -> None:
        if self.status_interval and time.monotonic() - self._last_status >= self.status_interval:
            self._send_status(False)

    def send_status(self, write_lsn: int, flush_lsn: int, apply_lsn: int, reply: bool = False) -> None:
        """Send a standby status update (``'r'``). ``flush_lsn`` is what the slot confirms: the server
        may recycle WAL before it and will not resend transactions whose commit LSN is before it.
        Positions are remembered and reused for automatic replies to keepalives. ``reply``: ask
        the server to answer with a keepalive at once."""
        self._write_lsn, self._flush_lsn, self._apply_lsn = write_lsn, flush_lsn, apply_lsn
        self._send_status(reply)

    def _send_status(self, reply: bool) -> None:
        msg = _STATUS.pack(b"r", self._write_lsn, self._flush_lsn, self._apply_lsn, _now_pg_us(), 1 if reply else 0)
        try:
            if self.pgconn.put_copy_data(msg) != 1 or self.pgconn.flush() != 0:
                raise self._lost(self.pgconn.error_message.decode(errors="replace"))
        except psycopg.OperationalError as e:
            raise self._lost(str(e)) from None
        self._last_status = time.monotonic()
        self.reply_requested = False

    @property
    def confirmed_positions(self) -> tuple[int, int, int]:
        """(write, flush, apply) LSNs last given to :meth:`send_status`."""
        return self._write_lsn, self._flush_lsn, self._apply_lsn

    def close(self) -> None:
        """End streaming (CopyDone) and close the connection. Idempotent. The walsender releases the
        slot as it exits, which the server finishes shortly after (use ``drop_slot(wait=True)`` to
        drop it right away from another connection)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.streaming_slot is not None and self.pgconn.status == pq.ConnStatus.OK:
                self.pgconn.put_copy_end()
                self.pgconn.flush()
        except Exception:
            pass
        finally:
            self.streaming_slot = None
            self._conn.close()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
