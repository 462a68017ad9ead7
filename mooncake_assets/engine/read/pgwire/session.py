"""One client connection: startup, authentication, then simple and extended queries.

Message flow as in the PostgreSQL manual, "Frontend/Backend Protocol / Message Flow": Start-up
(SSLRequest answered ``S`` and the socket wrapped in TLS when the server has a certificate, else
``N``; GSSENCRequest ``N``; "SSL Session Encryption"), authentication (SCRAM-SHA-256,
or trust on loopback when the server allows it), ParameterStatus, BackendKeyData, ReadyForQuery;
Simple Query (several statements in one message, each answered, an empty one with
EmptyQueryResponse; after an error the rest of the message is skipped); Extended Query
(Parse/Bind/Describe/Execute/Close/Flush/Sync: after an error every message up to Sync is
skipped); Termination.
"""

from __future__ import annotations

import base64
import socket
import ssl
import uuid
from decimal import Decimal
from typing import Any, Protocol

import duckdb
import pyarrow as pa

from ..missing import MirrorNotReadable
from ..snapshots import CutMissing
from ..union import ReadOnlyError
from .arrays import ELEMENT_OF, convert, dimensions, uses_as_array
from .arrays import decode_binary as decode_array
from .arrays import parse_text as parse_array
from .auth import MECHANISM, AuthFailed, ScramExchange, Verifier
from .backend import Backend, Canceled
from .binary import decode as decode_binary
from .catalog import REPORTED, Result, SessionSettings, SqlError, local_statement, rewrite_functions
from .copy import CopyOut, copy_out
from .protocol import (
    Body,
    ConnectionClosed,
    Field,
    ProtocolError,
    auth_ok,
    auth_sasl,
    auth_sasl_continue,
    auth_sasl_final,
    backend_key_data,
    bind_complete,
    close_complete,
    command_complete,
    copy_data,
    copy_done,
    copy_out_response,
    data_row,
    empty_query,
    error_response,
    no_data,
    parameter_description,
    parameter_status,
    parse_complete,
    portal_suspended,
    read_message,
    read_startup,
    ready_for_query,
    row_description,
)
from .psql import catalog_answer
from .sqltext import max_param, replace_params, split_statements
from .types import fields, text_values

#: parameter type OID -> (DuckDB type the ``$n`` is cast to, how its text becomes a Python value)
PARAM_TYPES: dict[int, tuple[str, Any]] = {
    16: ("BOOLEAN", lambda s: s.lower() in ("t", "true", "1", "on", "yes", "y")),
    20: ("BIGINT", int),
    21: ("SMALLINT", int),
    23: ("INTEGER", int),
    26: ("BIGINT", int),
    700: ("REAL", float),
    701: ("DOUBLE", float),
    1700: ("DECIMAL(38,10)", Decimal),
    1082: ("DATE", str),
    1083: ("TIME", str),
    1114: ("TIMESTAMP", str),
    1184: ("TIMESTAMPTZ", str),
    17: ("BLOB", lambda s: bytes.fromhex(s[2:]) if s.startswith("\\x") else s.encode()),
    2950: ("VARCHAR", lambda s: str(uuid.UUID(s))),  # mirrors keep uuids as canonical text
}


