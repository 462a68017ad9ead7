"""Warehouse storage: local directories, S3, GCS and Azure (docs/architecture.md#storage; docs/storage.md).

- ``config.py``: ``S3Config`` and how it is resolved (settings, environment, service hints);
  PyIceberg FileIO properties; ``s3://`` URI parsing;
- ``stores.py``: ``GCSConfig``, ``AzureConfig``, and ``resolve_store(uri)`` for any warehouse URI;
- ``fileio.py``: ``MooncakeFileIO``, PyIceberg's ``FsspecFileIO`` (s3fs, gcsfs, adlfs) for all
  Iceberg reads and writes;
- ``errors.py``: classified storage/catalog errors, each temporary or permanent (``retryable``);
- ``retry.py``: ``RetryPolicy``, ``retry_call`` and the service's per-table ``Backoff``;
- ``warehouse.py``: ``check_warehouse`` (missing bucket, rejected credentials, unreachable endpoint);
- ``duckdb_s3.py``: DuckDB's httpfs loaded offline and an S3 secret, so union reads scan ``s3://`` files;
  gcsfs/adlfs registered with DuckDB for ``gs://`` and ``abfs://``/``az://``;
- ``arrow_fs.py``: the same files opened for readers that decode Parquet themselves.

The rest of the engine does not know which store a warehouse is on: it gets a FileIO from the catalog
(``catalog_properties``), ReadState ``storage`` hints (``storage_hints``) and classified errors.

Freshly flushed files are staged on local disk (``<state>/tables/<t>/staging``) and reach the
warehouse only when a persist uploads them right before its Iceberg commit, as in pg_mooncake.
"""

from .arrow_fs import arrow_source, s3_filesystem, store_filesystem, use_store
from .config import (
    S3Config,
    apply_s3_settings,
    is_s3,
    parse_s3_uri,
    resolve_s3,
)
from .duckdb_s3 import configure_duckdb_s3, configure_duckdb_store, ensure_duckdb_store, load_httpfs, sql_str
from .errors import (
    AccessDenied,
    BucketNotFound,
    CatalogUnavailable,
    CredentialsRejected,
    StorageError,
    StorageUnavailable,
    WarehouseConfigError,
    WarehouseUnwritable,
    classify,
    is_retryable,
)
from .retry import RESTORE_POLICY, SERVICE_POLICY, Backoff, RetryPolicy, retry_call
from .stores import (
    AzureConfig,
    GCSConfig,
    catalog_properties,
    is_object_store,
    resolve_store,
    storage_hints,
    store_kind,
    warehouse_store,
)
from .warehouse import check_warehouse, describe_warehouse

__all__ = [
    "RESTORE_POLICY",
    "SERVICE_POLICY",
    "AccessDenied",
    "AzureConfig",
    "GCSConfig",
    "Backoff",
    "BucketNotFound",
    "CatalogUnavailable",
    "CredentialsRejected",
    "RetryPolicy",
    "S3Config",
    "StorageError",
    "StorageUnavailable",
    "WarehouseConfigError",
    "WarehouseUnwritable",
    "apply_s3_settings",
    "arrow_source",
    "catalog_properties",
    "check_warehouse",
    "classify",
    "configure_duckdb_s3",
    "configure_duckdb_store",
    "describe_warehouse",
    "ensure_duckdb_store",
    "is_retryable",
    "is_object_store",
    "is_s3",
    "load_httpfs",
    "parse_s3_uri",
    "resolve_s3",
    "sql_str",
    "resolve_store",
    "retry_call",
    "s3_filesystem",
    "storage_hints",
    "store_filesystem",
    "store_kind",
    "use_store",
    "warehouse_store",
]
