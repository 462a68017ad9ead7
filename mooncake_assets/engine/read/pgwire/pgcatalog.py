"""``pg_catalog`` tables over the mirrors, for clients that reflect a schema with general SQL over them
(SQLAlchemy's ``inspect(engine).get_table_names()``/``get_columns()``/``has_table()``, with bound
parameters, joins and scalar subqueries).

The catalog is built in a DuckDB schema ``__mc_pg`` of the backend's own connection (never the
readers'): ``pg_namespace`` (``pg_catalog``, ``public``, ``information_schema``), ``pg_class`` (one
ordinary table per mirror, oid ``16384 + its position``, as psql's answers number them),
``pg_attribute`` (its columns: type OID and ``atttypmod`` from the source column's type),
``pg_type`` (the types those columns use) and empty ``pg_attrdef``, ``pg_description``,
``pg_sequence``, ``pg_collation``, ``pg_index``, ``pg_constraint``, ``pg_inherits``, ``pg_enum``;
and macros for the functions such queries call (``format_type`` from those types'
names, ``pg_table_is_visible`` true, ``pg_get_expr``/``col_description`` NULL…). Columns and their
meaning as in the PostgreSQL manual, "System Catalogs".

The client's text is rewritten before it runs (outside literals and comments): ``pg_catalog.`` ->
``__mc_pg.``, casts to ``regclass``/``oid``/``regtype``/``regproc`` -> ``BIGINT`` and to ``name`` ->
``VARCHAR``, ``json_build_object`` -> DuckDB's ``json_object``. Unqualified catalog names resolve
through the connection's ``search_path``. A statement DuckDB cannot run is answered by the caller
the old way (no rows, the columns it selects).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import duckdb
import pyarrow as pa

from .infoschema import UDT
from .sqltext import rewrite_code
from .types import ARRAY_OF, TYPE_NAMES, TYPLEN, type_oid

SCHEMA = "__mc_pg"
TABLE_OID_BASE = 16384
NAMESPACES = [(11, "pg_catalog"), (2200, "public"), (13000, "information_schema")]
PUBLIC = 2200
UNKNOWN_TYPE_BASE = 90000  # OIDs given to source types without a built-in OID (an enum, a domain…)

#: catalog tables that start empty: name -> its columns (DuckDB types)
EMPTY = {
    "pg_attrdef": "oid BIGINT, adrelid BIGINT, adnum SMALLINT, adbin VARCHAR",
    "pg_description": "objoid BIGINT, classoid BIGINT, objsubid INTEGER, description VARCHAR",
    "pg_sequence": "seqrelid BIGINT, seqtypid BIGINT, seqstart BIGINT, seqincrement BIGINT, seqmax BIGINT, "
    "seqmin BIGINT, seqcache BIGINT, seqcycle BOOLEAN",
    "pg_collation": "oid BIGINT, collname VARCHAR, collnamespace BIGINT, collprovider VARCHAR",
    "pg_index": "indexrelid BIGINT, indrelid BIGINT, indnatts SMALLINT, indnkeyatts SMALLINT, indisunique BOOLEAN, "
    "indisprimary BOOLEAN, indisexclusion BOOLEAN, indimmediate BOOLEAN, indisclustered BOOLEAN, "
    "indisvalid BOOLEAN, indkey SMALLINT[], indoption SMALLINT[], indexprs VARCHAR, indpred VARCHAR, "
    "indnullsnotdistinct BOOLEAN",
    "pg_constraint": "oid BIGINT, conname VARCHAR, connamespace BIGINT, contype VARCHAR, conrelid BIGINT, "
    "contypid BIGINT, conindid BIGINT, confrelid BIGINT, conkey SMALLINT[], confkey SMALLINT[], "
    "condeferrable BOOLEAN, condeferred BOOLEAN, convalidated BOOLEAN, confupdtype VARCHAR, "
    "confdeltype VARCHAR, confmatchtype VARCHAR, conislocal BOOLEAN, coninhcount INTEGER",
    "pg_inherits": "inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER",
    "pg_enum": "oid BIGINT, enumtypid BIGINT, enumsortorder DOUBLE, enumlabel VARCHAR",
}

MACROS = [
    "pg_table_is_visible(o) AS true",
    "pg_type_is_visible(o) AS true",
    "pg_collation_is_visible(o) AS true",
    "pg_function_is_visible(o) AS true",
    "format_type(t, m) AS (SELECT ftext FROM __mc_pg.__format WHERE ftyp = t AND fmod = coalesce(m, -1))",
    "pg_get_expr(e, r) AS CAST(NULL AS VARCHAR), (e, r, p) AS CAST(NULL AS VARCHAR)",
    "pg_get_serial_sequence(t, c) AS CAST(NULL AS VARCHAR)",
    "pg_get_constraintdef(o) AS CAST(NULL AS VARCHAR), (o, p) AS CAST(NULL AS VARCHAR)",
    "pg_get_indexdef(o) AS CAST(NULL AS VARCHAR), (o, n, p) AS CAST(NULL AS VARCHAR)",
    "col_description(o, n) AS CAST(NULL AS VARCHAR)",
    "obj_description(o) AS CAST(NULL AS VARCHAR), (o, c) AS CAST(NULL AS VARCHAR)",
    "pg_get_userbyid(o) AS 'mooncake'",
    "has_table_privilege(t, p) AS true, (u, t, p) AS true",
    "has_schema_privilege(s, p) AS true, (u, s, p) AS true",
    "pg_encoding_to_char(e) AS 'UTF8'",
]

_PREFIX = re.compile(r"\bpg_catalog\s*\.\s*", re.I)
# ``::type``, or ``AS type)`` closing a CAST (an alias ``AS name`` is followed by anything but ``)``)
_CASTS = re.compile(r"(::\s*|\bAS\s+)(regclass|regtype|regproc|regnamespace|oid|name)\b", re.I)
_JSON_OBJECT = re.compile(r"\bjson_build_object\s*\(", re.I)


def rewrite(sql: str) -> str:
    """``sql`` with the rewrites of the module docstring (outside literals and comments)."""

    def one(code: str) -> str:
        code = _PREFIX.sub(SCHEMA + ".", code)
        code = _CASTS.sub(_cast, code)
        return _JSON_OBJECT.sub("json_object(", code)

    return rewrite_code(sql, one)


def _cast(m: re.Match[str]) -> str:
    rest = m.string[m.end() :].lstrip()
    if m.group(1).startswith("::") or rest.startswith(")"):  # ``x::oid``, ``CAST(x AS oid)``; not an alias
        return m.group(1) + ("VARCHAR" if m.group(2).lower() == "name" else "BIGINT")
    return m.group(0)


def typmod(source: str | None) -> int:
    """``atttypmod`` of a source type's ``format_type`` text: ``character varying(20)`` -> 24,
    ``numeric(10,2)`` -> 655366 (``(precision << 16 | scale) + 4``), ``timestamp(3) …`` -> 3; -1 when
    the type has none."""
    m = re.search(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)", source or "")
    if m is None:
        return -1
    head = (source or "").split("(")[0].strip().lower()
    a = int(m.group(1))
    if head in ("character varying", "varchar", "character", "bpchar", "char"):
        return a + 4
    if head in ("numeric", "decimal"):
        return ((a << 16) | int(m.group(2) or 0)) + 4
    return a


class CatalogTables:
    """Builds the catalog of the module docstring from the mirrors: ``mirrors()`` their names,
    ``schema(name)`` a mirror's Arrow schema, ``source_types(name)`` its columns' source types."""

    def __init__(
        self,
        mirrors: Callable[[], list[str]],
        schema: Callable[[str], pa.Schema],
        source_types: Callable[[str], dict[str, str]],
    ):
        self.mirrors, self.schema, self.source_types = mirrors, schema, source_types

    def install(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the schema, its empty tables and its macros on ``con`` (once per connection)."""
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        for name, cols in EMPTY.items():
            con.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.{name} ({cols})")
        con.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.__format (ftyp BIGINT, fmod INTEGER, ftext VARCHAR)")
        for m in MACROS:
            con.execute(f"CREATE OR REPLACE MACRO {SCHEMA}.{m}")

    def refresh(self, con: duckdb.DuckDBPyConnection, columns: bool) -> None:
        """Fill ``pg_namespace``, ``pg_class``, ``pg_type`` and (``columns``: one read of no rows per
        mirror) ``pg_attribute`` with the mirrors as they are now."""
        names = self.mirrors()
        attrs: list[dict[str, object]] = []
        formats: dict[tuple[int, int], str] = {(oid, -1): text for oid, text in TYPE_NAMES.items()}
        unknown: dict[str, int] = {}
        for i, name in enumerate(names if columns else []):
            schema = self.schema(name)  # a read of no rows: the source types are known after it
            source = self.source_types(name)
            for num, f in enumerate(schema, start=1):
                text = source.get(f.name)
                oid, mod = type_oid(f.type, text), typmod(text)
                if text and formats.setdefault((oid, mod), text) != text:
                    oid = unknown.setdefault(text, UNKNOWN_TYPE_BASE + len(unknown))
                    formats[(oid, mod)] = text
                attrs.append(_attribute(TABLE_OID_BASE + i, f.name, num, oid, mod))
        natts: dict[object, int] = {}
        for a in attrs:
            natts[a["attrelid"]] = natts.get(a["attrelid"], 0) + 1
        classes = [_relation(TABLE_OID_BASE + i, n, natts.get(TABLE_OID_BASE + i, 0)) for i, n in enumerate(names)]
        types = [_type(oid, text) for (oid, mod), text in formats.items() if mod == -1 or oid >= UNKNOWN_TYPE_BASE]
        tables = {
            "pg_namespace": pa.Table.from_pylist(
                [{"oid": o, "nspname": n, "nspowner": 10, "nspacl": None} for o, n in NAMESPACES],
                pa.schema(
                    [("oid", pa.int64()), ("nspname", pa.string()), ("nspowner", pa.int64()), ("nspacl", pa.string())]
                ),
            ),
            "pg_class": pa.Table.from_pylist(classes, _schema_of(_relation(0, "", 0))),
            "pg_attribute": pa.Table.from_pylist(attrs, _schema_of(_attribute(0, "", 0, 0, 0))),
            "pg_type": pa.Table.from_pylist(types, _schema_of(_type(0, ""))),
            "__format": pa.table(
                {
                    "ftyp": pa.array([k[0] for k in formats], pa.int64()),
                    "fmod": pa.array([k[1] for k in formats], pa.int32()),
                    "ftext": pa.array(list(formats.values()), pa.string()),
                }
            ),
        }
        for name, t in tables.items():
            src = f"__mc_src_{name}"
            con.register(src, t)
            try:
                con.execute(f"CREATE OR REPLACE TABLE {SCHEMA}.{name} AS SELECT * FROM {src}")
            finally:
                con.unregister(src)


