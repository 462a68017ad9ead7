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

from pyiceberg.io.fsspec import FsspecFileIO

from .stores import AZURE_SCHEMES, GCS_SCHEMES, config_from_properties


def kind_of_scheme(scheme: str) -> str | None:
    """``"s3"``/``"gcs"``/``"azure"`` for a URI scheme, None otherwise (local files)."""
    s = scheme.lower()
    if s in ("s3", "s3a", "s3n"):
        return "s3"
    if s in GCS_SCHEMES:
        return "gcs"
    if s in AZURE_SCHEMES:
        return "azure"
    return None


class MooncakeFileIO(FsspecFileIO):
    """``FsspecFileIO`` whose object-store filesystems come from ``config_from_properties(kind, props)``."""

    def __init__(self, properties):
        super().__init__(properties)
        for s in AZURE_SCHEMES:  # az:// and wasb(s):// as well as abfs(s)://
            self._scheme_to_fs.setdefault(s, None)

    def _get_fs(self, scheme: str, hostname: str | None = None):
        kind = kind_of_scheme(scheme)
        if kind is None:
            return super()._get_fs(scheme, hostname)
        return config_from_properties(kind, self.properties).filesystem()

    def _get_fs_from_uri(self, uri, location: str = ""):
        if kind_of_scheme(uri.scheme or "") == "azure":
            return self.get_fs(uri.scheme, None)  # the account comes from the properties
        return super()._get_fs_from_uri(uri, location)
