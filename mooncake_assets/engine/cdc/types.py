"""Postgres table schemas and the Postgres → Arrow type mapping, with column-wise text decoding.

Values arrive from Postgres in its **text output format** (pgoutput tuple data in text mode, and
``COPY … (FORMAT csv)`` for the initial copy). :func:`decode_text_columns` turns them into Arrow
column by column: one ``pa.array`` of strings per column, then vectorized ``pyarrow.compute`` casts.
The sessions that produce the text (the walsender of :class:`~.stream.ReplicationConnection` and the
copy transaction of :func:`~.copy.initial_copy`) pin the output settings the decoder relies on:
``DateStyle=ISO``, ``TimeZone=UTC``, ``IntervalStyle=postgres``, ``bytea_output=hex``,
``extra_float_digits=3``, ``lc_monetary=C``, ``search_path=pg_catalog`` (reg* types print
schema-qualified names).

Type mapping (``arrow_type_for``; the user-facing table with examples is ``docs/types.md``):

=============================================  ===========================================
Postgres                                       Arrow
=============================================  ===========================================
boolean                                        bool
smallint / integer / bigint                    int16 / int32 / int64
oid                                            int64
real / double precision                        float32 / float64 (NaN, ±Infinity kept)
numeric(p,s), 1 <= p <= 38, 0 <= s <= p         decimal128(p, s) ('NaN' cannot be held: the value
                                               raises ``ValueError`` naming the column)
numeric (unconstrained, p > 38, or s < 0 or    string holding Postgres's exact text ('NaN',
s > p)                                         'Infinity' included): never loses a digit
money                                          decimal128(19, 2) (sessions pin lc_monetary=C,
                                               so the text is '-$1,234.56')
text, varchar(n), char(n)/bpchar, "char",      string (char(n) keeps its blank padding, as
name, citext                                   Postgres outputs it)
uuid                                           string, canonical lower-case text
json, jsonb, xml                               string (Postgres's text output)
interval, timetz, inet, cidr, macaddr,         string (Postgres's text output)
macaddr8, bit(n), varbit
enum types                                     string (the label)
domains                                        the mapping of their base type
arrays of any type above (``t[]``, ``t[][]``)  list<T> nested once per declared dimension
                                               (``pg_attribute.attndims``, at least 1; a
                                               value with other dimensions or with explicit
                                               lower bounds raises ``ValueError``); NULL
                                               elements kept
bytea                                          binary
date                                           date32
time                                           time64('us')
timestamp                                      timestamp('us')
timestamptz                                    timestamp('us', tz='UTC')
composite types                                struct of the attributes' mappings (recursive)
hstore                                         map<string, string> (NULL values kept)
PostGIS geometry / geography                   binary: ISO WKB (what ``ST_AsBinary`` returns);
                                               the SRID in the field doc (``ColumnSpec.doc``)
anything else with an output function (ranges, string: Postgres's exact text output
multiranges, tsvector, geometric types, ltree, (``ColumnSpec.as_text``)
reg*, pg_lsn, txid_snapshot, int2vector, …)
=============================================  ===========================================

Refused (:class:`UnsupportedTypeError`, every such column in one message with the create-table
options that get past them): :data:`REFUSED_TYPES` (``regproc``/``regoper``, planner internals whose
text cannot be read back) and pseudo-types. ``describe_table(column_types={"c": "text"})`` mirrors a
column as its exact text whatever its type; ``exclude=[…]`` leaves columns out.

Special values: ``date``/``timestamp[tz]`` ``infinity`` and ``-infinity`` become DuckDB's sentinels
(``date``: ±(2**31-1) days; ``timestamp``: ±(2**63-1) µs), which DuckDB reads back (from Arrow and
from Parquet) as ``infinity``/``-infinity`` (``isinf`` is true); Python ``datetime`` cannot hold them, so
``to_pylist()`` on such a value fails. BC dates and timestamps are kept (proleptic Gregorian, astronomical year
numbering: 1 BC is year 0). Values that cannot be represented raise ``ValueError`` naming the
column: ``numeric`` NaN in a ``decimal128`` column, ``time '24:00:00'``, timestamps past
294247-01-10 (the int64 µs range from 1970).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

# the GUCs a session must have so that its text output is what the decoder expects (defined with the
# other sessions' settings at the Postgres edge; re-exported here for the decoder's users)
from ..pg.conninfo import OUTPUT_SETTINGS
from ..pg.partitions import TREE_CTE

__all__ = [
    "ColumnSpec",
    "TableSchema",
    "UnsupportedTypeError",
    "UnsupportedTableError",
    "describe_table",
    "arrow_type_for",
    "decode_text_columns",
    "decode_text_column",
    "SUPPORTED_TYPES",
    "OUTPUT_SETTINGS",
]


# -- type oids (pg_type.dat) --------------------------------------------------------------------
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, CIDR, FLOAT4, FLOAT8, MACADDR8, MACADDR, INET = 114, 142, 650, 700, 701, 774, 829, 869
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266
BIT, VARBIT, NUMERIC, UUID, JSONB = 1560, 1562, 1700, 2950, 3802
MONEY = 790
INT2VECTOR, OIDVECTOR = 22, 30  # category 'A' but space-separated text: not arrays we decode

_FIXED: dict[int, pa.DataType] = {
    BOOL: pa.bool_(),
    INT2: pa.int16(),
    INT4: pa.int32(),
    INT8: pa.int64(),
    OID: pa.int64(),
    FLOAT4: pa.float32(),
    FLOAT8: pa.float64(),
    BYTEA: pa.binary(),
    DATE: pa.date32(),
    TIME: pa.time64("us"),
    TIMESTAMP: pa.timestamp("us"),
    TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    MONEY: pa.decimal128(19, 2),
}
_TEXTUAL = {TEXT, VARCHAR, BPCHAR, CHAR, NAME, UUID, JSON, JSONB, XML, INTERVAL, TIMETZ, INET, CIDR,
            MACADDR, MACADDR8, BIT, VARBIT}
_TEXTUAL_NAMES = {"citext"}  # extension types without a fixed oid, recognised by name

#: Human-readable list used in :class:`UnsupportedTypeError` messages.
SUPPORTED_TYPES = (
    "boolean, smallint, integer, bigint, oid, real, double precision, numeric, text, varchar, char, "
    "name, citext, uuid, json, jsonb, xml, bytea, date, time, timetz, timestamp, timestamptz, "
    "interval, inet, cidr, macaddr, macaddr8, bit, varbit, money, enums, domains over these and "
    "arrays of these"
)

DATE_INFINITY = 2**31 - 1          # DuckDB's / Postgres's date 'infinity' (days)
TIMESTAMP_INFINITY = 2**63 - 1     # DuckDB's timestamp 'infinity' (µs); '-infinity' is its negation


class ColumnValueError(ValueError):
    """Values of one or more columns cannot be decoded to their mapped type; ``columns``: their names
    (the message names each column and a value)."""

    def __init__(self, message: str, columns: Sequence[str]):
        super().__init__(message)
        self.columns = list(columns)


class UnsupportedTypeError(ValueError):
    """A column's Postgres type has no mapping to Arrow (permanent: change the column or exclude
    the table). The message names table, column and type."""


@dataclass
class ColumnSpec:
    """One mirrored column.

    ``type_oid``/``typmod``: the type the value's text is decoded as (for a domain, its base type and
    base typmod); ``type_name``: ``format_type`` text of the column's declared type
    (``'numeric(12,2)'``, a domain's own name); ``is_key``: part of ``TableSchema.key_columns``.
    For an array column: ``element`` is the spec its elements decode with and ``ndims`` the number
    of dimensions (list nesting) of its values; both are None/0 otherwise. ``decl_oid``/
    ``decl_typmod``: the column's declared ``atttypid``/``atttypmod`` as pgoutput's Relation message
    carries them (a domain's own oid), to recognise schema changes; 0/-1 when unknown.

    Schema evolution (see :mod:`mooncake_assets.engine.table.evolution`): ``field_id`` is the column's
    Iceberg field id (written into every Parquet file as ``PARQUET:field_id``; 0 = not assigned yet)
    and ``element_ids`` the ids of its list elements, outermost first (one per array dimension);
    ``attnum`` is ``pg_attribute.attnum`` (stable across renames; 0 = unknown); ``initial_default``
    is the Postgres text of the value rows written before the column existed read as (an ``ADD
    COLUMN … DEFAULT``), None for NULL.
    """

    name: str
    type_oid: int
    typmod: int
    type_name: str
    arrow_type: pa.DataType
    not_null: bool = False
    is_key: bool = False
    element: "ColumnSpec | None" = None
    ndims: int = 0
    decl_oid: int = 0
    decl_typmod: int = -1
    field_id: int = 0
    element_ids: list = field(default_factory=list)
    attnum: int = 0
    initial_default: str | None = None
    generated: str | None = None  # a STORED generated column's expression (pg_get_expr of pg_attrdef.adbin)
    kind: str = ""
    fields: "list[ColumnSpec] | None" = None
    delim: str = ","
    as_text: bool = False
    srid: int | None = None

    # ``kind``: the decoder of a structured type: ``"composite"`` (``fields``: the spec of each
    # attribute, decoded into an Arrow struct), ``"hstore"`` (map<string, string>), ``"wkb"`` (PostGIS
    # geometry/geography: hex EWKB text -> ISO WKB; ``srid``: the SRID every value must have); ``""``
    # otherwise. ``delim``: the array delimiter of an array column's element type (``pg_type.typdelim``:
    # ``;`` for box, ``:`` for PostGIS). ``as_text``: mirrored as Postgres's exact text output because
    # the type has no structured mapping (or ``--column-type COL=text`` asked for it).

    def arrow_field(self) -> pa.Field:
        """The Arrow field files are written with: ``pg_type`` (and ``doc`` for a geometry: WKB, its
        SRID) and, once assigned, ``PARQUET:field_id`` metadata (also on nested fields: list elements,
        struct fields, map keys and values, as Iceberg's Parquet mapping expects)."""
        t = self.arrow_type
        if self.field_id and self.element_ids:
            t = _type_with_ids(t, iter(list(self.element_ids)))
        meta = {"pg_type": self.type_name}
        doc = self.doc()
        if doc:
            meta["doc"] = doc
        if self.field_id:
            meta["PARQUET:field_id"] = str(self.field_id)
        return pa.field(self.name, t, nullable=not self.not_null, metadata=meta)

    def doc(self) -> str | None:
        """The Iceberg field doc: for a PostGIS column, its encoding and SRID."""
        spec = self
        while spec.element is not None:
            spec = spec.element
        if spec.kind == "wkb":
            return f"{self.type_name}: ISO WKB, SRID {spec.srid}"
        return None


def nested_field_count(t: pa.DataType) -> int:
    """How many nested fields (each needs an Iceberg field id) an Arrow type has: a list's element, a
    struct's fields, a map's key and value, recursively."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return 1 + nested_field_count(t.value_type)
    if pa.types.is_map(t):
        return 2 + nested_field_count(t.key_type) + nested_field_count(t.item_type)
    if pa.types.is_struct(t):
        return sum(1 + nested_field_count(t.field(i).type) for i in range(t.num_fields))
    return 0


def _type_with_ids(t: pa.DataType, ids) -> pa.DataType:
    """``t`` with ``PARQUET:field_id`` on its nested fields, taken from ``ids`` in pre-order (list:
    element, then inside it; struct: each field, then inside it; map: key, value, then inside them)."""
    def fid(): return {"PARQUET:field_id": str(next(ids))}
    if pa.types.is_list(t):
        m = fid()
        return pa.list_(pa.field("element", _type_with_ids(t.value_type, ids), nullable=True, metadata=m))
    if pa.types.is_map(t):
        km, vm = fid(), fid()
        kt = _type_with_ids(t.key_type, ids)
        vt = _type_with_ids(t.item_type, ids)
        return pa.map_(pa.field("key", kt, nullable=False, metadata=km), pa.field("value", vt, nullable=True, metadata=vm))
    if pa.types.is_struct(t):
        out = []
        for i in range(t.num_fields):
            f = t.field(i)
            m = fid()
            out.append(pa.field(f.name, _type_with_ids(f.type, ids), nullable=True, metadata=m))
        return pa.struct(out)
    return t


def assign_field_ids(columns: list, next_id: int = 1) -> int:
    """Give every column without one a field id (and its nested fields ids: list elements, struct
    fields, map keys/values), in column order, from ``next_id``; returns the next free id. Top-level
    ids first, then nested ids column by column (pre-order, see :func:`_type_with_ids`)."""
    for c in columns:
        if not c.field_id:
            c.field_id = next_id
            next_id += 1
    for c in columns:
        missing = nested_field_count(c.arrow_type) - len(c.element_ids)
        if missing > 0:
            c.element_ids = list(c.element_ids) + list(range(next_id, next_id + missing))
            next_id += missing
    return next_id


@dataclass
class TableSchema:
    """A source table as mirrored.

    ``columns``: the table's columns in attribute order, dropped ones excluded; STORED generated
    columns included with their expression in ``ColumnSpec.generated`` (Postgres before 18 does not
    publish them: :class:`~.generated.GeneratedColumns` computes them for each applied batch; the
    initial copy selects them like any column). ``key_columns``: the primary key columns when the table
    has one; otherwise the columns of the replica identity index (replica identity ``'i'``);
    otherwise ``[]`` (the row as a whole is the key, which needs replica identity ``'f'``).
    ``replica_identity``: ``pg_class.relreplident`` (``'d'`` default, ``'f'`` full, ``'i'`` index,
    ``'n'`` nothing). ``relkind``: ``'r'`` table or ``'p'`` partitioned table. ``excluded``: source
    columns left out of the mirror (``create-table --exclude-column``); ``column_types``: column name
    -> ``"text"`` for columns mirrored as their exact text whatever their type (``--column-type``).
    """

    schema: str
    name: str
    oid: int
    columns: list[ColumnSpec]
    key_columns: list[str]
    has_primary_key: bool
    replica_identity: str
    relkind: str = "r"
    column_index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    excluded: list = field(default_factory=list)
    column_types: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.column_index = {c.name: i for i, c in enumerate(self.columns)}

    @property
    def qualified_name(self) -> str:
        """``schema.name`` in its SQL form, parts quoted where needed (``"Sales Data"."Q1 Orders"``)."""
        from ..pg.names import format_name

        return format_name(self.schema, self.name)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of the mirror: one field per column, nullable unless ``NOT NULL``.
        Field metadata carries ``pg_type`` (the ``format_type`` text) and, once assigned, the Iceberg
        field id (``PARQUET:field_id``; see :meth:`ColumnSpec.arrow_field`)."""
        return pa.schema([c.arrow_field() for c in self.columns])


# -- mapping ----------------------------------------------------------------------------------------

def numeric_precision_scale(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric`` typmod, or None when unconstrained (``typmod < 0``).
    Layout (PG 15 ``numeric.c``): ``typmod - 4 = precision << 16 | (scale & 0x7ff)``, scale an 11-bit
    signed integer."""
    if typmod < 4:
        return None
    t = typmod - 4
    return (t >> 16) & 0xFFFF, ((t & 0x7FF) ^ 1024) - 1024


def arrow_type_for(type_oid: int, typmod: int, type_name: str) -> pa.DataType:
    """Arrow type for a Postgres type (see the module table). ``type_name`` is ``format_type`` text
    (used for name-matched extension types such as ``citext`` and for the error message).
    Raises :class:`UnsupportedTypeError` (without table/column; :func:`describe_table` adds them)."""
    t = _FIXED.get(type_oid)
    if t is not None:
        return t
    if type_oid == NUMERIC:
        ps = numeric_precision_scale(typmod)
        if ps is not None:
            p, s = ps
            if 1 <= p <= 38 and 0 <= s <= p:
                return pa.decimal128(p, s)
        return pa.string()
    if type_oid in _TEXTUAL or type_name.split("(")[0].split(".")[-1].strip('"') in _TEXTUAL_NAMES:
        return pa.string()
    raise UnsupportedTypeError(f"type {type_name} cannot be mirrored (supported: {SUPPORTED_TYPES})")


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

#: Types whose text Postgres cannot read back as the same value: their input function refuses every
#: value (planner/statistics internals) or their output is ambiguous (``regproc``/``regoper`` print a
#: bare name, which names several functions/operators once one is overloaded). Refused at
#: create-table unless ``--column-type COL=text`` (the text as Postgres prints it) or
#: ``--exclude-column COL`` says what to do.
REFUSED_TYPES: dict[int, str] = {
    24: "regproc prints a bare function name, ambiguous once the function is overloaded (regprocedure is exact)",
    2203: "regoper prints a bare operator name, ambiguous once it is overloaded (regoperator is exact)",
    194: "pg_node_tree values cannot be read back (its input function refuses every value)",
    3361: "pg_ndistinct values cannot be read back (its input function refuses every value)",
    3402: "pg_dependencies values cannot be read back (its input function refuses every value)",
    5017: "pg_mcv_list values cannot be read back (its input function refuses every value)",
    4600: "pg_brin_bloom_summary values cannot be read back (its input function refuses every value)",
    4601: "pg_brin_minmax_multi_summary values cannot be read back (its input function refuses every value)",
}


def column_options(types: Sequence[str] = (), exclude: Sequence[str] = ()) -> str:
    """The create-table options ``--column-type c=text`` for each of ``types`` then ``--exclude-column c``
    for each of ``exclude``, space-separated ('' for none), each shell-quoted: column names may hold
    spaces or quotes, and the options are printed for the user to paste into a shell."""
    import shlex

    return " ".join([f"--column-type {shlex.quote(c + '=text')}" for c in types]
                    + [f"--exclude-column {shlex.quote(c)}" for c in exclude])


def column_option_hint(columns: Sequence[str]) -> str:
    """The create-table options that get past ``columns``: ``--column-type c=text … or
    --exclude-column c …`` (see :func:`column_options`)."""
    return ("mirror them as their exact text with " + column_options(columns)
            + ", or leave them out with " + column_options(exclude=columns)
            + " (create-table options, recorded with the mirror)")


def text_spec(c: ColumnSpec) -> ColumnSpec:
    """``c`` mirrored as Postgres's exact text output (``--column-type COL=text``): a string column
    keeping everything that is not about the value's structure — name, type, declared type, key and
    NOT NULL attributes, field id, attnum, initial default, generation expression (``generated``) —
    and nothing that is (no list element or dimensions, composite fields, decoder kind, SRID, nested
    field ids: a string has none). A new spec; ``c`` is not changed."""
    return replace(c, arrow_type=pa.string(), as_text=True, element=None, ndims=0, kind="", fields=None,
                   element_ids=[], delim=",", srid=None)


def _text_column(name: str, oid: int, typmod: int, type_name: str) -> ColumnSpec:
    """A column of type ``oid``/``typmod`` (``type_name``: its ``format_type`` text) mirrored as its
    exact text (no structured mapping, or ``--column-type COL=text``)."""
    return ColumnSpec(name, oid, typmod, type_name, pa.string(), as_text=True)

_KEY_SQL = """
SELECT i.indisprimary, i.indisreplident, array(
         SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
         ORDER BY k.ord)
FROM pg_index i
WHERE i.indrelid = %(oid)s AND (i.indisprimary OR i.indisreplident)
"""


def describe_table(conn: psycopg.Connection, qualified_name: str, *, skip_unsupported: bool = False,
                   column_types: dict | None = None, exclude: Sequence[str] | None = None) -> TableSchema:
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
            try:
                row = cur.execute(
                    "SELECT c.oid, n.nspname, c.relname, c.relkind, c.relreplident "
                    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.oid = to_regclass(%s)", (qualified_name,)).fetchone()
            except psycopg.errors.Error as e:  # e.g. invalid name syntax
                raise LookupError(f"table {qualified_name} does not exist ({e})") from None
            if row is None:
                raise LookupError(f"table {qualified_name} does not exist")
            oid, nsp, rel, relkind, replident = row
            if relkind not in ("r", "p"):
                kind = {"v": "a view", "m": "a materialized view", "f": "a foreign table",
                        "S": "a sequence", "i": "an index", "c": "a composite type"}.get(relkind, "not a table")
                raise LookupError(f"table {qualified_name} does not exist ({nsp}.{rel} is {kind})")
            parent = cur.execute(
                "SELECT pg_partition_root(c.oid)::regclass::text FROM pg_class c "
                "WHERE c.oid = %s AND c.relispartition", (oid,)).fetchone()
            if parent is not None:
                raise UnsupportedTableError(
                    f"table {nsp}.{rel} is a partition of {parent[0]}: changes of a partition are published "
                    f"under its partitioned root (publish_via_partition_root), so mirror {parent[0]} instead")
            attrs = cur.execute(_DESCRIBE_SQL, {"oid": oid}).fetchall()
            keys = cur.execute(_KEY_SQL, {"oid": oid}).fetchall()
            catalog_lsn = cur.execute("SELECT CASE WHEN pg_is_in_recovery() THEN NULL "
                                      "ELSE pg_current_wal_lsn() - '0/0'::pg_lsn END").fetchone()[0]
            types = _TypeResolver(cur)
            columns: list[ColumnSpec] = []
            column_types = dict(column_types or {})
            excluded = list(exclude or [])
            names = {a[0] for a in attrs}
            unknown = [c for c in list(column_types) + excluded if c not in names]
            if unknown:
                raise LookupError(f"table {nsp}.{rel} has no column {', '.join(unknown)} (named by --column-type/"
                                  "--exclude-column)")
            bad_kind = {c: k for c, k in column_types.items() if k != "text"}
            if bad_kind:
                raise LookupError(f"table {nsp}.{rel}: --column-type {', '.join(f'{c}={k}' for c, k in bad_kind.items())}"
                                  ": the only column type that can be asked for is text (Postgres's exact text output)")
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
                    f"table {nsp}.{rel}: {len(refused)} column(s) cannot be mirrored exactly: "
                    + "; ".join(f"{n} ({t}: {why})" for n, t, why in refused)
                    + f"; {column_option_hint([n for n, _, _ in refused])}")
            assign_field_ids(columns)

    pk = next((list(k[2]) for k in keys if k[0]), None)
    ident = next((list(k[2]) for k in keys if k[1]), None)
    if replident == "i" and ident is not None:
        key_columns = ident  # the replica identity is what UPDATE/DELETE old tuples carry
    elif pk is not None:
        key_columns = pk
    else:
        key_columns = []
    in_key = [c for c in excluded if c in key_columns]
    if in_key:
        raise LookupError(f"table {nsp}.{rel}: column {', '.join(in_key)} is part of the key "
                          f"({', '.join(key_columns)}), which cannot be left out (--exclude-column)")
    for c in columns:
        c.is_key = c.name in key_columns
    out = TableSchema(schema=nsp, name=rel, oid=oid, columns=columns, key_columns=key_columns,
                      has_primary_key=pk is not None, replica_identity=replident, relkind=relkind,
                      excluded=excluded, column_types=column_types)
    out.current_columns = {a[0] for a in attrs}
    out.catalog_lsn = int(catalog_lsn) if catalog_lsn is not None else 0
    return out


class UnsupportedTableError(UnsupportedTypeError):
    """The relation cannot be mirrored as named (e.g. a partition: mirror its partitioned root).
    Permanent; the message names the table and what to do."""


class _TypeResolver:
    """Resolves a column's type to a :class:`ColumnSpec` (``pg_type``: typtype, typbasetype,
    typtypmod, typelem, typcategory, typlen, typndims, typname, typrelid, typdelim): domains to their
    root base type, enums to text, arrays to a list of their element's spec, composite types to a
    struct of their attributes, ``hstore`` to a map, PostGIS ``geometry``/``geography`` to WKB, every
    other type to its exact text (``as_text``); :data:`REFUSED_TYPES` and pseudo-types raise
    :class:`UnsupportedTypeError`."""

    def __init__(self, cur):
        self.cur = cur
        self._info: dict[int, tuple] = {}

    def info(self, oid: int) -> tuple:
        if oid not in self._info:
            row = self.cur.execute(_TYPE_SQL, (oid,)).fetchone()
            if row is None:
                raise UnsupportedTypeError(f"type oid {oid} does not exist")
            self._info[oid] = row
        return self._info[oid]

    def format_type(self, oid: int, typmod: int) -> str:
        return self.cur.execute("SELECT format_type(%s, %s)", (oid, typmod)).fetchone()[0]

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
            return ColumnSpec(name, oid, typmod, decl_name, t, element=el, ndims=nd, delim=self.info(elem)[9] or ",",
                              as_text=el.as_text)
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


# -- decoding -----------------------------------------------------------------------------------------

def decode_text_columns(columns: Sequence[ColumnSpec], data: Sequence[Any], *,
                        column_major: bool = False) -> pa.RecordBatch:
    """Decode Postgres text-format values into one RecordBatch (schema: ``TableSchema.arrow_schema``
    of these columns, without metadata).

    ``data``: row-major (``[[v_col0, v_col1, …], …]``, the default) or, with ``column_major=True``,
    one sequence per column (``[[v_row0, v_row1, …], …]``, or a ``pa.Array``/``pa.ChunkedArray`` of
    strings per column). A value is ``str``, UTF-8 ``bytes`` (as pgoutput's TupleData carries them), or
    ``None`` for SQL NULL.

    Conversion is vectorized per column (``pyarrow.compute``); the only per-value Python is the
    fallback for rare dates/timestamps Arrow's parser rejects (BC, ``infinity``, years > 9999,
    second-precision zone offsets), taken only when the vectorized cast fails.

    Raises ``ValueError`` naming the column for a value that cannot be represented or parsed.
    """
    if not column_major:
        if len(data) == 0:
            cols_data: list[Any] = [[] for _ in columns]
        else:
            n = len(columns)
            if any(len(r) != n for r in data):
                bad = next(len(r) for r in data if len(r) != n)
                raise ValueError(f"a row has {bad} values, expected {n} columns")
            cols_data = [[r[i] for r in data] for i in range(n)]
    else:
        cols_data = list(data)
        if len(cols_data) != len(columns):
            raise ValueError(f"got {len(cols_data)} columns of values, expected {len(columns)}")
    arrays, errors = [], []
    for spec, vals in zip(columns, cols_data):  # every column that fails is named, not just the first
        try:
            arrays.append(decode_text_column(spec, vals))
        except ValueError as e:
            errors.append((spec.name, str(e)))
    if errors:
        raise ColumnValueError("; ".join(m for _, m in errors), [c for c, _ in errors])
    schema = pa.schema([pa.field(c.name, c.arrow_type, nullable=not c.not_null) for c in columns])
    if not arrays:
        return pa.RecordBatch.from_pylist([], schema=schema)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _as_string_array(values: Any, spec: ColumnSpec) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        if values.type == pa.string():
            return values
        if values.type in (pa.large_string(), pa.binary(), pa.large_binary(), pa.null()):
            try:
                return values.cast(pa.string())
            except pa.ArrowInvalid as e:
                raise ValueError(f"column {spec.name}: value is not valid UTF-8 ({e})") from None
        raise ValueError(f"column {spec.name}: expected text values, got an Arrow {values.type} array")
    try:
        return pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"column {spec.name}: value is not valid UTF-8 text ({e})") from None


def decode_text_column(spec: ColumnSpec, values: Any) -> pa.Array:
    """Decode one column of Postgres text values (sequence of ``str``/``bytes``/``None`` or a string
    ``pa.Array``) to ``spec.arrow_type``. Raises ``ValueError`` naming the column on bad values."""
    arr = _as_string_array(values, spec)
    t = spec.arrow_type
    try:
        if spec.kind == "composite":
            return _decode_composite(arr, spec)
        if spec.kind == "hstore":
            return _decode_hstore(arr, spec)
        if spec.kind == "wkb":
            return _decode_wkb(arr, spec)
        if pa.types.is_string(t):
            return arr
        if pa.types.is_boolean(t):
            return _decode_bool(arr, spec)
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return _cast(arr, t, spec)
        if pa.types.is_list(t):
            return _decode_array(arr, spec)
        if pa.types.is_decimal(t):
            if spec.type_oid == MONEY:  # '-$1,234.56' (lc_monetary=C) -> '-1234.56'
                arr = pc.replace_substring(pc.replace_substring(arr, "$", ""), ",", "")
            return _decode_decimal(arr, t, spec)
        if pa.types.is_binary(t):
            return _decode_bytea(arr, spec)
        if pa.types.is_date32(t):
            return _decode_date(arr, spec)
        if pa.types.is_timestamp(t):
            return _decode_timestamp(arr, t, spec)
        if pa.types.is_time64(t):
            return _decode_time(arr, spec)
    except ValueError:
        raise
    except pa.ArrowException as e:  # defensive: a cast we did not anticipate
        raise ValueError(f"column {spec.name} ({spec.type_name}): {e}") from None
    raise ValueError(f"column {spec.name}: no decoder for Arrow type {t}")


def _bad_value(arr: pa.Array, ok: pa.Array | None) -> str:
    """First value of ``arr`` where ``ok`` is false (for messages)."""
    if ok is None:
        return "?"
    idx = pc.index(ok, False).as_py()
    return repr(arr[idx].as_py()) if idx is not None and idx >= 0 else "?"


def _cast(arr: pa.Array, t: pa.DataType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid as e:
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot decode a value as {t}: {e}") from None


def _decode_bool(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    is_t = pc.equal(arr, "t")
    ok = pc.or_(is_t, pc.equal(arr, "f"))
    if pc.all(ok).as_py() is False:
        raise ValueError(f"column {spec.name} (boolean): value {_bad_value(arr, ok)} is not 't' or 'f'")
    return is_t


def _decode_decimal(arr: pa.Array, t: pa.DataType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid:
        for i, v in enumerate(arr.to_pylist()):
            if v is None:
                continue
            try:
                pc.cast(pa.array([v]), t)
            except pa.ArrowInvalid as e:
                why = (f"{spec.type_name} is mirrored as {t}, which has no NaN (unconstrained numeric is "
                       "mirrored exactly as text; see docs/types.md)" if v == "NaN" else str(e))
                raise ValueError(f"column {spec.name} ({spec.type_name}): value {v!r} cannot be "
                                 f"represented as {t} ({why})") from None
        raise


_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


def _decode_bytea(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """``'\\x0a1b…'`` → bytes, vectorized over the array's offsets/data buffers with numpy."""
    n = len(arr)
    if n == 0:
        return pa.array([], pa.binary())
    validity, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.zeros(0, np.uint8)
    valid = (np.ones(n, dtype=bool) if arr.null_count == 0
             else arr.is_valid().to_numpy(zero_copy_only=False))
    starts, lengths = offsets[:-1], np.diff(offsets)
    vstarts, vlens = starts[valid], lengths[valid]
    bad = (vlens < 2) | ((vlens & 1) == 1)
    if not bad.any() and len(vstarts):
        bad = (data[vstarts] != ord("\\")) | (data[vstarts + 1] != ord("x"))
    if bad.any():
        i = int(np.flatnonzero(valid)[np.flatnonzero(bad)[0]])
        raise ValueError(f"column {spec.name} (bytea): value {arr[i].as_py()[:40]!r} is not in hex "
                         "format ('\\x…'); the session needs bytea_output=hex")
    hex_len = np.where(valid, lengths - 2, 0)
    total = int(hex_len.sum())
    out_starts = np.concatenate(([0], np.cumsum(hex_len)[:-1]))
    src = np.repeat(starts + 2 - out_starts, hex_len) + np.arange(total, dtype=np.int64)
    nib = _HEX_LUT[data[src]]
    if total and nib.max() == 255:
        pos = int(np.flatnonzero(nib == 255)[0])
        i = int(np.searchsorted(out_starts, pos, side="right") - 1)
        raise ValueError(f"column {spec.name} (bytea): value {arr[i].as_py()[:40]!r} has a non-hex digit")
    out = (nib[0::2] << 4) | nib[1::2]
    new_offsets = np.concatenate(([0], np.cumsum(hex_len // 2))).astype(np.int32)
    if validity is not None and arr.offset:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(new_offsets.tobytes()),
                                                  pa.py_buffer(out.tobytes())], null_count=arr.null_count)


# Fallback parsing of dates/timestamps (proleptic Gregorian, any year, BC, infinity) -------------

_TS_RE = re.compile(
    r"^(\d{4,})-(\d\d)-(\d\d)(?:[ T](\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::?(\d\d))?(?::?(\d\d))?)?( BC)?$")


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (astronomical year numbering)."""
    y -= m <= 2
    era = y // 400  # floor division (the C original truncates and adjusts)
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _parse_rare(value: str, spec: ColumnSpec, unit: str) -> int:
    """One date ('D', days) or timestamp ('us') in Postgres ISO output → int since the Unix epoch."""
    inf = DATE_INFINITY if unit == "D" else TIMESTAMP_INFINITY
    if value == "infinity":
        return inf
    if value == "-infinity":
        return -inf
    m = _TS_RE.match(value)
    if not m:
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse {value!r}")
    y, mo, d = int(m[1]), int(m[2]), int(m[3])
    if m[12]:
        y = 1 - y  # 1 BC is year 0
    days = _days_from_civil(y, mo, d)
    if unit == "D":
        if not -DATE_INFINITY < days < DATE_INFINITY:
            raise ValueError(f"column {spec.name} ({spec.type_name}): {value!r} is outside date32's range")
        return days
    secs = days * 86400 + int(m[4] or 0) * 3600 + int(m[5] or 0) * 60 + int(m[6] or 0)
    if m[8]:
        off = int(m[9]) * 3600 + int(m[10] or 0) * 60 + int(m[11] or 0)
        secs -= off if m[8] == "+" else -off
    us = secs * 1_000_000 + int((m[7] or "0").ljust(6, "0"))
    if not -TIMESTAMP_INFINITY < us < TIMESTAMP_INFINITY:
        raise ValueError(f"column {spec.name} ({spec.type_name}): {value!r} is outside the range of "
                         "Arrow timestamp[us] (int64 microseconds since 1970)")
    return us


def _decode_date(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, pa.date32())
    except pa.ArrowInvalid:
        pass  # rare values: BC, infinity, years > 9999
    vals = [None if v is None else _parse_rare(v, spec, "D") for v in arr.to_pylist()]
    return pa.array(vals, pa.int32()).view(pa.date32())


def _decode_timestamp(arr: pa.Array, t: pa.TimestampType, spec: ColumnSpec) -> pa.Array:
    try:
        return pc.cast(arr, t)
    except pa.ArrowInvalid:
        pass  # rare values: BC, infinity, years > 9999, LMT offsets with seconds
    vals = [None if v is None else _parse_rare(v, spec, "us") for v in arr.to_pylist()]
    return pa.array(vals, pa.int64()).view(t)


def _decode_time(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    joined = pc.binary_join_element_wise("1970-01-01 ", arr, "")
    try:
        ts = pc.cast(joined, pa.timestamp("us"))
    except pa.ArrowInvalid:
        bad = next((v for v in arr.to_pylist() if v is not None and not re.match(r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?$", v)), None)
        if bad is not None and bad.startswith("24:00:00"):
            raise ValueError(f"column {spec.name} ({spec.type_name}): value {bad!r} cannot be represented "
                             "as Arrow time64 (its range is [00:00, 24:00))") from None
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse time value {bad!r}") from None
    return pc.cast(ts, pa.time64("us"))


# Arrays -------------------------------------------------------------------------------------------
#
# Postgres's array text output (``array_out``): ``{e1,e2,…}``, nested braces per dimension
# (``{{1,2},{3,4}}``), an optional ``[lo:hi]…=`` prefix when a lower bound is not 1, unquoted ``NULL``
# for a NULL element; an element is double-quoted when it is empty, equals ``NULL`` (any case), or
# holds braces, quotes, backslashes, the delimiter or white space, and inside quotes ``"`` and ``\``
# are backslash-escaped. The delimiter is ``,`` for every type we map (only ``box`` uses ``;``).

_ARRAY_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|([{},])|([^{},"]+)', re.S)
_UNESCAPE = re.compile(r"\\(.)", re.S)
_ARRAY_TOKENS: dict[str, re.Pattern] = {",": _ARRAY_TOKEN}


def _array_token(delim: str) -> re.Pattern:
    if delim not in _ARRAY_TOKENS:
        d = re.escape(delim)
        _ARRAY_TOKENS[delim] = re.compile(r'"((?:[^"\\]|\\.)*)"|([{}]|' + d + r')|([^{}' + d + r'"]+)', re.S)
    return _ARRAY_TOKENS[delim]


def _parse_array_text(text: str, spec: ColumnSpec):
    """One array value's text -> nested Python lists of element texts (None for NULL)."""
    if text.startswith("["):
        raise ValueError(f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has explicit "
                         "lower bounds, which a list cannot keep")
    stack: list[list] = []
    root = None
    delim = spec.delim or ","
    for m in _array_token(delim).finditer(text):
        quoted, punct, bare = m.group(1), m.group(2), m.group(3)
        if punct == "{":
            node: list = []
            if stack:
                stack[-1].append(node)
            elif root is not None:
                break  # text after the outer array
            else:
                root = node
            stack.append(node)
        elif punct == "}":
            if not stack:
                break
            stack.pop()
        elif punct == delim:
            continue
        elif not stack:
            break
        elif quoted is not None:
            stack[-1].append(_UNESCAPE.sub(r"\1", quoted))
        else:
            stack[-1].append(None if bare == "NULL" else bare)
    else:
        if root is not None and not stack:
            return root
    raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse array value {text[:60]!r}")


def _decode_array(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """Array texts -> ``list<…>`` nested ``spec.ndims`` times; elements decoded column-wise (one
    vectorized :func:`decode_text_column` over every element of every value)."""
    nd = spec.ndims
    offsets: list[list[int]] = [[0] for _ in range(nd)]
    flat: list = []
    valid: list[bool] = []

    def add(node: list, level: int, text: str) -> None:
        if level == nd - 1:
            if any(isinstance(x, list) for x in node):
                raise ValueError(f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has more "
                                 f"than the column's {nd} dimension(s)")
            flat.extend(node)
        else:
            for child in node:
                if not isinstance(child, list):
                    raise ValueError(f"column {spec.name} ({spec.type_name}): array value {text[:60]!r} has "
                                     f"fewer than the column's {nd} dimensions")
                add(child, level + 1, text)
        offsets[level].append(offsets[level][-1] + len(node))

    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            offsets[0].append(offsets[0][-1])
            continue
        valid.append(True)
        add(_parse_array_text(v, spec), 0, v)
    out: pa.Array = decode_text_column(spec.element, flat)
    types = [spec.arrow_type]
    for _ in range(nd - 1):
        types.append(types[-1].value_type)
    for level in reversed(range(nd)):
        mask = pa.array([not x for x in valid]) if level == 0 and not all(valid) else None
        out = pa.ListArray.from_arrays(pa.array(offsets[level], pa.int32()), out, type=types[level], mask=mask)
    return out


# Composite types, hstore, PostGIS ---------------------------------------------------------------------
#
# ``record_out``: ``(f1,f2,…)``; a NULL field is empty; a field is double-quoted when it is empty or
# holds ``"``, ``\``, ``(``, ``)``, ``,`` or white space, and inside quotes ``"`` and ``\`` are doubled.
# ``hstore_out``: ``"k"=>"v", "k2"=>NULL``; keys and values are always quoted, ``"`` and ``\``
# backslash-escaped. PostGIS ``geometry_out``/``geography_out``: hex EWKB (PostGIS's extended WKB:
# type flags 0x80000000 Z, 0x40000000 M, 0x20000000 SRID follows).

_RECORD_FIELD = re.compile(r'"((?:[^"\\]|\\.|"")*)"|([^,()"\\]*)', re.S)
_RECORD_UNESCAPE = re.compile(r'\\(.)|""', re.S)


def _parse_record_text(text: str, n: int, spec: ColumnSpec) -> list:
    """One composite value's text -> its ``n`` field texts (None for NULL)."""
    if len(text) < 2 or text[0] != "(" or text[-1] != ")":
        raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse composite value {text[:60]!r}")
    out: list = []
    pos, end = 1, len(text) - 1
    while True:
        m = _RECORD_FIELD.match(text, pos)
        quoted, bare = m.group(1), m.group(2)
        if quoted is not None:
            out.append(_RECORD_UNESCAPE.sub(lambda x: x.group(1) if x.group(1) is not None else '"', quoted))
        else:
            out.append(bare if bare else None)
        pos = m.end()
        if pos >= end:
            break
        if text[pos] != ",":
            raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse composite value {text[:60]!r}")
        pos += 1
    if len(out) != n:
        raise ValueError(f"column {spec.name} ({spec.type_name}): composite value {text[:60]!r} has {len(out)} "
                         f"fields, the type has {n} (was the type altered? that is not followed)")
    return out


def _decode_composite(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """Composite texts -> ``struct``; each field decoded column-wise by its own decoder."""
    n = len(spec.fields)
    cols: list[list] = [[] for _ in range(n)]
    valid = []
    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            for c in cols:
                c.append(None)
            continue
        valid.append(True)
        for c, x in zip(cols, _parse_record_text(v, n, spec)):
            c.append(x)
    children = [decode_text_column(f, c) for f, c in zip(spec.fields, cols)]
    mask = pa.array([not x for x in valid]) if not all(valid) else None
    return pa.StructArray.from_arrays(children, fields=list(spec.arrow_type), mask=mask)


_HSTORE_PAIR = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*=>\s*(?:"((?:[^"\\]|\\.)*)"|(NULL))\s*(,|$)', re.S)


def _decode_hstore(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """hstore texts -> ``map<string, string>`` (a NULL value stays NULL; keys in Postgres's order)."""
    offsets, keys, vals, valid = [0], [], [], []
    for v in arr.to_pylist():
        if v is None:
            valid.append(False)
            offsets.append(offsets[-1])
            continue
        valid.append(True)
        pos = 0
        while pos < len(v):
            m = _HSTORE_PAIR.match(v, pos)
            if m is None or m.end() == pos:
                if v[pos:].strip() == "":
                    break
                raise ValueError(f"column {spec.name} ({spec.type_name}): cannot parse hstore value {v[:60]!r}")
            keys.append(_UNESCAPE.sub(r"\1", m.group(1)))
            vals.append(None if m.group(3) else _UNESCAPE.sub(r"\1", m.group(2)))
            pos = m.end()
        offsets.append(len(keys))
    mask = pa.array([not x for x in valid]) if not all(valid) else None
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()),
                                   pa.array(vals, pa.string()), type=spec.arrow_type, mask=mask)


_ISO_DIMS = {(False, False): 0, (True, False): 1000, (False, True): 2000, (True, True): 3000}


def _ewkb_walk(b: bytes, pos: int, out: bytearray, spec: ColumnSpec) -> int:
    """Copy one EWKB geometry at ``b[pos:]`` into ``out`` as ISO WKB; returns the end position."""
    import struct

    bo = b[pos]
    f = "<" if bo == 1 else ">"
    (t,) = struct.unpack_from(f + "I", b, pos + 1)
    pos += 5
    if t & 0x20000000:
        pos += 4
    z, m = bool(t & 0x80000000), bool(t & 0x40000000)
    base = t & 0x0FFFFFFF
    if base >= 1000:  # already ISO-coded
        d, base = divmod(base, 1000)
        z, m = z or d in (1, 3), m or d in (2, 3)
    dims = 2 + z + m
    out += bytes([bo]) + struct.pack(f + "I", base + _ISO_DIMS[(z, m)])
    if base == 1:  # point
        n = dims * 8
    elif base in (2, 8):  # linestring, circularstring
        (k,) = struct.unpack_from(f + "I", b, pos)
        n = 4 + k * dims * 8
    elif base in (3, 17):  # polygon, triangle: rings of points
        (rings,) = struct.unpack_from(f + "I", b, pos)
        p = pos + 4
        for _ in range(rings):
            (k,) = struct.unpack_from(f + "I", b, p)
            p += 4 + k * dims * 8
        n = p - pos
    elif base in (4, 5, 6, 7, 9, 10, 11, 12, 15, 16):  # collections of geometries
        (k,) = struct.unpack_from(f + "I", b, pos)
        out += b[pos:pos + 4]
        pos += 4
        for _ in range(k):
            pos = _ewkb_walk(b, pos, out, spec)
        return pos
    else:
        raise ValueError(f"column {spec.name} ({spec.type_name}): EWKB geometry type {base} is not known")
    out += b[pos:pos + n]
    return pos + n


def _decode_wkb(arr: pa.Array, spec: ColumnSpec) -> pa.Array:
    """PostGIS hex EWKB texts -> ISO WKB bytes (what ``ST_AsBinary`` returns). Every value must have
    the column's SRID (``spec.srid``: the declared one, else 0 for geometry, 4326 for geography): a
    WKB holds none, so another one would be lost — that raises ``ValueError`` naming the column."""
    import struct

    out = []
    for v in arr.to_pylist():
        if v is None:
            out.append(None)
            continue
        try:
            b = bytes.fromhex(v)
            f = "<" if b[0] == 1 else ">"
            (t,) = struct.unpack_from(f + "I", b, 1)
            srid = struct.unpack_from(f + "I", b, 5)[0] if t & 0x20000000 else 0
        except (ValueError, IndexError, struct.error):
            raise ValueError(f"column {spec.name} ({spec.type_name}): value {v[:40]!r} is not hex EWKB") from None
        if srid != spec.srid:
            raise ValueError(f"column {spec.name} ({spec.type_name}): a value has SRID {srid}, the column's "
                             f"is {spec.srid} and WKB carries none (declare the column's SRID, e.g. "
                             f"geometry(Geometry,{srid}), or mirror it as hex EWKB text with --column-type "
                             f"{spec.name}=text)")
        if not t & 0xC0000000 and (t & 0x0FFFFFFF) < 1000:  # 2D: only the top header differs
            out.append(b[:1] + struct.pack(f + "I", t & 0x0FFFFFFF) + b[9 if t & 0x20000000 else 5:])
            continue
        buf = bytearray()
        try:
            end = _ewkb_walk(b, 0, buf, spec)
        except (IndexError, struct.error):
            raise ValueError(f"column {spec.name} ({spec.type_name}): value {v[:40]!r} is not valid EWKB") from None
        if end != len(b):
            raise ValueError(f"column {spec.name} ({spec.type_name}): value {v[:40]!r} is not valid EWKB")
        out.append(bytes(buf))
    return pa.array(out, pa.binary())


# Mirrored signatures ---------------------------------------------------------------------------------

def column_signature(schema: TableSchema) -> list[dict]:
    """What the mirror was built with, per column: ``{"name", "oid", "typmod", "ndims", "field_id",
    "element_ids", "attnum", "initial_default", "not_null"}`` (declared type as pgoutput's Relation
    message carries it; Iceberg field ids). Saved with the mirror (the registry and the Iceberg table
    property ``mooncake.columns``) so a restart rebuilds the same columns even when the source changed
    meanwhile (the change then shows up, at its LSN, in the replayed stream)."""
    return [{"name": c.name, "oid": c.decl_oid, "typmod": c.decl_typmod, "ndims": c.ndims,
             "field_id": c.field_id, "element_ids": list(c.element_ids), "attnum": c.attnum,
             "initial_default": c.initial_default, "not_null": c.not_null} for c in schema.columns]


def _apply_signature(c: ColumnSpec, sig: dict) -> ColumnSpec:
    """Carry the saved identity of a mirrored column (field ids, attnum, initial default) onto ``c``."""
    c.field_id = int(sig.get("field_id") or 0)
    c.element_ids = list(sig.get("element_ids") or [])
    c.attnum = int(sig.get("attnum") or c.attnum or 0)
    c.initial_default = sig.get("initial_default")
    if "not_null" in sig:
        c.not_null = bool(sig["not_null"])
    return c


def describe_mirrored(conn: psycopg.Connection, qualified_name: str, signature: list[dict] | None,
                      key: list[str] | None = None, *, column_types: dict | None = None,
                      exclude: Sequence[str] | None = None) -> TableSchema:
    """The :class:`TableSchema` of a mirror whose columns are ``signature`` (see
    :func:`column_signature`), decoded with the source's current catalogs: columns that still exist
    with the same type are taken from :func:`describe_table`; the others (dropped, renamed or retyped
    since) are resolved from their saved type oid. ``key``: the mirror's key columns (default: the
    source's current key). ``column_types``/``exclude``: the mirror's create-table column options
    (see :func:`describe_table`). Without a signature: :func:`describe_table`. ``current_columns`` of the
    result: the source's columns now (names)."""
    column_types = dict(column_types or {})
    exclude = list(exclude or [])
    if not signature:
        return describe_table(conn, qualified_name, column_types=column_types, exclude=exclude)
    # a later column may not map, and a column named by an option may be gone since
    current = describe_table(conn, qualified_name, skip_unsupported=True)
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
                name_sql = cur.execute("SELECT format_type(%s, %s)", (sig["oid"], sig["typmod"])).fetchone()[0]
                if column_types.get(sig["name"]) == "text":  # whatever the type: its text
                    spec = _text_column(sig["name"], sig["oid"], sig["typmod"], name_sql)
                else:
                    spec = types.spec(sig["name"], sig["oid"], sig["typmod"], name_sql, sig.get("ndims") or 0)
            except (UnsupportedTypeError, TypeError, psycopg.Error) as e:
                raise UnsupportedTypeError(
                    f"table {qualified_name}: mirrored column {sig['name']} (type oid {sig['oid']}) can no longer "
                    f"be resolved ({e})") from None
            spec.decl_oid, spec.decl_typmod = sig["oid"], sig["typmod"]
            cols.append(_apply_signature(spec, sig))
    keys = list(current.key_columns if key is None else key)
    for c in cols:
        c.is_key = c.name in keys
    out = TableSchema(schema=current.schema, name=current.name, oid=current.oid, columns=cols, key_columns=keys,
                      has_primary_key=current.has_primary_key, replica_identity=current.replica_identity,
                      relkind=current.relkind, excluded=exclude, column_types=column_types)
    out.current_columns = current_names
    out.catalog_lsn = current.catalog_lsn
    return out


# Catalog lookups for schema evolution -----------------------------------------------------------------

_ATTRS_SQL = "WITH RECURSIVE " + TREE_CTE.format(root="%(oid)s") + """
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
        super().__init__(f"the source's catalogs do not show transaction {xid} yet (committed in the WAL, "
                         "not yet visible to new snapshots)")
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
    return bool(conn.execute(_VISIBLE_SQL, {"xid": int(xid) & 0xFFFFFFFF}).fetchone()[0])


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
            out.append(CatalogColumn(int(r[0]), r[1], bool(r[2]), int(r[3]), int(r[4]), int(r[5] or 0), bool(r[6]),
                                     missing))
    return out


def _immutable_default(cur, expr: str, tree: str, typid: int, typmod: int) -> str | None:
    """The text (the column type's output form, as the replication stream carries values) of a default
    expression's value when every function and operator in it is immutable (and it reads no table),
    else None."""
    if "SUBLINK" in tree or "NEXTVAL" in tree.upper():
        return None
    ids = sorted({int(x) for x in _FUNC_IDS.findall(tree)})
    if ids:
        rows = cur.execute("SELECT provolatile FROM pg_proc WHERE oid = ANY(%s) UNION ALL "
                           "SELECT p.provolatile FROM pg_operator o JOIN pg_proc p ON p.oid = o.oprcode "
                           "WHERE o.oid = ANY(%s)", (ids, ids)).fetchall()
        if any(v != "i" for (v,) in rows):
            return None
    try:
        with cur.connection.transaction():  # format's %s uses the type's output function: 't', not 'true'
            tname = cur.execute("SELECT format_type(%s, %s)", (typid, typmod)).fetchone()[0]
            return cur.execute(f"SELECT format('%s', ({expr})::{tname})").fetchone()[0]
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
