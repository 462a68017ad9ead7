"""Every use of PyIceberg's and SQLAlchemy's internals, behind small functions, for the versions checked.

The Iceberg side of a mirror writes format-v3 tables, which PyIceberg 0.12 reads but does not write
(its writers stop at v2, ``TableMetadataV3.model_dump_json`` raises). To write them anyway we lean on
parts of PyIceberg that are not its public API; each such part is used here and nowhere else:

=============================================  =====================================================
``Catalog._convert_schema_if_needed``          Arrow schema -> Iceberg schema (``iceberg_schema``)
``Table(identifier=…, metadata=…, …)``          a table object at a metadata we committed (``table_at``)
``update_table_metadata``                      apply metadata updates as ``commit_table`` does
                                               (``apply_updates``: snapshot log, ``next-row-id``)
``IcebergBaseModel.model_dump_json``           v3 metadata JSON past the v3 guard (``metadata_json``)
``IcebergTables`` (ORM row), ``SqlCatalog``      the compare-and-swap of the SQL catalog's pointer
``.engine``, SQLAlchemy ``Session``/``update``  (``swap_sql_pointer``, ``SQL_CATALOG_ERRORS``)
``from_args(_table_format_version=…)``          manifest records in the v3 layout (``record``)
``AvroFile`` / ``AvroOutputFile``,              manifests and manifest lists in the v3 Avro schemas
``MANIFEST_ENTRY_SCHEMAS[3]`` & co.             (``read_avro``, ``write_avro``, the schema tables)
``pyiceberg.io.pyarrow`` statistics helpers    ``data_file`` metrics from a Parquet footer
                                               (``parquet_statistics``)
=============================================  =====================================================

(``storage/fileio.py`` overrides ``FsspecFileIO._get_fs``/``_get_fs_from_uri``; it sits
below this package, so it keeps them, and the test below pins them too.)

Version gate: importing this module checks the installed versions against ``PYICEBERG_RANGE`` and
``SQLALCHEMY_RANGE`` (the ranges ``pyproject.toml`` pins, where the behaviour relied on was verified)
and raises ``UnsupportedLibraryVersion`` outside them; ``MOONCAKE_UNCHECKED_LIBRARIES=1`` turns that into
a warning, to run ``tests/engine/test_iceberg_compat.py`` against a new release — that test fails, naming
the behaviour, when a release changes something relied on here. Then widen the range.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from enum import Enum
from importlib.metadata import version as _installed_version
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.avro.codecs import AVRO_CODEC_KEY
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DATA_FILE_TYPE, MANIFEST_ENTRY_SCHEMAS, MANIFEST_LIST_FILE_SCHEMAS
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableUpdate, update_table_metadata
from pyiceberg.typedef import IcebergBaseModel
from sqlalchemy import update
from sqlalchemy.exc import NoResultFound, SQLAlchemyError
from sqlalchemy.orm import Session

__all__ = [
    "AVRO_CODEC_KEY",
    "DATA_FILE_TYPE",
    "MANIFEST_ENTRY_SCHEMAS",
    "MANIFEST_LIST_FILE_SCHEMAS",
    "PYICEBERG_RANGE",
    "SQLALCHEMY_RANGE",
    "SQL_CATALOG_ERRORS",
    "UnsupportedLibraryVersion",
    "apply_updates",
    "check_versions",
    "iceberg_schema",
    "is_rest_catalog",
    "is_sql_catalog",
    "metadata_json",
    "parquet_column_ids",
    "parquet_statistics",
    "read_avro",
    "record",
    "swap_sql_pointer",
    "table_at",
    "write_avro",
]

PYICEBERG_RANGE = ((0, 12, 0), (0, 13, 0))
"""Installed ``pyiceberg`` must be >= the first and < the second (``pyproject.toml`` pins 0.12.0)."""

SQLALCHEMY_RANGE = ((2, 0, 0), (3, 0, 0))
"""Installed ``sqlalchemy`` must be >= the first and < the second (``pyproject.toml`` pins 2.1.9)."""

ALLOW_UNCHECKED_ENV = "MOONCAKE_UNCHECKED_LIBRARIES"

SQL_CATALOG_ERRORS: tuple[type[BaseException], ...] = (SQLAlchemyError,)
"""What the SQL catalog's driver raises when a statement's outcome is unknown (connection lost mid-commit)."""

R = TypeVar("R")


class UnsupportedLibraryVersion(ImportError):
    """The installed pyiceberg/sqlalchemy is outside the range whose internals this module was checked on."""


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"0.12.0"`` -> (0, 12, 0); ``"0.13.0rc1"`` -> (0, 13, 0) (a pre-release counts as its release)."""
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts + [0] * (3 - len(parts)))


