"""Schema evolution of a mirrored table: a source ``ALTER TABLE`` becomes an Iceberg schema change at
the LSN where pgoutput shows it (Iceberg spec "Schema Evolution", format v3 "Default values").

pgoutput sends a new Relation message before the first change made under the new schema; the
mirror compares it with its own columns (:func:`plan_schema_change`, pure: the service looks the
catalogs up) and, when the change can be followed, switches at that commit LSN
(``MirrorTable.evolve``):

=====================================  ==============================================================
source change                          mirror / Iceberg
=====================================  ==============================================================
``ADD COLUMN c T``                     new field (fresh id), optional; older rows read NULL
``ADD COLUMN c T DEFAULT v``           same, with Iceberg ``initial-default`` = v (``attmissingval``):
                                       older rows read v, as in Postgres (format v3 only)
``DROP COLUMN c``                      field removed from the current schema; old files keep it
``RENAME COLUMN a TO b``               same field id, new name
``int2→int4→int8``, ``real→double``,   Iceberg type promotion (int→long, float→double, decimal
``numeric(p,s)→numeric(p',s)``, p'≥p   precision); old files are cast when read
``varchar(n)→varchar(m)/text``         same Arrow/Iceberg type (string); nothing to promote
anything else                          the table stops with an error naming table, column and LSN
=====================================  ==============================================================

Columns are matched by ``pg_attribute.attnum`` (which a rename keeps), looked up in the catalogs
*now*, so a column dropped and re-added under the same name is a new field. A table without a key is
mirrored by its whole row: it follows ADD, RENAME and type promotions (rows keep being located by the
columns they were hashed with and re-checked on the whole row) but not DROP COLUMN, which would
change every row's identity.

Files keep the layout they were written with; every file carries ``PARQUET:field_id``, so readers
(PyIceberg, DuckDB's ``iceberg_scan``, the union read through ``read_parquet(schema=…)`` and
:func:`project`) resolve columns by id.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pyarrow as pa

from ..lsn import Lsn
from ..pg.catalog import CatalogColumn
from ..pg.names import case_collision
from ..pg.schema import ColumnSpec, TableSchema, UnsupportedTypeError, assign_field_ids

FIELD_ID = b"PARQUET:field_id"
log = logging.getLogger("mooncake.table")

__all__ = [
    "SchemaChangeError",
    "CatalogLookupError",
    "SchemaChange",
    "plan_schema_change",
    "promotable",
    "project",
    "field_id_of",
]


class SchemaChangeError(ValueError):
    """A source schema change the mirror cannot follow (permanent for this mirror: retrying the same
    WAL gives the same error). The message names table, column(s) and LSN."""


class CatalogLookupError(RuntimeError):
    """The source's catalogs gave no trustworthy answer for a schema change (temporary: they could not
    be read, or never showed the transaction that made the change, within the retries). The table
    stops rather than guess (e.g. give an added column no default); a restart of the service replays
    the change from the table's flush LSN and looks again. The message names table, column(s) and LSN."""


def promotable(old: pa.DataType, new: pa.DataType) -> bool:
    """Can values of Arrow type ``old`` be read as ``new`` under Iceberg's type promotion rules
    (int→long, float→double, decimal(P,S)→decimal(P',S) with P' ≥ P; equal types trivially)?"""
    if old.equals(new):
        return True
    ints = (pa.int16(), pa.int32(), pa.int64())
    if old in ints and new in ints:
        return ints.index(new) >= ints.index(old)
    if old == pa.float32() and new == pa.float64():
        return True
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return cast(bool, new.scale == old.scale and new.precision >= old.precision)
    return False


