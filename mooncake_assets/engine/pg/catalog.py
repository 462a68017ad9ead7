"""The source's catalogs as the mirror reads them: table schemas and schema-evolution lookups.

- :func:`describe_table`: a table's :class:`~mooncake_assets.engine.pg.schema.TableSchema` from
  ``pg_attribute``, ``pg_type`` and ``pg_index`` (columns, key, replica identity), each column's type
  resolved through domains, arrays, composites and extension types (:class:`_TypeResolver`).
- :func:`describe_mirrored`: a mirror's schema as it was built (its saved signature), checked
  against the catalog now.
- :func:`catalog_columns`, :func:`resolve_column`, :func:`xid_visible`: what schema evolution looks
  up when a Relation message shows a change (PG docs, "System Catalogs": ``pg_attribute``,
  ``pg_attrdef``, ``pg_type``); :class:`SourceCatalog`: the service's connection for them.
- :func:`estimate_rows`, :func:`nan_columns`, :func:`missing_relations`: what create-table and the
  publication check read about a source table.

Catalog reads take no lock on the user's tables (the partition walk reads ``pg_inherits``, see
:mod:`.partitions`).
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
import pyarrow as pa
from psycopg import sql
from psycopg.rows import TupleRow

from ..faults import fault
from .conninfo import with_options
from .names import split_qualified_name
from .partitions import TREE_CTE
from .schema import (
    INT2VECTOR,
    OIDVECTOR,
    REFUSED_TYPES,
    ColumnSignature,
    ColumnSpec,
    TableSchema,
    UnsupportedTableError,
    UnsupportedTypeError,
    _apply_signature,
    _text_column,
    arrow_type_for,
    assign_field_ids,
    column_option_hint,
    text_spec,
)
from .session import LazyConnection

__all__ = [
    "CatalogColumn",
    "CatalogNotCurrent",
    "SourceCatalog",
    "catalog_columns",
    "describe_mirrored",
    "describe_table",
    "estimate_rows",
    "missing_relations",
    "nan_columns",
    "resolve_column",
    "xid_visible",
]

log = logging.getLogger("mooncake.catalog")

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: a ``pg_type`` row of ``_TYPE_SQL``: typtype, typbasetype, typtypmod, typelem, typcategory, typlen,
#: typndims, typname, typrelid, typdelim
_TypeRow = tuple[str, int, int, int, str, int, int, str, int, str]


_DESCRIBE_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attndims,
       a.attnum, CASE WHEN a.attgenerated = 's' THEN pg_get_expr(d.adbin, d.adrelid) END
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated IN ('', 's')
ORDER BY a.attnum
"""

_TYPE_SQL = """
SELECT t.typtype, t.typbasetype, t.typtypmod, t.typelem, t.typcategory, t.typlen, t.typndims,
       t.typname, t.typrelid, t.typdelim
FROM pg_type t WHERE t.oid = %s
"""

_COMPOSITE_SQL = """
SELECT a.attname, a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod), a.attndims
FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""


_KEY_SQL = """
SELECT i.indisprimary, i.indisreplident, array(
         SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         ORDER BY k.ord)
