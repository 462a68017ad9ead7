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
    "with_password_hint",
    "PASSWORD_HINT",
    "SESSION_SETTINGS",
    "OUTPUT_SETTINGS",
    "PG_OPTIONS",
    "options_string",
    "with_options",
]

MASK = "********"
_URI_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:([^/\s]*)@")  # greedy: up to the last '@'
_LOOSE_PASSWORD = re.compile(r"password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))|://[^:/@\s]*:([^@\s]+)@")
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


def split_password(dsn: str | None) -> tuple[str | None, str | None]:
    """``(dsn without its password, the password or None)`` for a libpq key/value string or URI.

    A DSN without a password comes back unchanged (the same text). One with a password comes back as
    a key/value string (``make_conninfo``) without the ``password`` key; the password is remembered
    for :func:`scrub`. A DSN that libpq cannot parse comes back unchanged (connecting reports it)."""
    if not dsn:
        return dsn, None
    m: re.Match[str] | None
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        for m in _LOOSE_PASSWORD.finditer(dsn):  # still blank out what looks like its password
            remember_secret(next(g for g in m.groups() if g))
        return dsn, None
    m = _URI_USERINFO.match(dsn)
    if m and m.group(1).count("@"):  # an '@' left unencoded in a URI's password: libpq splits it wrongly
        remember_secret(m.group(1))
        for piece in m.group(1).split("@"):
            if len(piece) >= 4:
                remember_secret(piece)
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
        for m in _LOOSE_PASSWORD.finditer(dsn):
            remember_secret(next(g for g in m.groups() if g))
        why = " ".join(str(e).split())
        return f"DSN {scrub(dsn)} is not valid: {scrub(why)}"
    return None


def split_uri_password(uri: str | None) -> tuple[str | None, str | None]:
    """``(uri without the password of its user-info, password or None)`` for URL-style URIs such as a
    catalog's ``postgresql+psycopg://user:pw@host/db`` or ``https://user:pw@host``; the password is
    remembered for :func:`scrub`."""
    if not uri or "@" not in uri or "://" not in uri:
        return uri, None
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri, None
    pw = urllib.parse.unquote(parts.password)
    remember_secret(pw)
    remember_secret(parts.password)
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.netloc.rsplit("@", 1)[0].split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}")), pw


def connect_error(e: BaseException) -> str:
    """One line for a failed connection: the driver's first line, scrubbed, plus where a password can
    come from when the server asked for one (:data:`PASSWORD_HINT`)."""
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(e).__name__
    # libpq puts the server's FATAL line after "connection to server at … failed:"
    fatal = next((ln for ln in lines if "password" in ln.lower()), None)
    if fatal and fatal != first:
        first = f"{first} {fatal}"
    return with_password_hint(scrub(first))


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
