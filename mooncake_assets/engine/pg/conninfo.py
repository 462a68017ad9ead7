"""Passwords in connection strings: kept out of files, output and logs.

mooncake never writes a password to its state directory. A DSN given with one (``postgresql://u:pw@h/db``
or ``… password=pw``) is saved without it (:func:`split_password`); the process that was given it keeps
it in memory and hands it to the service it starts through that process's environment only
(``MOONCAKE_PG_DSN``, see ``engine/service/process.py``). Everywhere else the password comes from where
libpq looks for one when the DSN has none (PG docs, "libpq: Connection Strings", "The Password File",
"The Connection Service File"): ``PGPASSWORD``, the password file (``PGPASSFILE``, default
``~/.pgpass``), or a ``service=`` entry of ``pg_service.conf`` (``PGSERVICEFILE``, ``~/.pg_service.conf``).

Every password this process has seen is remembered (:func:`remember_secret`) so that :func:`scrub`
can blank it out of any text before it is printed or logged (:class:`ScrubFilter` for logging).
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from typing import Any, cast

from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = [
    "split_password",
    "strip_password",
    "redact",
    "dsn_problem",
    "remember_secret",
    "scrub",
    "ScrubFilter",
    "split_uri_password",
    "install_log_scrubber",
    "connect_error",
    "connect_reason",
    "catalog_error",
    "CATALOG_HINT",
    "login_refused",
    "with_password_hint",
    "PASSWORD_HINT",
    "SESSION_SETTINGS",
    "OUTPUT_SETTINGS",
    "PG_OPTIONS",
    "options_string",
    "with_options",
]

MASK = "********"
_URI_START = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
# the user info of a URI: user, ':', the password up to the last '@' before the first '/' (libpq ends it
# at the first '@' or '/'; a user's unencoded '@' or space is taken as part of the password here)
_URI_PASSWORD = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://[^:/@?\s]*:([^/]*)@")
# ... and one with an unencoded '/': what follows the ':' is no port number, an '@' comes later
_URI_SLASHED_PASSWORD = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://[^:/@?\s]*:((?![0-9]*[/?,]|[0-9]*$)[^@]*/[^@]*)@")
# a URI's query parameter whose name ends in "password" (password, sslpassword): its value up to the
# next '&' (or the end: a space or an unencoded '=' or '#' is taken as part of it)
_URI_QUERY_PASSWORD = re.compile(r"[?&][A-Za-z_]*password=([^&]*)", re.IGNORECASE)
_SECRETS: set[str] = set()

PASSWORD_HINT = (
    "mooncake keeps no password in its state directory: give it to this process by PGPASSWORD, "
    "the password file (~/.pgpass or PGPASSFILE), a service entry (service=… in the DSN, "
    "pg_service.conf), MOONCAKE_PG_DSN, or --dsn with the password"
)


def remember_secret(secret: str | None) -> None:
    """Blank ``secret`` out of everything :func:`scrub` sees from now on (no-op for None or '')."""
    if secret:
        _SECRETS.add(secret)
        q = urllib.parse.quote(secret, safe="")
        if q != secret:  # as it appears inside a URI
            _SECRETS.add(q)


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by ``********``."""
    if not _SECRETS or not isinstance(text, str):
        return text
    for s in sorted(_SECRETS, key=len, reverse=True):
        if s in text:
            text = text.replace(s, MASK)
    return text


def _loose_passwords(dsn: str) -> list[str]:
    """Every text of ``dsn`` that is or looks like a password, as written and as libpq reads it, found
    without libpq (so also in a DSN it cannot parse): the value of each ``…password`` key of a key/value
    string (a quoted value without its closing quote runs to the end of the string), or the password of a
    URI's user info or ``?password=``/``&sslpassword=`` parameter, as written and percent-decoded. Keys
    are matched in any case: libpq refuses ``PASSWORD=`` (its keywords are lower case), but it is still
    the user's password. Syntax: PG docs, "libpq: Connection Strings" (34.1.1.1 Keyword/Value Connection
    Strings: single quotes, ``\\'`` and ``\\\\`` escapes; 34.1.1.2 Connection URIs)."""
    found: list[str] = []
    if _URI_START.match(dsn):
        raws = [m.group(1) for m in (_URI_PASSWORD.match(dsn), _URI_SLASHED_PASSWORD.match(dsn)) if m]
        raws += [m.group(1) for m in _URI_QUERY_PASSWORD.finditer(dsn)]
        for raw in raws:
            found += [raw, urllib.parse.unquote(raw, errors="replace")]
            # an unencoded '@' or '/' makes libpq read parts of it as host, port or database name
            found += [p for p in re.split(r"[@/]", raw) if len(p) >= 4 and p != raw]
        return [f for f in found if f]
    for key, raw, value in _keyword_values(dsn):
        if key.lower().endswith("password"):
            found += [raw, value]
    return [f for f in found if f]