FROM pg_index i
WHERE i.indrelid = %(oid)s AND (i.indisprimary OR i.indisreplident)
"""


def describe_table(
    conn: psycopg.Connection,
    qualified_name: str,
    *,
    skip_unsupported: bool = False,
    column_types: dict[str, str] | None = None,
    exclude: Sequence[str] | None = None,
) -> TableSchema:
    """Read a table's mirror schema from the catalogs (``pg_class``, ``pg_attribute``, ``pg_index``,
    ``format_type``).

    ``qualified_name``: ``schema.table`` or ``table`` (resolved by ``search_path``), quoted as in SQL
    when needed (``'"My Schema"."T"'``). Runs in its own transaction block (or a savepoint when the
    connection is inside a transaction), leaving the connection as it found it.

    Raises ``LookupError("table public.x does not exist")`` for a missing relation (or one that is not
    a table), :class:`UnsupportedTypeError` naming table, column and type for a column that cannot
    be mirrored — every such column in one message, with the options that get past them — or, with
    ``skip_unsupported``, leaves such columns out. ``column_types``: column -> ``"text"`` (mirror the
    column as its exact text, see :func:`text_spec`); ``exclude``: columns left out (not the key);
    an unknown column name in either raises ``LookupError``. ``current_columns`` of the
    result: the names of every column the table has now (skipped ones included); ``catalog_lsn``: a
    WAL position after every commit these catalogs show (0 when unknown).
    """
    with conn.transaction():
        with conn.cursor() as cur:
            oid, nsp, rel, relkind, replident = _find_table(cur, qualified_name)
            attrs = cur.execute(_DESCRIBE_SQL, {"oid": oid}).fetchall()
            keys = cur.execute(_KEY_SQL, {"oid": oid}).fetchall()
            lsn_row = cur.execute(
                "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn() - '0/0'::pg_lsn END"
            ).fetchone()
            assert lsn_row is not None  # a SELECT without FROM returns one row
            catalog_lsn = lsn_row[0]
            column_types = dict(column_types or {})
            excluded = list(exclude or [])
            _check_column_options(f"{nsp}.{rel}", {a[0] for a in attrs}, column_types, excluded)
            columns = _column_specs(_TypeResolver(cur), f"{nsp}.{rel}", attrs, column_types, excluded, skip_unsupported)
            assign_field_ids(columns)
    key_columns, has_pk = _key_columns(keys, replident)
    in_key = [c for c in excluded if c in key_columns]
    if in_key:
        raise LookupError(
            f"table {nsp}.{rel}: column {', '.join(in_key)} is part of the key "
            f"({', '.join(key_columns)}), which cannot be left out (--exclude-column)"
        )
    for c in columns:
        c.is_key = c.name in key_columns
    out = TableSchema(
        schema=nsp,
        name=rel,
        oid=oid,
        columns=columns,
        key_columns=key_columns,
        has_primary_key=has_pk,
        replica_identity=replident,
        relkind=relkind,
        excluded=excluded,
        column_types=column_types,
    )
    out.current_columns = {a[0] for a in attrs}
    out.catalog_lsn = int(catalog_lsn) if catalog_lsn is not None else 0
    return out


def _find_table(cur: psycopg.Cursor[TupleRow], qualified_name: str) -> tuple[int, str, str, str, str]:
    """``(oid, schema, name, relkind, relreplident)`` of the table ``qualified_name`` names
    (``to_regclass``). ``LookupError`` when there is none or it is not a table (view, sequence…);
    :class:`UnsupportedTableError` for a partition (its root is what is published)."""
    try:
        row = cur.execute(
            "SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s)",
            (qualified_name,),
        ).fetchone()
    except psycopg.errors.Error as e:  # e.g. invalid name syntax
        raise LookupError(f"table {qualified_name} does not exist ({e})") from None
    if row is None:
        raise LookupError(f"table {qualified_name} does not exist")
    oid, nsp, rel, relkind, replident = row
    if relkind not in ("r", "p"):
        kind = {
            "v": "a view",
            "m": "a materialized view",
            "f": "a foreign table",
            "S": "a sequence",
            "i": "an index",
            "c": "a composite type",
        }.get(relkind, "not a table")
        raise LookupError(f"table {qualified_name} does not exist ({nsp}.{rel} is {kind})")
    parent = cur.execute(
        "SELECT pg_partition_root(c.oid)::regclass::text FROM pg_class c WHERE c.oid = %s AND c.relispartition", (oid,)
    ).fetchone()
    if parent is not None:
        raise UnsupportedTableError(
            f"table {nsp}.{rel} is a partition of {parent[0]}: changes of a partition are published "
            f"under its partitioned root (publish_via_partition_root), so mirror {parent[0]} instead"
        )
    return int(oid), nsp, rel, relkind, replident


def _check_column_options(table: str, names: set[str], column_types: dict[str, str], excluded: list[str]) -> None:
    """``LookupError`` when ``--column-type``/``--exclude-column`` name a column ``table`` does not
    have, or ask for a column type other than ``text``."""
    unknown = [c for c in list(column_types) + excluded if c not in names]
    if unknown:
        raise LookupError(f"table {table} has no column {', '.join(unknown)} (named by --column-type/--exclude-column)")
    bad_kind = {c: k for c, k in column_types.items() if k != "text"}
    if bad_kind:
        raise LookupError(
            f"table {table}: --column-type {', '.join(f'{c}={k}' for c, k in bad_kind.items())}"
            ": the only column type that can be asked for is text (Postgres's exact text output)"
        )


def _column_specs(
    types: _TypeResolver,
    table: str,
    attrs: list[tuple[Any, ...]],
    column_types: dict[str, str],
    excluded: list[str],
    skip_unsupported: bool,
) -> list[ColumnSpec]:
    """The :class:`ColumnSpec` of each column of ``attrs`` (rows of ``_DESCRIBE_SQL``) that is not
    excluded, without field ids. A column that cannot be mirrored is left out with
    ``skip_unsupported``; otherwise every such column is named in one :class:`UnsupportedTypeError`."""
    columns: list[ColumnSpec] = []
    refused: list[tuple[str, str, str]] = []
    for name, typid, typmod, tname, notnull, ndims, attnum, generated in attrs:
        if name in excluded:
            continue
        if column_types.get(name) == "text":
            spec = _text_column(name, typid, typmod, tname)
        else:
            try:
                spec = types.spec(name, typid, typmod, tname, ndims)
            except UnsupportedTypeError as e:
                if not skip_unsupported:
                    refused.append((name, tname, str(e)))
                continue
        spec.not_null = bool(notnull)
        spec.decl_oid, spec.decl_typmod = typid, typmod
        spec.attnum = int(attnum)
        spec.generated = generated
        columns.append(spec)
    if refused:
        raise UnsupportedTypeError(
            f"table {table}: {len(refused)} column(s) cannot be mirrored exactly: "
            + "; ".join(f"{n} ({t}: {why})" for n, t, why in refused)
            + f"; {column_option_hint([n for n, _, _ in refused])}"
        )
    return columns


def _key_columns(keys: list[tuple[Any, ...]], replident: str) -> tuple[list[str], bool]:
    """``(key columns, has a primary key)`` from the rows of ``_KEY_SQL``: the replica identity index
    when the table uses one (what UPDATE/DELETE old tuples carry), else the primary key, else none."""
    pk = next((list(k[2]) for k in keys if k[0]), None)
    ident = next((list(k[2]) for k in keys if k[1]), None)
    if replident == "i" and ident is not None:
        return ident, pk is not None
    if pk is not None:
        return pk, True
    return [], False


def _format_type(cur: psycopg.Cursor[TupleRow], oid: int, typmod: int) -> str:
    """``format_type(oid, typmod)`` in this session: the type's SQL name (``numeric(5,2)``)."""
    row = cur.execute("SELECT format_type(%s, %s)", (oid, typmod)).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    return str(row[0])


