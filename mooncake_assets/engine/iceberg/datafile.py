"""``data_file`` records for Parquet data files, from the Parquet footer (Iceberg spec: "Manifests",
``data_file`` struct; metrics as in Appendix D single-value serialization).

Record count, file size, column sizes, value/null/NaN counts, lower/upper bounds and split offsets come
from the footer through PyIceberg's own statistics helpers (``compat.parquet_statistics``), honouring the table's
``write.metadata.metrics.*`` properties. Columns are matched to the table schema by name; a Parquet field
id that disagrees with the table's id for that name is an error, because readers resolve columns by id.
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import pyarrow_to_schema, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.typedef import TableVersion

from .compat import parquet_column_ids, parquet_statistics
from .lineage import LINEAGE_FIELD_IDS
from .manifest import new_data_file

PARQUET_FIELD_ID = b"PARQUET:field_id"


def iceberg_arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema to write data files with: the table's columns carrying ``PARQUET:field_id``."""
    return schema_to_pyarrow(schema, include_field_ids=True)


def check_parquet_schema(schema: Schema, parquet_schema: pa.Schema, location: str) -> None:
    """Raise ``ValueError`` if a top-level Parquet column is unknown to ``schema`` or carries another field id."""
    for field in parquet_schema:
        try:
            expected = schema.find_field(field.name).field_id
        except ValueError:
            raise ValueError(
                f"data file {location}: column {field.name!r} is not in the table schema "
                f"(columns: {[f.name for f in schema.fields]})"
            ) from None
        if field.metadata and PARQUET_FIELD_ID in field.metadata:
            found = int(field.metadata[PARQUET_FIELD_ID])
            if found != expected:
                raise ValueError(
                    f"data file {location}: column {field.name!r} has Parquet field id {found}, "
                    f"expected the table's id {expected}"
                )


def data_file_from_parquet_metadata(
    location: str,
    file_size_in_bytes: int,
    parquet_metadata: pq.FileMetaData,
    schema: Schema,
    table_properties: dict[str, str],
    format_version: int,
    known_field_ids: set[int] | None = None,
) -> DataFile:
    """A DATA ``data_file`` record (layout of ``format_version``) for the Parquet file at ``location``.

    ``file_size_in_bytes``: the whole file, bytes. A file whose columns carry ``PARQUET:field_id`` is
    described by its own schema (it may have been written under an older or newer schema of the table:
    schema evolution keeps ids stable, so metrics keyed by id stay right); a file without ids must match
    the table ``schema`` by name. ``known_field_ids``: every field id the table has had or is about to
    have (default: those of ``schema``); the row lineage columns' reserved ids (spec "Reserved Field
    IDs", written by compaction) are always allowed, and left out of the metrics. Raises ``ValueError`` when the columns do not match (see
    ``check_parquet_schema``) or a field id is unknown to the table.
    """
    file_arrow = parquet_metadata.schema.to_arrow_schema()
    if file_arrow and all(f.metadata and PARQUET_FIELD_ID in f.metadata for f in file_arrow):
        known = (known_field_ids if known_field_ids is not None else set(index_by_id(schema))) | LINEAGE_FIELD_IDS
        for f in file_arrow:
            fid = int(f.metadata[PARQUET_FIELD_ID])
            if fid not in known:
                expected = ""
                try:
                    expected = f", expected the table's id {schema.find_field(f.name).field_id}"
                except ValueError:
                    pass
                raise ValueError(
                    f"data file {location}: column {f.name!r} has Parquet field id {fid}, which the "
                    f"table never had{expected}"
                )
        schema = pyarrow_to_schema(file_arrow, format_version=cast(TableVersion, format_version))
    else:
        check_parquet_schema(schema, file_arrow, location)
    mapping = parquet_column_ids(schema)
    try:
        try:
            stats = parquet_statistics(parquet_metadata, schema, table_properties)
        except (OverflowError, ValueError):
            # a bound Python cannot hold (date/timestamp 'infinity' sentinels, years past 9999): keep the
            # counts of those columns and leave their bounds out (no bounds = never pruned, still correct)
            counts_only = {
                f"write.metadata.metrics.column.{schema.find_column_name(mapping[path])}": "counts"
                for path in _unreadable_bounds(parquet_metadata)
                if path in mapping
            }
            stats = parquet_statistics(parquet_metadata, schema, {**table_properties, **counts_only})
    except KeyError as e:
        raise ValueError(f"data file {location}: Parquet column {e} does not map to the table schema") from None
    _drop_lineage_metrics(stats)
    return new_data_file(
        format_version,
        content=DataFileContent.DATA,
        file_path=location,
        file_format=FileFormat.PARQUET,
        file_size_in_bytes=file_size_in_bytes,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **stats,
    )


def data_file_from_parquet(
    io: FileIO,
    location: str,
    schema: Schema,
    table_properties: dict[str, str],
    format_version: int,
    known_field_ids: set[int] | None = None,
) -> DataFile:
    """Like ``data_file_from_parquet_metadata``, reading the footer of ``location`` through ``io``.

    Raises ``FileNotFoundError`` when the file is missing, ``ValueError`` when it is not Parquet or does not
    match the schema.
    """
    input_file = io.new_input(location)
    if not input_file.exists():
        raise FileNotFoundError(f"data file {location} does not exist (upload it with upload_data_file first)")
    with input_file.open() as stream:
        try:
            metadata = pq.read_metadata(stream)
        except pa.ArrowInvalid as e:
            raise ValueError(f"data file {location} is not a Parquet file: {e}") from None
    return data_file_from_parquet_metadata(
        location, len(input_file), metadata, schema, table_properties, format_version, known_field_ids
    )


def _drop_lineage_metrics(stats: dict[str, Any]) -> None:
    """Leave the row lineage columns (reserved ids, not table columns) out of a file's metrics: they are
    about the table's columns, which readers prune and plan with."""
    for value in stats.values():
        if isinstance(value, dict):
            for fid in LINEAGE_FIELD_IDS:
                value.pop(fid, None)


def _unreadable_bounds(parquet_metadata: pq.FileMetaData) -> set[str]:
    """Parquet column paths whose min/max statistics cannot be turned into Python values."""
    bad: set[str] = set()
    for rg in range(parquet_metadata.num_row_groups):
        group = parquet_metadata.row_group(rg)
        for c in range(group.num_columns):
            col = group.column(c)
            st = col.statistics
            if st is None or not st.has_min_max or col.path_in_schema in bad:
                continue
            try:
                _ = (st.min, st.max)  # converting them raises for values Arrow cannot hold
            except (OverflowError, ValueError):
                bad.add(col.path_in_schema)
    return bad