def _schema_of(row: dict[str, object]) -> pa.Schema:
    types = {bool: pa.bool_(), int: pa.int64(), str: pa.string(), type(None): pa.string()}
    return pa.schema([(k, types[type(v)]) for k, v in row.items()])


def _relation(oid: int, name: str, natts: int) -> dict[str, object]:
    """A ``pg_class`` row: an ordinary, permanent table of schema ``public``."""
    return {
        "oid": oid,
        "relname": name,
        "relnamespace": PUBLIC,
        "reltype": 0,
        "reloftype": 0,
        "relowner": 10,
        "relam": 2,
        "relfilenode": oid,
        "reltablespace": 0,
        "relpages": 0,
        "reltuples": -1,
        "relallvisible": 0,
        "reltoastrelid": 0,
        "relhasindex": False,
        "relisshared": False,
        "relpersistence": "p",
        "relkind": "r",
        "relnatts": natts,
        "relchecks": 0,
        "relhasrules": False,
        "relhastriggers": False,
        "relhassubclass": False,
        "relrowsecurity": False,
        "relforcerowsecurity": False,
        "relispopulated": True,
        "relreplident": "d",
        "relispartition": False,
        "relrewrite": 0,
        "relacl": None,
        "reloptions": None,
        "relpartbound": None,
    }


