"""Pre-flight checks of a source Postgres (``mooncake check-source``; ``create-table`` runs the table
part before it changes anything).

Each :class:`Check` is ``ok``, ``warning`` or ``error``, and every problem carries the statement or
setting that fixes it. What is checked, and why (PG docs: "Logical Replication" §31.10
Configuration Settings, §31.9 Security, "Replication" server settings, ``CREATE ROLE``):

- ``wal_level`` is ``logical`` (else no logical decoding at all);
- free replication slots and WAL senders: the service needs its own slot plus a temporary one
  (initial copy, ``verify``), and a WAL sender for each;
- ``max_slot_wal_keep_size``: unlimited (``-1``) is a warning, a stuck slot can fill the disk;
- the role can open a replication connection (``REPLICATION`` attribute, or a managed service's
  role such as RDS's ``rds_replication``): tried for real with ``IDENTIFY_SYSTEM``, which creates
  nothing;
- the server version: 12+ needed; streaming of large transactions needs 14; generated columns
  are published by pgoutput only from 18;
- per table: it exists and its types are supported, ``USAGE`` on its schema and ``SELECT`` on it,
  it is logged, its replica identity (a table without a primary key needs ``FULL``: set by
  create-table when the role owns the table, else the statement for the administrator), and its
  publication (the administrator's: membership, actions, partition root, row filter, column list;
  the service's own: ownership of the table and ``CREATE`` on the database).

Nothing here creates anything: catalog reads, ``current_setting`` and one replication connection
that only runs ``IDENTIFY_SYSTEM``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import psycopg
from psycopg import pq, sql
from psycopg.abc import Params
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from . import publication as pubs
from .conninfo import connect_error, redact
from .names import InvalidName, TableName, format_name, resolve_table
from .partitions import partition_tree

if TYPE_CHECKING:
    from .schema import TableSchema

__all__ = [
    "Check",
    "TableOptions",
    "check_source",
    "server_checks",
    "check_table",
    "table_checks",
    "identity_todo",
    "set_identity_full",
    "replication_check",
]


@dataclass
class Check:
    """One line of ``check-source``: ``level`` ``ok`` | ``warning`` | ``error``; ``subject`` what was
    checked (``wal_level``, ``table public.t``…); ``message``; ``fix`` the SQL or setting that
    fixes a problem (None for ok)."""

    level: str
    subject: str
    message: str
    fix: str | None = None

    def line(self) -> str:
        """``error   table public.t is not in publication p — fix: ALTER PUBLICATION …``."""
        head = self.message if self.message.startswith(self.subject + " ") else f"{self.subject}: {self.message}"
        return f"{self.level:<7} {head}" + (f" — fix: {self.fix}" if self.fix else "")

    def sentence(self) -> str:
        """The problem and its fix as one clause (create-table's error): ``table public.t has …; run: …``."""
        msg = self.message
        if not msg.startswith(("table ", "publication ")):
            msg = f"{self.subject} {msg}" if self.subject.startswith("table ") else f"{self.subject}: {msg}"
        return f"{msg}; run: {self.fix}" if self.fix else msg


class TableOptions(TypedDict, total=False):
    """A mirror's create-table column options: ``column_types`` (column -> ``"text"``, mirrored as its
    exact text) and ``exclude`` (columns left out)."""

    column_types: dict[str, str]
    exclude: list[str]


def _one(conn: psycopg.Connection, query: str, params: Params | None = None) -> tuple[Any, ...]:
    """The one row of ``query`` (a SELECT without FROM, or an aggregate without GROUP BY)."""
    row = conn.execute(query, params).fetchone()
    assert row is not None  # such a SELECT returns one row
    return row


def _setting(conn: psycopg.Connection, name: str) -> str | None:
    value = _one(conn, "SELECT current_setting(%s, true)", (name,))[0]
    return None if value is None else str(value)


def server_checks(conn: psycopg.Connection, slot: str) -> list[Check]:
    """wal_level, slots, WAL senders, max_slot_wal_keep_size, version. ``slot``: the service's slot
    name (when it exists already, one slot and, while it streams, one WAL sender fewer are needed)."""
    row = conn.execute(
        "SELECT active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    own_exists, own_active = row is not None, bool(row and row[0])
    return [
        _wal_level_check(conn),
        _slot_check(conn, slot, own_exists),
        _wal_sender_check(conn, own_active),
        _wal_keep_check(conn),
        _version_check(conn),
    ]


def _wal_level_check(conn: psycopg.Connection) -> Check:
    """``wal_level`` must be ``logical``: no logical decoding otherwise."""
    wal_level = _setting(conn, "wal_level")
    if wal_level == "logical":
        return Check("ok", "wal_level", "logical")
    return Check(
        "error",
        "wal_level",
        f"is {wal_level}; logical decoding needs logical",
        "ALTER SYSTEM SET wal_level = logical; then restart the server (RDS/Aurora: "
        "rds.logical_replication = 1 in the parameter group; Cloud SQL: cloudsql.logical_decoding = on; "
        "Azure: wal_level = logical in the server parameters)",
    )


def _slot_check(conn: psycopg.Connection, slot: str, own_exists: bool) -> Check:
    """Free replication slots: the service's own (unless ``own_exists``) and a temporary one for an
    initial copy or a verify; the fix names an idle slot to drop when there is one."""
    max_slots = int(_setting(conn, "max_replication_slots") or 0)
    used = int(_one(conn, "SELECT count(*) FROM pg_replication_slots")[0])
    need = (0 if own_exists else 1) + 1  # the service's slot + a temporary one for a copy or verify
    free = max_slots - used
    if free >= need:
        return Check("ok", "replication slots", f"{free} of {max_slots} free (needs {need})")
    idle = [
        r[0]
        for r in conn.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE active_pid IS NULL "
            "AND slot_name <> %s ORDER BY 1 LIMIT 3",
            (slot,),
        ).fetchall()
    ]
    return Check(
        "error",
        "replication slots",
        f"{free} of {max_slots} free, {need} needed (the service's slot and a temporary one for the initial copy)",
        f"ALTER SYSTEM SET max_replication_slots = {used + need}; then restart the server"
        + (f"; or drop an unused slot: SELECT pg_drop_replication_slot('{idle[0]}');" if idle else ""),
    )


def _wal_sender_check(conn: psycopg.Connection, own_active: bool) -> Check:
    """Free WAL senders: one for the service's stream (unless it is streaming now, ``own_active``) and
    one for the temporary slot's connection."""
    max_senders = int(_setting(conn, "max_wal_senders") or 0)
    senders = int(_one(conn, "SELECT count(*) FROM pg_stat_get_wal_senders()")[0])
    need_s = (0 if own_active else 1) + 1
    if max_senders - senders >= need_s:
        return Check("ok", "WAL senders", f"{max_senders - senders} of {max_senders} free (needs {need_s})")
    return Check(
        "error",
        "WAL senders",
        f"{max_senders - senders} of {max_senders} free, {need_s} needed",
        f"ALTER SYSTEM SET max_wal_senders = {senders + need_s}; then restart the server",
    )


def _wal_keep_check(conn: psycopg.Connection) -> Check:
    """``max_slot_wal_keep_size``: unlimited (or a server before 13, which has no such setting) is a
    warning, a slot that stops advancing keeps WAL until the disk is full."""
    keep = _setting(conn, "max_slot_wal_keep_size")
    if keep not in (None, "-1"):
        return Check("ok", "max_slot_wal_keep_size", keep)
    return Check(
        "warning",
        "max_slot_wal_keep_size",
        "unlimited: a slot that stops advancing (service down, a stopped mirror) keeps WAL until "
        "the source's disk is full",
        "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf();  (a size the "
        "disk can spare; PG 13+)"
        if keep is not None
        else "PostgreSQL 13 or later",
    )


def _version_check(conn: psycopg.Connection) -> Check:
    """The server version: 12+ needed; before 14 large transactions are not streamed (a warning);
    before 18 generated columns are not published (mooncake computes them)."""
    v = conn.info.server_version
    text = _setting(conn, "server_version")
    if v < 120000:
        return Check("error", "server version", f"PostgreSQL {text}: mooncake needs 12 or later", "upgrade the server")
    feats = [
        (
            "streams large transactions"
            if v >= 140000
            else "does not stream large transactions (needs 14; they are sent at commit)"
        ),
        (
            "publishes generated columns"
            if v >= 180000
            else "does not publish generated columns (needs 18; mooncake computes them on the source)"
        ),
    ]
    return Check(
        "ok" if v >= 140000 else "warning",
        "server version",
        f"PostgreSQL {text}: " + "; ".join(feats),
        None if v >= 140000 else "PostgreSQL 14 or later",
    )


def replication_check(dsn: str) -> Check:
    """Open a replication connection (``replication=database``) and run ``IDENTIFY_SYSTEM``: the
    role's ``REPLICATION`` attribute (or managed-service role) and ``pg_hba.conf`` tried for real."""
    params = conninfo_to_dict(dsn)
    params.update(replication="database", connect_timeout=params.get("connect_timeout") or 10)
    try:
        conn = psycopg.connect(make_conninfo("", **params), autocommit=True)
    except psycopg.OperationalError as cause:
        msg = connect_error(cause)  # the driver's error: one scrubbed line with the server's reason
        user = _user_of(dsn)
        if "replication role" in str(cause) or "permission denied to start WAL sender" in str(cause):
            return Check(
                "error",
                f"role {user}",
                "cannot open a replication connection: it lacks the REPLICATION attribute",
                f"ALTER ROLE {format_name(user)} WITH REPLICATION;  (RDS/Aurora: GRANT "
                f"rds_replication TO {format_name(user)};)",
            )
        return Check(
            "error",
            f"role {user}",
            f"cannot open a replication connection: {msg}",
            "let the role connect for replication (pg_hba.conf: a line for this database and role, e.g. "
            "host <db> <role> <address> scram-sha-256)",
        )
    try:
        # a walsender speaks only the simple query protocol: PQexec on psycopg's own libpq connection
        res = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
        if res.status != pq.ExecStatus.TUPLES_OK:
            err = (res.error_message or b"").decode(errors="replace").strip()
            return Check(
                "error", f"role {_user_of(dsn)}", f"IDENTIFY_SYSTEM failed on a replication connection: {err}", None
            )
    finally:
        conn.close()
    return Check(
        "ok", f"role {_user_of(dsn)}", "opens a replication connection (REPLICATION attribute or a role that grants it)"
    )


def _user_of(dsn: str) -> str:
    import getpass
    import os

    from psycopg.conninfo import conninfo_to_dict

    try:
        user = conninfo_to_dict(dsn).get("user")
        return str(user) if user else os.environ.get("PGUSER") or getpass.getuser()
    except Exception:
        return "?"


def check_table(
    conn: psycopg.Connection,
    src: str,
    *,
    publication: str | None,
    own_publication: str,
    column_types: dict[str, str] | None = None,
    exclude: list[str] | None = None,
    publication_info: pubs.PublicationInfo | None = None,
) -> list[Check]:
    """The checks of the source table named ``src`` (``schema.table``, ``table`` or
    ``db.schema.table``, parsed and found as Postgres does: :func:`~.names.resolve_table`): one error
    line saying how the name was parsed when it names no table, else :func:`table_checks`."""
    try:
        oid, name = resolve_table(conn, src)
    except InvalidName as e:
        return [
            Check(
                "error",
                f"table {src}",
                str(e),
                'name an existing table as schema.table, quoting parts as SQL does: \'"Sales Data"."Q1 Orders"\'',
            )
        ]
    return table_checks(
        conn,
        name,
        oid,
        publication=publication,
        own_publication=own_publication,
        column_types=column_types,
        exclude=exclude,
        publication_info=publication_info,
    )[0]


def table_checks(
    conn: psycopg.Connection,
    name: TableName,
    oid: int,
    *,
    publication: str | None,
    own_publication: str,
    column_types: dict[str, str] | None = None,
    exclude: list[str] | None = None,
    publication_info: pubs.PublicationInfo | None = None,
) -> tuple[list[Check], TableSchema | None]:
    """The checks of one source table: ``name`` and ``oid`` as :func:`~.names.resolve_table` found
    it. ``publication``: the administrator's publication (None: the service's own, named
    ``own_publication``); ``publication_info``: that publication as :func:`~.publication.describe`
    read it (``check_source`` reads it once for all tables; read here when None).
    ``column_types``/``exclude``: create-table's column options (a column mirrored as text or left out
    is not refused).

    Returns ``(checks, schema)``: ``schema`` the table as ``describe_table`` read it with those
    options (create-table mirrors that), None when a check stopped before it could be read.

    In order: the relation (a table, in a schema the role may use), its access (SELECT, logged), its
    schema (columns that can be mirrored), its replica identity, its generated columns, its publication."""
    subj = f"table {name}"
    q = str(name)
    user = str(_one(conn, "SELECT current_user")[0])
    found = _relation_check(conn, subj, name, oid, user)
    if isinstance(found, Check):
        return [found], None
    relkind, persistence, owner = found
    out = _access_checks(conn, subj, q, oid, user, persistence)
    schema_ = _schema_check(conn, subj, name, user, column_types, exclude)
    if isinstance(schema_, Check):
        out.append(schema_)
        return out, None
    out.append(_identity_check(conn, subj, q, schema_, owner))
    out.extend(_generated_check(conn, subj, schema_))
    out.extend(
        _publication_checks(
            conn,
            subj,
            name,
            oid,
            relkind,
            owner,
            [c.name for c in schema_.columns],
            publication,
            publication_info,
            own_publication,
            user,
        )
    )
    return out, schema_


def _relation_check(
    conn: psycopg.Connection, subj: str, name: TableName, oid: int, user: str
) -> tuple[str, str, bool] | Check:
    """The relation ``oid``: ``(relkind, relpersistence, the role owns it)`` when it is a table in a
    schema the role has ``USAGE`` on, else the error (no such table, not a table, no USAGE)."""
    row = conn.execute(
        "SELECT c.relkind, c.relpersistence, has_schema_privilege(c.relnamespace, 'USAGE'), "
        "pg_has_role(c.relowner, 'USAGE') FROM pg_class c WHERE c.oid = %s",
        (oid,),
    ).fetchone()
    if row is None or row[0] not in ("r", "p"):
        return Check(
            "error",
            subj,
            "does not exist as a table" if row is not None else "does not exist",
            "name an existing table as schema.table, quoting parts as SQL does",
        )
    relkind, persistence, usage, owner = row
    if not usage:
        return Check(
            "error",
            subj,
            f"is in schema {name.schema}, on which role {user} has no USAGE",
            f"GRANT USAGE ON SCHEMA {format_name(name.schema)} TO {format_name(user)};",
        )
    return relkind, persistence, owner


def _access_checks(conn: psycopg.Connection, subj: str, q: str, oid: int, user: str, persistence: str) -> list[Check]:
    """The role may SELECT the table (the initial copy reads it: the table, or every column), and the
    table is not UNLOGGED (its changes would not be in the WAL)."""
    out: list[Check] = []
    select_ok = _one(
        conn,
        "SELECT has_table_privilege(%s, 'SELECT') OR coalesce(bool_and(has_column_privilege(%s, a.attnum, 'SELECT')), "
        "false) FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped",
        (oid, oid, oid),
    )[0]
    if select_ok:
        out.append(Check("ok", subj, f"role {user} may SELECT it (the initial copy)"))
    else:
        out.append(
            Check(
                "error",
                subj,
                f"is not readable by role {user} (no SELECT; the initial copy reads it)",
                f"GRANT SELECT ON {q} TO {format_name(user)};",
            )
        )
    if persistence == "u":
        out.append(
            Check(
                "error",
                subj,
                "is UNLOGGED: its changes are not in the WAL, so they cannot be replicated",
                f"ALTER TABLE {q} SET LOGGED;",
            )
        )
    return out


def _schema_check(
    conn: psycopg.Connection,
    subj: str,
    name: TableName,
    user: str,
    column_types: dict[str, str] | None,
    exclude: list[str] | None,
) -> TableSchema | Check:
    """The table's schema as ``describe_table`` reads it with the column options, or the error: a
    column that cannot be mirrored (the message names it and the options past it), an unknown column
    in the options, or a privilege the catalog read lacks."""
    from .catalog import describe_table
    from .schema import UnsupportedTypeError

    try:
        return describe_table(conn, str(name), column_types=column_types, exclude=exclude)
    except (LookupError, UnsupportedTypeError) as e:  # the message names the column and the options past it
        return Check("error", subj, str(e).strip("'\""))
    except psycopg.errors.InsufficientPrivilege as e:
        return Check(
            "error",
            subj,
            str(e).splitlines()[0],
            f"GRANT USAGE ON SCHEMA {format_name(name.schema)} TO {format_name(user)};",
        )


def _generated_check(conn: psycopg.Connection, subj: str, schema_: TableSchema) -> list[Check]:
    """One ok line naming the table's STORED generated columns and how they are mirrored (none
    without them; ``describe_table`` leaves virtual ones out)."""
    gen = [c.name for c in schema_.columns if c.generated]
    if not gen:
        return []
    # mirrored either way (engine/cdc/generated.py): Postgres < 18 does not send them, so the service
    # computes them on the source for each applied batch; 18 sends them (publish_generated_columns)
    how = (
        "sent by pgoutput with the publication's publish_generated_columns = stored)"
        if conn.info.server_version >= 180000
        else "PostgreSQL before 18 does not send them: computed on the source for each applied batch)"
    )
    return [Check("ok", subj, f"generated column(s) {', '.join(gen)} are mirrored (" + how)]


def _identity_check(conn: psycopg.Connection, subj: str, q: str, schema_: TableSchema, owner: bool) -> Check:
    ri = schema_.replica_identity
    if schema_.has_primary_key or schema_.key_columns:
        if ri == "n":
            return Check(
                "error",
                subj,
                "has REPLICA IDENTITY NOTHING: its UPDATEs and DELETEs would carry no key",
                f"ALTER TABLE {q} REPLICA IDENTITY DEFAULT;",
            )
        what = {"d": "its primary key", "i": "its replica identity index", "f": "FULL"}.get(ri, ri)
        return Check("ok", subj, f"replica identity is {what} (key: {', '.join(schema_.key_columns) or 'whole row'})")
    todo = identity_todo(conn, schema_)
    if not todo:
        return Check("ok", subj, "has no primary key; replica identity is FULL (the whole row is the key)")
    stmts = " ".join(f"ALTER TABLE {t} REPLICA IDENTITY FULL;" for t in todo)
    if owner:
        return Check(
            "ok", subj, f"has no primary key; create-table sets REPLICA IDENTITY FULL (the role owns it): {stmts}"
        )
    return Check(
        "error",
        subj,
        "has no primary key and its replica identity is not FULL, so its UPDATEs and DELETEs "
        "would not carry the old row; the role does not own it, so an administrator must set it",
        stmts,
    )


def identity_todo(conn: psycopg.Connection, schema: TableSchema) -> list[TableName]:
    """The tables whose replica identity must become ``FULL`` for a keyless mirror of ``schema``
    (``pg_class.relreplident`` not ``'f'``): the table itself and, for a partitioned one, each of its
    partitions, which log their own old rows (found through ``pg_inherits``:
    :func:`~.partitions.partition_tree`, no locks); the table first, then by schema and name. Empty
    when all are ``FULL``. (PG docs, ``ALTER TABLE … REPLICA IDENTITY``.)"""
    if schema.relkind != "p":
        return [] if schema.replica_identity == "f" else [TableName(schema.schema, schema.name)]
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = ANY(%s) AND c.relreplident <> 'f' ORDER BY c.oid <> %s, 1, 2",
        (partition_tree(conn, schema.oid), schema.oid),
    ).fetchall()
    return [TableName(a, b) for a, b in rows]