def check_versions(installed: Callable[[str], str] = _installed_version) -> dict[str, str]:
    """Check the installed versions against the ranges; returns ``{distribution: version}``.

    Raises ``UnsupportedLibraryVersion`` (unless ``MOONCAKE_UNCHECKED_LIBRARIES=1``, which warns) when a
    version is outside its range. ``installed``: distribution name -> version text (for tests).
    """
    found = {}
    for dist, (low, high) in (("pyiceberg", PYICEBERG_RANGE), ("sqlalchemy", SQLALCHEMY_RANGE)):
        text = installed(dist)
        found[dist] = text
        if low <= _version_tuple(text) < high:
            continue
        message = (
            f"{dist} {text} is installed; mooncake_assets.engine.iceberg.compat relies on {dist} internals checked "
            f"for >= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}. Run tests/engine/test_iceberg_compat.py "
            f"with {ALLOW_UNCHECKED_ENV}=1 against it, then widen the range in compat.py"
        )
        if os.environ.get(ALLOW_UNCHECKED_ENV) == "1":
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:
            raise UnsupportedLibraryVersion(message)
    return found


check_versions()


# ------------------------------------------------------------------------------------------ schemas


def iceberg_schema(arrow_schema: pa.Schema, format_version: int) -> Schema:
    """The Iceberg schema ``catalog.create_table`` would derive from ``arrow_schema``: non-nullable fields
    required, field ids still unassigned (``new_table_metadata`` assigns 1..n). Through PyIceberg's
    ``Catalog._convert_schema_if_needed``."""
    # PyIceberg types format_version as the Literal TableVersion (1, 2 or 3); this function takes a plain int
    return Catalog._convert_schema_if_needed(arrow_schema, format_version)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ metadata


def table_at(table: Table, metadata: TableMetadata, metadata_location: str, catalog: Catalog) -> Table:
    """A ``Table`` with ``table``'s identifier and FileIO at ``metadata`` (stored at ``metadata_location``):
    the object ``catalog.load_table`` would return right after our own commit, without reloading."""
    return Table(
        identifier=table.name(), metadata=metadata, metadata_location=metadata_location, io=table.io, catalog=catalog
    )


def apply_updates(metadata: TableMetadata, updates: tuple[TableUpdate, ...], metadata_location: str) -> TableMetadata:
    """``updates`` applied to ``metadata`` (read from ``metadata_location``) as ``commit_table`` applies them:
    snapshot and metadata logs, ``last-sequence-number``, v3 ``next-row-id`` advanced by a new snapshot's
    ``added-rows`` (spec "Row Lineage"), ``last-updated-ms``."""
    return update_table_metadata(metadata, updates, metadata_location=metadata_location)


def metadata_json(metadata: TableMetadata) -> bytes:
    """Table metadata as the spec's JSON (Appendix C), for any format version: PyIceberg's own pydantic
    serializer (aliases, ``exclude_none``) past the guard ``TableMetadataV3.model_dump_json`` raises."""
    return IcebergBaseModel.model_dump_json(metadata, exclude_none=True).encode("utf-8")


# ------------------------------------------------------------------------------------------ catalogs


def is_sql_catalog(catalog: Catalog) -> bool:
    """True for PyIceberg's ``SqlCatalog`` (SQLite, Postgres): the catalog whose pointer we swap ourselves."""
    return isinstance(catalog, SqlCatalog)


def is_rest_catalog(catalog: Catalog) -> bool:
    """True for PyIceberg's ``RestCatalog`` (the server writes metadata and swaps the pointer). A
    RestCatalog exists only once its module is imported, so a process that never made one does not pay
    that import (~0.13 s: requests, urllib3) to learn it has none."""
    rest = sys.modules.get("pyiceberg.catalog.rest")
    return rest is not None and isinstance(catalog, rest.RestCatalog)


