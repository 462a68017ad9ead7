"""Confine a DuckDB connection that runs users' SQL to the mirrors' own files.

A union read runs the user's statement on a DuckDB connection, and DuckDB's table functions read any
path the process can (``read_csv('/etc/passwd')``, ``read_text``, ``glob``, a quoted path in FROM).
Through ``mooncake sql-server`` that would give every SQL user the service account's files. So a
connection that runs users' statements is confined before the first one runs
(DuckDB docs, "Securing DuckDB": ``allowed_directories`` and ``enable_external_access``):

- ``allowed_directories`` is set to the directories and object-store prefixes that hold the mirrors'
  data files (the service's status ``data_roots``: the warehouse and the staging directory), or to
  none for a connection that reads only registered Arrow tables;
- ``enable_external_access`` is then turned off: no file, URL or extension outside those roots (and
  DuckDB's own temporary directory) can be opened, and neither setting can be changed again on that
  database (DuckDB refuses it while external access is off).

Writes are refused before this by the read-only check (``union.check_read_only``). Extensions and
secrets the reads need (httpfs, the S3 secret) are set up before confining; a secret can be replaced
afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

__all__ = ["confine", "confine_to_service", "confined", "root_prefixes"]


def root_prefixes(roots: Iterable[str]) -> list[str]:
    """Each of ``roots`` (a local directory, a ``file://`` URI or an object-store URI) as the directory
    prefixes DuckDB compares paths with: a trailing ``/``; a ``file://`` URI also as its plain path."""
    out: list[str] = []
    for r in roots:
        r = str(r).rstrip("/") + "/"
        out.append(r)
        if r.startswith("file://"):
            out.append(r[len("file://") :])
    return sorted(set(out))


def confined(con: Any) -> bool:
    """Whether ``con``'s database has external access turned off already (then it is confined)."""
    row = con.execute("SELECT current_setting('enable_external_access')").fetchone()
    return bool(row) and row[0] is False


#: one confinement at a time in this process: the sql-server's readers are cursors of one database, and
#: two first statements at once would otherwise both set allowed_directories, the second after the first
#: had turned external access off (DuckDB refuses that)
_CONFINING = threading.Lock()


def confine(con: Any, roots: Iterable[str] = ()) -> None:
    """Confine DuckDB connection ``con`` (and every cursor of its database) to files under ``roots``
    (module docstring; none: only registered Arrow data and DuckDB's temporary directory). A database
    already confined is left as it is; cursors of one database may call this at once. Raises
    ``duckdb.Error`` when DuckDB refuses a setting."""
    with _CONFINING:
        if confined(con):
            return
        dirs = root_prefixes(roots)
        literal = "[" + ", ".join("'" + d.replace("'", "''") + "'" for d in dirs) + "]"
        con.execute(f"SET allowed_directories = {literal}")
        con.execute("SET enable_external_access = false")


def confine_to_service(con: Any, client: Any) -> None:
    """Confine ``con`` to the ``data_roots`` of ``client``'s service (its ``status``: the warehouse and
    the staging directory); a database already confined, no client, or a client without a status or
    whose status names no roots (a ReadState source other than the service) leaves it as it is."""
    status = getattr(client, "status", None)
    if status is None or confined(con):
        return
    roots = status().get("data_roots")
    if roots:
        confine(con, roots)