class _TypeResolver:
    """Resolves a column's type to a :class:`ColumnSpec` (``pg_type``: typtype, typbasetype,
    typtypmod, typelem, typcategory, typlen, typndims, typname, typrelid, typdelim): domains to their
    root base type, enums to text, arrays to a list of their element's spec, composite types to a
    struct of their attributes, ``hstore`` to a map, PostGIS ``geometry``/``geography`` to WKB, every
    other type to its exact text (``as_text``); :data:`REFUSED_TYPES` and pseudo-types raise
    :class:`UnsupportedTypeError`."""

    def __init__(self, cur: psycopg.Cursor[TupleRow]):
        self.cur = cur
        self._info: dict[int, _TypeRow] = {}

    def info(self, oid: int) -> _TypeRow:
        if oid not in self._info:
            row = self.cur.execute(_TYPE_SQL, (oid,)).fetchone()
            if row is None:
                raise UnsupportedTypeError(f"type oid {oid} does not exist")
            self._info[oid] = row
        return self._info[oid]

    def format_type(self, oid: int, typmod: int) -> str:
        return _format_type(self.cur, oid, typmod)

    def spec(self, name: str, oid: int, typmod: int, decl_name: str, attndims: int = 0, _depth: int = 0) -> ColumnSpec:
        """Spec for a column ``name`` of type ``oid``/``typmod`` (``decl_name``: its ``format_type``)."""
        if _depth > 16:
            raise UnsupportedTypeError(f"type {decl_name}: nesting too deep")
        typtype, base, base_mod, elem, category, typlen, typndims, typname, typrelid, _ = self.info(oid)
        dec_name = decl_name
        depth = 0
        while typtype == "d":  # domains (nested ones too) decode as their root base type
            oid, typmod = base, base_mod
            attndims = attndims or typndims
            typtype, base, base_mod, elem, category, typlen, typndims, typname, typrelid, _ = self.info(oid)
            dec_name = self.format_type(oid, typmod)
            depth += 1
            if depth > 32:
                raise UnsupportedTypeError(f"type {decl_name}: domain nesting too deep")
        if oid in REFUSED_TYPES:
            raise UnsupportedTypeError(REFUSED_TYPES[oid])
        if typtype == "p":
            raise UnsupportedTypeError(f"{dec_name} is a pseudo-type, which has no values to mirror")
        if typtype == "e":
            return ColumnSpec(name, oid, typmod, decl_name, pa.string())
        if category == "A" and elem and typlen == -1 and oid not in (INT2VECTOR, OIDVECTOR):
            # the attribute's typmod applies to the elements (numeric(5,2)[] has numeric(5,2) elements)
            el = self.spec(f"{name}[]", elem, typmod, self.format_type(elem, typmod), _depth=_depth + 1)
            if el.element is not None:
                raise UnsupportedTypeError(f"type {decl_name}: arrays of arrays")
            nd = max(int(attndims or 0), 1)
            t: pa.DataType = el.arrow_type
            for _ in range(nd):
                t = pa.list_(t)
            return ColumnSpec(
                name,
                oid,
                typmod,
                decl_name,
                t,
                element=el,
                ndims=nd,
                delim=self.info(elem)[9] or ",",
                as_text=el.as_text,
            )
        if typtype == "c" and typrelid:
            fields = []
            try:
                for fname, ftyp, fmod, ftname, fnd in self.cur.execute(_COMPOSITE_SQL, (typrelid,)).fetchall():
                    fields.append(self.spec(fname, ftyp, fmod, ftname, fnd, _depth=_depth + 1))
            except UnsupportedTypeError:  # a field that cannot be mirrored: the composite as its exact text
                return _text_column(name, oid, typmod, decl_name)
            if not fields:
                return _text_column(name, oid, typmod, decl_name)
            names = [f.name for f in fields]
            if len(set(names)) != len(names):
                return _text_column(name, oid, typmod, decl_name)
            t = pa.struct([pa.field(f.name, f.arrow_type, nullable=True) for f in fields])
            return ColumnSpec(name, oid, typmod, decl_name, t, kind="composite", fields=fields)
        if typtype == "b" and typname == "hstore":
            return ColumnSpec(name, oid, typmod, decl_name, pa.map_(pa.string(), pa.string()), kind="hstore")
        if typtype == "b" and typname in ("geometry", "geography"):
            m = re.search(r"\(\s*\w+\s*(?:,\s*(-?\d+)\s*)?\)\s*$", dec_name)
            srid = int(m.group(1)) if m and m.group(1) else (4326 if typname == "geography" else 0)
            return ColumnSpec(name, oid, typmod, decl_name, pa.binary(), kind="wkb", srid=srid)
        try:
            return ColumnSpec(name, oid, typmod, decl_name, arrow_type_for(oid, typmod, dec_name))
        except UnsupportedTypeError:
            # every other type (ranges, multiranges, geometric types, tsvector, ltree, reg*, pg_lsn, …):
            # its output function's text, exactly as Postgres prints it (the session settings are pinned)
            return _text_column(name, oid, typmod, decl_name)


