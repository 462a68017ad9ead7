"""Catalogs and the atomic metadata-pointer swap (Iceberg spec: "Optimistic Concurrency", "Table Metadata",
"Metastore Tables").

Every state change of a mirrored table is one new table-metadata JSON file plus one compare-and-swap of the
catalog's pointer from the metadata file the change was based on to the new one. How the swap is done:

- **format v2, any catalog**: ``catalog.commit_table(table, requirements, updates)``, PyIceberg's own path
  (the SQL catalog writes the JSON and runs ``UPDATE iceberg_tables SET metadata_location = new WHERE
  metadata_location = base``; a REST catalog sends the updates to the server).
- **format v3, SQL catalog (SQLite, Postgres)**: PyIceberg 0.12 refuses to serialize v3 metadata
  (``TableMetadataV3.model_dump_json`` raises) and to upgrade a table past v2. We apply the same update
  objects with PyIceberg's ``update_table_metadata`` (which maintains ``next-row-id``, the snapshot log and
  the metadata log), serialize the v3 metadata ourselves (``metadata_json``), write it as a new file, and
  run the same compare-and-swap statement on the SQL catalog's ``iceberg_tables`` row: the row is updated
  only if its ``metadata_location`` is still the one we read, so a concurrent writer makes the swap fail
  and nothing is lost. Those PyIceberg/SQLAlchemy internals are used through ``compat.py`` only. Table creation writes ``00000-<uuid>.metadata.json`` and inserts the row through
  ``catalog.register_table`` (a primary-key insert: creating twice fails).
- **format v3, REST catalog**: ``commit_table``/``create_table`` as for v2; the server writes the metadata
  and does the swap, so it must support format v3 (Iceberg REST servers since 1.8 do). Not exercised by
  the tests here (no REST server offline).
- **format v3, other catalogs** (Glue, Hive, ...): refused with ``UnsupportedCatalog``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import cast

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.update import TableRequirement, TableUpdate

import mooncake_assets.engine.iceberg.compat as compat

from .. import faults
from .errors import CommitStateUnknown, UnsupportedCatalog

logger = logging.getLogger(__name__)

_METADATA_FILE_RE = re.compile(r"^(\d+)-([0-9a-fA-F-]{36})(?:\.gz)?\.metadata\.json$")


class SwapConflict(Exception):
    """Internal: the pointer had moved; the swap did not happen (the new files are orphans)."""


# an armed ``commit_conflicts`` fault (``engine/faults.py``) loses the pointer race like a concurrent writer
faults.register_conflict("commit:before_swap", SwapConflict)


def normalize_warehouse(warehouse: str) -> str:
    """``s3://…``/``file://…`` as given (no trailing slash); a plain path becomes an absolute ``file://`` URI."""
    if "://" in warehouse:
        return warehouse.rstrip("/")
    return "file://" + os.path.abspath(os.path.expanduser(warehouse))


