"""``COPY … TO STDOUT``: a query's rows streamed in COPY's text or CSV format (psql's ``\\copy … to``,
psycopg's ``cursor.copy()``).

Sources: the PostgreSQL manual, "COPY" (the statement's forms and options; text format: columns
separated by the delimiter, default tab, NULL as ``\\N``, backslash escapes for backslash, newline,
carriage return, tab and the delimiter; CSV: a value holding the delimiter, the quote, CR or LF —
or an empty string, which would read back as NULL — is quoted, quotes doubled, NULL is an empty
unquoted field) and "Frontend/Backend Protocol / Message Flow / COPY Operations" (CopyOutResponse,
one CopyData per row, CopyDone, then CommandComplete ``COPY n``).

Supported: ``COPY (query) TO STDOUT`` and ``COPY table [(columns)] TO STDOUT``, options ``FORMAT
text|csv``, ``HEADER``, ``DELIMITER``, ``NULL``, ``QUOTE`` (both the ``WITH (…)`` list and the old
``CSV HEADER`` words). ``COPY … TO 'file'``/``PROGRAM`` and binary format: SQLSTATE ``0A000`` with
what to use instead; ``COPY … FROM``: a write, refused as every write is (``25006``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .catalog import SqlError
from .sqltext import code_only, top_level

_TARGET = re.compile(r"\s*TO\s+(STDOUT\b|\S+)(.*)$", re.I | re.S)
_TABLE = re.compile(r'\s*((?:"(?:[^"]|"")*"|[\w$]+)(?:\s*\.\s*(?:"(?:[^"]|"")*"|[\w$]+))*)\s*(\([^)]*\))?', re.S)


@dataclass
class CopyOut:
    """One ``COPY … TO STDOUT``: the ``query`` whose rows go out and how they are written."""

    query: str
    csv: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    quote: str = '"'

    def line(self, values: list[str | None]) -> bytes:
        """One row in the COPY format, with its newline."""
        if self.csv:
            out = [self._csv(v) for v in values]
        else:
            out = [self.null if v is None else self._text(v) for v in values]
        return (self.delimiter.join(out) + "\n").encode()

    def _text(self, v: str) -> str:
        v = v.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
        return v.replace(self.delimiter, "\\" + self.delimiter) if self.delimiter != "\t" else v

    def _csv(self, v: str | None) -> str:
        if v is None:
            return self.null
        q = self.quote
        if v == "" or v == self.null or any(c in v for c in (self.delimiter, q, "\n", "\r")) or v.startswith("\\."):
            return q + v.replace(q, q + q) + q
        return v


def _literal(raw: str | None) -> str:
    """The value of one COPY option token: a quoted string literal ``'a''b'`` without its quotes and with
    doubled quotes undone (``a'b``), any other word as it is, ``""`` for a missing token (None).
    String constants: https://www.postgresql.org/docs/current/sql-syntax-lexical.html#SQL-SYNTAX-STRINGS
    (the tokens ``_options`` splits are such literals and plain words)."""
    if raw is None:
        return ""
    if raw.startswith("'"):
        return raw[1:-1].replace("''", "'")
    return raw


def _query_part(rest: str) -> tuple[str, str]:
    """``(query)`` at the start of ``rest``: (the query, the text after its closing parenthesis)."""
    for i, ch, depth in top_level(rest):
        if ch == ")" and depth == 1:
            return rest[1:i], rest[i + 1 :]
    raise SqlError("42601", "syntax error in COPY: unbalanced parentheses")


def _options(text: str, plan: CopyOut) -> None:
    """The options after ``TO STDOUT``: ``[WITH] (name value, …)`` or the old ``CSV HEADER …`` words."""
    tokens = re.findall(r"'(?:[^']|'')*'|\w+", re.sub(r"^\s*WITH\b", "", text.strip().rstrip(";"), flags=re.I))
    i = 0
    delimiter_given = False
    while i < len(tokens):
        name = tokens[i].upper()
        i += 1
        value = ""
        if name in ("FORMAT", "DELIMITER", "NULL", "QUOTE", "ESCAPE", "ENCODING", "FORCE_QUOTE") and i < len(tokens):
            value, i = _literal(tokens[i]), i + 1
        elif name == "HEADER" and i < len(tokens) and tokens[i].lower() in ("true", "false", "on", "off", "0", "1"):
            value, i = tokens[i].lower(), i + 1
        if name == "BINARY" or (name == "FORMAT" and value.lower() == "binary"):
            raise SqlError(
                "0A000", "COPY's binary format is not supported", "use FORMAT text or FORMAT csv (COPY … TO STDOUT)"
            )
        if name == "FORMAT" and value.lower() in ("csv", "text"):
            plan.csv = value.lower() == "csv"
        elif name == "CSV":
            plan.csv = True
        elif name == "HEADER":
            plan.header = value not in ("false", "off", "0")
        elif name == "DELIMITER" and len(value) == 1:
            plan.delimiter, delimiter_given = value, True
        elif name == "NULL":
            plan.null = value
        elif name == "QUOTE" and len(value) == 1:
            plan.quote = value
        elif name not in ("ENCODING", "ESCAPE"):
            raise SqlError("42601", f'COPY option "{name.lower()}" is not supported here')
    if plan.csv and plan.null == "\\N":
        plan.null = ""
    if plan.csv and not delimiter_given:
        plan.delimiter = ","


def copy_out(sql: str) -> CopyOut | None:
    """The plan of a ``COPY … TO STDOUT`` statement; None for a statement that is not a COPY, or a
    ``COPY … FROM`` (a write: refused where writes are). ``SqlError`` ``0A000`` for a COPY to a file
    or program, or in binary format; ``42601`` for one that does not parse."""
    code = code_only(sql).strip()
    m = re.match(r"COPY\b", code, re.I)
    if not m:
        return None
    rest = code[m.end() :].lstrip()
    if rest.startswith("("):
        query, after = _query_part(rest)
    else:
        t = _TABLE.match(rest)
        if not t or not t.group(1):
            raise SqlError("42601", "syntax error in COPY: expected a table name or (query)")
        cols = t.group(2)
        query = f"SELECT {cols.strip()[1:-1] if cols else '*'} FROM {t.group(1)}"
        after = rest[t.end() :]
    target = _TARGET.match(after)
    if target is None:
        if re.match(r"\s*FROM\b", after, re.I):
            return None
        raise SqlError("42601", "syntax error in COPY: expected TO STDOUT")
    if target.group(1).upper() != "STDOUT":
        raise SqlError(
            "0A000",
            "COPY to a file or program is not supported: the server writes nothing",
            "use COPY (query) TO STDOUT (psql: \\copy (query) TO 'file')",
        )
    plan = CopyOut(query)
    _options(target.group(2), plan)
    return plan