def _attribute(rel: int, name: str, num: int, oid: int, mod: int) -> dict[str, object]:
    """A ``pg_attribute`` row: a column that may be NULL, without default, identity or generation."""
    return {
        "attrelid": rel,
        "attname": name,
        "atttypid": oid,
        "attlen": TYPLEN.get(oid, -1),
        "attnum": num,
        "atttypmod": mod,
        "attndims": 1 if oid in ARRAY_OF.values() else 0,
        "attbyval": oid in TYPLEN and TYPLEN[oid] <= 8,
        "attalign": "d" if TYPLEN.get(oid) == 8 else "i",
        "attstorage": "p" if oid in TYPLEN else "x",
        "attcompression": "",
        "attnotnull": False,
        "atthasdef": False,
        "atthasmissing": False,
        "attidentity": "",
        "attgenerated": "",
        "attisdropped": False,
        "attislocal": True,
        "attinhcount": 0,
        "attcollation": 0,
        "attstattarget": -1,
        "attacl": None,
        "attoptions": None,
    }


def _type(oid: int, text: str) -> dict[str, object]:
    """A ``pg_type`` row for ``oid`` named ``text`` (its ``format_type``), in ``pg_catalog``."""
    array = oid in ARRAY_OF.values()
    elem = next((e for e, a in ARRAY_OF.items() if a == oid), 0)
    base = text[:-2] if array else text
    return {
        "oid": oid,
        "typname": ("_" if array else "") + UDT.get(base, base).replace(" ", "_"),
        "typnamespace": 11 if oid < UNKNOWN_TYPE_BASE else PUBLIC,
        "typowner": 10,
        "typlen": TYPLEN.get(oid, -1),
        "typbyval": oid in TYPLEN and TYPLEN[oid] <= 8,
        "typtype": "b",
        "typcategory": "A" if array else "U",
        "typisdefined": True,
        "typdelim": ",",
        "typrelid": 0,
        "typelem": elem,
        "typarray": ARRAY_OF.get(oid, 0),
        "typnotnull": False,
        "typbasetype": 0,
        "typtypmod": -1,
        "typndims": 0,
        "typcollation": 0,
        "typdefault": None,
    }