def sqlstate(e: BaseException) -> tuple[str, str]:
    """(SQLSTATE, message) for an error raised by a read (Postgres's "Appendix A. Error Codes")."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, SqlError):
        return e.code, str(e)
    if isinstance(e, ReadOnlyError):
        return "25006", msg
    if isinstance(e, duckdb.ParserException):
        return "42601", msg
    if isinstance(e, duckdb.CatalogException):
        if "does not exist" in msg and ("Table" in msg or "table" in msg):
            return "42P01", msg
        if "Function" in msg:
            return "42883", msg
        return "42704", msg
    if isinstance(e, duckdb.BinderException):
        return ("42703" if "column" in msg.lower() else "42804"), msg
    if isinstance(e, duckdb.InterruptException):
        return "57014", "canceling statement due to user request"
    if isinstance(e, (duckdb.ConversionException, duckdb.InvalidInputException)):
        return "22P02", msg
    if isinstance(e, duckdb.OutOfRangeException):
        return "22003", msg
    if isinstance(e, duckdb.NotImplementedException):
        return "0A000", msg
    if isinstance(e, Canceled):
        return "57014", "canceling statement due to user request"
    if isinstance(e, (CutMissing, MirrorNotReadable)):
        return "42P01", msg
    if isinstance(e, TimeoutError):
        return "57014", msg
    if type(e).__name__ == "ServiceError":  # the service's refusal (a layer above: not imported)
        return "58000", msg
    return "XX000", f"{type(e).__name__}: {msg}"


class Host(Protocol):
    """What a session needs from its server (:class:`~.server.SqlServer` is one)."""

    backend: Backend
    users: dict[str, Verifier]

    tls: ssl.SSLContext | None

    def trusts(self, peer: str) -> bool: ...

    def cancel(self, pid: int, key: int) -> None: ...

    def forget(self, session: Session) -> None: ...


class Portal:
    """A bound statement: its SQL, parameter values, and (once run) its result and rows sent;
    ``original``: the statement as the client wrote it (its output column names come from it)."""

    def __init__(self, sql: str, params: list[Any], original: str | None = None):
        self.sql = sql
        self.params = params
        self.original = original or sql
        self.result: Result | None = None
        self.sent = 0


class Session:
    """Serves one accepted socket until Terminate or EOF (see the module docstring)."""

    def __init__(self, server: Host, sock: socket.socket, peer: str, pid: int, key: int):
        self.server, self.sock, self.peer, self.pid, self.key = server, sock, peer, pid, key
        self.rf: Any = _ExactReader(sock)  # the start-up packets; a buffered file of the socket after
        self.out: list[bytes] = []
        self.settings: SessionSettings | None = None
        self.statements: dict[str, tuple[str, list[int]]] = {}
        self.portals: dict[str, Portal] = {}
        self.user = ""
        self.database = ""

    # ---------------------------------------------------------------- io
    def send(self, *msgs: bytes) -> None:
        self.out.extend(msgs)

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(b"".join(self.out))
            self.out = []

    def run(self) -> None:
        """Serve the connection; never raises (errors end the connection)."""
        try:
            if self._startup():
                self._loop()
        except (ConnectionClosed, ConnectionError, OSError):
            pass
        except ProtocolError as e:
            try:
                self.send(error_response("08P01", str(e), fatal=True))
                self.flush()
            except OSError:
                pass
        finally:
            self.server.forget(self)
            try:  # the socket's file object holds the descriptor open too: close both, and say so
                self.rf.close()
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

    # ---------------------------------------------------------------- start-up
    def _startup(self) -> bool:
        while True:
            st = read_startup(self.rf)
            tls = getattr(self.server, "tls", None)
            if st.kind == "ssl" and tls is not None and not isinstance(self.sock, ssl.SSLSocket):
                self.sock.sendall(b"S")  # then the TLS handshake; nothing sent before it was read
                self.sock = tls.wrap_socket(self.sock, server_side=True)
                self.rf = _ExactReader(self.sock)
                continue
            if st.kind in ("ssl", "gssenc"):
                self.sock.sendall(b"N")  # no TLS (no --tls-cert) / no GSS: the client may go on in plain text
                continue
            if st.kind == "cancel":
                self.server.cancel(st.pid, st.key)
                return False
            break
        self.rf = self.sock.makefile("rb")
        self.user = st.params.get("user", "")
        self.database = st.params.get("database", self.user)
        backend = self.server.backend
        defaults = {"mooncake.max_wait": f"{backend.max_wait:g}s"}
        try:
            self.settings = SessionSettings(st.params, defaults, snapshots=backend.snapshots is not None)
        except SqlError as e:
            self.send(error_response(e.code, str(e), fatal=True))
            self.flush()
            return False
        if not self._authenticate():
            return False
        self.send(auth_ok())
        for name in REPORTED:
            self.send(parameter_status(name, self.settings.values[name]))
        self.send(backend_key_data(self.pid, self.key), ready_for_query(b"I"))
        self.flush()
        return True

    def _fail_auth(self, why: str) -> bool:
        self.send(
            error_response("28P01", f'password authentication failed for user "{self.user}"', detail=why, fatal=True)
        )
        self.flush()
        return False

    def _authenticate(self) -> bool:
        """SCRAM-SHA-256 ("SASL Authentication"), or none for a trusted loopback peer."""
        if self.server.trusts(self.peer):
            return True
        if not self.server.users:
            return self._fail_auth("no users are configured (--users FILE or MOONCAKE_SQL_PASSWORD)")
        scram = ScramExchange(self.server.users.get(self.user))
        self.send(auth_sasl([MECHANISM]))
        self.flush()
        try:
            kind, body = read_message(self.rf)
            b = Body(body)
            if kind != b"p" or b.cstr() != MECHANISM:
                return self._fail_auth("expected a SASLInitialResponse for SCRAM-SHA-256")
            n = b.int32()
            first = b.take(n).decode() if n >= 0 else ""
            self.send(auth_sasl_continue(scram.first(first).encode()))
            self.flush()
            kind, body = read_message(self.rf)
            if kind != b"p":
                return self._fail_auth("expected a SASLResponse")
            final = scram.final(body.decode())
        except AuthFailed as e:
            return self._fail_auth(str(e))
        except (UnicodeDecodeError, ValueError, base64.binascii.Error):  # type: ignore[attr-defined]
            return self._fail_auth("malformed SCRAM message")
        self.send(auth_sasl_final(final.encode()))
        return True

    # ---------------------------------------------------------------- queries
    def _loop(self) -> None:
        skipping = False  # extended query: after an error, skip to Sync
        while True:
            kind, body = read_message(self.rf)
            if kind == b"X":
                return
            if kind == b"Q":
                self._simple(Body(body).cstr())
                continue
            if kind == b"S":
                skipping = False
                self.send(ready_for_query(self._status()))
                self.flush()
                continue
            if kind == b"H":
                self.flush()
                continue
            if skipping:
                continue
            try:
                self._extended(kind, Body(body))
            except ProtocolError:
                raise  # the framing is broken: FATAL 08P01, connection closed (run)
            except Exception as e:
                self._error(e)
                skipping = True

    def _status(self) -> bytes:
        assert self.settings is not None
        return self.settings.status

    def _error(self, e: BaseException) -> None:
        code, message = sqlstate(e)
        hint = getattr(e, "hint", None)
        if hint is None and isinstance(e, TimeoutError):
            hint = "raise mooncake.max_wait, or read what is applied: SET mooncake.read = 'applied'"
        self.send(error_response(code, message, hint=hint))
        assert self.settings is not None
        if self.settings.status == b"T":
            self.settings.status = b"E"

    def _simple(self, sql: str) -> None:
        statements = split_statements(sql)
        if not statements:
            self.send(empty_query())
        for st in statements:
            try:
                res = self.execute(st, [])
            except Exception as e:
                self._error(e)
                break
            if res.copy is not None:
                self._send_copy(res)
            elif res.fields is not None:
                self.send(row_description(res.fields))
                self.send(*(data_row(r) for r in res.rows))
            self.send(command_complete(res.tag))
            self.flush()
        self.send(ready_for_query(self._status()))
        self.flush()

    def execute(self, sql: str, params: list[Any], original: str | None = None) -> Result:
        """Answer one statement: locally (settings, transactions, psql's catalog) or through the reader.
        ``original``: the client's text of a bound statement (``sql`` has the parameters' casts), whose
        select list names the result's columns (:mod:`.parsed`)."""
        assert self.settings is not None
        before = {k: self.settings.values[k] for k in REPORTED}
        cut = self.settings.cut()
        res = local_statement(sql, self.settings)
        if res is not None:
            if self.settings.cut() not in (None, cut):
                self._check_cut(cut)
            for k in REPORTED:  # "Asynchronous Operations": a reported setting's change is announced
                if self.settings.values[k] != before[k]:
                    self.send(parameter_status(k, self.settings.values[k]))
            return res
        plan = copy_out(sql)
        if plan is not None:
            return self._copy(plan, params)
        res = catalog_answer(sql, self.server.backend, params or None)
        if res is not None:
            return res
        backend = self.server.backend
        named = backend.parser.parse(original or sql)
        parsed = backend.parser.parse(sql) if original else named
        run_sql = rewrite_functions(parsed.sql, self.settings, self.user, self.database)
        if parsed.information_schema:
            table = backend.information_schema(parsed, run_sql, params or None, self.database or "mooncake")
        else:
            table = backend.run(
                run_sql,
                params or None,
                self.settings.values["mooncake.read"],
                owner=self,
                max_wait=self.settings.max_wait(),
                cut=self.settings.cut(),
            )
        names = named.output_names(table.num_columns)
        if names is not None:
            table = table.rename_columns([n or old for n, old in zip(names, table.column_names)])
        return self._result(sql, table, backend.type_hints(named, table.column_names))

    def _check_cut(self, previous: str | None) -> None:
        """After ``SET mooncake.as_of_lsn``: the cut must exist in the warehouse (else 22023, and the
        setting keeps its previous value)."""
        assert self.settings is not None
        snapshots = self.server.backend.snapshots
        tag = self.settings.cut()
        try:
            if snapshots is not None and tag is not None:
                snapshots.check_cut(tag)
        except (LookupError, ValueError) as e:
            self.settings.values["mooncake.as_of_lsn"] = previous or ""
            raise SqlError(
                "22023", str(e).strip("'\""), "RESET mooncake.as_of_lsn reads the mirrors as they are now"
            ) from e

    def _copy(self, plan: CopyOut, params: list[Any]) -> Result:
        """``COPY … TO STDOUT``: the query's rows as COPY lines (:mod:`.copy`)."""
        res = self.execute(plan.query, params)
        names: list[str | None] = [f.name for f in res.fields or []]
        lines = [plan.line(names)] if plan.header else []
        lines.extend(plan.line(r) for r in res.rows)
        return Result(f"COPY {len(res.rows)}", res.fields, [], lines)

    def _send_copy(self, res: Result) -> None:
        """CopyOutResponse, a CopyData per line, CopyDone ("COPY Operations"); CommandComplete follows."""
        self.send(copy_out_response(len(res.fields or [])))
        self.send(*(copy_data(line) for line in res.copy or []))
        self.send(copy_done())

    @staticmethod
    def _result(sql: str, table: pa.Table, hints: dict[str, str] | None = None) -> Result:
        head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        tag = "EXPLAIN" if head == "EXPLAIN" else f"SELECT {table.num_rows}"
        return Result(tag, fields(table.schema, hints), text_values(table))

    # ---------------------------------------------------------------- extended query
    def _extended(self, kind: bytes, b: Body) -> None:
        if kind == b"P":
            name, sql = b.cstr(), b.cstr()
            oids = [b.int32() for _ in range(b.int16())]
            self.statements[name] = (sql, oids)
            self.send(parse_complete())
        elif kind == b"B":
            self._bind(b)
        elif kind == b"D":
            self._describe(b.byte(), b.cstr())
        elif kind == b"E":
            self._execute(b.cstr(), b.int32())
        elif kind == b"C":
            what, name = b.byte(), b.cstr()
            (self.statements if what == b"S" else self.portals).pop(name, None)
            self.send(close_complete())
        else:
            raise ProtocolError(f"unexpected message type {kind!r}")

    def _bind(self, b: Body) -> None:
        portal, stmt = b.cstr(), b.cstr()
        formats = [b.int16() for _ in range(b.int16())]
        raw: list[bytes | None] = []
        for _ in range(b.int16()):
            n = b.int32()
            raw.append(None if n < 0 else b.take(n))
        result_formats = [b.int16() for _ in range(b.int16())]
        if any(result_formats):
            raise SqlError("0A000", "binary result format is not supported yet: request text results")
        if stmt not in self.statements:
            raise SqlError("26000", f'prepared statement "{stmt}" does not exist')
        sql, oids = self.statements[stmt]
        binary = [(formats[i] if len(formats) > 1 else (formats[0] if formats else 0)) == 1 for i in range(len(raw))]
        bound, values = bind_params(sql, oids, raw, binary)
        self.portals[portal] = Portal(bound, values, sql)
        self.send(bind_complete())

    def _run_portal(self, portal: Portal) -> Result:
        if portal.result is None:
            portal.result = self.execute(portal.sql, portal.params, portal.original)
        return portal.result

    def _describe(self, what: bytes, name: str) -> None:
        if what == b"S":
            if name not in self.statements:
                raise SqlError("26000", f'prepared statement "{name}" does not exist')
            sql, oids = self.statements[name]
            n = max(len(oids), max_param(sql))
            full = [(oids[i] if i < len(oids) and oids[i] else 25) for i in range(n)]
            self.send(parameter_description(full))
            res = self._describe_statement(sql, full)
        else:
            if name not in self.portals:
                raise SqlError("34000", f'portal "{name}" does not exist')
            res = self._run_portal(self.portals[name])
        if res is None or res.fields is None or res.copy is not None:
            self.send(no_data())
        else:
            self.send(row_description(res.fields))

    def _describe_statement(self, sql: str, oids: list[int]) -> Result | None:
        """A statement's columns before it is bound: run with NULL parameters and no rows."""
        assert self.settings is not None
        if local_statement_kind(sql):
            return None
        probe, values = bind_params(sql, oids, [None] * len(oids))
        try:
            res = self.execute(f"SELECT * FROM ({probe.rstrip().rstrip(';')}) AS __mc_describe LIMIT 0", values)
        except Exception:
            return None
        names = self.server.backend.parser.parse(sql).output_names(len(res.fields or []))
        if names is not None and res.fields is not None:  # the probe's columns, named as the statement's
            res.fields = [Field(n or f.name, f.oid, f.typlen, f.typmod) for n, f in zip(names, res.fields)]
        return res

    def _execute(self, name: str, max_rows: int) -> None:
        if name not in self.portals:
            raise SqlError("34000", f'portal "{name}" does not exist')
        portal = self.portals[name]
        res = self._run_portal(portal)
        if res.copy is not None:
            self._send_copy(res)
            self.send(command_complete(res.tag))
            return
        rows = res.rows[portal.sent :]
        if max_rows > 0 and len(rows) > max_rows:
            self.send(*(data_row(r) for r in rows[:max_rows]))
            portal.sent += max_rows
            self.send(portal_suspended())
            return
        self.send(*(data_row(r) for r in rows))
        portal.sent = len(res.rows)
        self.send(command_complete(res.tag))
        if name == "":
            pass  # the unnamed portal lives until the next Bind or Sync-ended transaction