def make_catalog(uri: str, warehouse: str, name: str = "mooncake", **props: str) -> Catalog:
    """A PyIceberg catalog for ``uri`` with default warehouse ``warehouse``.

    ``uri``: ``sqlite:///relative.db`` / ``sqlite:////abs/path.db`` or ``postgresql://user@host/db``
    (driven through psycopg 3: ``postgresql+psycopg://``) -> ``SqlCatalog``; ``http(s)://…`` ->
    ``RestCatalog``. ``warehouse``: ``file:///dir``, a plain directory path, ``s3://bucket/prefix``,
    ``gs://bucket/prefix`` or ``abfs://container/prefix`` (``az://``, ``abfss://…@account…``).
    ``props``: further catalog/FileIO properties (``StoreConfig.fileio_properties()``); without a
    ``py-io-impl`` the object store's ones come from the environment (``engine/storage/stores.py``): the
    FileIO is PyIceberg's fsspec one (``storage.fileio.MooncakeFileIO``). Raises ``ValueError`` for
    any other URI scheme; ``storage.errors.CatalogUnavailable`` (one line, no password) when a SQL
    catalog's database cannot be reached, refuses the login or cannot hold the catalog's tables.
    """
    wh = normalize_warehouse(warehouse)
    if wh.startswith("file://"):
        Path(wh[len("file://") :]).mkdir(parents=True, exist_ok=True)
    elif "py-io-impl" not in props:  # an object store: FileIO through fsspec, settings of this process
        from ..storage.stores import resolve_store

        cfg = resolve_store(wh)  # s3/gs/abfs endpoint, region/project/account, credentials from the environment
        if cfg is not None:
            props = {**cfg.fileio_properties(), **props}
    if uri.startswith("sqlite:"):
        db = uri.split(":///", 1)[1] if ":///" in uri else ""
        if db and db != ":memory:":
            Path(db).parent.mkdir(parents=True, exist_ok=True)
        return _sql_catalog(uri, name, uri=uri, warehouse=wh, **props)
    for prefix in ("postgresql://", "postgres://"):
        if uri.startswith(prefix):
            return _sql_catalog(uri, name, uri="postgresql+psycopg://" + uri[len(prefix) :], warehouse=wh, **props)
    if uri.startswith("postgresql+"):
        return _sql_catalog(uri, name, uri=uri, warehouse=wh, **props)
    if uri.startswith(("http://", "https://")):
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(name, uri=uri, warehouse=wh, **props)
    raise ValueError(f"catalog: expected a 'sqlite:///…', 'postgresql://…' or 'http(s)://…' URI, found {uri!r}")


def _sql_catalog(given: str, name: str, **props: str) -> SqlCatalog:
    """PyIceberg's ``SqlCatalog``, which connects (to create its tables when they are missing).
    ``given``: the URI as the user wrote it. Raises ``storage.errors.CatalogUnavailable`` when the
    database cannot be reached, refuses the login, or cannot hold the catalog's tables (e.g. no privilege
    to create them): one line (``pg.conninfo.catalog_error``: the URI without its password, the driver's
    reason without SQLAlchemy's link, for a refused login where the catalog's password comes from),
    ``location`` the URI without its password, ``retryable`` only when the server could not be reached."""
    import sqlalchemy.exc

    try:
        return SqlCatalog(name, **props)
    except sqlalchemy.exc.DBAPIError as e:
        from ..pg.conninfo import catalog_error, connect_reason, login_refused, scrub, split_uri_password
        from ..storage.errors import CatalogUnavailable

        connecting = isinstance(e, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError))
        retryable = connecting and not login_refused(connect_reason(e))
        shown = scrub(split_uri_password(given)[0] or given)
        raise CatalogUnavailable(catalog_error(given, e), location=shown, retryable=retryable) from None


def check_catalog_supports(catalog: Catalog, format_version: int) -> None:
    """Raise ``UnsupportedCatalog`` when this module cannot commit ``format_version`` through ``catalog``."""
    if format_version >= 3 and not (compat.is_sql_catalog(catalog) or compat.is_rest_catalog(catalog)):
        raise UnsupportedCatalog(
            f"format v{format_version} tables need a SQL or REST catalog here, found {type(catalog).__name__}; "
            "use delete_format='position-deletes' (format v2) with this catalog"
        )


def uses_own_swap(catalog: Catalog, format_version: int) -> bool:
    """True when commits of this table go through ``write_metadata`` + ``swap_sql_pointer``."""
    return format_version >= 3 and compat.is_sql_catalog(catalog)


metadata_json = compat.metadata_json


