"""Row lineage of format-v3 tables (Iceberg spec "Row Lineage", "Reserved Field IDs").

Every row of a v3 table has a ``_row_id`` (unique in the table) and a ``_last_updated_sequence_number``.
A file the mirror writes with new rows only (initial copy, flush) stores neither: readers inherit
``_row_id`` = the data file's ``first_row_id`` + the row's position and ``_last_updated_sequence_number``
= the file's data sequence number. A file that *moves* existing rows (compaction) stores both as
columns with the reserved field ids, carrying each row's values from before the move (spec: "When an
existing row is moved to a different data file for any reason ... the row's existing non-null
``_row_id`` must be copied", and an unmodified row keeps its ``_last_updated_sequence_number``).

This module holds the reserved fields and the arithmetic: the Arrow fields to append to a data file's
schema (:func:`lineage_fields`), a batch's values from its source file (:func:`fill_lineage`), and
whether a column is one of them (:func:`is_lineage_field`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROW_ID_FIELD_ID = 2147483540
"""Field id of ``_row_id`` (spec "Reserved Field IDs"), ``long``."""

LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID = 2147483539
"""Field id of ``_last_updated_sequence_number`` (spec "Reserved Field IDs"), ``long``."""

ROW_ID = "_row_id"
LAST_UPDATED_SEQUENCE_NUMBER = "_last_updated_sequence_number"

LINEAGE_FIELD_IDS = frozenset({ROW_ID_FIELD_ID, LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID})

_FIELD_ID_KEY = b"PARQUET:field_id"


@dataclass(frozen=True)
class FileLineage:
    """What a data file's rows inherit (spec "Row Lineage"): ``first_row_id`` (None: the file has no
    row ids, e.g. it was added before a v2→v3 upgrade and no v3 snapshot assigned it one yet) and
    ``sequence_number`` (its data sequence number)."""

    first_row_id: int | None
    sequence_number: int


def lineage_fields() -> list[pa.Field]:
    """The two reserved columns as Arrow fields (``int64``, nullable, with ``PARQUET:field_id``), in the
    order they are appended to a data file's schema."""
    return [
        pa.field(ROW_ID, pa.int64(), nullable=True, metadata={_FIELD_ID_KEY: str(ROW_ID_FIELD_ID).encode()}),
        pa.field(
            LAST_UPDATED_SEQUENCE_NUMBER,
            pa.int64(),
            nullable=True,
            metadata={_FIELD_ID_KEY: str(LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID).encode()},
        ),
    ]


def with_lineage(schema: pa.Schema) -> pa.Schema:
    """``schema`` (a table's Arrow schema with field ids) plus the two lineage columns at the end."""
    return pa.schema(list(schema) + lineage_fields(), metadata=schema.metadata)


def is_lineage_field(field: pa.Field) -> bool:
    """Is ``field`` one of the reserved lineage columns (by its ``PARQUET:field_id``)?"""
    md = field.metadata or {}
    raw = md.get(_FIELD_ID_KEY)
    return raw is not None and int(raw) in LINEAGE_FIELD_IDS


def has_lineage(schema: pa.Schema) -> bool:
    """Does a data file's Arrow schema carry a lineage column?"""
    return any(is_lineage_field(f) for f in schema)


def fill_lineage(batch: pa.RecordBatch, source: FileLineage, start: int) -> pa.RecordBatch:
    """``batch`` (rows ``start``.. of one source file, already in a :func:`with_lineage` layout; its
    lineage columns hold what the source file stored, or NULL) with every NULL lineage value replaced
    by the inherited one: ``_row_id`` = ``source.first_row_id`` + position (left NULL when the file has
    no ``first_row_id``), ``_last_updated_sequence_number`` = ``source.sequence_number``."""
    n = batch.num_rows
    names = batch.schema.names
    i_row, i_seq = names.index(ROW_ID), names.index(LAST_UPDATED_SEQUENCE_NUMBER)
    arrays = list(batch.columns)
    if source.first_row_id is not None and arrays[i_row].null_count:
        inherited = pa.array(np.arange(start, start + n, dtype=np.int64) + np.int64(source.first_row_id))
        arrays[i_row] = pc.coalesce(arrays[i_row], inherited)
    if arrays[i_seq].null_count:
        arrays[i_seq] = pc.coalesce(arrays[i_seq], pa.scalar(source.sequence_number, pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


def live_file_lineage(
    catalog: Any, identifier: str, loaded: Any, format_version: int, locations: Iterable[str]
) -> dict[str, FileLineage]:
    """What the rows of each live data file in ``locations`` inherit in the current snapshot (spec "Row
    Lineage", "First Row ID Inheritance", "Sequence Number Inheritance"): its ``first_row_id`` and data
    sequence number. Empty before format v3 (no lineage). ``loaded`` (a PyIceberg ``Table``, the table as
    loaded last) is looked at first, then ``catalog``'s (not kept) if a location is missing;
    ``ValueError`` names a location still not live. Reads the manifests with a reader of its own and
    leaves ``loaded`` as it is (safe beside a commit in another thread)."""
    from .manifest import data_file_field
    from .snapshots import SnapshotReader

    wanted = list(dict.fromkeys(locations))
    if format_version < 3 or not wanted:
        return {}
    for attempt in (0, 1):
        table = catalog.load_table(identifier) if attempt else loaded
        live = SnapshotReader(identifier).files(table.io, table.metadata, table.metadata.current_snapshot())
        missing = [loc for loc in wanted if loc not in live.data]
        if not missing:
            break
    else:
        raise ValueError(f"{identifier}: data files not in the current snapshot: {missing}")
    out = {}
    for loc in wanted:
        entry = live.data[loc]
        out[loc] = FileLineage(
            data_file_field(entry.entry.data_file, "first_row_id", format_version), entry.sequence_number
        )
    return out