def describe_mirrored(
    conn: psycopg.Connection,
    qualified_name: str,
    signature: list[ColumnSignature] | None,
    key: list[str] | None = None,
    *,
    column_types: dict[str, str] | None = None,
    exclude: Sequence[str] | None = None,
    text_field_ids: Collection[int] = (),
    field_types: Mapping[int, pa.DataType] | None = None,
    unresolved: list[str] | None = None,
    oid: int | None = None,
) -> TableSchema:
    """The :class:`TableSchema` of a mirror whose columns are ``signature`` (see
    :func:`column_signature`), decoded with the source's current catalogs: columns that still exist
    with the same type are taken from :func:`describe_table`; the others (dropped, renamed or retyped
    since) are resolved from their saved type oid. ``key``: the mirror's key columns (default: the
    source's current key). ``column_types``/``exclude``: the mirror's create-table column options
    (see :func:`describe_table`). ``text_field_ids``: the Iceberg field ids that are plain strings in
    the mirror; a saved type that no longer exists (an enum dropped after its column moved to a new
    enum, as Prisma's enum migrations do) is read as the column's current type when that is a plain
    string too and the field is one of these (the saved type oid is kept, so the replayed stream meets
    the retype at its LSN). Without a signature: :func:`describe_table`. ``current_columns`` of the
    result: the source's columns now (names).

    A saved type that can neither be resolved nor read as the column's current one raises
    :class:`UnsupportedTypeError` naming the table, column and type oid — unless ``unresolved`` (a list)
    is given and ``field_types`` (Iceberg field id -> the mirror's Arrow type) has the column: then the
    column keeps that Arrow type, undecodable (the caller stops the table), and one line naming table,
    column and type oid is appended to ``unresolved``.

    ``oid``: the source relation's oid as the mirror recorded it. With it, a source table whose oid no
    longer exists either (dropped while the mirror was stopped, or the service down) gives the schema of the
    saved columns, their types resolved from their saved oids, with ``current_columns`` empty and
    ``source_gone`` True (the caller keeps the mirror stopped and readable), instead of ``LookupError``."""
    column_types = dict(column_types or {})
    exclude = list(exclude or [])
    if not signature:
        return describe_table(conn, qualified_name, column_types=column_types, exclude=exclude)
    # a later column may not map, and a column named by an option may be gone since
    current = _current_or_gone(conn, qualified_name, oid, key)
    current.columns = [text_spec(c) if column_types.get(c.name) == "text" else c for c in current.columns]
    current_names = current.current_columns
    by_name = {c.name: c for c in current.columns}
    cols: list[ColumnSpec] = []
    with conn.transaction(), conn.cursor() as cur:
        types = _TypeResolver(cur)
        for sig in signature:
            c = by_name.get(sig["name"])
            if c is not None and (c.decl_oid, c.decl_typmod) == (sig["oid"], sig["typmod"]):
                cols.append(_apply_signature(c, sig))
                continue
            try:
                name_sql = types.format_type(sig["oid"], sig["typmod"])
                if column_types.get(sig["name"]) == "text":  # whatever the type: its text
                    spec = _text_column(sig["name"], sig["oid"], sig["typmod"], name_sql)
                else:
                    spec = types.spec(sig["name"], sig["oid"], sig["typmod"], name_sql, sig.get("ndims") or 0)
            except (UnsupportedTypeError, TypeError, psycopg.Error) as e:
                cols.append(
                    _apply_signature(
                        _gone_type_column(qualified_name, sig, c, e, text_field_ids, field_types, unresolved), sig
                    )
                )
                continue
            spec.decl_oid, spec.decl_typmod = sig["oid"], sig["typmod"]
            cols.append(_apply_signature(spec, sig))
    keys = list(current.key_columns if key is None else key)
    for c in cols:
        c.is_key = c.name in keys
    out = TableSchema(
        schema=current.schema,
        name=current.name,
        oid=current.oid,
        columns=cols,
        key_columns=keys,
        has_primary_key=current.has_primary_key,
        replica_identity=current.replica_identity,
        relkind=current.relkind,
        excluded=exclude,
        column_types=column_types,
    )
    out.current_columns = current_names
    out.source_gone = current.source_gone
    out.catalog_lsn = current.catalog_lsn
    return out


