"""Statements the SQL endpoint answers itself, without DuckDB: session settings, transaction
control, and the catalog queries ``psql`` sends for ``\\dt`` and ``\\d TABLE``.

Design (first cut): mirrors are not DuckDB tables until a statement reads them, and psql's catalog
queries use Postgres-only syntax (``OPERATOR(pg_catalog.~)``, ``::regclass``), so they are
recognised by their shape and answered from the mirrors' list and a union read's schema:

- ``\\dt [PATTERN]`` — ``FROM pg_catalog.pg_class c … c.relkind IN ('r','p',…)``: one row per
  mirror (schema ``public``, type ``table``, owner ``mooncake``);
- ``\\d TABLE`` — the lookup by ``c.relname OPERATOR(pg_catalog.~) '^(name)$'`` (oid = the mirror's
  position + 16384), the relation's details (``WHERE c.oid = '…'``: an ordinary table) and its
  columns (``FROM pg_catalog.pg_attribute a``: name, ``format_type`` text from the column's OID);
- any other statement naming ``pg_catalog.`` tables: an empty result (psql's footers: no indexes,
  no constraints…).

Settings (``SET``/``RESET``/``SHOW``, ``current_setting('…')``) are per session; every setting is
accepted and shown back (``client_encoding`` only as ``UTF8``, the text the server sends);
``mooncake.read`` picks the read mode (:data:`~.backend.READ_MODES`). ``BEGIN``/``COMMIT``/
``ROLLBACK`` are accepted (reads only: a transaction block groups nothing) and tracked for
ReadyForQuery's status. Sources: the PostgreSQL manual, "SET", "SHOW", "psql" (the meta-commands'
queries are psql's own, visible with ``psql -E``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .protocol import Field
from .sqltext import code_only, words
from .types import TEXT

#: ``SET mooncake.read`` values (:mod:`.backend`)
READ_MODES = ("latest", "applied", "persisted")
SERVER_VERSION = "16.0"
VERSION_TEXT = f"PostgreSQL {SERVER_VERSION} (mooncake-assets union read over DuckDB)"

#: the settings a session starts with; those in :data:`REPORTED` go to the client as ParameterStatus
DEFAULTS = {
    "server_version": SERVER_VERSION,
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "is_superuser": "off",
    "application_name": "",
    "default_transaction_read_only": "on",
    "transaction_read_only": "on",
    "search_path": "public",
    "extra_float_digits": "1",
    "bytea_output": "hex",
    "transaction_isolation": "read committed",
    "mooncake.read": "latest",
    "mooncake.max_wait": "30s",
    "mooncake.as_of_lsn": "",
}
REPORTED = (
    "server_version",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "is_superuser",
    "application_name",
    "default_transaction_read_only",
)
_CANON = {k.lower(): k for k in DEFAULTS}
TABLE_OID_BASE = 16384


class SqlError(Exception):
    """An error the endpoint reports itself: ``code`` is its SQLSTATE."""

    def __init__(self, code: str, message: str, hint: str | None = None):
        super().__init__(message)
        self.code = code
        self.hint = hint


@dataclass
class Result:
    """One statement's answer: ``fields`` None for a statement without rows (SET, BEGIN), else the
    columns and ``rows`` of text values; ``tag``: the CommandComplete text; ``copy``: for ``COPY … TO
    STDOUT``, the lines sent as CopyData (``fields`` then give the column count)."""

    tag: str
    fields: list[Field] | None = None
    rows: list[list[str | None]] = field(default_factory=list)
    copy: list[bytes] | None = None  # COPY … TO STDOUT: the CopyData payloads (no RowDescription)


def _text_result(names: list[str], rows: list[list[str | None]], tag: str | None = None) -> Result:
    return Result(tag or f"SELECT {len(rows)}", [Field(n, TEXT) for n in names], rows)


def _value(raw: str) -> str:
    raw = raw.strip()
    if raw.upper() == "DEFAULT":
        return ""
    parts = [p.strip() for p in re.split(r",(?=(?:[^']*'[^']*')*[^']*$)", raw)]
    out = []
    for p in parts:
        if len(p) >= 2 and p[0] == p[-1] == "'":
            p = p[1:-1].replace("''", "'")
        elif len(p) >= 2 and p[0] == p[-1] == '"':
            p = p[1:-1]
        out.append(p)
    return ", ".join(out)


class SessionSettings:
    """One session's settings and transaction state (``status``: ReadyForQuery's ``I``/``T``/``E``).

    ``defaults``: the server's own defaults over :data:`DEFAULTS` (``mooncake.max_wait``: its
    ``--max-wait``), what ``RESET`` returns to; ``snapshots``: the server can read persisted
    snapshots and cuts (else ``mooncake.read = 'persisted'`` and ``mooncake.as_of_lsn`` are 0A000)."""

    def __init__(self, startup: dict[str, str], defaults: dict[str, str] | None = None, snapshots: bool = False):
        self.defaults = {**DEFAULTS, **(defaults or {})}
        self.values = dict(self.defaults)
        self.snapshots = snapshots
        self.status = b"I"
        for k, v in startup.items():
            if k not in ("user", "database", "options", "replication"):
                self.set(k, v)

    def set(self, name: str, value: str) -> None:
        key = _CANON.get(name.lower(), name.lower())
        if key == "client_encoding" and value.upper().replace("-", "") not in ("UTF8", "UNICODE"):
            raise SqlError("22023", f"client_encoding {value!r} is not supported: the server sends UTF8 only")
        if key == "client_encoding":
            value = "UTF8"
        if key == "DateStyle" and value:
            value = _datestyle(value, self.values["DateStyle"])
        if key.startswith("mooncake.") and value != "":
            value = self._mooncake(key, value)
        self.values[key] = value if value != "" or key not in self.defaults else self.defaults[key]

    def _mooncake(self, key: str, value: str) -> str:
        """A ``mooncake.*`` setting's value, checked (22023 for a bad one, 0A000 for one the server
        cannot serve) and in its canonical form."""
        if key == "mooncake.read":
            if value not in READ_MODES:
                raise SqlError(
                    "22023",
                    f'invalid value for parameter "mooncake.read": "{value}"',
                    f"Available values: {', '.join(READ_MODES)}.",
                )
            if value == "persisted" and not self.snapshots:
                raise SqlError(
                    "0A000",
                    "mooncake.read = 'persisted' needs the warehouse's catalog, which this server was not given",
                    "use 'latest' or 'applied'",
                )
        elif key == "mooncake.max_wait":
            if duration_seconds(value) is None:
                raise SqlError(
                    "22023",
                    f'invalid value for parameter "mooncake.max_wait": "{value}"',
                    'A duration: a number and one of the units "us", "ms", "s", "min", "h", "d" (none: ms).',
                )
            return value.strip().replace(" ", "")
        elif key == "mooncake.as_of_lsn":
            from ...iceberg.cuts import cut_tag, parse_cut_tag

            lsn = parse_cut_tag(value.strip())
            if lsn is None:
                raise SqlError(
                    "22023",
                    f'invalid value for parameter "mooncake.as_of_lsn": "{value}"',
                    "A cut: its LSN X/Y or its tag lsn-X-Y (see `mooncake list-cuts`).",
                )
            if not self.snapshots:
                raise SqlError(
                    "0A000", "mooncake.as_of_lsn needs the warehouse's catalog, which this server was not given"
                )
            return cut_tag(lsn)
        return value

    def get(self, name: str) -> str:
        key = _CANON.get(name.lower(), name.lower())
        if key not in self.values:
            raise SqlError("42704", f'unrecognized configuration parameter "{name}"')
        return self.values[key]

    def max_wait(self) -> float:
        """``mooncake.max_wait`` in seconds."""
        return duration_seconds(self.values["mooncake.max_wait"]) or 0.0

    def cut(self) -> str | None:
        """The cut tag ``mooncake.as_of_lsn`` reads at, None for fresh reads."""
        return self.values.get("mooncake.as_of_lsn") or None


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def duration_seconds(text: str) -> float | None:
    """A Postgres time setting's value in seconds (``'5s'``, ``'500ms'``, ``'1min'``; a bare number is
    milliseconds, as for ``statement_timeout``: the manual's "Parameter Names and Values"); None when
    ``text`` is none."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s|min|h|d)?\s*", text)
    if m is None:
        return None
    return float(m.group(1)) * _UNITS[m.group(2) or "ms"]


