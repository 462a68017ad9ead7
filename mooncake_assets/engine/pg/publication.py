"""Publications the replication stream reads: the service's own, or one an administrator created.

Two modes (PG docs, "Logical Replication" §31.1 Publication, ``CREATE PUBLICATION``, ``ALTER
PUBLICATION``, the ``pg_publication_tables`` view):

- **own** (the default): the service keeps a publication of its own (``mooncake_<hash>``) and adds
  each mirrored table to it (:func:`add_table`), removes it again (:func:`remove_table`) and drops the
  publication with its last table (:func:`drop`). Adding a table needs ``CREATE`` on the database (to
  create the publication) and **ownership of the table** (Postgres's rule for ``ADD TABLE``).
- **administrator's** (``mooncake --publication NAME``): an administrator created the publication
  (``FOR TABLE …``, ``FOR TABLES IN SCHEMA …`` or ``FOR ALL TABLES``); the service only reads it and
  never alters it. :func:`table_problems` says what keeps a table from being mirrored through it, each
  with the statement the administrator runs.

Either way a table can leave the publication while it is mirrored (``ALTER PUBLICATION … DROP
TABLE``, ``DROP PUBLICATION``, the table moved to another schema): pgoutput then simply stops sending
its changes. :func:`published_oids` is the poll the service runs to notice it.

Membership is read from ``pg_publication``, ``pg_publication_rel`` and ``pg_publication_namespace``
directly, not from the ``pg_publication_tables`` view, which opens (and locks) every table of the
publication to list its columns.

Every function takes an open psycopg connection (autocommit) and sends only catalog reads, except
:func:`add_table`, :func:`remove_table` and :func:`drop` (own mode only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from .names import TableName, format_name
from .partitions import partition_tree

__all__ = [
    "publish_generated_columns",
    "PublicationInfo",
    "Membership",
    "describe",
    "membership",
    "membership_of_partitions",
    "published_oids",
    "table_problems",
    "add_table",
    "add_table_sql",
    "remove_table",
    "drop",
    "REQUIRED_ACTIONS",
]

REQUIRED_ACTIONS = ("insert", "update", "delete", "truncate")  # a mirror needs every kind of change


@dataclass
class PublicationInfo:
    """One ``pg_publication`` row: ``all_tables`` (``FOR ALL TABLES``), ``via_root``
    (``publish_via_partition_root``), ``actions`` (the published kinds of change), ``schemas`` (the
    ``FOR TABLES IN SCHEMA`` schemas, PG 15+), ``owner`` (role name)."""

    name: str
    all_tables: bool
    via_root: bool
    actions: tuple[str, ...]
    owner: str
    schemas: list[str] = field(default_factory=list)

    @property
    def missing_actions(self) -> list[str]:
        """The kinds of change of :data:`REQUIRED_ACTIONS` this publication does not publish (its
        ``publish`` parameter; ``pg_publication.pubinsert`` … ``pubtruncate``), in that order; empty
        when it publishes all four."""
        return [a for a in REQUIRED_ACTIONS if a not in self.actions]


def describe(conn: psycopg.Connection, name: str) -> PublicationInfo | None:
    """The publication ``name`` (exact, case-sensitive), or None when there is none."""
    row = conn.execute(
        "SELECT p.oid, p.puballtables, p.pubviaroot, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, "
        "pg_get_userbyid(p.pubowner) FROM pg_publication p WHERE p.pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    oid, alltables, viaroot, ins, upd, dele, trunc, owner = row
    actions = tuple(a for a, on in zip(REQUIRED_ACTIONS, (ins, upd, dele, trunc)) if on)
    schemas = []
    if conn.info.server_version >= 150000:
        schemas = [
            r[0]
            for r in conn.execute(
                "SELECT n.nspname FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid "
                "WHERE pn.pnpubid = %s ORDER BY 1",
                (oid,),
            ).fetchall()
        ]
    return PublicationInfo(name, bool(alltables), bool(viaroot), actions, owner, schemas)


@dataclass
class Membership:
    """How a table is in a publication: ``columns`` the published columns of a PG 15+ column list
    (None: every column), ``row_filter`` the ``WHERE`` text or None."""

    columns: list[str] | None
    row_filter: str | None


def _listed_expr(conn: psycopg.Connection[Any]) -> str:
    """SQL that is true when publication ``p`` lists relation ``c``: ``FOR ALL TABLES``, a
    ``pg_publication_rel`` row, or (PG 15+, ``FOR TABLES IN SCHEMA``) its schema in
    ``pg_publication_namespace``. Catalogs alone (``pg_publication_tables`` would open, and lock,
    every table of the publication)."""
    schema_part = (
        (
            " OR EXISTS (SELECT 1 FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid "
            "AND pn.pnnspid = c.relnamespace)"
        )
        if conn.info.server_version >= 150000
        else ""
    )
    return (
        "(p.puballtables OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid "
        f"AND r.prrelid = c.oid){schema_part})"
    )


def _member_expr(conn: psycopg.Connection[Any]) -> str:
    """SQL that is true when publication ``p`` publishes table ``c`` under ``c``'s own oid: it lists it
    (:func:`_listed_expr`); a partitioned table only with ``publish_via_partition_root``; never an
    unlogged or temporary one."""
    return f"({_listed_expr(conn)} AND (c.relkind = 'r' OR p.pubviaroot) AND c.relpersistence = 'p')"


def membership(conn: psycopg.Connection, name: str, oid: int) -> Membership | None:
    """How publication ``name`` publishes the table ``oid`` (``pg_class.oid``) under its own name, or
    None when it does not (a partitioned table in a publication without ``publish_via_partition_root``
    is published by its partitions, so it is not a member here; a table that no longer exists is
    not a member either). Catalog reads only, no locks on the table."""
    row = conn.execute(
        f"SELECT c.oid FROM pg_class c, pg_publication p WHERE p.pubname = %s AND c.oid = %s AND {_member_expr(conn)}",
        (name, oid),
    ).fetchone()
    if row is None:
        return None
    if conn.info.server_version < 150000:
        return Membership(None, None)
    listed = conn.execute(
        "SELECT pg_get_expr(r.prqual, r.prrelid), (SELECT array_agg(a.attname ORDER BY a.attnum) FROM pg_attribute a "
        "WHERE a.attrelid = r.prrelid AND a.attnum = ANY(r.prattrs::int2[])), r.prattrs IS NULL "
        "FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = %s AND r.prrelid = %s",
        (name, row[0]),
    ).fetchone()
    if listed is None:  # published by FOR ALL TABLES / its schema: every row and column
        return Membership(None, None)
    qual, cols, no_list = listed
    return Membership(None if no_list else list(cols or []), qual)


def published_oids(conn: psycopg.Connection, name: str, oids: list[int]) -> tuple[int, set[int] | None]:
    """The poll that notices a table leaving the publication: ``(lsn, present)`` where ``lsn`` is the
    source's ``pg_current_wal_lsn()`` read *before* the catalog lookup (so whatever the lookup shows
    was already true at ``lsn``), and ``present`` the subset of ``oids`` the publication ``name``
    publishes under their own oid — or None when the publication does not exist. Catalog reads only:
    no lock on any table (it must never hold up the user's DDL)."""
    lsn_row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert lsn_row is not None  # a SELECT without FROM returns one row
    lsn = lsn_row[0]
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone() is None:
        return int(lsn), None
    rows = conn.execute(
        f"SELECT c.oid FROM pg_class c, pg_publication p WHERE p.pubname = %s AND c.oid = ANY(%s) "
        f"AND {_member_expr(conn)}",
        (name, list(oids)),
    ).fetchall()
    return int(lsn), {r[0] for r in rows}


def add_table_sql(name: str, schema: str, table: str) -> str:
    """The statement that adds a table to publication ``name`` (shown to an administrator)."""
    return f"ALTER PUBLICATION {format_name(name)} ADD TABLE {format_name(schema, table)};"


def table_problems(
    conn: psycopg.Connection,
    name: str,
    info: PublicationInfo | None,
    oid: int,
    table: TableName,
    relkind: str,
    mirrored_columns: list[str],
) -> list[tuple[str, str]]:
    """Why the administrator's publication ``name`` cannot feed a mirror of ``table`` (``pg_class``
    oid ``oid``), as ``[(problem, statement that fixes it), …]`` (empty: it can). ``info``: the
    publication as :func:`describe` read it (None: it does not exist). ``relkind``: ``'r'`` or
    ``'p'`` (partitioned: its changes must come under the root, ``publish_via_partition_root =
    true``); ``mirrored_columns``: the columns the mirror takes (a column list must include them all)."""
    schema = table.schema
    q = str(table)
    if info is None:
        return [
            (
                f"publication {name} does not exist",
                f"CREATE PUBLICATION {format_name(name)} FOR TABLE {q};  (or FOR TABLES IN SCHEMA "
                f"{format_name(schema)})",
            )
        ]
    out = []
    if info.missing_actions:
        out.append(
            (
                f"publication {name} does not publish {', '.join(info.missing_actions)} (a mirror needs every "
                "kind of change)",
                f"ALTER PUBLICATION {format_name(name)} SET (publish = '{', '.join(REQUIRED_ACTIONS)}');",
            )
        )
    if relkind == "p" and not info.via_root:
        out.append(
            (
                f"table {q} is partitioned and publication {name} publishes its partitions under their own "
                "names (publish_via_partition_root is off)",
                f"ALTER PUBLICATION {format_name(name)} SET (publish_via_partition_root = true);",
            )
        )
        if membership_of_partitions(conn, name, oid):
            return out
    m = membership(conn, name, oid)
    if m is None:
        out.append((f"table {q} is not in publication {name}", add_table_sql(name, schema, table.name)))
        return out
    readd = (
        f"ALTER PUBLICATION {format_name(name)} DROP TABLE {q}; ALTER PUBLICATION {format_name(name)} ADD TABLE {q};"
    )
    if m.row_filter:
        out.append(
            (
                f"publication {name} publishes only the rows of {q} WHERE {m.row_filter} (a mirror needs every row)",
                readd,
            )
        )
    if m.columns is not None:
        left_out = [c for c in mirrored_columns if c not in m.columns]
        if left_out:
            out.append(
                (
                    f"publication {name} leaves column(s) {', '.join(left_out)} of {q} out (a column list; "
                    "a mirror needs every column)",
                    readd,
                )
            )
    return out


def membership_of_partitions(conn: psycopg.Connection, name: str, oid: int) -> bool:
    """True when publication ``name`` lists the partitioned table ``oid`` or one of its partitions
    (walked through ``pg_inherits``: :func:`~.partitions.partition_tree`, no locks), so that, with
    ``publish_via_partition_root`` off, their changes are published under the partitions' own names."""
    row = conn.execute(
        f"SELECT 1 FROM pg_class c, pg_publication p WHERE p.pubname = %s AND c.oid = ANY(%s) "
        f"AND {_listed_expr(conn)} LIMIT 1",
        (name, partition_tree(conn, oid)),
    ).fetchone()
    return row is not None


# -- own mode: the service's publication ---------------------------------------------------------------
def add_table(conn: psycopg.Connection, name: str, schema: str, table: str, oid: int) -> str:
    """Put ``schema.table`` (``pg_class`` oid ``oid``) into the service's own publication ``name``,
    creating it (``FOR TABLE … WITH (publish_via_partition_root = true)``) when it does not exist. Returns ``"present"``
    (already in it: left by a create that was killed), ``"added"`` or ``"created"`` — what
    :func:`remove_table` / :func:`drop` undo. Raises ``psycopg.errors.InsufficientPrivilege`` when
    the role does not own the table."""
    ident = sql.Identifier(schema, table)
    if describe(conn, name) is None:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)").format(
                sql.Identifier(name), ident
            )
        )
        return "created"
    if membership(conn, name, oid) is not None:
        return "present"
    conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(sql.Identifier(name), ident))
    return "added"


def remove_table(conn: psycopg.Connection, name: str, schema: str, table: str) -> None:
    """Take ``schema.table`` out of the service's own publication ``name`` (nothing when it is not in
    it, or the table or publication is gone)."""
    try:
        with conn.transaction():
            conn.execute(
                sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
                    sql.Identifier(name), sql.Identifier(schema, table)
                )
            )
    except psycopg.Error:
        pass


def drop(conn: psycopg.Connection, name: str) -> None:
    """``DROP PUBLICATION IF EXISTS`` the service's own publication ``name``."""
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


def publish_generated_columns(conn: psycopg.Connection, name: str) -> bool:
    """Have the service's own publication ``name`` send stored generated columns
    (``publish_generated_columns = stored``, Postgres 18 and later; older servers do not send them
    and the service computes them, see ``engine/cdc/generated.py``). Returns whether it was set."""
    if conn.info.server_version < 180000:
        return False
    conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(sql.Identifier(name)))
    return True