def _current_or_gone(
    conn: psycopg.Connection, qualified_name: str, oid: int | None, key: list[str] | None
) -> TableSchema:
    """:func:`describe_table` of the source table now (unsupported columns skipped); when it is gone
    under its name and its recorded ``oid`` is gone too (dropped), an empty schema with ``source_gone``
    (see :func:`describe_mirrored`). A relation that still exists under its oid (renamed?) raises
    ``LookupError`` as :func:`describe_table` did."""
    try:
        return describe_table(conn, qualified_name, skip_unsupported=True)
    except LookupError:
        if oid is None or conn.execute("SELECT 1 FROM pg_class WHERE oid = %s::oid", [oid]).fetchone():
            raise  # a relation that still exists under its oid (renamed?) is not a dropped one
    parts = split_qualified_name(qualified_name)
    return TableSchema(
        schema=parts[0] if len(parts) > 1 else "public",
        name=parts[-1],
        oid=oid,
        columns=[],
        key_columns=list(key or []),
        has_primary_key=bool(key),
        replica_identity="d",
        source_gone=True,
    )


def _gone_type_column(
    qualified_name: str,
    sig: ColumnSignature,
    current: ColumnSpec | None,
    error: Exception,
    text_field_ids: Collection[int],
    field_types: Mapping[int, pa.DataType] | None,
    unresolved: list[str] | None,
) -> ColumnSpec:
    """The column spec of a mirrored column whose saved type oid (``sig``) could not be resolved
    (``error``), as :func:`describe_mirrored` documents: read as its ``current`` type when both are
    plain strings in the mirror, else kept with the mirror's Arrow type and reported in ``unresolved``,
    else :class:`UnsupportedTypeError` naming table, column and type oid."""
    if (
        current is not None
        and sig.get("field_id") in text_field_ids
        and _plain_string(current)
        and (not sig.get("attnum") or sig.get("attnum") == current.attnum)
    ):
        log.warning(
            "table %s: type oid %s of column %s no longer exists (%s); reading it as its current "
            "type %s (both are text in the mirror)",
            qualified_name,
            sig["oid"],
            sig["name"],
            error,
            current.type_name,
        )
        spec = copy.copy(current)
    else:
        fid = int(sig.get("field_id") or 0)
        msg = (
            f"table {qualified_name}: mirrored column {sig['name']} (type oid {sig['oid']}) can no longer "
            f"be resolved ({error})"
        )
        if unresolved is None or field_types is None or fid not in field_types:
            raise UnsupportedTypeError(msg) from None
        unresolved.append(msg)
        spec = ColumnSpec(sig["name"], sig["oid"], sig["typmod"], f"type oid {sig['oid']}", field_types[fid])
    spec.decl_oid, spec.decl_typmod = sig["oid"], sig["typmod"]
    return spec