class _ExactReader:
    """Reads exactly the bytes asked for from a socket and none more: the start-up packets are read so,
    since bytes a client sends after SSLRequest must not be read before the TLS handshake."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        pass


def local_statement_kind(sql: str) -> bool:
    """True when ``sql`` starts with a keyword the endpoint answers itself (no rows to describe)."""
    from .sqltext import words

    w = words(sql, 1)
    return bool(w) and w[0] in (
        "SET",
        "RESET",
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "DISCARD",
        "DEALLOCATE",
        "SAVEPOINT",
        "RELEASE",
    )


def bind_params(
    sql: str, oids: list[int], raw: list[bytes | None], binary: list[bool] | None = None
) -> tuple[str, list[Any]]:
    """Parameter values as DuckDB prepared-statement parameters: each ``$n`` whose type is known
    becomes ``CAST($n AS type)``, its value the Python value of its text (``PARAM_TYPES``) or of its
    binary form (:mod:`.binary`, where ``binary[i]``); an array type (``int4[]``, ``text[]``…, or an
    untyped ``{…}`` used as ``ANY($n)``: :mod:`.arrays`) becomes a list cast to ``type[]``; unknown
    (OID 0) and text types stay strings. Values never enter the SQL text."""
    values: list[Any] = []
    casts: dict[int, str] = {}
    for i, v in enumerate(raw):
        oid = oids[i] if i < len(oids) else 0
        is_binary = bool(binary and binary[i])
        if oid == 0 and not is_binary and (v is None or v.lstrip()[:1] in (b"{", b"[")) and uses_as_array(sql, i + 1):
            oid = 1009  # psycopg's list of strings: untyped array text
        if oid in ELEMENT_OF:
            elem = ELEMENT_OF[oid]
            elem_spec = PARAM_TYPES.get(elem, ("VARCHAR", str))
            value = None
            if v is not None:
                value = decode_array(v, decode_binary) if is_binary else convert(parse_array(v.decode()), elem_spec[1])
            casts[i + 1] = f"CAST(${i + 1} AS {elem_spec[0]}{'[]' * dimensions(value)})"
            values.append(value)
            continue
        spec = PARAM_TYPES.get(oid)
        if spec is not None:
            casts[i + 1] = f"CAST(${i + 1} AS {spec[0]})"
        if v is None:
            values.append(None)
        elif is_binary:
            values.append(decode_binary(oid, v))
        else:
            values.append(spec[1](v.decode()) if spec is not None else v.decode())
    if casts:
        sql = replace_params(sql, casts)
    return sql, values