def metadata_version(metadata_location: str) -> int:
    """The version prefix of ``…/00042-<uuid>.metadata.json`` (42); -1 when the name has no version."""
    m = _METADATA_FILE_RE.match(metadata_location.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else -1


def new_metadata_location(metadata: TableMetadata, version: int) -> str:
    """Where version ``version`` of the table's metadata JSON goes (honours ``write.metadata.path``)."""
    return load_location_provider(metadata.location, metadata.properties).new_table_metadata_file_location(version)


def write_metadata(table_io: FileIO, metadata: TableMetadata, location: str) -> None:
    """Write ``metadata`` as JSON to ``location`` (must not exist: metadata files are immutable)."""
    with table_io.new_output(location).create(overwrite=False) as out:
        out.write(compat.metadata_json(metadata))


def split_identifier(identifier: str | tuple[str, ...]) -> tuple[str, str]:
    """(namespace as the SQL catalog stores it, table name)."""
    return Catalog.namespace_to_string(Catalog.namespace_from(identifier)), Catalog.table_name_from(identifier)


def swap_sql_pointer(
    catalog: SqlCatalog, identifier: str | tuple[str, ...], base_location: str, new_location: str
) -> None:
    """Compare-and-swap the SQL catalog's pointer: ``base_location`` -> ``new_location`` (one conditional
    ``UPDATE`` of SqlCatalog's ``iceberg_tables`` row, ``compat.swap_sql_pointer``).

    Raises ``SwapConflict`` when the row no longer points at ``base_location`` (or is gone); the driver's
    errors (``compat.SQL_CATALOG_ERRORS``) propagate.
    """
    namespace, name = split_identifier(identifier)
    if not compat.swap_sql_pointer(catalog, namespace, name, base_location, new_location):
        raise SwapConflict(f"{namespace}.{name}: pointer moved away from {base_location}")


def commit_metadata(
    catalog: Catalog,
    table: Table,
    requirements: tuple[TableRequirement, ...],
    updates: tuple[TableUpdate, ...],
    *,
    before_swap: Callable[[str | None], None] | None = None,
) -> tuple[TableMetadata, str]:
    """Apply ``updates`` to ``table`` (as loaded) in one atomic commit; returns (new metadata, its location).

    ``requirements`` are checked against ``table.metadata`` (v3 path) or by the catalog against its current
    metadata (``commit_table`` path). ``before_swap``: test hook called after every file of the commit is
    written and before the pointer swap, with the new metadata location when known here (v3 path), else
    None. Raises ``SwapConflict`` when another writer moved the pointer first (nothing committed),
    ``CommitStateUnknown`` when the catalog cannot tell whether the swap happened, and
    ``CommitFailedException`` from a requirement that no longer holds is mapped to ``SwapConflict`` too.
    """
    if uses_own_swap(catalog, table.format_version):
        for requirement in requirements:
            try:
                requirement.validate(table.metadata)
            except CommitFailedException as e:
                raise SwapConflict(str(e)) from e
        new_metadata = compat.apply_updates(table.metadata, updates, table.metadata_location)
        location = new_metadata_location(new_metadata, metadata_version(table.metadata_location) + 1)
        write_metadata(table.io, new_metadata, location)
        if before_swap is not None:
            before_swap(location)
        try:
            # uses_own_swap above: a SqlCatalog (compat.is_sql_catalog)
            swap_sql_pointer(cast(SqlCatalog, catalog), table.name(), table.metadata_location, location)
        except compat.SQL_CATALOG_ERRORS as e:  # e.g. the connection dropped around COMMIT: outcome unknown
            raise CommitStateUnknown(f"SQL catalog error while swapping the pointer of {table.name()}: {e}") from e
        except SwapConflict:
            try:  # the swap did not happen: the new metadata file is an orphan
                table.io.delete(location)
            except Exception:
                logger.warning("could not delete orphan metadata file %s", location)
            raise
        return new_metadata, location
    check_catalog_supports(catalog, table.format_version)
    if before_swap is not None:
        before_swap(None)
    try:
        response = catalog.commit_table(table, requirements, updates)
    except CommitFailedException as e:
        raise SwapConflict(str(e)) from e
    except CommitStateUnknownException as e:
        raise CommitStateUnknown(f"catalog could not tell whether the commit of {table.name()} happened: {e}") from e
    return response.metadata, response.metadata_location