def _plain_string(c: ColumnSpec) -> bool:
    """True when ``c`` is mirrored as a plain string (an enum, a text type, a type as its exact text)."""
    return c.arrow_type == pa.string() and c.element is None and not c.fields and not c.kind


# Catalog lookups for schema evolution -----------------------------------------------------------------

_ATTRS_SQL = (
    "WITH RECURSIVE "
    + TREE_CTE.format(root="%(oid)s")
    + """
SELECT a.attnum, a.attname, a.attisdropped, a.atttypid, a.atttypmod, a.attndims, a.attnotnull,
       CASE WHEN NOT a.attisdropped THEN COALESCE(
         CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END,
         -- a partitioned root stores no rows: its leaves hold the value older rows read (walked through
         -- pg_inherits, which takes no lock on the partitions: pg_partition_tree() does, and could
         -- deadlock with the user's ALTER TABLE)
         (SELECT (p.attmissingval::text::text[])[1] FROM tree t
          JOIN pg_attribute p ON p.attrelid = t.relid AND p.attname = a.attname
          WHERE t.relid <> a.attrelid AND p.atthasmissing AND NOT p.attisdropped LIMIT 1)) END,
       pg_get_expr(d.adbin, d.adrelid), d.adbin::text
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %(oid)s AND a.attnum > 0 AND a.attgenerated = ''
ORDER BY a.attnum
"""
)

_FUNC_IDS = re.compile(r":(?:funcid|opfuncid|opno) (\d+)")


@dataclass
class CatalogColumn:
    """One ``pg_attribute`` row of a mirrored table as the catalogs show it now: ``missing`` is the
    text of ``attmissingval`` (the value rows that predate an ``ADD COLUMN … DEFAULT`` read as; for a
    partitioned table, a leaf partition's), None when there is none."""

    attnum: int
    name: str
    dropped: bool
    type_oid: int
    typmod: int
    ndims: int
    not_null: bool
    missing: str | None


class CatalogNotCurrent(Exception):
    """The source's catalogs do not show transaction ``xid`` yet (temporary: retry). Postgres writes a
    commit record, and logical decoding may send the transaction, *before* the committing backend
    leaves the proc array (``ProcArrayEndTransaction`` comes after the WAL flush, the clog update and
    a synchronous-replication wait): for that moment a new snapshot still sees the catalogs as they
    were before the transaction — an ``ADD COLUMN`` made by it is not there yet."""

    def __init__(self, xid: int):
        super().__init__(
            f"the source's catalogs do not show transaction {xid} yet (committed in the WAL, "
            "not yet visible to new snapshots)"
        )
        self.xid = xid


# the full (epoch-qualified) xid of a 32-bit xid that is older than the snapshot's xmax, and whether the
# snapshot sees it committed (pg_visible_in_snapshot: Postgres 13+; docs: "Transaction ID and Snapshot
# Information Functions")
_VISIBLE_SQL = """
WITH s AS (SELECT pg_current_snapshot() AS snap),
     x AS (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax FROM s)
SELECT pg_visible_in_snapshot(
         (((xmax >> 32) - CASE WHEN %(xid)s::bigint > (xmax & 4294967295) THEN 1 ELSE 0 END) * 4294967296
          + %(xid)s::bigint)::text::xid8, snap)
FROM x
"""


def xid_visible(conn: psycopg.Connection, xid: int) -> bool:
    """Does a new snapshot of the source see transaction ``xid`` (32-bit, as pgoutput's Begin and
    Stream Start carry it) as committed? A transaction logical decoding sent is committed, so False
    means "not visible *yet*" (see :class:`CatalogNotCurrent`)."""
    row = conn.execute(_VISIBLE_SQL, {"xid": int(xid) & 0xFFFFFFFF}).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    return bool(row[0])