def set_identity_full(conn: psycopg.Connection, tables: list[TableName]) -> None:
    """``ALTER TABLE … REPLICA IDENTITY FULL`` on each of ``tables`` (what :func:`identity_todo`
    found; the role must own them, which the table check made sure of)."""
    for t in tables:
        conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(t.ident()))


def _publication_checks(
    conn: psycopg.Connection,
    subj: str,
    name: TableName,
    oid: int,
    relkind: str,
    owner: bool,
    columns: list[str],
    publication: str | None,
    info: pubs.PublicationInfo | None,
    own: str,
    user: str,
) -> list[Check]:
    q = str(name)
    if publication is not None:
        if info is None:
            info = pubs.describe(conn, publication)
        problems = pubs.table_problems(conn, publication, info, oid, name, relkind, columns)
        if not problems:
            return [Check("ok", subj, f"is in publication {publication}")]
        return [Check("error", subj, msg, fix) for msg, fix in problems]
    # the service's own publication
    own_exists = pubs.describe(conn, own) is not None
    if own_exists and pubs.membership(conn, own, oid) is not None:
        return [Check("ok", subj, f"is in the service's publication {own}")]
    out = []
    admin_fix = (
        f"or have an administrator create one: CREATE PUBLICATION mooncake FOR TABLE {q}; and start mooncake "
        "with --publication mooncake"
    )
    if not own_exists and not _one(conn, "SELECT has_database_privilege(current_database(), 'CREATE')")[0]:
        out.append(
            Check(
                "error",
                subj,
                f"cannot be published by the service: creating its publication {own} needs CREATE on the database",
                f"GRANT CREATE ON DATABASE {format_name(conn.info.dbname)} TO {format_name(user)}; " + admin_fix,
            )
        )
    if not owner:
        out.append(
            Check(
                "error",
                subj,
                f"is not owned by role {user}, and adding it to the service's publication {own} needs ownership of it",
                admin_fix.removeprefix("or "),
            )
        )
    if not out:
        out.append(Check("ok", subj, f"create-table adds it to the service's publication {own}"))
    return out


