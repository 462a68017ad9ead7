"""Manifests and manifest lists in the format-v2 and format-v3 Avro schemas (Iceberg spec: "Manifests",
"Manifest Lists", "Sequence Number Inheritance", "First Row ID Inheritance", "First Row ID Assignment").

PyIceberg 0.12 defines the v3 ``manifest_entry``/``data_file``/``manifest_file`` schemas
(``MANIFEST_ENTRY_SCHEMAS[3]``, ``DATA_FILE_TYPE[3]``, ``MANIFEST_LIST_FILE_SCHEMAS[3]``) but its writers
stop at v2 and its readers project everything onto v2 (dropping ``first_row_id``,
``referenced_data_file``, ``content_offset``, ``content_size_in_bytes``). This module drives PyIceberg's
own Avro writer/reader (``AvroOutputFile``/``AvroFile``, through ``compat.py``) and records (``ManifestEntry``, ``DataFile``,
``ManifestFile``) with the schema of the table's format version, so v3 fields are written and read.

Records keep PyIceberg's positional layout: a v3 ``data_file`` is the v2 one plus, at the end,
``first_row_id`` (142), ``referenced_data_file`` (143), ``content_offset`` (144) and
``content_size_in_bytes`` (145); a v3 ``manifest_file`` is the v2 one plus ``first_row_id`` (520).
The helpers ``data_file_field``/``set_data_file_field`` address fields by spec name.

Only unpartitioned tables are supported (mirrors are unpartitioned): the ``partition`` struct is empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from pydantic_core import to_json
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record

from .compat import (
    AVRO_CODEC_KEY,
    DATA_FILE_TYPE,
    MANIFEST_ENTRY_SCHEMAS,
    MANIFEST_LIST_FILE_SCHEMAS,
    read_avro,
    record,
    write_avro,
)

AVRO_CODEC = "deflate"  # what PyIceberg and Iceberg Java write by default ("gzip" maps to Avro deflate)

_DATA_FILE_POS = {fv: {f.name: i for i, f in enumerate(DATA_FILE_TYPE[fv].fields)} for fv in (2, 3)}
_MANIFEST_FILE_POS = {fv: {f.name: i for i, f in enumerate(MANIFEST_LIST_FILE_SCHEMAS[fv].fields)} for fv in (2, 3)}


def check_format_version(format_version: int) -> None:
    """Raise ``ValueError`` unless ``format_version`` is 2 or 3 (the versions written here)."""
    if format_version not in (2, 3):
        raise ValueError(f"manifest: expected table format version 2 or 3, found {format_version}")


def data_file_field(data_file: DataFile, name: str, format_version: int) -> Any:
    """A ``data_file`` field by its spec name (e.g. ``"referenced_data_file"``); None if the version lacks it."""
    pos = _DATA_FILE_POS[format_version].get(name)
    if pos is None or pos >= len(data_file):
        return None
    return data_file[pos]


def set_data_file_field(data_file: DataFile, name: str, value: Any, format_version: int) -> None:
    """Set a ``data_file`` field by its spec name; raises ``KeyError`` if the version has no such field."""
    data_file[_DATA_FILE_POS[format_version][name]] = value


def manifest_file_first_row_id(manifest: ManifestFile, format_version: int) -> int | None:
    """The manifest list's ``first_row_id`` (field 520, v3) of ``manifest``; None before v3."""
    pos = _MANIFEST_FILE_POS[format_version].get("first_row_id")
    return None if pos is None or pos >= len(manifest) else manifest[pos]


def new_data_file(format_version: int, **fields: Any) -> DataFile:
    """A ``DataFile`` record in the layout of ``format_version``; missing fields take the spec default."""
    check_format_version(format_version)
    fields.setdefault("partition", Record())
    df = record(DataFile, format_version, **fields)
    df.spec_id = 0
    return df


def entry_schema(format_version: int) -> Schema:
    """The ``manifest_entry`` Avro schema of an unpartitioned table for ``format_version``."""
    check_format_version(format_version)
    return MANIFEST_ENTRY_SCHEMAS[format_version]


@dataclass
class ManifestInfo:
    """A manifest as listed in a manifest list, with the values its entries inherit (spec: manifest_file).

    ``first_row_id``: field 520 (v3 data manifests); None for delete manifests and before v3.
    """

    record: ManifestFile
    first_row_id: int | None

    @property
    def path(self) -> str:
        return self.record.manifest_path

    @property
    def content(self) -> ManifestContent:
        return self.record.content

    @property
    def live_files(self) -> int:
        return (self.record.added_files_count or 0) + (self.record.existing_files_count or 0)