def catalog_columns(conn: psycopg.Connection, table_oid: int, xid: int | None = None) -> list[CatalogColumn]:
    """Every non-generated attribute of the table (dropped ones too), in ``attnum`` order.

    ``xid``: the transaction whose change is being followed (pgoutput's xid). The catalogs are read
    only once a snapshot sees it committed — else :class:`CatalogNotCurrent` (retry): a lookup before
    that would see the table without the column the transaction added, and give it no default.

    ``missing`` comes from ``attmissingval``; a table rewrite since the ``ADD COLUMN`` (``ALTER …
    TYPE``, ``VACUUM FULL``) stores the values in the rows and clears it, and then the column's default
    expression is evaluated instead when it is immutable (constants, casts, immutable functions: the
    value the rows got); a volatile default leaves it unknown (None). Errors: ``psycopg.Error`` as
    raised (``OperationalError``, e.g. a ``lock_timeout``, is temporary)."""
    out = []
    with conn.transaction(), conn.cursor() as cur:
        # READ COMMITTED: every later statement's snapshot is newer than the one that saw xid committed
        if xid is not None and not xid_visible(conn, xid):
            raise CatalogNotCurrent(xid)
        # the value texts as the stream prints them (reg* names schema-qualified: OUTPUT_SETTINGS)
        cur.execute("SET LOCAL search_path = pg_catalog")
        for r in cur.execute(_ATTRS_SQL, {"oid": table_oid}).fetchall():
            missing = r[7]
            if missing is None and r[8] is not None and not r[2]:
                missing = _immutable_default(cur, r[8], r[9], int(r[3]), int(r[4]))
            out.append(
                CatalogColumn(int(r[0]), r[1], bool(r[2]), int(r[3]), int(r[4]), int(r[5] or 0), bool(r[6]), missing)
            )
    return out


def _immutable_default(cur: psycopg.Cursor[TupleRow], expr: str, tree: str, typid: int, typmod: int) -> str | None:
    """The text (the column type's output form, as the replication stream carries values) of a default
    expression's value when every function and operator in it is immutable (and it reads no table),
    else None."""
    if "SUBLINK" in tree or "NEXTVAL" in tree.upper():
        return None
    ids = sorted({int(x) for x in _FUNC_IDS.findall(tree)})
    if ids:
        rows = cur.execute(
            "SELECT provolatile FROM pg_proc WHERE oid = ANY(%s) UNION ALL "
            "SELECT p.provolatile FROM pg_operator o JOIN pg_proc p ON p.oid = o.oprcode "
            "WHERE o.oid = ANY(%s)",
            (ids, ids),
        ).fetchall()
        if any(v != "i" for (v,) in rows):
            return None
    try:
        with cur.connection.transaction():  # format's %s uses the type's output function: 't', not 'true'
            tname = _format_type(cur, typid, typmod)
            row = cur.execute(f"SELECT format('%s', ({expr})::{tname})").fetchone()
            assert row is not None  # a SELECT without FROM returns one row
            return None if row[0] is None else str(row[0])
    except psycopg.OperationalError:
        raise  # a lock timeout, a cancel, a lost connection: no answer yet, not "no default" (the caller retries)
    except psycopg.Error:
        return None  # the expression cannot be evaluated on its own (e.g. it fails for this type)


def resolve_column(conn: psycopg.Connection, name: str, type_oid: int, typmod: int, ndims: int = 0) -> ColumnSpec:
    """The :class:`ColumnSpec` for a column of type ``type_oid``/``typmod`` (as a Relation message
    names it). Raises :class:`UnsupportedTypeError` (without table; the caller adds it) when the type
    cannot be mirrored."""
    with conn.transaction(), conn.cursor() as cur:
        types = _TypeResolver(cur)
        tname = types.format_type(type_oid, typmod)
        spec = types.spec(name, type_oid, typmod, tname, ndims)
    spec.decl_oid, spec.decl_typmod = type_oid, typmod
    return spec


