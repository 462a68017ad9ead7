"""Parquet position-delete files for format-v2 tables (Iceberg spec: "Position Delete Files").

A position-delete file is a Parquet file with rows ``(file_path, pos)`` sorted by file path then
position; columns carry the reserved field ids ``2147483546 file_path`` (string, required) and
``2147483545 pos`` (long, required). Here every file holds the deletes of exactly one data file (the
whole merged set), so its metrics bound ``file_path`` to that one path: readers then apply it to that
data file only.

Codec only: ``encode_position_deletes`` returns bytes and ``decode_position_deletes`` takes bytes.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.types import LongType, StringType
from pyroaring import BitMap64

from .manifest import new_data_file

FILE_PATH_FIELD_ID = 2147483546
POS_FIELD_ID = 2147483545

POSITION_DELETE_ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            "file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_FIELD_ID).encode()}
        ),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_FIELD_ID).encode()}),
    ]
)


def encode_position_deletes(data_file_path: str, positions: BitMap64) -> bytes:
    """A whole position-delete Parquet file for one data file's ``positions`` (row ordinals, from 0)."""
    if len(positions) == 0:
        raise ValueError(f"position deletes: refusing to write an empty delete file for {data_file_path}")
    pos = pa.array(positions.to_array() if hasattr(positions, "to_array") else list(positions), type=pa.int64())
    table = pa.table(
        {"file_path": pa.array([data_file_path] * len(pos), pa.string()), "pos": pos},
        schema=POSITION_DELETE_ARROW_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_position_deletes(data: bytes, data_file_path: str | None = None) -> dict[str, BitMap64]:
    """Positions per data file path in a position-delete Parquet file (only ``data_file_path`` if given).

    Raises ``ValueError`` if the bytes are not Parquet or lack the ``file_path``/``pos`` columns.
    """
    try:
        table = pq.read_table(pa.BufferReader(data), columns=["file_path", "pos"])
    except (pa.ArrowInvalid, KeyError) as e:
        raise ValueError(f"position deletes: expected Parquet with columns file_path, pos: {e}") from None
    out: dict[str, BitMap64] = {}
    paths = table.column("file_path").to_pylist()
    positions = table.column("pos").to_pylist()
    for path, p in zip(paths, positions):
        if data_file_path is not None and path != data_file_path:
            continue
        out.setdefault(path, BitMap64()).add(p)
    return out


def position_delete_data_file(
    location: str, file_size_in_bytes: int, data_file_path: str, positions: BitMap64
) -> DataFile:
    """The v2 ``data_file`` record (content POSITION_DELETES) of a file made by ``encode_position_deletes``.

    ``record_count`` = number of deleted positions; bounds on ``file_path`` (both = ``data_file_path``)
    and ``pos`` as the spec's metrics rule for delete files asks.
    """
    return new_data_file(
        2,
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        record_count=len(positions),
        file_size_in_bytes=file_size_in_bytes,
        value_counts={FILE_PATH_FIELD_ID: len(positions), POS_FIELD_ID: len(positions)},
        null_value_counts={FILE_PATH_FIELD_ID: 0, POS_FIELD_ID: 0},
        lower_bounds={
            FILE_PATH_FIELD_ID: to_bytes(StringType(), data_file_path),
            POS_FIELD_ID: to_bytes(LongType(), positions.min()),
        },
        upper_bounds={
            FILE_PATH_FIELD_ID: to_bytes(StringType(), data_file_path),
            POS_FIELD_ID: to_bytes(LongType(), positions.max()),
        },
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
    )