def read_manifest_list(io: FileIO, location: str, format_version: int) -> list[ManifestInfo]:
    """Read a manifest list (Avro) with the ``manifest_file`` schema of ``format_version``."""
    check_format_version(format_version)
    records = read_avro(
        io.new_input(location),
        MANIFEST_LIST_FILE_SCHEMAS[format_version],
        read_types={-1: ManifestFile, 508: PartitionFieldSummary},
        read_enums={517: ManifestContent},
    )
    return [ManifestInfo(r, manifest_file_first_row_id(r, format_version)) for r in records]


def read_manifest_entries(io: FileIO, manifest: ManifestInfo, format_version: int) -> list[ManifestEntry]:
    """All entries of a manifest (DELETED ones included), with inherited values filled in.

    Inheritance (spec "Sequence Number Inheritance", "First Row ID Inheritance"): a null
    ``snapshot_id`` takes the manifest's ``added_snapshot_id``; null sequence numbers of ADDED entries
    take the manifest's ``sequence_number``; in a v3 data manifest with a ``first_row_id``, a null
    ``first_row_id`` becomes the manifest's ``first_row_id`` plus the record counts of the preceding
    data files that also had a null ``first_row_id``.
    """
    check_format_version(format_version)
    entries = read_avro(
        io.new_input(manifest.path),
        entry_schema(format_version),
        read_types={-1: ManifestEntry, 2: DataFile},
        read_enums={0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
    )
    rec = manifest.record
    next_row_id = manifest.first_row_id
    for entry in entries:
        if entry.snapshot_id is None:
            entry.snapshot_id = rec.added_snapshot_id
        if entry.status == ManifestEntryStatus.ADDED:
            if entry.sequence_number is None:
                entry.sequence_number = rec.sequence_number
            if entry.file_sequence_number is None:
                entry.file_sequence_number = rec.sequence_number
        entry.data_file.spec_id = rec.partition_spec_id
        if format_version >= 3 and rec.content == ManifestContent.DATA and next_row_id is not None:
            if data_file_field(entry.data_file, "first_row_id", format_version) is None:
                set_data_file_field(entry.data_file, "first_row_id", next_row_id, format_version)
                next_row_id += entry.data_file.record_count
    return entries


def _manifest_metadata(
    format_version: int, schema: Schema, spec: PartitionSpec, content: ManifestContent
) -> dict[str, str]:
    # Avro key-value metadata, spec "Manifest Metadata" (v2/v3: all keys required).
    return {
        "schema": schema.model_dump_json(),
        "schema-id": str(schema.schema_id),
        "partition-spec": to_json(spec.fields).decode("utf-8"),
        "partition-spec-id": str(spec.spec_id),
        "format-version": str(format_version),
        "content": "data" if content == ManifestContent.DATA else "deletes",
        AVRO_CODEC_KEY: AVRO_CODEC,
    }


def write_manifest(
    io: FileIO,
    location: str,
    *,
    format_version: int,
    schema: Schema,
    spec: PartitionSpec,
    content: ManifestContent,
    snapshot_id: int,
    sequence_number: int,
    entries: Iterable[ManifestEntry],
) -> ManifestInfo:
    """Write one manifest (Avro) and return its manifest-list record.

    ``entries``: records in the ``format_version`` layout. ADDED entries of this snapshot may leave
    ``snapshot_id``, both sequence numbers and (v3 data files) ``first_row_id`` null: they are inherited.
    EXISTING and DELETED entries must carry both sequence numbers, as the spec requires (``ValueError``
    otherwise), and should carry their inherited ``first_row_id``; a data file still without one (from
    before v3) is assigned one through this manifest's ``first_row_id``. ``sequence_number``: the
    snapshot's, used for the list record (``sequence_number``, ``min_sequence_number``). The returned
    ``first_row_id`` is None: it is assigned when the manifest list is written.
    """
    check_format_version(format_version)
    entries = list(entries)
    if not entries:
        raise ValueError("manifest: refusing to write an empty manifest")
    counts = {s: [0, 0] for s in ManifestEntryStatus}
    min_seq: int | None = None
    for e in entries:
        if e.status != ManifestEntryStatus.ADDED:
            if e.sequence_number is None or e.file_sequence_number is None:
                raise ValueError(
                    f"manifest: {e.status.name} entry for {e.data_file.file_path} must carry its sequence numbers, "
                    f"found sequence_number={e.sequence_number} file_sequence_number={e.file_sequence_number}"
                )
        counts[e.status][0] += 1
        counts[e.status][1] += e.data_file.record_count
        if e.status != ManifestEntryStatus.DELETED:
            seq = e.sequence_number if e.sequence_number is not None else sequence_number
            min_seq = seq if min_seq is None else min(min_seq, seq)
    write_avro(
        io.new_output(location),
        entry_schema(format_version),
        "manifest_entry",
        _manifest_metadata(format_version, schema, spec, content),
        entries,
    )
    manifest_length = len(io.new_input(location))
    list_record = record(
        ManifestFile,
        format_version,
        manifest_path=location,
        manifest_length=manifest_length,
        partition_spec_id=spec.spec_id,
        content=content,
        sequence_number=sequence_number,
        min_sequence_number=min_seq if min_seq is not None else sequence_number,
        added_snapshot_id=snapshot_id,
        added_files_count=counts[ManifestEntryStatus.ADDED][0],
        existing_files_count=counts[ManifestEntryStatus.EXISTING][0],
        deleted_files_count=counts[ManifestEntryStatus.DELETED][0],
        added_rows_count=counts[ManifestEntryStatus.ADDED][1],
        existing_rows_count=counts[ManifestEntryStatus.EXISTING][1],
        deleted_rows_count=counts[ManifestEntryStatus.DELETED][1],
        partitions=[],
        key_metadata=None,
    )
    return ManifestInfo(list_record, None)


def unassigned_row_count(
    io: FileIO, manifest: ManifestInfo, format_version: int, entries: list[ManifestEntry] | None
) -> int:
    """Rows of data files in ``manifest`` that will inherit a ``first_row_id`` (spec "First Row ID Assignment").

    ``entries``: the entries as written (before inheritance), when known; otherwise the upper bound
    ``added_rows_count + existing_rows_count`` is used, which the spec allows.
    """
    if entries is None:
        return (manifest.record.added_rows_count or 0) + (manifest.record.existing_rows_count or 0)
    return sum(
        e.data_file.record_count
        for e in entries
        if data_file_field(e.data_file, "first_row_id", format_version) is None
    )


def write_manifest_list(
    io: FileIO,
    location: str,
    *,
    format_version: int,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int,
    first_row_id: int | None,
    manifests: list[tuple[ManifestInfo, int]],
) -> int:
    """Write a snapshot's manifest list (Avro); returns the number of row ids assigned (v3 ``added-rows``).

    ``manifests``: (manifest, rows that will inherit a ``first_row_id`` in it). In v3, every data
    manifest without a ``first_row_id`` gets one, counting up from ``first_row_id`` (the snapshot's
    ``first-row-id``) by those rows (spec "First Row ID Assignment"); existing manifests keep theirs;
    delete manifests keep null. Before v3 ``first_row_id`` must be None.
    """
    check_format_version(format_version)
    if format_version < 3 and first_row_id is not None:
        raise ValueError(f"manifest list: first_row_id is a v3 field, found {first_row_id} for v{format_version}")
    if format_version >= 3 and first_row_id is None:
        raise ValueError("manifest list: a v3 snapshot needs its first-row-id")
    records = []
    next_row_id = first_row_id
    pos = _MANIFEST_FILE_POS[format_version].get("first_row_id")
    for info, unassigned_rows in manifests:
        rec = info.record
        if format_version >= 3 and rec.content == ManifestContent.DATA and info.first_row_id is None:
            rec = ManifestFile(*(rec[i] for i in range(len(rec))))  # a copy: the base's record stays as read
            # v3: the layout has first_row_id and the snapshot's first-row-id was checked above
            assert pos is not None and next_row_id is not None
            rec[pos] = next_row_id
            info.first_row_id = next_row_id
            next_row_id += unassigned_rows
        records.append(rec)
    meta = {
        "snapshot-id": str(snapshot_id),
        "parent-snapshot-id": str(parent_snapshot_id) if parent_snapshot_id is not None else "null",
        "sequence-number": str(sequence_number),
        "format-version": str(format_version),
        AVRO_CODEC_KEY: AVRO_CODEC,
    }
    if format_version >= 3:
        meta["first-row-id"] = str(first_row_id)
    write_avro(io.new_output(location), MANIFEST_LIST_FILE_SCHEMAS[format_version], "manifest_file", meta, records)
    return 0 if first_row_id is None else cast(int, next_row_id) - first_row_id  # counted up from it