class SourceCatalog:
    """The source's catalogs as schema evolution looks them up (``columns``, ``resolve``; see
    :func:`mooncake_assets.engine.table.schema_change.on_relation`), over one lazily opened connection
    that is re-opened (a few tries, with backoff) when it broke.

    A lookup never waits on a lock for long (``lock_timeout`` 500 ms: the user's DDL goes first) and
    retries what can pass: a lost connection or a lock/statement timeout (``OperationalError``, 5
    tries, 0.5–4 s apart), a ``cache lookup failed`` internal error (a type dropped by a DDL that
    committed while the lookup ran: 5 tries, 0.05–0.4 s apart) and catalogs that do not show the
    change's transaction yet
    (:class:`CatalogNotCurrent`: polled for up to ``visible_wait_s``
    seconds — a commit is sent by logical decoding a moment before it is visible, longer while a
    synchronous standby is awaited). What is still failing after that is raised; the caller stops the
    table with an error naming table, column and LSN (never "no catalog rows": that would read as "no
    default"). Fault point ``catalog:lookup`` (:mod:`mooncake_assets.engine.faults`) before every try."""

    def __init__(self, dsn: str, visible_wait_s: float = 60.0):
        self.dsn = dsn
        self.visible_wait_s = visible_wait_s
        self._conn = LazyConnection(self._connect)

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(with_options(self.dsn), autocommit=True)
        # never hold up the user's DDL: the lookups hold no relation locks (pg_get_expr takes one on the
        # table for a moment) and must not wait for one
        conn.execute("SET lock_timeout = '500ms'")
        return conn

    def _call(self, fn: Callable[Concatenate[psycopg.Connection, _P], _T], *args: _P.args, **kw: _P.kwargs) -> _T:
        attempt = 0
        waiting_since: float | None = None
        pause = 0.01
        while True:
            fault("catalog:lookup")
            try:
                return fn(self._conn.get(), *args, **kw)
            except CatalogNotCurrent as e:
                now = time.monotonic()
                waiting_since = waiting_since or now
                if now - waiting_since >= self.visible_wait_s:
                    raise CatalogNotCurrent(e.xid) from None
                if pause >= 0.32:
                    log.warning("schema change lookup: %s; waiting (%.0fs so far)", e, now - waiting_since)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
            except psycopg.OperationalError:
                self._conn.close()
                if attempt == 4:
                    raise
                time.sleep(0.5 * 2**attempt)
                attempt += 1
            except psycopg.errors.InternalError_ as e:
                # "cache lookup failed for type N": the statement's snapshot saw a type that a DDL
                # transaction committing meanwhile dropped (Prisma's enum migration) before the system
                # cache looked it up. A new statement sees the committed catalogs: try again.
                if "cache lookup failed" not in str(e) or attempt == 4:
                    raise
                log.info("schema change lookup: %s; trying again", " ".join(str(e).split()))
                time.sleep(0.05 * 2**attempt)
                attempt += 1

    def columns(self, table_oid: int, xid: int | None = None) -> list[CatalogColumn]:
        return self._call(catalog_columns, table_oid, xid)

    def resolve(self, name: str, type_oid: int, typmod: int, ndims: int = 0) -> ColumnSpec:
        return self._call(resolve_column, name, type_oid, typmod, ndims)

    def close(self) -> None:
        self._conn.close()


def estimate_rows(conn: psycopg.Connection, oid: int) -> int | None:
    """The planner's row estimate of table ``oid`` (``pg_class.reltuples``, at least 0), for the copy's
    progress; None when unknown or not readable."""
    try:
        r = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = %s", (oid,)).fetchone()
        return max(int(r[0]), 0) if r else None
    except psycopg.Error:
        return None


def missing_relations(conn: psycopg.Connection, oids: Sequence[int]) -> set[int]:
    """Those of ``oids`` that name no relation any more (``pg_class``): the tables that were dropped."""
    return {
        r[0]
        for r in conn.execute(
            "SELECT o FROM unnest(%s::oid[]) o WHERE NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = o)", (list(oids),)
        ).fetchall()
    }


def _is_decimal(c: ColumnSpec) -> bool:
    t = c.arrow_type
    while pa.types.is_list(t):
        t = t.value_type
    return pa.types.is_decimal(t) and c.type_oid != 790 and (c.element is None or c.element.type_oid != 790)


def nan_columns(conn: psycopg.Connection, schema: TableSchema) -> list[ColumnSpec]:
    """The ``numeric(p,s)`` columns of ``schema`` (mapped to decimal128, which has no NaN; money
    excluded) that hold ``'NaN'`` now, in any row or array element: one scan of the table, only when
    it has such columns (else ``[]`` without a query)."""
    cols = [c for c in schema.columns if _is_decimal(c)]
    if not cols:
        return []
    tests = [
        sql.SQL("bool_or('NaN'::numeric = {})").format(sql.Identifier(c.name))
        if c.element is None
        else sql.SQL("bool_or('NaN'::numeric = ANY({}))").format(sql.Identifier(c.name))
        for c in cols
    ]
    q = sql.SQL("SELECT {} FROM {}").format(sql.SQL(", ").join(tests), sql.Identifier(schema.schema, schema.name))
    row = conn.execute(q).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return [c for c, hit in zip(cols, row) if hit]
