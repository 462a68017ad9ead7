"""PyArrow reads of warehouse files in a reader process (union reads that decode Parquet themselves).

A union reader learns the warehouse's store from the ReadState's ``storage`` hints
(``duckdb_s3.ensure_duckdb_store`` calls ``use_store``); ``arrow_source(path)`` then gives what
``pyarrow.parquet.ParquetFile`` takes: the path itself for local files; for ``s3://`` an open
random-access file of PyArrow's own S3 filesystem (C++, the fastest reader of Parquet ranges); for
``gs://`` and ``abfs://``/``az://`` an open file of the store's fsspec filesystem (gcsfs, adlfs). One cached
filesystem per configuration, so connections are reused.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .config import S3Config, is_s3, resolve_s3

if TYPE_CHECKING:
    import pyarrow.fs
    from fsspec import AbstractFileSystem

    from .stores import StoreConfig

_lock = threading.Lock()
_active: dict[str, StoreConfig] = {}


def use_store(cfg: StoreConfig) -> None:
    """Make ``cfg`` (an ``S3Config``, ``GCSConfig`` or ``AzureConfig``) the configuration ``arrow_source``
    uses for paths on its store in this process."""
    with _lock:
        _active[cfg.kind] = cfg


@functools.lru_cache(maxsize=8)
def _filesystem(cfg: S3Config) -> pyarrow.fs.S3FileSystem:
    return cfg.pyarrow_filesystem()


@functools.lru_cache(maxsize=8)
def _fsspec(cfg: StoreConfig) -> AbstractFileSystem:
    return cfg.filesystem()


def s3_filesystem(cfg: S3Config | None = None) -> pyarrow.fs.S3FileSystem:
    """The cached PyArrow ``S3FileSystem`` for ``cfg`` (default: the one set by ``use_store``, else the
    environment's)."""
    return _filesystem(cfg or cast("S3Config | None", _active.get("s3")) or resolve_s3())


def store_filesystem(kind: str, cfg: StoreConfig | None = None) -> AbstractFileSystem:
    """The cached fsspec filesystem of store ``kind`` (``"s3"``, ``"gcs"``, ``"azure"``) for ``cfg``
    (default: the one set by ``use_store``, else the environment's)."""
    if cfg is None:
        cfg = _active.get(kind)
    if cfg is None:
        from .stores import resolve_azure, resolve_gcs

        cfg = cast("Callable[[], StoreConfig]", {"s3": resolve_s3, "gcs": resolve_gcs, "azure": resolve_azure}[kind])()
    return _fsspec(cfg)


def arrow_source(path: str) -> Any:
    """``path`` unchanged when local; for an object-store URI an open random-access file."""
    if "://" not in path or path.startswith("file://"):
        return path
    if is_s3(path):
        return s3_filesystem().open_input_file(path.split("://", 1)[1])
    from .stores import kind_of_scheme

    kind = kind_of_scheme(path.split("://", 1)[0])
    if kind is None:
        return path
    return store_filesystem(kind).open(path, "rb")
