"""Other engines reading a persisted mirror: the Iceberg readers of ``mooncake verify --reader``.

Each reader is given the mirror's PyIceberg ``Table`` (loaded from the catalog; its
``metadata_location`` is the current snapshot's metadata JSON) and returns every live row of the
current snapshot as a ``pyarrow.Table`` (column order and Arrow types as the engine produces them;
``verify`` compares them with the source as multisets):

- ``pyiceberg``: PyIceberg's own scan (``Table.scan().to_arrow()``);
- ``duckdb-iceberg``: DuckDB's ``iceberg`` extension (``iceberg_scan`` over the metadata JSON);
- ``iceberg-rust``: Apache iceberg-rust through its Python bindings ``pyiceberg-core``, scanned by
  DataFusion (``pyiceberg_core.datafusion.IcebergDataFusionTable`` registered in a
  ``datafusion.SessionContext``; ``pyiceberg-core`` 0.11 speaks the FFI of ``datafusion`` 54, and a
  ``datafusion`` 55 is refused);
- ``polars``: ``polars.scan_iceberg`` with its native reader, the scan planned by the ``polars-iceberg``
  plugin (what ``pip install 'polars[iceberg]'`` brings; without it polars plans through PyIceberg).

Which engines apply Iceberg v3 deletion vectors (Puffin ``deletion-vector-v1`` blobs, Iceberg spec
"Deletion Vectors") and which need v2 position-delete files (``create-table --delete-format
position-deletes``) is the reader-compatibility table of README.md ("Reading the mirrors with other
engines"), kept true by tests/integration/test_readers.py.

A reader whose library is not importable raises ``ReaderUnavailable`` with one line naming what to
install (the ``readers`` extra of pyproject.toml: ``pip install 'mooncake-assets[readers]'``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa


class ReaderUnavailable(RuntimeError):
    """A reader's library is not importable here (the message says what to install)."""


@dataclass(frozen=True)
class Reader:
    name: str
    modules: tuple[str, ...]  # imported by ``require`` before reading
    install: str  # what to install when one of them is missing
    read: Callable[[Any, Any], pa.Table]  # (PyIceberg Table, StoreConfig | None) -> rows


def _read_pyiceberg(tbl: Any, store: Any) -> pa.Table:
    return tbl.scan().to_arrow()


def _read_duckdb(tbl: Any, store: Any) -> pa.Table:
    from .engine.storage import configure_duckdb_store, sql_str
    from .engine.storage.duckdb_ext import connect_with_iceberg

    con = connect_with_iceberg()
    try:
        configure_duckdb_store(con, store)  # httpfs for s3://, gcsfs/adlfs for gs://, abfs://
        return con.execute(f"SELECT * FROM iceberg_scan({sql_str(tbl.metadata_location)})").to_arrow_table()
    finally:
        con.close()


def _read_iceberg_rust(tbl: Any, store: Any) -> pa.Table:
    """iceberg-rust's scan (pyiceberg-core) run by DataFusion. The FileIO properties are PyIceberg's
    (``s3.endpoint``, ``s3.access-key-id``, ...: iceberg-rust reads the same keys)."""
    from datafusion import SessionContext
    from pyiceberg_core.datafusion import IcebergDataFusionTable

    _local_or_s3_only("iceberg-rust", store)
    props = {k: str(v) for k, v in tbl.io.properties.items() if not k.startswith(("py-", "mooncake."))}
    if store is not None and store.kind == "s3" and store.use_path_style:
        props["s3.path-style-access"] = "true"  # iceberg-rust's key (PyIceberg's is s3.force-virtual-addressing)
    provider = IcebergDataFusionTable(
        identifier=list(tbl.name()), metadata_location=tbl.metadata_location, file_io_properties=props
    )
    ctx = SessionContext()
    ctx.register_table("mirror", provider)
    return ctx.sql("SELECT * FROM mirror").to_arrow_table()


def _local_or_s3_only(reader: str, store: Any) -> None:
    """Refuse warehouses this module does not hand to ``reader`` yet (gs://, abfs://): better one clear error
    than a reader that falls back to the cloud's public endpoint."""
    if store is not None and store.kind != "s3":
        raise ReaderUnavailable(f"reader {reader!r} reads local and s3:// warehouses only, not {store.kind}")


def _read_polars(tbl: Any, store: Any) -> pa.Table:
    """polars' scan with the table's FileIO properties as its storage options (polars maps PyIceberg's
    ``s3.*`` keys to object_store's); for S3 also path-style addressing and plain HTTP as configured."""
    import polars as pl

    _local_or_s3_only("polars", store)
    opts: dict[str, str] | None = None
    if store is not None:
        opts = {k: str(v) for k, v in tbl.io.properties.items() if not k.startswith(("py-", "mooncake."))}
        opts["s3.force-virtual-addressing"] = "false" if store.use_path_style else "true"
        if store.http_allowed:
            opts["allow_http"] = "true"
    return pl.scan_iceberg(tbl, reader_override="native", storage_options=opts).collect().to_arrow()


_EXTRA = "pip install 'mooncake-assets[readers]'"

READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        Reader("pyiceberg", ("pyiceberg",), "pyiceberg (a dependency of mooncake-assets)", _read_pyiceberg),
        Reader(
            "duckdb-iceberg",
            ("duckdb",),
            "duckdb-extension-iceberg and duckdb-extension-avro (the test extra)",
            _read_duckdb,
        ),
        Reader(
            "iceberg-rust",
            ("pyiceberg_core.datafusion", "datafusion"),
            f"{_EXTRA} (pyiceberg-core, datafusion<55)",
            _read_iceberg_rust,
        ),
        Reader("polars", ("polars", "polars_iceberg"), f"{_EXTRA} (polars-iceberg)", _read_polars),
    )
}


def require(name: str) -> Reader:
    """The reader called ``name`` with its libraries imported.

    Raises ``ValueError`` for an unknown name and ``ReaderUnavailable`` (one line: what to install)
    when a library it needs cannot be imported."""
    reader = READERS.get(name)
    if reader is None:
        raise ValueError(f"unknown reader {name!r}; choose one of union, {', '.join(READERS)}")
    for module in reader.modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ReaderUnavailable(
                f"reader {name!r} needs {reader.install}: cannot import {module} ({str(e).splitlines()[0]})"
            ) from None
    return reader


def read_mirror(name: str, tbl: Any, store: Any = None) -> pa.Table:
    """Every live row of PyIceberg table ``tbl``'s current snapshot read by reader ``name``
    (``store``: the warehouse's ``StoreConfig`` or None for a local one). Raises as ``require``."""
    return require(name).read(tbl, store)
