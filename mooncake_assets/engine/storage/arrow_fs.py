"""PyArrow reads of warehouse files in a reader process (union reads that decode Parquet themselves).

A union reader learns the warehouse's endpoint from the ReadState's ``storage`` hints
(``duckdb_s3.ensure_duckdb_s3`` calls ``use_s3``); ``arrow_source(path)`` then gives what
``pyarrow.parquet.ParquetFile`` takes: the path itself for local files, an open random-access S3 file
for ``s3://`` ones (through one cached ``S3FileSystem`` per configuration, so connections are reused).
"""
from __future__ import annotations

import functools
import threading

from .config import S3Config, is_s3, resolve_s3

_lock = threading.Lock()
_active: S3Config | None = None


def use_s3(cfg: S3Config) -> None:
    """Make ``cfg`` the configuration ``arrow_source`` uses for ``s3://`` paths in this process."""
    global _active
    with _lock:
        _active = cfg


@functools.lru_cache(maxsize=8)
def _filesystem(cfg: S3Config):
    return cfg.pyarrow_filesystem()


def s3_filesystem(cfg: S3Config | None = None):
    """The cached ``S3FileSystem`` for ``cfg`` (default: the one set by ``use_s3``, else the environment's)."""
    return _filesystem(cfg or _active or resolve_s3())


def arrow_source(path: str):
    """``path`` unchanged when local; for ``s3://bucket/key`` an open ``pyarrow`` random-access file."""
    if not is_s3(path):
        return path
    return s3_filesystem().open_input_file(path.split("://", 1)[1])
