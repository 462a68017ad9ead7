"""Names: source tables as Postgres parses a qualified name, and the rule for mirror names.

**Source tables** (``create-table DST SRC``) are named the way SQL names them: ``schema.table`` or
``table`` (found by the connection's ``search_path``), each part either *unquoted* — folded to lower
case, so ``public.User`` means ``public.user`` — or *double-quoted*, kept exactly, with ``""`` for a
quote inside and dots and spaces allowed: ``"Sales Data"."Q1 Orders"``, ``public."User"``. (PG docs,
"Lexical Structure: Identifiers and Key Words"; the function ``parse_ident``.)

:func:`resolve_table` does it on the server: ``parse_ident()`` splits the text (so the rules are
Postgres's own, including its errors), ``to_regclass()`` finds the table, and the names come back
from ``pg_namespace``/``pg_class``. Every later statement names the table with psycopg's
``sql.Identifier(schema, table)`` (:meth:`TableName.ident`), never by pasting text. A name that does
not resolve gets one line saying how it was parsed (``schema "sales data", table "q1 orders"``) and,
when an unquoted part matched another table only ignoring case, the quoted form to use.

:func:`split_qualified_name` is the same parse done locally, for the places that have no server at
hand (the Dagster definitions build asset keys at load time); tests check it against ``parse_ident``.

**Mirror names** (``DST``) become the Iceberg table ``mooncake.<DST>``, a directory
``<state>/tables/<DST>``, a DuckDB view in union reads and the last part of Dagster asset keys, so
they are kept to what all of those take without quoting: 1–63 ASCII letters, digits and ``_``, not
starting with a digit (:func:`check_mirror_name`). Two mirrors may not differ only in case (DuckDB
and case-insensitive file systems would not tell them apart).

**Column names** are never restricted: they are carried as they are (mixed case, reserved words,
spaces, non-ASCII, 63 bytes) and quoted wherever SQL names them. The one limit: two columns of a
table may not differ only in ASCII case (``"id"`` and ``"ID"``; :func:`case_collision`), which DuckDB
cannot tell apart. :func:`asset_key_part` maps any
name to a Dagster asset key part (which allows only ``[A-Za-z0-9_]``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

__all__ = [
    "TableName",
    "InvalidName",
    "split_qualified_name",
    "quote_part",
    "format_name",
    "resolve_table",
    "check_mirror_name",
    "asset_key_part",
    "case_collision",
    "MIRROR_NAME_RULE",
]

NAMEDATALEN = 64  # Postgres identifiers keep at most NAMEDATALEN - 1 = 63 bytes
_SPACE = " \t\n\r\f\v"
MIRROR_NAME_RULE = "1-63 ASCII letters, digits and _, not starting with a digit"
_MIRROR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SIMPLE = re.compile(r"[a-z_][a-z0-9_]*")


class InvalidName(ValueError):
    """A table name that does not parse or does not resolve; the message is one line for the user."""


@dataclass(frozen=True)
class TableName:
    """A table as the catalogs spell it: ``schema`` = ``pg_namespace.nspname``, ``name`` =
    ``pg_class.relname`` (exact text, no quoting). ``str()`` is the SQL form, quoted where needed
    (``public."User"``, ``"Sales Data"."Q1 Orders"``), which parses back to the same table."""

    schema: str
    name: str

    def ident(self) -> sql.Identifier:
        """``"schema"."name"`` for psycopg's ``sql.SQL(...).format()``."""
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return format_name(self.schema, self.name)


def quote_part(name: str) -> str:
    """One name part as the qualified-name parser needs it: unquoted when it is all lower-case ASCII
    letters, digits and ``_`` (not starting with a digit), else double-quoted with ``"`` doubled.
    Key words are not quoted: ``parse_ident``/``to_regclass`` take them unquoted (``public.order``)."""
    return name if _SIMPLE.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def format_name(*parts: str) -> str:
    """``quote_part`` of each part, joined with dots."""
    return ".".join(quote_part(p) for p in parts)