_SPACE = " \t\n\r\f\v"  # C isspace(), which libpq's parser uses


def _keyword_values(dsn: str) -> list[tuple[str, str, str]]:
    """``(key, value as written, value as libpq reads it)`` of each ``key = value`` of a key/value
    conninfo string, read as libpq's ``conninfo_parse`` does (a value in single quotes or up to the next
    white space; a backslash takes the next character as it is) except that nothing is an error: a word
    without ``=`` is skipped, a quoted value without its closing quote runs to the end."""
    out: list[tuple[str, str, str]] = []
    i, n = 0, len(dsn)
    while i < n:
        while i < n and dsn[i] in _SPACE:
            i += 1
        start = i
        while i < n and dsn[i] != "=" and dsn[i] not in _SPACE:
            i += 1
        key = dsn[start:i]
        while i < n and dsn[i] in _SPACE:
            i += 1
        if i >= n or dsn[i] != "=":
            continue  # libpq: missing "=" after the word; the next word is looked at
        i += 1
        while i < n and dsn[i] in _SPACE:
            i += 1
        value: list[str] = []
        if i < n and dsn[i] == "'":
            i += 1
            start = i
            while i < n and dsn[i] != "'":
                if dsn[i] == "\\" and i + 1 < n:
                    i += 1
                value.append(dsn[i])
                i += 1
            raw = dsn[start:i]
            i += 1  # the closing quote
        else:
            start = i
            while i < n and dsn[i] not in _SPACE:
                if dsn[i] == "\\" and i + 1 < n:
                    i += 1
                elif dsn[i] == "\\":
                    break
                value.append(dsn[i])
                i += 1
            raw = dsn[start:i]
        out.append((key, raw, "".join(value)))
    return out


def _remember_loose(dsn: str) -> None:
    for secret in _loose_passwords(dsn):
        remember_secret(secret)


def split_password(dsn: str | None) -> tuple[str | None, str | None]:
    """``(dsn without its password, the password or None)`` for a libpq key/value string or URI.

    A DSN without a password comes back unchanged (the same text). One with a password comes back as
    a key/value string (``make_conninfo``) without the ``password`` key; the password is remembered
    for :func:`scrub`, as libpq reads it and as the DSN writes it (quoted, escaped, percent-encoded).
    A DSN that libpq cannot parse comes back unchanged (connecting reports it), what looks like its
    password remembered (:func:`_loose_passwords`: e.g. all of an unterminated ``password='…``)."""
    if not dsn:
        return dsn, None
    _remember_loose(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return dsn, None
    password = params.pop("password", None)
    if password is None:
        return dsn, None
    remember_secret(str(password))
    return make_conninfo(**cast("dict[str, Any]", params)), str(password)


def strip_password(dsn: str | None) -> str | None:
    """The DSN without its password (see :func:`split_password`)."""
    return split_password(dsn)[0]


def redact(dsn: str | None) -> str | None:
    """A DSN to show: without its password (``str(dsn)`` scrubbed when it does not parse)."""
    out, _ = split_password(dsn)
    return scrub(out) if out else out


def dsn_problem(dsn: str | None) -> str | None:
    """Why libpq cannot parse ``dsn`` (key/value string or URI), in one line naming the bad parameter
    and showing the DSN without its password — or None when it parses (or is empty). Parsing only: no
    connection is made."""
    if not dsn:
        return None
    try:
        conninfo_to_dict(dsn)
    except Exception as e:
        _remember_loose(dsn)
        why = " ".join(scrub(str(e)).split())  # scrubbed first: the error may echo it with odd white space
        return f"DSN {scrub(dsn)} is not valid: {why}"
    return None


def split_uri_password(uri: str | None) -> tuple[str | None, str | None]:
    """``(uri without the password of its user-info, password or None)`` for URL-style URIs such as a
    catalog's ``postgresql+psycopg://user:pw@host/db`` or ``https://user:pw@host``; the password is
    remembered for :func:`scrub`."""
    if not uri or "@" not in uri or "://" not in uri:
        return uri, None
    _remember_loose(uri)  # also what libpq would read as its password (an unencoded '/', '@' or space)
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri, None
    pw = urllib.parse.unquote(parts.password)
    remember_secret(pw)
    remember_secret(parts.password)
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}")), pw


