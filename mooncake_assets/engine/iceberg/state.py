"""What one Iceberg snapshot of a mirrored table holds, as the mirror restores it (``PersistedState``).

Spec sections: "Snapshots" (summary), "Scan Planning" (which deletes apply to a data file), "Manifests"
(``lower_bounds``/``upper_bounds``, Appendix D single-value serialization).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import PrimitiveType
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import read_puffin

from .names import INDEX_BLOB_TYPE, SUMMARY_FLUSH_LSN, SUMMARY_INDEX_FILE
from .snapshots import SnapshotReader, read_all


@dataclass(frozen=True)
class DataFileState:
    """One live data file of a snapshot and the positions deleted in it.

    ``record_count``: rows in the file (deleted ones included). ``file_size_in_bytes``: bytes.
    ``deleted``: row positions (0-based) deleted by the file's applicable DV / position-delete file.
    ``sequence_number``: the file's data sequence number. ``delete_file``: location of the Puffin (v3)
    or Parquet (v2) file holding ``deleted`` (None if nothing is deleted). ``lower_bounds`` /
    ``upper_bounds``: column name -> bound value from the manifest metrics (strings may be truncated
    prefixes, still valid bounds); only primitive columns.
    """

    location: str
    record_count: int
    file_size_in_bytes: int
    deleted: BitMap64
    sequence_number: int = 0
    delete_file: str | None = None
    lower_bounds: dict[str, Any] = field(default_factory=dict)
    upper_bounds: dict[str, Any] = field(default_factory=dict)

    @property
    def live_rows(self) -> int:
        """Rows not deleted."""
        return self.record_count - len(self.deleted)


@dataclass(frozen=True)
class PersistedState:
    """What one Iceberg snapshot of a mirrored table holds.

    ``snapshot_id`` None (and everything empty) for a table without snapshots. ``summary``: the snapshot
    summary as strings, ``operation`` and the ``mooncake.*`` properties included. ``data_files``: location
    -> DataFileState for every live data file. ``index_blob``: the ``mooncake-hash-index-v1`` bytes the
    snapshot references, or None.
    """

    snapshot_id: int | None
    sequence_number: int
    summary: dict[str, str]
    data_files: dict[str, DataFileState]
    index_blob: bytes | None
    metadata_location: str
    format_version: int

    @property
    def flush_lsn(self) -> str | None:
        """``mooncake.flush-lsn`` of the snapshot (Postgres LSN text ``X/Y``), if recorded."""
        return self.summary.get(SUMMARY_FLUSH_LSN)

    @property
    def live_rows(self) -> int:
        return sum(f.live_rows for f in self.data_files.values())


def read_state(reader: SnapshotReader, table: Table, snapshot: Snapshot | None, index: bool = True) -> PersistedState:
    """The ``PersistedState`` of ``snapshot`` of ``table`` (empty for None). ``index`` False: the index
    file is not read (``index_blob`` None; it is about as large as the table's keys). Raises
    ``ValueError`` when the referenced index file has no ``mooncake-hash-index-v1`` blob."""
    md = table.metadata
    fv = md.format_version
    if snapshot is None:
        return PersistedState(None, 0, {}, {}, None, table.metadata_location, fv)
    io = table.io
    snap = reader.files(io, md, snapshot)
    _, by_file = reader.deletes_by_file(io, snap, fv)
    schema = md.schema()
    files = {}
    for location, live in snap.data.items():
        df = live.entry.data_file
        seq = live.sequence_number
        lives = by_file.get(location, [])
        applicable = [entry for entry in lives if entry.sequence_number >= seq]
        files[location] = DataFileState(
            location=location,
            record_count=df.record_count,
            file_size_in_bytes=df.file_size_in_bytes,
            deleted=reader.deleted(io, lives, location, fv, seq),
            sequence_number=seq,
            delete_file=applicable[-1].entry.data_file.file_path if applicable else None,
            lower_bounds=_decode_bounds(schema, df.lower_bounds),
            upper_bounds=_decode_bounds(schema, df.upper_bounds),
        )
    summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
    if snapshot.summary:
        summary["operation"] = snapshot.summary.operation.value
    return PersistedState(
        snapshot_id=snapshot.snapshot_id,
        sequence_number=snapshot.sequence_number or 0,
        summary=summary,
        data_files=files,
        index_blob=_index_blob(table, summary.get(SUMMARY_INDEX_FILE), reader.identifier) if index else None,
        metadata_location=table.metadata_location,
        format_version=fv,
    )


def _index_blob(table: Table, location: str | None, identifier: str) -> bytes | None:
    if not location:
        return None
    puffin = read_puffin(read_all(table.io, location))
    blobs = [b for b in puffin.blobs if b.type == INDEX_BLOB_TYPE]
    if not blobs:
        raise ValueError(f"{identifier}: index file {location} has no {INDEX_BLOB_TYPE} blob")
    return puffin.blob_data(blobs[0])


def _decode_bounds(schema: Schema, bounds: dict[int, bytes] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field_id, raw in (bounds or {}).items():
        try:
            f = schema.find_field(field_id)
        except ValueError:
            continue
        if isinstance(f.field_type, PrimitiveType):
            try:
                out[f.name] = from_bytes(f.field_type, raw)
            except Exception:
                continue
    return out
