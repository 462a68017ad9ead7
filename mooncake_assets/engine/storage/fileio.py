"""PyIceberg's ``FsspecFileIO`` with the warehouse's filesystems built here (``stores.py``).

``make_catalog`` passes ``py-io-impl = mooncake_assets.engine.storage.fileio.MooncakeFileIO`` with the
store's properties, so every Iceberg read and write (metadata JSON, manifests, data files, Puffin) goes
through fsspec: ``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, ``adlfs`` for ``abfs://``/``abfss://``/
``az://``. What differs from PyIceberg's own ``FsspecFileIO`` (which reads the same ``s3.*``/``gcs.*``/
``adls.*`` properties): the filesystem of each store is the one the union reader and the warehouse check
use (``StoreConfig.filesystem()``: timeouts, no listing cache, gcsfs's core filesystem for emulators),
and ``az://`` is accepted as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.io.fsspec import FsspecFileIO

from .stores import config_from_properties, kind_of_scheme

if TYPE_CHECKING:
    from urllib.parse import ParseResult

    from fsspec import AbstractFileSystem


class MooncakeFileIO(FsspecFileIO):
    """``FsspecFileIO`` whose object-store filesystems come from ``config_from_properties(kind, props)``
    (every scheme :func:`~.stores.kind_of_scheme` knows, ``az://`` and ``wasb(s)://`` included: they
    never reach PyIceberg's own scheme table)."""

    def _get_fs(self, scheme: str, hostname: str | None = None) -> AbstractFileSystem:
        kind = kind_of_scheme(scheme)
        if kind is None:
            return super()._get_fs(scheme, hostname)
        return config_from_properties(kind, self.properties).filesystem()

    def _get_fs_from_uri(self, uri: ParseResult, location: str = "") -> AbstractFileSystem:
        if kind_of_scheme(uri.scheme or "") == "azure":
            return self.get_fs(uri.scheme, None)  # the account comes from the properties
        return super()._get_fs_from_uri(uri, location)