def connect_reason(e: BaseException) -> str:
    """The driver's reason for a failed connection in one scrubbed line: its first line, plus the
    server's line about a password (libpq puts the server's FATAL line after "connection to server at …
    failed:"). For an SQLAlchemy error, its driver's error (``e.orig``): without SQLAlchemy's
    "(Background on this error at: https://sqlalche.me/…)" and its statement."""
    orig = getattr(e, "orig", None)
    if isinstance(orig, BaseException):
        e = orig
    text = scrub(str(e)).strip()  # scrubbed before it is cut into lines and its white space collapsed
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("(Background on")]
    first = lines[0] if lines else type(e).__name__
    fatal = next((ln for ln in lines if "password" in ln.lower()), None)
    if fatal and fatal != first:
        first = f"{first} {fatal}"
    return " ".join(first.split())


def connect_error(e: BaseException) -> str:
    """One line for a failed connection to the source: :func:`connect_reason`, plus where a password can
    come from when the server asked for one (:data:`PASSWORD_HINT`)."""
    return with_password_hint(connect_reason(e))


#: where the password of a catalog URI comes from (its own, not the source's: :data:`PASSWORD_HINT`)
CATALOG_HINT = (
    "check the user and password of the catalog URI (--catalog-uri or MOONCAKE_CATALOG_URI); mooncake keeps "
    "no password in its state directory: give the URI with its password to the command that starts the "
    "service, or put the password in the password file (~/.pgpass or PGPASSFILE)"
)


def catalog_error(uri: str, e: BaseException) -> str:
    """One line for an Iceberg catalog that could not be opened: the catalog's URI without its password,
    the driver's reason (:func:`connect_reason`, no SQLAlchemy link or statement) and, when the server
    refused the login, :data:`CATALOG_HINT` (never the source's :data:`PASSWORD_HINT`). ``e``: the
    connection's error (an ``OperationalError`` or ``InterfaceError``, of SQLAlchemy or the driver) or one
    of a statement that opening the catalog runs (creating its tables: e.g. no ``CREATE`` privilege)."""
    shown, _ = split_uri_password(uri)
    shown = scrub(shown or uri)
    reason = connect_reason(e)
    if type(e).__name__ not in ("OperationalError", "InterfaceError"):
        return f"the Iceberg catalog at {shown} cannot be used: {reason}"
    if login_refused(reason):
        return f"cannot log in to the Iceberg catalog at {shown}: {reason} ({CATALOG_HINT})"
    return f"the Iceberg catalog at {shown} could not be reached: {reason}"


# FATAL errors of a server that answered but will not come back by itself: the login needs a fix
# (PostgreSQL's messages of client authentication and of a missing database, "Client Authentication",
# https://www.postgresql.org/docs/current/client-authentication-problems.html). Messages of a server that
# is starting, stopping or full are transient and not listed.
_LOGIN_REFUSED = (
    "authentication failed",
    "no password supplied",
    "password is required",
    "no pg_hba.conf entry",
    "does not exist",
    "is not permitted to log in",
    "permission denied",
    "pg_hba.conf rejects",
)


def login_refused(message: str) -> bool:
    """True when libpq's connection ``message`` says the server answered and refused the login (a fix of
    the DSN or the server's roles is needed), False when the server could not be reached or was
    transiently unavailable (refused connection, timeout, unknown host, starting up, too many clients)."""
    low = message.lower()
    return any(m in low for m in _LOGIN_REFUSED)


_ASKED = ("no password supplied", "password authentication failed", "password is required", "password required")


def with_password_hint(msg: str) -> str:
    """``msg`` plus where a password can come from (:data:`PASSWORD_HINT`), when ``msg`` says the server
    wanted one (``fe_sendauth: no password supplied``, ``password authentication failed``)."""
    low = msg.lower()
    if CATALOG_HINT in msg or "iceberg catalog" in low:  # the catalog's login, not the source's
        return msg
    if any(a in low for a in _ASKED) and PASSWORD_HINT not in msg:
        return f"{msg} ({PASSWORD_HINT})"
    return msg


