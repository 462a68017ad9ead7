"""The files a commit writes besides manifests: deletion vectors, v2 position-delete files, the index.

Spec sections: "Deletion Vectors" and the Puffin spec's ``deletion-vector-v1`` blob (v3: a DV's
``data_file`` record names its data file in ``referenced_data_file`` and its blob by
``content_offset``/``content_size_in_bytes``), "Position Delete Files" (v2). The mooncake hash index is
a Puffin file of one ``mooncake-hash-index-v1`` blob, referenced from the snapshot summary only.

Every location written is appended to the caller's ``written`` list before the file is created, so a
failed commit knows what to clean up (``SnapshotProducer.written``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.locations import LocationProvider
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import PuffinBlob, deletion_vector_blob, write_puffin

from .manifest import new_data_file
from .names import CREATED_BY, INDEX_BLOB_TYPE
from .position_deletes import encode_position_deletes, position_delete_data_file

Remember = Callable[[str, "int | None", str, BitMap64], None]
"""``(delete file location, content offset or None, data file, positions)``: cache what was just written."""


def _write(io: FileIO, location: str, data: bytes, written: list[str]) -> None:
    written.append(location)
    with io.new_output(location).create(overwrite=False) as out:
        out.write(data)


def write_deletion_vectors(
    io: FileIO,
    provider: LocationProvider,
    sets: dict[str, BitMap64],
    snapshot_id: int,
    written: list[str],
    remember: Remember,
) -> list[DataFile]:
    """v3: one Puffin file ``data/<snapshot>-<uuid>-deletes.puffin`` per data file of ``sets`` (data file
    location -> its whole delete set), holding its ``deletion-vector-v1`` blob. Returns the DV records,
    in the order of the sorted data file locations.

    The spec allows several DV blobs in one Puffin file, but DuckDB's iceberg extension (1.5.5) applied
    the wrong positions to such files (seen here: 99,378 rows instead of 100,000), so every reader gets
    the simplest layout.
    """
    records = []
    for target in sorted(sets):
        data, metas = write_puffin([deletion_vector_blob(target, sets[target])], {"created-by": CREATED_BY})
        meta = metas[0]
        location = provider.new_data_location(f"{snapshot_id}-{uuid.uuid4()}-deletes.puffin")
        _write(io, location, data, written)
        records.append(
            new_data_file(
                3,
                content=DataFileContent.POSITION_DELETES,
                file_path=location,
                file_format=FileFormat.PUFFIN,
                record_count=len(sets[target]),
                file_size_in_bytes=len(data),
                referenced_data_file=target,
                content_offset=meta.offset,
                content_size_in_bytes=meta.length,
                sort_order_id=None,
                equality_ids=None,
                key_metadata=None,
            )
        )
        remember(location, meta.offset, target, sets[target])
    return records


def write_position_delete_files(
    io: FileIO, provider: LocationProvider, sets: dict[str, BitMap64], written: list[str], remember: Remember
) -> list[DataFile]:
    """v2: one Parquet position-delete file ``data/<uuid>-deletes.parquet`` per data file of ``sets``
    (its whole delete set). Returns their records, in the order of the sorted data file locations."""
    records = []
    for target in sorted(sets):
        data = encode_position_deletes(target, sets[target])
        location = provider.new_data_location(f"{uuid.uuid4()}-deletes.parquet")
        _write(io, location, data, written)
        records.append(position_delete_data_file(location, len(data), target, sets[target]))
        remember(location, None, target, sets[target])
    return records


def write_index(
    io: FileIO, table_location: str, blob: bytes, snapshot_id: int, sequence_number: int, written: list[str]
) -> str:
    """Write ``blob`` as the ``mooncake-hash-index-v1`` Puffin file ``index/<snapshot>-<uuid>.puffin``
    under ``table_location``; returns its location (for summary ``mooncake.index-file``)."""
    data, _ = write_puffin(
        [
            PuffinBlob(
                type=INDEX_BLOB_TYPE,
                fields=[],
                data=bytes(blob),
                snapshot_id=snapshot_id,
                sequence_number=sequence_number,
            )
        ],
        {"created-by": CREATED_BY},
    )
    location = f"{table_location.rstrip('/')}/index/{snapshot_id}-{uuid.uuid4()}.puffin"
    _write(io, location, data, written)
    return location