def _is_ident_start(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ord(ch) >= 0x80


def _is_ident_cont(ch: str) -> bool:
    return _is_ident_start(ch) or ("0" <= ch <= "9") or ch == "$"


def split_qualified_name(text: str) -> list[str]:
    """The parts of a qualified name, parsed like Postgres's ``parse_ident(text)`` (strict): quoted
    parts kept exactly (``""`` → ``"``), unquoted parts folded to lower case (ASCII letters only, as
    Postgres does in a UTF-8 database), spaces around parts ignored; no truncation to 63 bytes.

    Raises :class:`InvalidName` for text that is not a qualified name (empty, an unclosed quote, an
    empty quoted part, a dot with nothing on one side, other characters)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n and text[i] in _SPACE:
        i += 1
    after_dot = False
    while True:
        if i < n and text[i] == '"':
            j, part = i + 1, []
            while True:
                k = text.find('"', j)
                if k < 0:
                    raise InvalidName(f"name {text!r} has an unclosed double quote")
                part.append(text[j:k])
                if k + 1 < n and text[k + 1] == '"':
                    part.append('"')
                    j = k + 2
                    continue
                i = k + 1
                break
            name = "".join(part)
            if not name:
                raise InvalidName(f'name {text!r} has an empty quoted part ("")')
            out.append(name)
        elif i < n and _is_ident_start(text[i]):
            j = i + 1
            while j < n and _is_ident_cont(text[j]):
                j += 1
            out.append("".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text[i:j]))
            i = j
        else:
            where = "after a dot" if after_dot else ("before a dot" if i < n and text[i] == "." else "")
            raise InvalidName(
                f"name {text!r} has no valid identifier {where}".rstrip()
                + ' (quote a part that is not a plain word: "Sales Data"."Q1 Orders")'
            )
        while i < n and text[i] in _SPACE:
            i += 1
        if i < n and text[i] == ".":
            after_dot = True
            i += 1
            while i < n and text[i] in _SPACE:
                i += 1
            continue
        if i >= n:
            return out
        raise InvalidName(
            f"name {text!r} has invalid characters after {format_name(*out)} "
            '(quote a part that holds spaces or other characters: "Sales Data"."Q1 Orders")'
        )


def _parts_text(parts: list[str]) -> str:
    kinds = {1: ["table"], 2: ["schema", "table"], 3: ["database", "schema", "table"]}.get(len(parts))
    if kinds is None:
        return ", ".join(f'"{p}"' for p in parts)
    return ", ".join(f'{k} "{p}"' for k, p in zip(kinds, parts))


def resolve_table(conn: psycopg.Connection, text: str) -> tuple[int, TableName]:
    """Find the relation ``text`` names, on the server: ``(oid, TableName)``.

    ``text``: ``schema.table``, ``table`` (the connection's ``search_path``) or ``db.schema.table``
    (the current database only), parsed by ``parse_ident`` as described in the module docstring.
    Any relation kind is returned (the caller checks it is a table), also one in a schema the role has
    no ``USAGE`` on (found in the catalogs; the caller's checks say what to grant). Runs in a transaction block of
    its own (or a savepoint), leaving the connection as it found it.

    Raises :class:`InvalidName` with one line: the text does not parse (Postgres's reason), names
    another database, or does not resolve — then the message says how it was parsed and, when a
    table matches ignoring case, the quoted form (``did you mean public."User"?``)."""
    with conn.transaction(), conn.cursor() as cur:
        try:
            with conn.transaction():
                row = cur.execute("SELECT parse_ident(%s)", (text,)).fetchone()
                assert row is not None  # a SELECT without FROM returns one row
                parts = row[0]
        except psycopg.Error as e:
            msg = (e.diag.message_primary or str(e)).strip()
            detail = (e.diag.message_detail or "").strip()
            raise InvalidName(
                f"table name {text!r} does not parse as a qualified name: {msg}"
                + (f" {detail}" if detail else "")
                + ' (quote parts with spaces, dots or capitals: \'"Sales Data"."Q1 Orders"\')'
            ) from None
        if len(parts) > 3:
            raise InvalidName(f"table name {text!r} has too many dotted parts ({_parts_text(parts)}): use schema.table")
        if len(parts) == 3:
            db_row = cur.execute("SELECT current_database()").fetchone()
            assert db_row is not None  # a SELECT without FROM returns one row
            db = db_row[0]
            if parts[0][: NAMEDATALEN - 1] != db:
                raise InvalidName(
                    f'table name {text!r} names database "{parts[0]}", but the source DSN connects '
                    f'to database "{db}" (cross-database references are not possible)'
                )
            parts = parts[1:]
        quoted = sql.Identifier(*parts).as_string(conn)
        try:
            with conn.transaction():
                row = cur.execute(
                    "SELECT c.oid, n.nspname, c.relname FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
                    (quoted,),
                ).fetchone()
        except psycopg.errors.InsufficientPrivilege:
            if len(parts) != 2:  # pragma: no cover — search_path leaves out schemas without USAGE
                raise
            # no USAGE on the named schema (to_regclass checks it): the catalogs, which any role may
            # read, still tell which table it is, and the caller's checks name the missing GRANT
            row = cur.execute(
                "SELECT c.oid, n.nspname, c.relname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                tuple(_truncated(p) for p in parts),
            ).fetchone()
        if row is not None:
            return int(row[0]), TableName(row[1], row[2])
        where = _parts_text(parts)
        hint = _case_hint(cur, parts)
        raise InvalidName(
            f"table {text} does not exist (parsed as {where}"
            + (", looked up by search_path " + _search_path(cur) if len(parts) == 1 else "")
            + ")"
            + hint
        )


def _truncated(part: str) -> str:
    """``part`` cut to the 63 bytes Postgres keeps of an identifier (never inside a UTF-8 character)."""
    return part.encode("utf-8")[: NAMEDATALEN - 1].decode("utf-8", errors="ignore")


def _search_path(cur: psycopg.Cursor[Any]) -> str:
    try:
        row = cur.execute("SELECT current_schemas(false)").fetchone()
        assert row is not None  # a SELECT without FROM returns one row
        return ", ".join(row[0]) or "(empty)"
    except psycopg.Error:  # pragma: no cover
        return "?"


def _case_hint(cur: psycopg.Cursor[Any], parts: list[str]) -> str:
    """``; did you mean …?`` for tables whose name matches ``parts`` ignoring case (schema too when
    given), quoted as they must be written; '' when there is none."""
    if len(parts) == 1:
        rows = cur.execute(
            "SELECT n.nspname, c.relname, n.nspname = ANY(current_schemas(false)) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE lower(c.relname) = lower(%s) "
            "AND c.relkind IN ('r', 'p') ORDER BY 3 DESC, 1, 2 LIMIT 5",
            (parts[0],),
        ).fetchall()
    else:
        rows = cur.execute(
            "SELECT n.nspname, c.relname, true FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE lower(c.relname) = lower(%s) AND lower(n.nspname) = lower(%s) AND c.relkind IN ('r', 'p') "
            "ORDER BY 1, 2 LIMIT 5",
            (parts[1], parts[0]),
        ).fetchall()
    if not rows:
        return ""
    forms = []
    for nsp, rel, visible in rows:
        forms.append(format_name(rel) if len(parts) == 1 and visible and len(rows) == 1 else format_name(nsp, rel))
    return (
        f"; did you mean {' or '.join(forms)}? (unquoted names are folded to lower case; quote a name with "
        "capitals, spaces or dots, and quote the whole argument for the shell: "
        '\'"Sales Data"."Q1 Orders"\')'
    )


def check_mirror_name(name: str) -> str:
    """``name`` when it is a valid mirror name (:data:`MIRROR_NAME_RULE`), else :class:`InvalidName`
    with one line suggesting a valid spelling."""
    if isinstance(name, str) and _MIRROR_NAME.fullmatch(name):
        return name
    suggestion = re.sub(r"[^A-Za-z0-9_]+", "_", str(name)).strip("_")[:63] or "t"
    if suggestion[0].isdigit():
        suggestion = "t_" + suggestion[:61]
    raise InvalidName(
        f"mirror name {name!r} is not valid: use {MIRROR_NAME_RULE} (e.g. {suggestion}); the "
        "source table's own name may be anything"
    )


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def case_collision(names: Iterable[str]) -> tuple[str, str] | None:
    """The first two of ``names`` that differ only in the case of ASCII letters (``"id"``, ``"ID"``), or
    None. Postgres tells such columns apart; DuckDB, which runs union reads, matches identifiers
    ignoring ASCII case and would read one for the other, so such a table is refused."""
    seen: dict[str, str] = {}
    for n in names:
        other = seen.setdefault(n.translate(_ASCII_LOWER), n)
        if other != n:
            return other, n
    return None


def asset_key_part(name: str) -> str:
    """A Dagster asset key part (``[A-Za-z0-9_]+``) for any name: the name itself when it fits, else
    its runs of other characters replaced by ``_`` plus 8 hex digits of its SHA-1, so that different
    names never map to the same part (``Sales Data`` → ``Sales_Data_e7470ad3``)."""
    if re.fullmatch(r"[A-Za-z0-9_]+", name):
        return name
    base = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")[:40]
    h = hashlib.sha1(name.encode("utf-8")).hexdigest()[:8]
    return f"{base}_{h}" if base else f"n_{h}"
