"""Warehouse checks: is the configured warehouse there, reachable, and writable with these credentials?

``check_warehouse`` runs before anything is created in a warehouse (``create-table``) so that a missing
bucket, rejected credentials or an endpoint that does not answer are one clear message instead of a
stack trace from deep inside a commit. For an object store (S3, GCS, Azure, through the store's fsspec
filesystem) it asks for the bucket or container, then writes and deletes a small probe object under the
prefix (the permission a persist needs); for a local warehouse it creates the directory and a probe file.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from .errors import AccessDenied, BucketNotFound, StorageError, classify

if TYPE_CHECKING:
    from .stores import StoreConfig

PROBE_PREFIX = ".mooncake-probe-"


def _raise_classified(e: BaseException, warehouse: str, cfg: StoreConfig, what: str) -> NoReturn:
    err = classify(e, location=warehouse, endpoint=cfg.describe(), what=what)
    if err is None:
        err = StorageError(
            f"{what} at {cfg.describe()}: {str(e).strip().splitlines()[0] if str(e) else type(e).__name__}",
            location=warehouse,
            endpoint=cfg.describe(),
        )
    raise err from e


def _connect_probe(endpoint: str | None, timeout: float = 5.0) -> None:
    """Open (and close) a TCP connection to a custom endpoint: a dead one fails here in at most
    ``timeout`` seconds instead of after the client library's own retries (gcsfs ~30 s, Azure ~70 s)."""
    if not endpoint:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.create_connection((parts.hostname, port), timeout=timeout):
        pass


def check_warehouse(warehouse: str, cfg: StoreConfig | None = None, *, write_probe: bool = True) -> None:
    """Raise a ``StorageError`` subclass saying what is wrong with ``warehouse``, or return None.

    ``warehouse``: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``abfs://container/prefix`` (``az://``,
    ``abfss://container@account…``), ``file:///dir`` or a directory path. ``cfg``: how to reach the store
    (default: ``stores.resolve_store`` from the environment). The bucket (container) is asked for through
    the store's fsspec filesystem, then a probe object is written and deleted under the prefix
    (``write_probe``: the permission a persist needs). Errors: ``WarehouseConfigError`` (bad URI or
    endpoint, plain HTTP not allowed, a missing credentials file), ``BucketNotFound``,
    ``CredentialsRejected``, ``AccessDenied`` (permanent), ``StorageUnavailable`` (endpoint unreachable or
    failing: temporary). Each message is one line naming the warehouse and the endpoint.
    """
    from .stores import bucket_and_prefix, resolve_store, store_kind

    kind = store_kind(warehouse)
    if kind == "file":
        path = Path(warehouse[len("file://") :] if warehouse.startswith("file://") else warehouse)
        try:
            path.mkdir(parents=True, exist_ok=True)
            if write_probe:
                probe = path / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
                probe.write_bytes(b"")
                probe.unlink()
        except OSError as e:
            raise StorageError(
                f"warehouse {warehouse}: cannot write to {path} ({e.strerror or e})", location=warehouse
            ) from e
        return
    bucket, prefix = bucket_and_prefix(warehouse)
    cfg = cast("StoreConfig", cfg or resolve_store(warehouse)).validate()  # an object store: never None
    what = f"warehouse {warehouse}"
    noun = "container" if kind == "azure" else "bucket"
    denied: BaseException | None = None
    try:
        _connect_probe(getattr(cfg, "endpoint", None))
    except OSError as e:
        _raise_classified(e, warehouse, cfg, what)
    try:
        fs = cfg.filesystem()
        fs.info(bucket)
    except FileNotFoundError as e:
        raise BucketNotFound(
            f"{what}: {noun} {bucket!r} does not exist at {cfg.describe()}; create it or fix the warehouse URI",
            location=warehouse,
            endpoint=cfg.describe(),
        ) from e
    except Exception as e:
        if not isinstance(classify(e), AccessDenied) or not write_probe:
            _raise_classified(e, warehouse, cfg, what)
        denied = e  # HeadBucket answers a bare 403 for unknown keys too: the probe write tells which
    if not write_probe:
        return
    key = f"{bucket}/{prefix + '/' if prefix else ''}{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        fs.pipe_file(key, b"mooncake warehouse probe\n")
        fs.rm_file(key)
    except Exception as e:
        _raise_classified(e, warehouse, cfg, what)
    if denied is not None:  # could write but not HeadBucket: fine for a persist, but say so in the log
        import logging

        logging.getLogger("mooncake.storage").warning("%s: HeadBucket denied but writes work (%s)", what, denied)


def describe_warehouse(warehouse: str, cfg: StoreConfig | None = None) -> str:
    """``s3://bucket/prefix at http://endpoint`` (likewise gs://, abfs://) or the local path, for messages."""
    from .stores import is_object_store, resolve_store

    if is_object_store(warehouse):
        cfg = cast("StoreConfig", cfg or resolve_store(warehouse))  # an object store: never None
        return f"{warehouse} at {cfg.describe()}"
    return warehouse[len("file://") :] if warehouse.startswith("file://") else os.path.abspath(warehouse)