def swap_sql_pointer(catalog: SqlCatalog, namespace: str, name: str, base_location: str, new_location: str) -> bool:
    """Compare-and-swap the SQL catalog's pointer of ``namespace.name``: ``base_location`` -> ``new_location``.

    One ``UPDATE iceberg_tables SET metadata_location = new, previous_metadata_location = base WHERE …
    AND metadata_location = base`` in its own transaction, on SqlCatalog's own table and engine (on
    dialects without a reliable row count, ``SELECT … FOR UPDATE`` then update, as PyIceberg does).
    Returns False, changing nothing, when the row no longer points at ``base_location`` (or is gone).
    Errors of the driver (``SQL_CATALOG_ERRORS``) propagate: the outcome is then unknown.
    """
    where = (
        IcebergTables.catalog_name == catalog.name,
        IcebergTables.table_namespace == namespace,
        IcebergTables.table_name == name,
        IcebergTables.metadata_location == base_location,
    )
    with Session(catalog.engine) as session:
        if catalog.engine.dialect.supports_sane_rowcount:
            result = session.execute(
                update(IcebergTables)
                .where(*where)
                .values(metadata_location=new_location, previous_metadata_location=base_location)
            )
            # an UPDATE's result is a CursorResult (rowcount); Session.execute is typed as the generic Result
            if result.rowcount < 1:  # type: ignore[attr-defined]
                session.rollback()
                return False
        else:  # pragma: no cover - sqlite and postgres both report row counts
            try:
                row = session.query(IcebergTables).with_for_update(of=IcebergTables).filter(*where).one()
            except NoResultFound:
                return False
            row.metadata_location = new_location
            row.previous_metadata_location = base_location
        session.commit()
    return True


# ------------------------------------------------------------------------------------------ manifests


def record(cls: Callable[..., R], format_version: int, **fields: Any) -> R:
    """A PyIceberg manifest record (``DataFile``, ``ManifestEntry``, ``ManifestFile``) in the positional
    layout of ``format_version`` (v3: the v2 fields plus the v3 ones at the end); missing fields take
    the spec default. Through ``from_args(_table_format_version=…)``."""
    # from_args: a classmethod of PyIceberg's record classes, which Callable[..., R] does not name
    return cast(R, cls.from_args(_table_format_version=format_version, **fields))  # type: ignore[attr-defined]


def read_avro(
    input_file: InputFile,
    schema: Schema,
    read_types: dict[int, Callable[..., Any]],
    read_enums: dict[int, Callable[..., Enum]],
) -> list[Any]:
    """Every record of an Avro file, read with ``schema`` (field ids -> the record classes of
    ``read_types``, the enums of ``read_enums``), through PyIceberg's ``AvroFile``."""
    reader: AvroFile[Any]
    with AvroFile(input_file, schema, read_types=read_types, read_enums=read_enums) as reader:
        return list(reader)


def write_avro(
    output_file: OutputFile, schema: Schema, schema_name: str, metadata: dict[str, str], records: Iterable[Any]
) -> None:
    """Write ``records`` (positional, in ``schema``'s layout) as one Avro block with key-value ``metadata``
    (the codec under ``AVRO_CODEC_KEY``), through PyIceberg's ``AvroOutputFile``."""
    writer: AvroOutputFile[Any]
    with AvroOutputFile(
        output_file=output_file, file_schema=schema, schema_name=schema_name, record_schema=schema, metadata=metadata
    ) as writer:
        writer.write_block(list(records))


def parquet_statistics(
    parquet_metadata: pq.FileMetaData, schema: Schema, table_properties: dict[str, str]
) -> dict[str, Any]:
    """The ``data_file`` metrics (record count, column sizes, value/null/NaN counts, bounds, split offsets)
    of a Parquet footer, as ``DataFile.from_args`` keywords, honouring ``write.metadata.metrics.*``.

    Raises ``KeyError`` for a Parquet column path that does not map to ``schema``, ``OverflowError`` /
    ``ValueError`` for a bound Python cannot hold.
    """
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(schema, table_properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    return stats.to_serialized_dict()


def parquet_column_ids(schema: Schema) -> dict[str, int]:
    """Parquet column path -> Iceberg field id for ``schema`` (how ``parquet_statistics`` matches columns)."""
    return parquet_path_to_id_mapping(schema)
