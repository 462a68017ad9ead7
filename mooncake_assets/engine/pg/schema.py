"""Postgres table schemas and the Postgres → Arrow type mapping.

:class:`ColumnSpec` (one column: its Postgres type, its Arrow type, key/NOT NULL attributes, Iceberg
field id), :class:`TableSchema` (a table as it is mirrored), :func:`arrow_type_for` (the mapping),
field-id assignment and the mirrored signature kept with a mirror (:func:`column_signature`). How
text values become Arrow values: :mod:`.decode`; how a schema is read from the source's catalogs:
:mod:`mooncake_assets.engine.pg.catalog`.

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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NotRequired, TypedDict

import pyarrow as pa

__all__ = [
    "ColumnSignature",
    "ColumnSpec",
    "ColumnValueError",
    "TableSchema",
    "UnsupportedTypeError",
    "UnsupportedTableError",
    "arrow_type_for",
    "assign_field_ids",
    "column_option_hint",
    "column_options",
    "column_signature",
    "text_spec",
    "SUPPORTED_TYPES",
    "REFUSED_TYPES",
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
_TEXTUAL = {
    TEXT,
    VARCHAR,
    BPCHAR,
    CHAR,
    NAME,
    UUID,
    JSON,
    JSONB,
    XML,
    INTERVAL,
    TIMETZ,
    INET,
    CIDR,
    MACADDR,
    MACADDR8,
    BIT,
    VARBIT,
}
_TEXTUAL_NAMES = {"citext"}  # extension types without a fixed oid, recognised by name

#: Human-readable list used in :class:`UnsupportedTypeError` messages.
SUPPORTED_TYPES = (
    "boolean, smallint, integer, bigint, oid, real, double precision, numeric, text, varchar, char, "
    "name, citext, uuid, json, jsonb, xml, bytea, date, time, timetz, timestamp, timestamptz, "
    "interval, inet, cidr, macaddr, macaddr8, bit, varbit, money, enums, domains over these and "
    "arrays of these"
)

DATE_INFINITY = 2**31 - 1  # DuckDB's / Postgres's date 'infinity' (days)
TIMESTAMP_INFINITY = 2**63 - 1  # DuckDB's timestamp 'infinity' (µs); '-infinity' is its negation


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
    element: ColumnSpec | None = None
    ndims: int = 0
    decl_oid: int = 0
    decl_typmod: int = -1
    field_id: int = 0
    element_ids: list[int] = field(default_factory=list)
    attnum: int = 0
    initial_default: str | None = None
    generated: str | None = None  # a STORED generated column's expression (pg_get_expr of pg_attrdef.adbin)
    kind: str = ""
    fields: list[ColumnSpec] | None = None
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


def _type_with_ids(t: pa.DataType, ids: Iterator[int]) -> pa.DataType:
    """``t`` with ``PARQUET:field_id`` on its nested fields, taken from ``ids`` in pre-order (list:
    element, then inside it; struct: each field, then inside it; map: key, value, then inside them)."""

    def fid() -> dict[str, str]:
        return {"PARQUET:field_id": str(next(ids))}

    if pa.types.is_list(t):
        m = fid()
        return pa.list_(pa.field("element", _type_with_ids(t.value_type, ids), nullable=True, metadata=m))
    if pa.types.is_map(t):
        km, vm = fid(), fid()
        kt = _type_with_ids(t.key_type, ids)
        vt = _type_with_ids(t.item_type, ids)
        return pa.map_(
            pa.field("key", kt, nullable=False, metadata=km), pa.field("value", vt, nullable=True, metadata=vm)
        )
    if pa.types.is_struct(t):
        out: list[pa.Field] = []
        for i in range(t.num_fields):
            f = t.field(i)
            m = fid()
            out.append(pa.field(f.name, _type_with_ids(f.type, ids), nullable=True, metadata=m))
        return pa.struct(out)
    return t


def assign_field_ids(columns: list[ColumnSpec], next_id: int = 1) -> int:
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
    Set by the catalog reads (:mod:`.catalog`), not compared: ``current_columns``, the names of every
    column the source table has now (unmirrored ones included); ``catalog_lsn``, a WAL position after
    every commit the catalogs read showed (0 when unknown); ``source_gone``, True when the source
    table no longer exists (the schema was built from the mirror's saved columns alone).
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
    excluded: list[str] = field(default_factory=list)
    column_types: dict[str, str] = field(default_factory=dict)
    current_columns: set[str] = field(default_factory=set, repr=False, compare=False)
    catalog_lsn: int = field(default=0, repr=False, compare=False)
    source_gone: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.column_index = {c.name: i for i, c in enumerate(self.columns)}

    @property
    def qualified_name(self) -> str:
        """``schema.name`` in its SQL form, parts quoted where needed (``"Sales Data"."Q1 Orders"``)."""
        from .names import format_name

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

    return " ".join(
        [f"--column-type {shlex.quote(c + '=text')}" for c in types]
        + [f"--exclude-column {shlex.quote(c)}" for c in exclude]
    )


def column_option_hint(columns: Sequence[str]) -> str:
    """The create-table options that get past ``columns``: ``--column-type c=text … or
    --exclude-column c …`` (see :func:`column_options`)."""
    return (
        "mirror them as their exact text with "
        + column_options(columns)
        + ", or leave them out with "
        + column_options(exclude=columns)
        + " (create-table options, recorded with the mirror)"
    )


def text_spec(c: ColumnSpec) -> ColumnSpec:
    """``c`` mirrored as Postgres's exact text output (``--column-type COL=text``): a string column
    keeping everything that is not about the value's structure — name, type, declared type, key and
    NOT NULL attributes, field id, attnum, initial default, generation expression (``generated``) —
    and nothing that is (no list element or dimensions, composite fields, decoder kind, SRID, nested
    field ids: a string has none). A new spec; ``c`` is not changed."""
    return replace(
        c,
        arrow_type=pa.string(),
        as_text=True,
        element=None,
        ndims=0,
        kind="",
        fields=None,
        element_ids=[],
        delim=",",
        srid=None,
    )


def _text_column(name: str, oid: int, typmod: int, type_name: str) -> ColumnSpec:
    """A column of type ``oid``/``typmod`` (``type_name``: its ``format_type`` text) mirrored as its
    exact text (no structured mapping, or ``--column-type COL=text``)."""
    return ColumnSpec(name, oid, typmod, type_name, pa.string(), as_text=True)


class UnsupportedTableError(UnsupportedTypeError):
    """The relation cannot be mirrored as named (e.g. a partition: mirror its partitioned root).
    Permanent; the message names the table and what to do."""


# Mirrored signatures ---------------------------------------------------------------------------------


class ColumnSignature(TypedDict):
    """One column of a mirrored signature (:func:`column_signature`, saved as JSON): ``name``;
    ``oid``/``typmod``: the declared type as pgoutput's Relation message carries it; ``ndims``: array
    dimensions; ``field_id``/``element_ids``: the Iceberg field ids of the column and its nested fields;
    ``attnum``: ``pg_attribute.attnum``; ``initial_default``: the default older rows read (SQL text);
    ``not_null``. Only ``name``, ``oid`` and ``typmod`` are always there: a signature saved by an
    earlier version may lack the others (read with their defaults, :func:`_apply_signature`)."""

    name: str
    oid: int
    typmod: int
    ndims: NotRequired[int]
    field_id: NotRequired[int]
    element_ids: NotRequired[list[int]]
    attnum: NotRequired[int]
    initial_default: NotRequired[str | None]
    not_null: NotRequired[bool]


def column_signature(schema: TableSchema) -> list[ColumnSignature]:
    """What the mirror was built with, per column: ``{"name", "oid", "typmod", "ndims", "field_id",
    "element_ids", "attnum", "initial_default", "not_null"}`` (declared type as pgoutput's Relation
    message carries it; Iceberg field ids). Saved with the mirror (the registry and the Iceberg table
    property ``mooncake.columns``) so a restart rebuilds the same columns even when the source changed
    meanwhile (the change then shows up, at its LSN, in the replayed stream)."""
    return [
        {
            "name": c.name,
            "oid": c.decl_oid,
            "typmod": c.decl_typmod,
            "ndims": c.ndims,
            "field_id": c.field_id,
            "element_ids": list(c.element_ids),
            "attnum": c.attnum,
            "initial_default": c.initial_default,
            "not_null": c.not_null,
        }
        for c in schema.columns
    ]


def _apply_signature(c: ColumnSpec, sig: ColumnSignature) -> ColumnSpec:
    """Carry the saved identity of a mirrored column (field ids, attnum, initial default) onto ``c``."""
    c.field_id = int(sig.get("field_id") or 0)
    c.element_ids = list(sig.get("element_ids") or [])
    c.attnum = int(sig.get("attnum") or c.attnum or 0)
    c.initial_default = sig.get("initial_default")
    if "not_null" in sig:
        c.not_null = bool(sig["not_null"])
    return c
