"""The Iceberg side of mirrored tables: format v3 (deletion vectors in Puffin, row lineage) or v2
(Parquet position deletes), committed through PyIceberg catalogs with an atomic metadata-pointer swap.

See ``table.py`` (the table API), ``manifest.py`` (v2/v3 manifests), ``catalog.py`` (catalogs and the
swap), ``duckdb_ext.py`` (DuckDB with the iceberg extension, offline), ``faults.py`` (crash injection
for tests).
"""
from .catalog import make_catalog, metadata_json
from .datafile import iceberg_arrow_schema
from .duckdb_ext import connect_with_iceberg
from .errors import CommitConflict, CommitStateUnknown, IcebergMirrorError, UnsupportedCatalog
from .table import (
    DELETE_FORMATS,
    INDEX_BLOB_TYPE,
    SUMMARY_FLUSH_LSN,
    SUMMARY_INDEX_FILE,
    DataFileState,
    IcebergMirrorTable,
    PersistedState,
)


__all__ = [
    "DELETE_FORMATS",
    "INDEX_BLOB_TYPE",
    "SUMMARY_FLUSH_LSN",
    "SUMMARY_INDEX_FILE",
    "CommitConflict",
    "CommitStateUnknown",
    "DataFileState",
    "IcebergMirrorError",
    "IcebergMirrorTable",
    "PersistedState",
    "UnsupportedCatalog",
    "connect_with_iceberg",
    "iceberg_arrow_schema",
    "make_catalog",
    "metadata_json",
]
