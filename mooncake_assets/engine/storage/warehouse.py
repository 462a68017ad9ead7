"""Warehouse checks: is the configured warehouse there, reachable, and writable with these credentials?

``check_warehouse`` runs before anything is created in a warehouse (``create-table``) so that a missing
bucket, rejected credentials or an endpoint that does not answer are one clear message instead of a
stack trace from deep inside a commit. For S3 it asks for the bucket (HeadBucket), then writes and
deletes a small probe object under the prefix (the permission a persist needs); for a local warehouse
it creates the directory and a probe file.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from .config import S3Config, is_s3, parse_s3_uri, resolve_s3
from .errors import AccessDenied, BucketNotFound, StorageError, WarehouseConfigError, classify

PROBE_PREFIX = ".mooncake-probe-"


def _raise_classified(e: BaseException, warehouse: str, cfg: S3Config, what: str):
    err = classify(e, location=warehouse, endpoint=cfg.describe(), what=what)
    if err is None:
        err = StorageError(f"{what} at {cfg.describe()}: {str(e).strip().splitlines()[0] if str(e) else type(e).__name__}",
                           location=warehouse, endpoint=cfg.describe())
    raise err from e


def check_warehouse(warehouse: str, cfg: S3Config | None = None, *, write_probe: bool = True) -> None:
    """Raise a ``StorageError`` subclass saying what is wrong with ``warehouse``, or return None.

    ``warehouse``: ``s3://bucket/prefix``, ``file:///dir`` or a directory path. ``cfg``: how to reach S3
    (default: ``resolve_s3()`` from the environment). ``write_probe``: also write and delete a probe
    object (checks write permission). Errors: ``WarehouseConfigError`` (bad URI or endpoint, plain HTTP
    not allowed), ``BucketNotFound``, ``CredentialsRejected``, ``AccessDenied`` (permanent),
    ``StorageUnavailable`` (endpoint unreachable or failing: temporary).
    """
    if not is_s3(warehouse):
        if "://" in warehouse and not warehouse.startswith("file://"):
            raise WarehouseConfigError(f"warehouse {warehouse!r}: expected file://, s3:// or a directory path")
        path = Path(warehouse[len("file://"):] if warehouse.startswith("file://") else warehouse)
        try:
            path.mkdir(parents=True, exist_ok=True)
            if write_probe:
                probe = path / f"{PROBE_PREFIX}{uuid.uuid4().hex}"
                probe.write_bytes(b"")
                probe.unlink()
        except OSError as e:
            raise StorageError(f"warehouse {warehouse}: cannot write to {path} ({e.strerror or e})",
                               location=warehouse) from e
        return
    bucket, prefix = parse_s3_uri(warehouse)
    cfg = (cfg or resolve_s3()).validate()
    fs = cfg.pyarrow_filesystem()
    what = f"warehouse {warehouse}"
    denied: BaseException | None = None
    try:
        info = fs.get_file_info(bucket)
    except OSError as e:
        if not isinstance(classify(e), AccessDenied) or not write_probe:
            _raise_classified(e, warehouse, cfg, what)
        denied = e  # HeadBucket answers a bare 403 for unknown keys too: the probe write tells which
    else:
        from pyarrow.fs import FileType

        if info.type == FileType.NotFound:
            raise BucketNotFound(
                f"{what}: bucket {bucket!r} does not exist at {cfg.describe()}; create it or fix the warehouse URI",
                location=warehouse, endpoint=cfg.describe(),
            )
    if not write_probe:
        return
    key = f"{bucket}/{prefix + '/' if prefix else ''}{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        with fs.open_output_stream(key) as out:
            out.write(b"mooncake warehouse probe\n")
        fs.delete_file(key)
    except OSError as e:
        _raise_classified(e, warehouse, cfg, what)
    if denied is not None:  # could write but not HeadBucket: fine for a persist, but say so in the log
        import logging

        logging.getLogger("mooncake.storage").warning("%s: HeadBucket denied but writes work (%s)", what, denied)


def describe_warehouse(warehouse: str, cfg: S3Config | None = None) -> str:
    """``s3://bucket/prefix at http://endpoint`` or the local path, for messages."""
    if is_s3(warehouse):
        cfg = cfg or resolve_s3()
        return f"{warehouse} at {cfg.describe()}"
    return warehouse[len("file://"):] if warehouse.startswith("file://") else os.path.abspath(warehouse)
