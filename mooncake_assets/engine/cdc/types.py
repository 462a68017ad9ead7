"""The names of the former single type module, re-exported for code that still imports them here.

The type mapping lives in :mod:`..pg.schema` (``ColumnSpec``, ``TableSchema``, ``arrow_type_for``,
field ids, mirrored signatures), text decoding in :mod:`.decode`, and everything read from the
source's catalogs in :mod:`mooncake_assets.engine.pg.catalog` (``describe_table``,
``describe_mirrored``, ``catalog_columns``, ``resolve_column``). New code imports from those.
"""
from __future__ import annotations

from ..pg.catalog import (CatalogColumn, CatalogNotCurrent, catalog_columns, describe_mirrored,  # noqa: F401
                          describe_table, resolve_column, xid_visible)
from ..pg.conninfo import OUTPUT_SETTINGS  # noqa: F401
from .decode import _decode_wkb, _unhex, civil_from_days, decode_text_column, decode_text_columns, ewkb_srid_suspect  # noqa: F401
from ..pg.schema import (BIT, BOOL, BPCHAR, BYTEA, CHAR, CIDR, DATE, DATE_INFINITY, FLOAT4, FLOAT8,  # noqa: F401
                     INET, INT2, INT2VECTOR, INT4, INT8, INTERVAL, JSON, JSONB, MACADDR, MACADDR8, MONEY, NAME,
                     NUMERIC, OID, OIDVECTOR, REFUSED_TYPES, SUPPORTED_TYPES, TEXT, TIME, TIMESTAMP,
                     TIMESTAMP_INFINITY, TIMESTAMPTZ, TIMETZ, UUID, VARBIT, VARCHAR, XML, ColumnSpec,
                     ColumnValueError, TableSchema, UnsupportedTableError, UnsupportedTypeError, arrow_type_for,
                     assign_field_ids, column_option_hint, column_options, column_signature, nested_field_count,
                     numeric_precision_scale, text_spec)

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
