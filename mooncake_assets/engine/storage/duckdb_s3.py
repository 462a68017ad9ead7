"""DuckDB over the warehouse's object store.

- **S3**: the ``httpfs`` extension, loaded offline from the PyPI package ``duckdb-extension-httpfs``
  (same DuckDB version), and an S3 secret built from an ``S3Config``. After ``configure_duckdb_s3(con,
  cfg)`` the connection reads ``s3://bucket/key`` paths directly (``read_parquet``, ``iceberg_scan``),
  with ranged GETs: only the footers, the needed columns and the row groups that survive the statistics
  are fetched. httpfs is chosen over registering ``s3fs`` with DuckDB because it reads the same objects
  several times faster (docs/storage.md, "DuckDB: httpfs or fsspec").
- **GCS, Azure**: the store's fsspec filesystem (gcsfs, adlfs) registered with the connection
  (``register_filesystem``), so ``gs://`` and ``abfs://``/``az://`` paths are read through it — the same
  endpoint and credentials as the service's FileIO, emulators included (httpfs reaches GCS only through
  HMAC keys on Google's S3-compatible endpoint, which emulators do not serve).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # imported lazily: loading settings must stay cheap
    import duckdb

    from .stores import StoreConfig

from .arrow_fs import store_filesystem, use_store
from .config import S3Config, resolve_s3

SECRET_NAME = "mooncake_s3"


def sql_str(s: str) -> str:
    """``s`` as a DuckDB (standard SQL) string literal: single-quoted, each ``'`` doubled. For paths,
    secrets' options and the like spliced into statements DuckDB takes no parameters in (``LOAD``,
    ``CREATE SECRET``, ``read_parquet`` lists)."""
    return "'" + s.replace("'", "''") + "'"


def load_httpfs(con: duckdb.DuckDBPyConnection) -> None:
    """Load ``httpfs`` into ``con`` from the installed ``duckdb-extension-httpfs`` package (no download).

    Raises ``RuntimeError`` naming the package to install when it is missing or built for another DuckDB."""
    row = con.execute("SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'httpfs'").fetchone()
    if row and row[0]:
        return
    from .duckdb_ext import extension_file

    con.execute(f"LOAD {sql_str(str(extension_file('httpfs')))}")


def configure_duckdb_s3(con: duckdb.DuckDBPyConnection, cfg: S3Config, *, name: str = SECRET_NAME) -> None:
    """Load httpfs and (re)create the S3 secret ``name`` on ``con`` for ``cfg`` (endpoint, region, URL
    style, SSL, credentials). Idempotent; cheap enough to call before every registration."""
    load_httpfs(con)
    opts = ["TYPE s3", f"REGION {sql_str(cfg.region)}"]
    if cfg.access_key_id:
        opts.append(f"KEY_ID {sql_str(cfg.access_key_id)}")
    if cfg.secret_access_key:
        opts.append(f"SECRET {sql_str(cfg.secret_access_key)}")
    if cfg.session_token:
        opts.append(f"SESSION_TOKEN {sql_str(cfg.session_token)}")
    if cfg.endpoint:
        opts.append(f"ENDPOINT {sql_str(cast(str, cfg.host_port))}")  # set with the endpoint
        opts.append(f"USE_SSL {'true' if cfg.scheme == 'https' else 'false'}")
    opts.append(f"URL_STYLE {sql_str('path' if cfg.use_path_style else 'vhost')}")
    con.execute(f"CREATE OR REPLACE TEMPORARY SECRET {name} ({', '.join(opts)})")


def register_fsspec(con: duckdb.DuckDBPyConnection, cfg: StoreConfig) -> None:
    """Register ``cfg``'s fsspec filesystem (``GCSConfig``/``AzureConfig``) with ``con``, once."""
    fs = store_filesystem(cfg.kind, cfg)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if any(p in con.list_filesystems() for p in protocols):
        return
    con.register_filesystem(fs)


def configure_duckdb_store(con: duckdb.DuckDBPyConnection, cfg: StoreConfig | None) -> None:
    """Make ``con`` read the warehouse files of ``cfg``'s store (module docstring); None: nothing."""
    if cfg is None:
        return
    if cfg.kind == "s3":
        configure_duckdb_s3(con, cast(S3Config, cfg))  # the config of kind "s3"
    else:
        register_fsspec(con, cfg)


def ensure_duckdb_store(con: duckdb.DuckDBPyConnection, hints: Mapping[str, Any] | None) -> StoreConfig | None:
    """For a ReadState's ``storage`` hints (None for local warehouses): configure ``con`` for the
    warehouse's store (S3: httpfs and a secret; GCS, Azure: the fsspec filesystem) with the endpoint the
    service uses and this process's credentials, and make it the process's configuration for PyArrow
    reads (``arrow_fs.arrow_source``); returns the config (None if nothing to do). Each call resolves
    the store and recreates the secret: callers that read often remember the hints they applied
    (``UnionReader`` does)."""
    if not hints:
        return None
    from .stores import resolve_store

    cfg = resolve_store(hints["warehouse"], hints=hints) if hints.get("warehouse") else resolve_s3(hints=hints)
    configure_duckdb_store(con, cfg)
    # PyArrow reads of the same files (arrow_fs.arrow_source); hints name object stores only
    use_store(cast("StoreConfig", cfg))
    return cfg