class ScrubFilter(logging.Filter):
    """A logging filter that blanks remembered secrets out of each record's message (and arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _SECRETS:
            try:
                msg = record.getMessage()
            except Exception:
                return True
            record.msg, record.args = scrub(msg), None
            if record.exc_info and record.exc_info[1] is not None:
                import traceback

                record.exc_text = scrub("".join(traceback.format_exception(*record.exc_info)).rstrip())
                record.exc_info = None
        return True


def install_log_scrubber() -> None:
    """Add a :class:`ScrubFilter` to every handler of the root logger (idempotent)."""
    root = logging.getLogger()
    for h in root.handlers:
        if not any(isinstance(f, ScrubFilter) for f in h.filters):
            h.addFilter(ScrubFilter())


#: GUCs every session mooncake opens to the source has: they pin every value's text form, which the
#: decoders rely on (see table/keys.py) — ISO dates, UTC, Postgres-style intervals, hex bytea, exact
#: floats, C money format (``'-$1,234.56'``). The one source of these settings: the walsender and the
#: initial copy take :data:`OUTPUT_SETTINGS`, every other session :data:`PG_OPTIONS`.
SESSION_SETTINGS: dict[str, str] = {
    "DateStyle": "ISO",
    "TimeZone": "UTC",
    "IntervalStyle": "postgres",
    "bytea_output": "hex",
    "extra_float_digits": "3",
    "lc_monetary": "C",
}

#: :data:`SESSION_SETTINGS` plus ``search_path=pg_catalog``, for the sessions whose value texts must be
#: the stream's (the walsender, the initial copy, the generated-columns session): reg* types
#: (regclass, regtype, …) print a name schema-qualified unless its schema is on the search_path, so
#: with only pg_catalog on it they name an object the same way in each. Not for sessions that resolve
#: a user's table name (create-table, pre-flight): those keep the role's search_path.
OUTPUT_SETTINGS: dict[str, str] = {**SESSION_SETTINGS, "search_path": "pg_catalog"}


def options_string(settings: dict[str, str]) -> str:
    """``settings`` as libpq ``options`` (``-c key=value …``; the values hold no spaces)."""
    return " ".join(f"-c {k}={v}" for k, v in settings.items())


# session settings that pin every value's text form (the decoders rely on them; see table/keys.py)
PG_OPTIONS = options_string(SESSION_SETTINGS)


def with_options(dsn: str, settings: dict[str, str] | None = None) -> str:
    """``dsn`` with the session settings that pin every value's text form (``settings``, default
    :data:`SESSION_SETTINGS`; :data:`OUTPUT_SETTINGS` for the stream's text output) appended to its
    ``options`` (they win over the same keys set before); a ``-c key=value`` the DSN already ends with
    is not repeated. Returns a key/value conninfo string; errors: ``psycopg.ProgrammingError`` for a
    DSN that does not parse. Source: PG docs, "libpq: Parameter Key Words" (``options``)."""
    d = conninfo_to_dict(dsn)
    have = str(d.get("options", "")).split()
    todo = [f"-c {k}={v}" for k, v in (SESSION_SETTINGS if settings is None else settings).items()]
    # already applied last (e.g. with_options twice): leave it; anything else is appended so it wins
    tail = " ".join(have)
    add = [o for o in todo if not _ends_with_setting(tail, o)]
    d["options"] = (" ".join(have) + " " + " ".join(add)).strip()
    return make_conninfo(**cast("dict[str, Any]", d))


def source_label(dsn: str) -> str:
    """``dsn`` as ``key=value`` conninfo without its secrets (``password``, ``sslpassword``), keys
    sorted, for messages, ``status`` and the ``ping`` answer: two DSNs that give libpq the same
    parameters get the same label, so labels are compared to tell whether two commands name one source
    (libpq's parameters: https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS).
    A DSN libpq cannot parse comes back as its own text, scrubbed (:func:`split_password` blanks what
    looks like its password): it equals only a DSN written the same way."""
    out, _ = split_password(dsn)
    assert out is not None  # split_password gives a str DSN back as a str
    try:
        params = conninfo_to_dict(out)
    except Exception:
        return scrub(out)
    return make_conninfo(**cast("dict[str, Any]", {k: params[k] for k in sorted(params) if "password" not in k}))


def _ends_with_setting(options: str, setting: str) -> bool:
    """Is ``setting`` (``-c k=v``) in ``options`` with no later ``-c k=…`` overriding it?"""
    key = setting.split("=", 1)[0] + "="
    at = options.rfind(setting)
    return at >= 0 and options.rfind(key) == at
