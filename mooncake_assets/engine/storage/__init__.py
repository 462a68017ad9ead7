"""Warehouse storage: local directories and S3 (issue 9; DESIGN.md §5).

- ``config.py``: ``S3Config`` and how it is resolved (settings, environment, service hints);
  PyIceberg FileIO properties; ``s3://`` URI parsing;
- ``errors.py``: classified storage/catalog errors, each temporary or permanent (``retryable``);
- ``retry.py``: ``RetryPolicy``, ``retry_call`` and the service's per-table ``Backoff``;
- ``warehouse.py``: ``check_warehouse`` (missing bucket, rejected credentials, unreachable endpoint);
- ``duckdb_s3.py``: DuckDB's httpfs loaded offline and an S3 secret, so union reads scan ``s3://`` files;
- ``arrow_fs.py``: the same files opened through PyArrow's S3 filesystem (readers that decode Parquet).

Freshly flushed files are staged on local disk (``<state>/tables/<t>/staging``) and reach the
warehouse only when a persist uploads them right before its Iceberg commit, as in pg_mooncake.
"""
from .arrow_fs import arrow_source, s3_filesystem, use_s3
from .config import (
    S3Config,
    apply_s3_settings,
    catalog_properties,
    is_s3,
    parse_s3_uri,
    resolve_s3,
    storage_hints,
    warehouse_s3,
)
from .duckdb_s3 import configure_duckdb_s3, ensure_duckdb_s3, load_httpfs
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
from .warehouse import check_warehouse, describe_warehouse

__all__ = [
    "RESTORE_POLICY",
    "SERVICE_POLICY",
    "AccessDenied",
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
    "describe_warehouse",
    "ensure_duckdb_s3",
    "is_retryable",
    "is_s3",
    "load_httpfs",
    "parse_s3_uri",
    "resolve_s3",
    "retry_call",
    "s3_filesystem",
    "storage_hints",
    "use_s3",
    "warehouse_s3",
]
