"""Why a name a read asked for is no readable mirror, in one line.

A union read registers the readable mirrors only (``copying`` ones are not), so DuckDB answers a
statement naming any other table with its own ``Table with name X does not exist!``. That says
nothing about the mirror: it may be in its initial copy, stopped, its copy interrupted by a service
stop, or there may be no mirror of that name at all. :func:`explain_missing` tells which, from the
service's ``status`` document (its ``tables`` and ``interrupted`` lists), and :func:`missing_table`
finds the name in DuckDB's message.
"""

from __future__ import annotations

import re
from typing import Any

_MISSING = re.compile(r"Table with name ([^\s!]+) does not exist", re.IGNORECASE)


class MirrorNotReadable(LookupError):
    """A statement named a table that is no readable mirror; the message says why in one line
    (:func:`explain_missing`)."""

    def __str__(self) -> str:  # LookupError's str of one argument is its repr (quoted)
        return str(self.args[0]) if self.args else ""


def missing_table(message: str) -> str | None:
    """The table name in DuckDB's "Table with name X does not exist!" message, as the SQL spelt it
    (quotes dropped): ``schema.table`` when the SQL named a schema other than DuckDB's ``main`` (a
    mirror is read by its name alone), else ``table``; None for any other message."""
    m = _MISSING.search(message)
    if m is None:
        return None
    parts = m.group(1).replace('"', "").split(".")
    schema = parts[-2] if len(parts) > 1 else None
    return f"{schema}.{parts[-1]}" if schema and schema.lower() != "main" else parts[-1]


def explain_missing(name: str, status: dict[str, Any]) -> str:
    """One line saying why ``name`` (matched case-insensitively, as DuckDB names are) cannot be read,
    from a ``status`` document (``tables``: dicts with ``name``, ``state``, ``source``, ``applied_lsn``,
    ``error``, ``progress``; ``interrupted``: dicts with ``name`` and ``source``, initial copies a
    service stop interrupted). Names the mirror, its LSN and the next command to run. A ``schema.table``
    name whose table part (or whole name, as a source) is a mirror's says to name the mirror alone."""
    low = name.lower()
    tables = status.get("tables") or []
    if "." in name:
        table = low.rsplit(".", 1)[1]
        for t in tables:
            n, src = str(t.get("name", "")), str(t.get("source") or "")
            if n.lower() == table or src.lower() == low:
                return (
                    f"no table {name}: a mirror is read by its mirror name, without a schema: "
                    f"{n} (the mirror of {src or 'its source table'}); write FROM {n}"
                )
    for t in tables:
        if str(t.get("name", "")).lower() != low:
            continue
        n, src = t["name"], t.get("source") or "its source table"
        if t.get("state") == "copying":
            prog = t.get("progress") or {}
            done = f" ({prog['rows']} rows copied so far)" if prog.get("rows") is not None else ""
            return (
                f"mirror {n} is still in its initial copy of {src}{done}: it can be read once its create-table "
                "finishes; see `mooncake status`"
            )
        if t.get("state") == "error":
            return f"mirror {n} is stopped at LSN {t.get('applied_lsn')}: {t.get('error')}; see `mooncake status`"
        return f"mirror {n} ({t.get('state')}) could not be read; see `mooncake status`"
    for i in status.get("interrupted") or []:
        if str(i.get("name", "")).lower() == low:
            n, src = i["name"], i.get("source")
            return (
                f"mirror {n}'s initial copy of {src} was interrupted (the service stopped during it) and nothing "
                f"of it is kept: run `mooncake create-table {n} {src}` again"
            )
    names = sorted(str(t.get("name")) for t in tables)
    if not names:
        return f"no mirror named {name}; there are no mirrors yet (`mooncake create-table NAME SCHEMA.TABLE` makes one)"
    return f"no mirror named {name}; mirrors: {', '.join(names)} (see `mooncake list-tables`)"