_STYLES = {"ISO": "ISO", "SQL": "SQL", "POSTGRES": "Postgres", "GERMAN": "German"}
_ORDERS = {
    "MDY": "MDY",
    "DMY": "DMY",
    "YMD": "YMD",
    "US": "MDY",
    "NONEURO": "MDY",
    "NONEUROPEAN": "MDY",
    "EUROPEAN": "DMY",
    "EURO": "DMY",
}


def _datestyle(value: str, current: str) -> str:
    """``DateStyle`` as Postgres keeps it: the output style and the field order, each kept from
    ``current`` when ``value`` names only the other ("SET DateStyle = ISO" shows ``ISO, MDY``)."""
    style, order = (p.strip() for p in current.split(",", 1))
    for tok in re.split(r"[\s,]+", value.strip()):
        up = tok.upper()
        if up in _STYLES:
            if up != "ISO":  # values are printed in ISO style only (render.py)
                raise SqlError(
                    "0A000", f"DateStyle {_STYLES[up]} is not supported: dates and times are output in ISO style"
                )
            style = _STYLES[up]
        elif up in _ORDERS:
            order = _ORDERS[up]
        elif up:
            raise SqlError("22023", f'invalid value for parameter "DateStyle": "{value}"')
    return f"{style}, {order}"