@dataclass
class SchemaChange:
    """A followable change: the mirror's new ``columns`` (field ids kept or fresh) and ``key_columns``,
    plus what changed, for logs and the table's history."""

    columns: list[ColumnSpec]
    key_columns: list[str]
    lsn: int
    next_field_id: int
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    retyped: list[tuple[str, str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for logs and errors: ``schema change at LSN X/Y: added a; renamed b to c; d: int4 -> int8``."""
        parts = [f"added {a}" for a in self.added] + [f"dropped {d}" for d in self.dropped]
        parts += [f"renamed {a} to {b}" for a, b in self.renamed]
        parts += [f"{c}: {a} -> {b}" for c, a, b in self.retyped]
        return f"schema change at LSN {Lsn(self.lsn)}: " + ("; ".join(parts) or "type details only")

    def is_noop(self) -> bool:
        """Nothing the mirror has changes (e.g. only an ignored column, or a type change within the same
        Arrow type and declared type — never, since the Relation differed)."""
        return not (self.added or self.dropped or self.renamed or self.retyped)


def plan_schema_change(
    schema: TableSchema,
    rel_columns: list[tuple[str, int, int]],
    catalog: list[CatalogColumn],
    resolve: Callable[[str, int, int, int], ColumnSpec],
    lsn: int,
    next_field_id: int,
    *,
    table: str,
    format_version: int = 3,
) -> SchemaChange:
    """Match a Relation message's columns (``rel_columns``: (name, type oid, typmod) in order) with the
    mirror's ``schema`` through the table's catalog rows now (``catalog``, dropped ones included);
    ``resolve(name, oid, typmod, ndims)`` gives the spec of a new or retyped column (raises
    :class:`UnsupportedTypeError`); ``next_field_id``: the first free Iceberg field id.

    Returns a :class:`SchemaChange`. Raises :class:`SchemaChangeError`, naming
    ``table``, the column(s) and ``lsn``, for a change Iceberg cannot express or the mirror cannot
    follow: a type change that is not a promotion, an unmappable type, a default on a format v2 table,
    DROP COLUMN on a table without a key, or a column the catalogs no longer identify (for an added
    column: no catalog row can be told to be it, so its default for older rows is unknown). An added column
    whose type cannot be mirrored but which the source has dropped again since is left out
    (``ignored``): that is how undoing such an ADD COLUMN and restarting resumes the table."""
    fail = _Failure(f"table {table} (source {schema.qualified_name}): schema change at LSN {Lsn(lsn)}")
    alive = {c.name: c for c in catalog if not c.dropped}
    by_attnum = {c.attnum: c for c in schema.columns if c.attnum}
    by_name = {c.name: c for c in schema.columns}
    rel_names = {n for n, _, _ in rel_columns}
    pairs = _pair_by_identity(rel_columns, alive, by_attnum, by_name, fail)
    _pair_by_position(schema, rel_columns, catalog, alive, rel_names, pairs)
    matched: dict[int, ColumnSpec] = {}  # id(mine) -> new spec
    out: list[ColumnSpec] = []
    change = SchemaChange(columns=out, key_columns=[], lsn=lsn, next_field_id=next_field_id)
    for (name, oid, typmod), mine in zip(rel_columns, pairs):
        cat = alive.get(name)
        if mine is None and cat is None:
            cat = _guess_added(catalog, out, by_attnum, rel_names, oid, typmod)
        if mine is None:  # a new column
            spec = _added_column(name, oid, typmod, cat, resolve, fail, table, lsn, format_version)
            if spec is None:  # dropped again since (a replayed change): its values are gone
                change.ignored.append(name)  # from the source too, so it is left out
                continue
            out.append(spec)
            change.added.append(name)
            continue
        spec = _kept_column(name, oid, typmod, mine, cat, resolve, fail, change)
        matched[id(mine)] = spec
        out.append(spec)
    keys = _kept_keys(schema, matched, by_name, change, fail)
    clash = case_collision(c.name for c in out)
    if clash:
        raise fail(
            f'columns "{clash[0]}" and "{clash[1]}" differ only in case, which union reads (DuckDB) cannot tell apart',
            undo=f'rename column "{clash[1]}" on the source',
        )
    change.key_columns = keys
    change.next_field_id = assign_field_ids(out, next_field_id)
    for c in out:
        c.is_key = c.name in keys
    return change


class _Failure:
    """The :class:`SchemaChangeError` of one change: ``where`` (table, source, LSN) and ``what``
    happened; ``undo``: a fix on the source after which a restart resumes the table (replaying the
    change from the slot must then go through); without one, only a fresh copy gets past the change."""

    def __init__(self, where: str):
        self.where = where

    def __call__(self, what: str, undo: str | None = None) -> SchemaChangeError:
        how = f"{undo} and restart the service, or re-create the mirror" if undo else "re-create the mirror"
        return SchemaChangeError(
            f"{self.where}: {what} — this table stopped (the others go on) and holds the replication slot at its "
            f"flush LSN, so nothing is lost; to resume, {how} (drop-table, then create-table: a fresh copy)"
        )


def _pair_by_identity(
    rel_columns: list[tuple[str, int, int]],
    alive: dict[str, CatalogColumn],
    by_attnum: dict[int, ColumnSpec],
    by_name: dict[str, ColumnSpec],
    fail: _Failure,
) -> list[ColumnSpec | None]:
    """Step 1: the mirror's column each Relation column is (None: none yet), by attnum (the catalogs
    now), else by name. Raises when two Relation columns would be the same mirror column."""
    pairs: list[ColumnSpec | None] = []
    for name, _oid, _typmod in rel_columns:
        cat = alive.get(name)
        mine = None
        if cat is not None and cat.attnum in by_attnum:
            mine = by_attnum[cat.attnum]
        elif name in by_name and (by_name[name].attnum == 0 or cat is None):
            mine = by_name[name]  # no attnum known, or the name is gone from the catalogs again since
        if mine is not None and any(m is mine for m in pairs):
            raise fail(f"column {name} cannot be told apart from column {mine.name} (the catalogs changed again since)")
        pairs.append(mine)
    return pairs


def _pair_by_position(
    schema: TableSchema,
    rel_columns: list[tuple[str, int, int]],
    catalog: list[CatalogColumn],
    alive: dict[str, CatalogColumn],
    rel_names: set[str],
    pairs: list[ColumnSpec | None],
) -> None:
    """Step 2, filling in ``pairs``: a column renamed at this LSN and renamed again or dropped since
    (the change is processed late, e.g. replayed after a restart) is known to the catalogs under
    neither name; a rename keeps the column's place, so such columns are paired in order (same
    declared type) between their matched neighbours."""
    by_num = {c.attnum: c for c in catalog}

    def maybe_renamed(m: ColumnSpec) -> bool:
        c = by_num.get(m.attnum) if m.attnum else None
        return c is None or c.dropped or c.name not in rel_names

    pos_of = {id(m): j for j, m in enumerate(pairs) if m is not None}
    window: list[ColumnSpec] = []
    prev = -1
    for m in list(schema.columns) + [None]:
        if m is not None and id(m) not in pos_of:
            window.append(m)
            continue
        nxt = pos_of[id(m)] if m is not None else len(rel_columns)
        free = [j for j in range(prev + 1, nxt) if pairs[j] is None]
        for w in window:
            if not maybe_renamed(w):
                continue
            # a name the catalogs know is a candidate only for a column whose attnum is unknown (a column
            # dropped and re-added under the same name has a new attnum: not a rename)
            same = [
                j
                for j in free
                if (rel_columns[j][1], rel_columns[j][2]) == (w.decl_oid, w.decl_typmod)
                and (rel_columns[j][0] not in alive or not w.attnum)
            ]
            if same:
                pairs[same[0]] = w
                free = [j for j in free if j > same[0]]
        window = []
        prev = nxt


def _added_column(
    name: str,
    oid: int,
    typmod: int,
    cat: CatalogColumn | None,
    resolve: Callable[[str, int, int, int], ColumnSpec],
    fail: _Failure,
    table: str,
    lsn: int,
    format_version: int,
) -> ColumnSpec | None:
    """The spec of a column the Relation adds (``cat``: its catalog row, None when none can be told to
    be it): optional, its initial default the catalogs' ``missing`` value. None: its type cannot be
    mirrored but the source has dropped it again since (left out). Raises when its type cannot be
    mirrored, when no catalog row is it (older rows' value unknown), or for a default on format v2."""
    try:
        spec = resolve(name, oid, typmod, cat.ndims if cat is not None else 0)
    except UnsupportedTypeError as e:
        if cat is None or cat.dropped:
            return None
        raise fail(
            f"column {name} was added with a type that cannot be mirrored ({e})",
            undo=f"drop column {name} on the source",
        ) from None
    if cat is None:  # no catalog row is this column: what older rows read is unknown, never "no default"
        raise fail(
            f"column {name} was added, but the catalogs show no column it can be now (changed again "
            "since, in a way that cannot be told apart), so the value older rows read in it is "
            "unknown"
        )
    spec.attnum = cat.attnum
    spec.initial_default = cat.missing
    if cat.dropped:
        # dropped again since (a replayed change): Postgres clears attmissingval on DROP, so the value
        # is gone; the mirror drops the column too when it reaches the DROP, and reads between the
        # two LSNs are refused from then on
        log.warning(
            "table %s: column %s added at LSN %s has been dropped on the source since; older rows "
            "read NULL in it until the DROP is replayed",
            table,
            name,
            str(Lsn(lsn)),
        )
    spec.not_null = False  # rows older than the column may read NULL
    if spec.initial_default is not None and format_version < 3:
        raise fail(
            f"column {name} was added with a default; a format v2 table (delete format "
            "position-deletes) cannot give older rows that default (Iceberg initial-default needs "
            "format v3)"
        )
    return spec


def _kept_column(
    name: str,
    oid: int,
    typmod: int,
    mine: ColumnSpec,
    cat: CatalogColumn | None,
    resolve: Callable[[str, int, int, int], ColumnSpec],
    fail: _Failure,
    change: SchemaChange,
) -> ColumnSpec:
    """The new spec of the mirror's column ``mine`` (a copy: same field ids), renamed to ``name`` and
    promoted to the Relation's type ``oid``/``typmod`` when they differ (recorded in ``change``).
    Raises when the new type cannot be mirrored or is not an Iceberg type promotion."""
    spec = copy.copy(mine)
    spec.element_ids = list(mine.element_ids)
    if not spec.attnum and cat is not None:
        spec.attnum = cat.attnum
    if name != mine.name:
        spec.name = name
        change.renamed.append((mine.name, name))
    if (oid, typmod) != (mine.decl_oid, mine.decl_typmod):
        try:
            new = resolve(name, oid, typmod, mine.ndims)
        except UnsupportedTypeError as e:
            raise fail(f"column {name} changed type to one that cannot be mirrored ({e})") from None
        if not promotable(mine.arrow_type, new.arrow_type) or new.ndims != mine.ndims:
            raise fail(
                f"column {name} changed type from {mine.type_name} to {new.type_name}, which is not an "
                f"Iceberg type promotion ({mine.arrow_type} to {new.arrow_type})"
            )
        change.retyped.append((name, mine.type_name, new.type_name))
        for attr in ("type_oid", "typmod", "type_name", "arrow_type", "element", "decl_oid", "decl_typmod"):
            setattr(spec, attr, getattr(new, attr))
    return spec


def _kept_keys(
    schema: TableSchema,
    matched: dict[int, ColumnSpec],
    by_name: dict[str, ColumnSpec],
    change: SchemaChange,
    fail: _Failure,
) -> list[str]:
    """The mirror's columns no Relation column is are dropped (recorded in ``change``); returns the key
    columns under their new names. Raises for a dropped key column, and for any drop on a table
    without a key (mirrored by its whole row, which a drop changes for every row)."""
    dropped = [c for c in schema.columns if id(c) not in matched]
    change.dropped = [c.name for c in dropped]
    if dropped and not schema.key_columns:
        raise fail(
            f"column {', '.join(change.dropped)} was dropped from a table without a primary key; such a "
            "table is mirrored by its whole row, and dropping a column changes every row's identity"
        )
    keys = []
    for k in schema.key_columns:
        kept = matched.get(id(by_name[k]))
        if kept is None:
            raise fail(f"key column {k} was dropped")
        keys.append(kept.name)
    return keys


def _guess_added(
    catalog: list[CatalogColumn],
    out: list[ColumnSpec],
    by_attnum: dict[int, ColumnSpec],
    rel_names: set[str],
    oid: int,
    typmod: int,
) -> CatalogColumn | None:
    """The catalog row of a column added at this LSN and renamed (or dropped) since: columns are added
    with growing attnums, so it is the first row after the previous column's attnum that no known
    column holds, whose name the Relation does not carry, and whose type matches (a dropped row's type
    is gone) — or, failing that, the only such row of a type the column's can have been widened to.
    Its ``missing`` value is the column's default for older rows. None: no row can be told to be it."""
    used = set(by_attnum) | {c.attnum for c in out if c.attnum}
    after = max([c.attnum for c in out if c.attnum] + [0])
    free = [
        c
        for c in sorted(catalog, key=lambda c: c.attnum)
        if c.attnum > after and c.attnum not in used and c.name not in rel_names
    ]
    for c in free:
        if c.dropped or (c.type_oid, c.typmod) == (oid, typmod):
            return c
    # renamed and widened since (int→bigint, varchar(n)→text, numeric precision): the only free row of a
    # type the column's can have been promoted to
    wider = [c for c in free if _widened(oid, c.type_oid)]
    return wider[0] if len(wider) == 1 else None


#: type oid → type oids ALTER COLUMN … TYPE can have turned it into while the mirror followed it
_WIDER = {21: {23, 20}, 23: {20}, 700: {701}, 1700: {1700}, 1043: {1043, 25}}


def _widened(old_oid: int, new_oid: int) -> bool:
    return new_oid in _WIDER.get(old_oid, ())


def field_id_of(f: pa.Field) -> int | None:
    """The ``PARQUET:field_id`` of an Arrow field, None when it has none."""
    if f.metadata and FIELD_ID in f.metadata:
        return int(f.metadata[FIELD_ID])
    return None


def project(
    data: pa.Table | pa.RecordBatch, target: pa.Schema, defaults: dict[int, pa.Scalar] | None = None
) -> pa.Table | pa.RecordBatch:
    """Rows of a file or batch written under an older schema, in the ``target`` layout: columns
    matched by field id (by name when ``data`` carries no ids), cast on a type promotion, and a
    column the data lacks filled with its initial default (``defaults``: field id → Arrow scalar) or
    NULL. Returns the same kind (Table or RecordBatch) with schema ``target``. Raises
    ``pyarrow.ArrowInvalid`` on a cast that is not a promotion."""
    if data.schema.equals(target, check_metadata=True):
        return data
    by_id = {field_id_of(f): i for i, f in enumerate(data.schema) if field_id_of(f) is not None}
    by_name = {f.name: i for i, f in enumerate(data.schema)}
    n = data.num_rows
    arrays = []
    for f in target:
        fid = field_id_of(f)
        i = by_id.get(fid) if (by_id and fid is not None) else by_name.get(f.name)
        if i is not None:
            a = data.column(i)
            arrays.append(a if a.type.equals(f.type) else a.cast(f.type))
            continue
        d = cast(dict[int | None, Any], defaults or {}).get(fid)  # None: no default
        arrays.append(pa.repeat(d.cast(f.type), n) if d is not None and d.is_valid else pa.nulls(n, f.type))
    if isinstance(data, pa.RecordBatch):
        arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
        return pa.RecordBatch.from_arrays(arrays, schema=target)
    return pa.Table.from_arrays(arrays, schema=target)