def check_source(
    dsn: str,
    tables: list[str],
    *,
    publication: str | None,
    own_publication: str,
    slot: str,
    table_options: Mapping[str, TableOptions] | None = None,
) -> list[Check]:
    """Every check, in order: connection, server, replication connection, then each table. A DSN that
    does not connect gives one error line (the DSN shown without its password). ``table_options``:
    source -> ``{"column_types": …, "exclude": …}`` (a mirror's create-table options)."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as e:
        return [
            Check(
                "error",
                "connection",
                f"cannot connect to {redact(dsn)}: {connect_error(e)}",
                "check host, port, database, role and password (and pg_hba.conf)",
            )
        ]
    with conn:
        out = [Check("ok", "connection", f"{redact(dsn)} as {_one(conn, 'SELECT current_user')[0]}")]
        out += server_checks(conn, slot)
        out.append(replication_check(dsn))
        info = None
        if publication is not None:
            info = pubs.describe(conn, publication)
            if info is None:
                out.append(
                    Check(
                        "error",
                        f"publication {publication}",
                        "does not exist",
                        f"CREATE PUBLICATION {format_name(publication)} FOR TABLE <schema.table>, …;  "
                        "(or FOR TABLES IN SCHEMA <schema>, or FOR ALL TABLES)",
                    )
                )
            else:
                kind = (
                    "FOR ALL TABLES"
                    if info.all_tables
                    else "FOR TABLES IN SCHEMA " + ", ".join(info.schemas)
                    if info.schemas
                    else "FOR TABLE …"
                )
                out.append(
                    Check(
                        "ok",
                        f"publication {publication}",
                        f"{kind}, owned by {info.owner}, publishes {', '.join(info.actions)}"
                        + ("; publish_via_partition_root" if info.via_root else ""),
                    )
                )
        for src in tables:
            opts = (table_options or {}).get(src, {})
            out += check_table(
                conn,
                src,
                publication=publication,
                own_publication=own_publication,
                column_types=opts.get("column_types"),
                exclude=opts.get("exclude"),
                publication_info=info,
            )
    return out