_SET = re.compile(r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?([A-Za-z_][\w.]*)\s*(?:=|\s+TO\s+)\s*(.*?)\s*$", re.I | re.S)
_SET_TZ = re.compile(r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?TIME\s+ZONE\s+(.*?)\s*$", re.I | re.S)
_SHOW = re.compile(r"^\s*SHOW\s+([A-Za-z_][\w.]*)\s*$", re.I)
_RESET = re.compile(r"^\s*RESET\s+([A-Za-z_][\w.]*)\s*$", re.I)
_TX = {
    "BEGIN": "BEGIN",
    "START": "START TRANSACTION",
    "COMMIT": "COMMIT",
    "END": "COMMIT",
    "ROLLBACK": "ROLLBACK",
    "ABORT": "ROLLBACK",
}


def local_statement(sql: str, s: SessionSettings) -> Result | None:
    """The answer to a statement the endpoint handles itself (module docstring), else None."""
    w = words(sql, 2)
    if not w:
        return None
    head = w[0]
    if head in _TX:
        if head in ("BEGIN", "START"):
            s.status = b"T" if s.status == b"I" else s.status
            return Result(_TX[head])
        tag = "ROLLBACK" if s.status == b"E" else _TX[head]
        s.status = b"I"
        return Result(tag)
    if head in ("SAVEPOINT", "RELEASE"):
        return Result(head)
    if s.status == b"E":
        raise SqlError("25P02", "current transaction is aborted, commands ignored until end of transaction block")
    text = code_only(sql).strip().rstrip(";")
    if head == "SET":
        return _set(text, s)
    if head == "RESET":
        m = _RESET.match(text)
        if m and m.group(1).upper() == "ALL":
            s.values = dict(s.defaults)
        elif m:
            key = _CANON.get(m.group(1).lower(), m.group(1).lower())
            s.values[key] = s.defaults.get(key, "")
        return Result("RESET")
    if head == "SHOW":
        text = re.sub(r"^\s*SHOW\s+TRANSACTION\s+ISOLATION\s+LEVEL\s*$", "SHOW transaction_isolation", text, flags=re.I)
        m = _SHOW.match(text)
        if m and m.group(1).upper() == "ALL":
            return _text_result(["name", "setting"], [[k, v] for k, v in sorted(s.values.items())], "SHOW")
        if m:
            name = m.group(1)
            return _text_result([_CANON.get(name.lower(), name.lower())], [[s.get(name)]], "SHOW")
        raise SqlError("42601", "syntax error: SHOW takes one setting name (or ALL)")
    if head in ("DISCARD", "DEALLOCATE", "UNLISTEN", "CLOSE"):
        return Result(" ".join(w[:2]) if head == "DISCARD" else head)
    return None


def _set(text: str, s: SessionSettings) -> Result:
    m = _SET_TZ.match(text)
    if m:
        s.set("TimeZone", _value(m.group(1)))
        return Result("SET")
    m = _SET.match(text)
    if not m:
        if re.match(r"^\s*SET\s+(SESSION\s+)?(CHARACTERISTICS|TRANSACTION)\b", text, re.I):
            return Result("SET")
        raise SqlError("42601", "syntax error in SET: expected SET name = value")
    s.set(m.group(1), _value(m.group(2)))
    return Result("SET")


_FUNC_VERSION = re.compile(r"\b(?:pg_catalog\.)?version\s*\(\s*\)", re.I)
_FUNC_SETTING = re.compile(r"\b(?:pg_catalog\.)?current_setting\s*\(\s*'((?:[^']|'')*)'\s*(?:,\s*\w+\s*)?\)", re.I)


_FUNC_SESSION = re.compile(
    r"\b(?:pg_catalog\.)?(current_database|current_schema)\s*\(\s*\)|\b(current_user|session_user|user)\b(?!\s*\()",
    re.I,
)


def rewrite_functions(sql: str, s: SessionSettings, user: str = "", database: str = "") -> str:
    """``version()``, ``current_setting('name')``, ``current_database()``, ``current_schema()`` and
    ``current_user``/``session_user`` replaced by their values as SQL literals (the session's, not
    DuckDB's), outside string literals and comments."""
    from .sqltext import rewrite_code

    def lit(v: str) -> str:
        return "'" + v.replace("'", "''") + "'"

    def session_value(m: re.Match[str]) -> str:
        name = (m.group(1) or m.group(2)).lower()
        if name == "current_database":
            return lit(database or "mooncake")
        if name == "current_schema":
            return lit("public")
        return lit(user)

    def one(code: str) -> str:
        return _FUNC_SESSION.sub(session_value, _FUNC_VERSION.sub(lit(VERSION_TEXT), code))

    # current_setting's argument is a literal: matched over the whole text
    sql = _FUNC_SETTING.sub(lambda m: lit(s.get(m.group(1).replace("''", "'"))), sql)
    return rewrite_code(sql, one)
