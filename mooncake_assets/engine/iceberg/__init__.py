"""The Iceberg side of mirrored tables: format v3 (deletion vectors in Puffin, row lineage) or v2
(Parquet position deletes), committed through PyIceberg catalogs with an atomic metadata-pointer swap.

See ``table.py`` (the table API), ``producer.py`` (one commit as a snapshot producer in phases),
``snapshots.py`` / ``state.py`` (reading a snapshot), ``writers.py`` (DVs, position deletes, the index),
``manifest.py`` (v2/v3 manifests), ``catalog.py`` (catalogs and the swap), ``retention.py`` (expiry),
``compat.py`` (every use of PyIceberg/SQLAlchemy internals, version-gated), ``..storage.duckdb_ext`` (DuckDB
with the iceberg extension, offline), ``faults.py`` (crash injection for tests).
"""

from ..storage.duckdb_ext import connect_with_iceberg
from .catalog import make_catalog, metadata_json
from .datafile import iceberg_arrow_schema
from .errors import CommitConflict, CommitStateUnknown, IcebergMirrorError, UnsupportedCatalog
from .names import DELETE_FORMATS, INDEX_BLOB_TYPE, SUMMARY_DELETE_LOG, SUMMARY_FLUSH_LSN, SUMMARY_INDEX_FILE
from .state import DataFileState, PersistedState
from .table import IcebergMirrorTable

__all__ = [
    "DELETE_FORMATS",
    "INDEX_BLOB_TYPE",
    "SUMMARY_FLUSH_LSN",
    "SUMMARY_DELETE_LOG",
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
