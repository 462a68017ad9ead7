"""One commit of a mirrored table, produced in phases that read against the Iceberg table spec (v3).

A ``SnapshotProducer`` turns a ``CommitRequest`` and the table as just loaded (the *base*) into the
files and metadata updates of one new snapshot. ``produce`` runs the phases in order:

1. ``validate`` — the request still fits the base snapshot ("Optimistic Concurrency");
2. ``merge_deletes`` — one delete entry per data file: the new positions merged with the file's
   current DV / position-delete file, which is replaced ("Deletion Vectors", "Scan Planning");
3. ``write_delete_files`` and ``mooncake_properties`` — the DVs (Puffin) or v2 position-delete files,
   and the index Puffin (``writers.py``);
4. ``write_manifests`` — new manifests for added files, untouched manifests carried over, touched
   ones rewritten with EXISTING/DELETED entries, many small ones merged ("Manifests");
5. ``write_manifest_list`` — the manifest list with first row ids assigned ("Manifest Lists",
   "Row Lineage": the snapshot's ``first-row-id`` and ``added-rows``);
6. ``summary`` and ``snapshot`` — the summary metrics and the operation ("Snapshots").

The compare-and-swap of the metadata pointer is ``catalog.commit_metadata`` (called by the table with
``requirements`` and ``updates``), and on a lost race ``discard`` deletes what the attempt wrote. A
producer serves one attempt; a retry builds a new one on the reloaded table.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataV3
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)
from pyroaring import BitMap64

import mooncake_assets.engine.iceberg.compat as compat

from .errors import CommitConflict
from .manifest import ManifestInfo, unassigned_row_count, write_manifest, write_manifest_list
from .names import CREATED_BY, SUMMARY_COMMIT_ID, SUMMARY_DELETE_LOG, SUMMARY_DELETE_LOG_ROWS, SUMMARY_INDEX_FILE
from .snapshots import LiveEntry, SnapshotReader
from .writers import write_deletion_vectors, write_index, write_position_delete_files

logger = logging.getLogger(__name__)

OPERATIONS = {op.value: op for op in Operation}


@dataclass(frozen=True)
class CommitRequest:
    """What one ``commit`` call asks for (see ``IcebergMirrorTable.commit`` for each field's meaning).

    ``deletes``: data file location -> NEW deleted positions. ``commit_id``: the ``mooncake.commit-id``
    summary value by which a retry finds the commit if it already landed.
    """

    add_files: list[str]
    deletes: dict[str, BitMap64]
    remove_files: list[str]
    index_blob: bytes | None
    summary: dict[str, str]
    operation: Operation | None
    commit_id: str
    schema: list[Schema] | None = None
    properties: dict[str, str] | None = None

    @classmethod
    def of(
        cls,
        *,
        add_files: Iterable[str],
        deletes: Mapping[str, BitMap64 | Iterable[int]] | None,
        remove_files: Iterable[str],
        index_blob: bytes | None,
        summary: Mapping[str, str] | None,
        operation: str | None,
        schema: Schema | Sequence[Schema] | None,
        properties: Mapping[str, str] | None,
    ) -> CommitRequest:
        """The request with a fresh commit id. Raises ``ValueError`` for an unknown operation, non-string
        summary keys/values, or a file both added and removed."""
        if operation is not None and operation not in OPERATIONS:
            raise ValueError(f"operation: expected one of {sorted(OPERATIONS)}, found {operation!r}")
        props = dict(summary or {})
        for k, v in props.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"summary: expected string keys and values, found {k!r}: {v!r}")
        request = cls(
            add_files=list(dict.fromkeys(add_files)),
            deletes={k: as_bitmap(v) for k, v in (deletes or {}).items()},
            remove_files=list(dict.fromkeys(remove_files)),
            index_blob=index_blob,
            summary=props,
            operation=OPERATIONS[operation] if operation else None,
            commit_id=uuid.uuid4().hex,
            schema=schema_list(schema) or None,
            properties=dict(properties) if properties else None,
        )
        both = set(request.add_files) & set(request.remove_files)
        if both:
            raise ValueError(f"commit: files both added and removed: {sorted(both)}")
        return request


@dataclass
class DeletePlan:
    """The outcome of ``merge_deletes``. ``new_sets``: data file -> its whole delete set, to be written as
    its one new DV / position-delete file. ``dropped``: the live delete entries (by ``id`` of the entry)
    the new snapshot marks DELETED (replaced, or their data file is removed)."""

    new_sets: dict[str, BitMap64]
    dropped: dict[int, LiveEntry]


@dataclass(frozen=True)
class ProducedSnapshot:
    """A snapshot ready for the pointer swap: ``updates`` to apply to the base metadata, ``requirements``
    the base must still meet (the catalog's compare-and-swap checks them)."""

    snapshot_id: int
    updates: tuple[TableUpdate, ...]
    requirements: tuple[TableRequirement, ...]


class SnapshotProducer:
    """Produces one snapshot of ``table`` (as loaded: the base) for ``request`` (one commit attempt).

    ``reader``: the table's snapshot reader (its caches learn the delete sets written here).
    ``new_files``: location -> ``data_file`` record of each file of ``request.add_files``.
    ``attempt``: 1-based, part of the manifest names. ``manifest_merge_threshold``: when the base has
    this many live data (or delete) manifests, they are merged into one. ``written``: every file this
    attempt has written so far, in order.
    """

    def __init__(
        self,
        table: Table,
        reader: SnapshotReader,
        request: CommitRequest,
        new_files: dict[str, DataFile],
        *,
        attempt: int,
        manifest_merge_threshold: int,
    ) -> None:
        self.md: TableMetadata = table.metadata
        self.fv = self.md.format_version
        self.io = table.io
        self.reader = reader
        self.request = request
        self.new_files = new_files
        self.attempt = attempt
        self.manifest_merge_threshold = manifest_merge_threshold
        self.written: list[str] = []
        self.identifier = reader.identifier
        self.provider = load_location_provider(self.md.location, self.md.properties)
        self.base: Snapshot | None = self.md.current_snapshot()
        self.current = reader.files(self.io, self.md, self.base)
        self.sequence_number = self.md.next_sequence_number()  # spec "Sequence Numbers": base's + 1
        self.snapshot_id = self.md.new_snapshot_id()
        self._manifests_written = 0

    @property
    def base_snapshot_id(self) -> int | None:
        return self.base.snapshot_id if self.base else None

    def produce(self) -> ProducedSnapshot:
        """Run every phase; returns what the pointer swap needs. Raises ``CommitConflict(retryable=False)``
        or ``ValueError`` from ``validate``; files written before an error stay in ``written``."""
        self.validate()
        schema_changes, schema_id = schema_updates(self.md, self.request.schema, self.request.properties)
        plan = self.merge_deletes()
        delete_files = self.write_delete_files(plan.new_sets)
        mooncake = self.mooncake_properties()
        manifest_list, first_row_id, added_rows = self.write_manifest_list(self.write_manifests(plan, delete_files))
        # PyIceberg's pydantic models take field names (populate_by_name); without the pydantic mypy plugin their types know only the aliases
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.base_snapshot_id,
            sequence_number=self.sequence_number,
            timestamp_ms=max(int(time.time() * 1000), self.md.last_updated_ms),
            manifest_list=manifest_list,
            summary=self.summary(plan, delete_files, mooncake),
            schema_id=schema_id,
            first_row_id=first_row_id,
            added_rows=added_rows,
        )
        updates = schema_changes + (
            AddSnapshotUpdate(snapshot=snapshot),
            # as above, and pydantic validates "branch" into SnapshotRefType.BRANCH
            SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=self.snapshot_id),  # type: ignore[call-arg, arg-type]
        )
        return ProducedSnapshot(self.snapshot_id, updates, self.requirements())

    # ------------------------------------------------------------------------------- 1. validate

    def validate(self) -> None:
        """Check the request against the base snapshot (spec "Optimistic Concurrency": re-done on every
        attempt, against the table as reloaded). Raises ``CommitConflict(retryable=False)`` when a file to
        add is already live, or a file to remove or delete from is not; ``ValueError`` for a position
        beyond its file's ``record_count``."""
        live = self.current.data
        for location in self.request.add_files:
            if location in live:
                raise CommitConflict(
                    f"{self.identifier}: data file {location} is already in the table", retryable=False
                )
        for location in self.request.remove_files:
            if location not in live:
                raise CommitConflict(
                    f"{self.identifier}: data file {location} to remove is not in the table (removed concurrently?)",
                    retryable=False,
                )
        removed = set(self.request.remove_files)
        record_counts = {loc: entry.entry.data_file.record_count for loc, entry in live.items()}
        record_counts.update({loc: df.record_count for loc, df in self.new_files.items()})
        for location, positions in self.request.deletes.items():
            if location in removed or not positions:
                continue
            if location not in record_counts:
                raise CommitConflict(
                    f"{self.identifier}: deletes for {location}, which is not in the table (removed concurrently?)",
                    retryable=False,
                )
            if positions.max() >= record_counts[location]:
                raise ValueError(
                    f"deletes for {location}: position {positions.max()} is beyond the file's "
                    f"{record_counts[location]} rows"
                )

    # ------------------------------------------------------------------------------- 2. merge deletes

    def merge_deletes(self) -> DeletePlan:
        """One delete entry per data file (spec "Deletion Vectors": at most one DV per data file; a new DV
        holds the old one's positions too and the old one is removed in the same snapshot). A data file
        gets a new set when its deletes grow or it had several entries; the entries of removed data files
        are dropped with them. Only the entries applicable to a file count (spec "Scan Planning")."""
        targets, by_file = self.reader.deletes_by_file(self.io, self.current, self.fv)
        removed = set(self.request.remove_files)
        new_sets: dict[str, BitMap64] = {}
        for location, positions in self.request.deletes.items():
            if location in removed or not positions:
                continue
            lives = by_file.get(location, [])
            existing = self._deleted(by_file, location)
            merged = existing | positions
            if len(merged) != len(existing) or len(lives) > 1:
                new_sets[location] = merged
        dropped: dict[int, LiveEntry] = {}
        for location in list(new_sets) + list(removed):
            for live in by_file.get(location, []):
                dropped[id(live.entry)] = live
        self._rewrite_shared_deletes(targets, by_file, new_sets, dropped)
        return DeletePlan({loc: bm for loc, bm in new_sets.items() if len(bm)}, dropped)

    def _deleted(self, by_file: dict[str, list[LiveEntry]], location: str) -> BitMap64:
        """The positions deleted now in ``location`` (a file added by this commit: its data sequence number
        is the new snapshot's)."""
        live = self.current.data.get(location)
        seq = live.sequence_number if live is not None else self.sequence_number
        return self.reader.deleted(self.io, by_file.get(location, []), location, self.fv, seq)

    def _rewrite_shared_deletes(
        self,
        targets: dict[int, set[str]],
        by_file: dict[str, list[LiveEntry]],
        new_sets: dict[str, BitMap64],
        dropped: dict[int, LiveEntry],
    ) -> None:
        """A dropped delete file that also covers other data files (only v2 files written elsewhere do)
        must have those files' deletes rewritten too, or they would be lost; repeated until closed."""
        removed = set(self.request.remove_files)
        pending = list(dropped.values())
        while pending:
            live = pending.pop()
            for other in targets[id(live.entry)]:
                if other in removed or other in new_sets or other not in self.current.data:
                    continue
                new_sets[other] = self._deleted(by_file, other)
                for more in by_file.get(other, []):
                    if id(more.entry) not in dropped:
                        dropped[id(more.entry)] = more
                        pending.append(more)

    # ------------------------------------------------------------------------------- 3. delete files, index

    def write_delete_files(self, new_sets: dict[str, BitMap64]) -> list[DataFile]:
        """v3: one Puffin DV file per data file; v2: one Parquet position-delete file per data file."""
        if not new_sets:
            return []
        remember = self.reader.remember_deletes
        if self.fv >= 3:
            return write_deletion_vectors(self.io, self.provider, new_sets, self.snapshot_id, self.written, remember)
        return write_position_delete_files(self.io, self.provider, new_sets, self.written, remember)

    def mooncake_properties(self) -> dict[str, str]:
        """The ``mooncake.*`` summary properties: the base's carried over (not its commit id, nor its
        delete log, which describes that commit's deletes only), a new
        ``mooncake.index-file`` when the request has an index blob (written here), the request's summary,
        this commit's id, and ``engine-name``."""
        base = self.base.summary.additional_properties if self.base and self.base.summary else {}
        props = {k: v for k, v in base.items() if k.startswith("mooncake.") and k not in _NOT_CARRIED}
        if self.request.index_blob is not None:
            props[SUMMARY_INDEX_FILE] = write_index(
                self.io, self.md.location, self.request.index_blob, self.snapshot_id, self.sequence_number, self.written
            )
        props.update(self.request.summary)
        props[SUMMARY_COMMIT_ID] = self.request.commit_id
        props.setdefault("engine-name", CREATED_BY)
        return props

    # ------------------------------------------------------------------------------- 4. manifests

    def write_manifests(self, plan: DeletePlan, delete_files: list[DataFile]) -> list[tuple[ManifestInfo, int]]:
        """The manifests of the new snapshot, as (manifest, rows that will inherit a first row id), in list
        order: added data files, carried data manifests, added delete files, carried delete manifests
        (spec "Manifests": ADDED entries inherit the snapshot id and sequence numbers)."""
        listed: list[tuple[ManifestInfo, int]] = []
        added = list(self.new_files.values())
        if added:
            info = self._write_manifest(ManifestContent.DATA, [self._added(df) for df in added])
            listed.append((info, sum(df.record_count for df in added)))
        removed = set(self.request.remove_files)
        kept_data = self._carry_manifests(ManifestContent.DATA, lambda e: e.data_file.file_path in removed)
        kept_deletes = self._carry_manifests(ManifestContent.DELETES, lambda e: id(e) in plan.dropped)
        listed.extend(kept_data)
        if delete_files:
            listed.append((self._write_manifest(ManifestContent.DELETES, [self._added(df) for df in delete_files]), 0))
        listed.extend(kept_deletes)
        return listed

    def _carry_manifests(
        self, content: ManifestContent, gone: Callable[[ManifestEntry], bool]
    ) -> list[tuple[ManifestInfo, int]]:
        """The base's live manifests of ``content`` in the new snapshot: untouched ones as they are, those
        with an entry ``gone`` rewritten (EXISTING / DELETED), all merged into one at the threshold. A
        rewrite drops the DELETED history of older snapshots."""
        is_data = content == ManifestContent.DATA
        manifests = [m for m in self.current.manifests if m.content == content and m.live_files > 0]

        def live_entries(m: ManifestInfo) -> list[ManifestEntry]:
            return [e for e in self.current.entries[m.path] if e.status != ManifestEntryStatus.DELETED]

        def rewrite(entries: list[ManifestEntry]) -> tuple[ManifestInfo, int]:
            carried = [self._carried(e, gone(e)) for e in entries]
            info = self._write_manifest(content, carried)
            return info, unassigned_row_count(self.io, info, self.fv, carried) if is_data else 0

        if len(manifests) >= self.manifest_merge_threshold:
            return [rewrite([e for m in manifests for e in live_entries(m)])]
        out = []
        for manifest in manifests:
            entries = live_entries(manifest)
            if any(gone(e) for e in entries):
                out.append(rewrite(entries))
            elif manifest.first_row_id is not None or not is_data:
                out.append((manifest, 0))
            else:
                out.append((manifest, unassigned_row_count(self.io, manifest, self.fv, None)))
        return out

    def _added(self, df: DataFile) -> ManifestEntry:
        return manifest_entry(self.fv, ManifestEntryStatus.ADDED, self.snapshot_id, None, None, df)

    def _carried(self, e: ManifestEntry, gone: bool) -> ManifestEntry:
        """A base entry in a rewritten manifest: DELETED by this snapshot (keeping its sequence numbers, as
        the spec requires) or EXISTING."""
        if gone:
            return manifest_entry(
                self.fv,
                ManifestEntryStatus.DELETED,
                self.snapshot_id,
                e.sequence_number,
                e.file_sequence_number,
                e.data_file,
            )
        return manifest_entry(
            self.fv, ManifestEntryStatus.EXISTING, e.snapshot_id, e.sequence_number, e.file_sequence_number, e.data_file
        )

    def _write_manifest(self, content: ManifestContent, entries: list[ManifestEntry]) -> ManifestInfo:
        location = self.provider.new_metadata_location(
            f"{self.snapshot_id}-{self.attempt}-{uuid.uuid4().hex[:8]}-m{self._manifests_written}.avro"
        )
        self._manifests_written += 1
        self.written.append(location)
        return write_manifest(
            self.io,
            location,
            format_version=self.fv,
            schema=self.md.schema(),
            spec=self.md.spec(),
            content=content,
            snapshot_id=self.snapshot_id,
            sequence_number=self.sequence_number,
            entries=entries,
        )

    # ------------------------------------------------------------------------------- 5. manifest list, lineage

    def write_manifest_list(self, manifests: list[tuple[ManifestInfo, int]]) -> tuple[str, int | None, int | None]:
        """Write the manifest list; returns (its location, the snapshot's ``first-row-id``, its
        ``added-rows``), the last two None before v3. Spec "Row Lineage": the snapshot's first row id is
        the table's ``next-row-id``; data manifests without one are assigned ranges from it, and
        ``added-rows`` counts them (the metadata update then advances ``next-row-id`` by it)."""
        location = self.provider.new_metadata_location(f"snap-{self.snapshot_id}-{self.attempt}-{uuid.uuid4()}.avro")
        self.written.append(location)
        first_row_id = (cast(TableMetadataV3, self.md).next_row_id or 0) if self.fv >= 3 else None  # v3 metadata
        added_rows = write_manifest_list(
            self.io,
            location,
            format_version=self.fv,
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=self.base_snapshot_id,
            sequence_number=self.sequence_number,
            first_row_id=first_row_id,
            manifests=manifests,
        )
        return location, first_row_id, added_rows if self.fv >= 3 else None

    # ------------------------------------------------------------------------------- 6. summary, operation

    def summary(self, plan: DeletePlan, delete_files: list[DataFile], mooncake: dict[str, str]) -> Summary:
        """The snapshot summary (spec "Snapshots", metrics named as in Appendix F) with the ``mooncake.*``
        properties, and its operation: the request's, else ``append`` (only adds, or nothing),
        ``delete`` (only deletes/removals) or ``overwrite`` (both)."""
        removed = set(self.request.remove_files)
        removed_deletes = [live.entry.data_file for live in plan.dropped.values()]
        added_data = list(self.new_files.values())
        removed_data = [self.current.data[loc].entry.data_file for loc in self.request.remove_files]
        live_data = [live.entry.data_file for loc, live in self.current.data.items() if loc not in removed] + added_data
        dropped_ids = {id(d) for d in removed_deletes}
        live_deletes = [
            live.entry.data_file for live in self.current.deletes if id(live.entry.data_file) not in dropped_ids
        ] + delete_files
        props = summary_counts(added_data, removed_data, delete_files, removed_deletes, live_data, live_deletes)
        props.update(mooncake)
        if self.request.operation is not None:
            op = self.request.operation
        elif added_data and (removed_data or delete_files or removed_deletes):
            op = Operation.OVERWRITE
        elif removed_data or delete_files or removed_deletes:
            op = Operation.DELETE
        else:
            op = Operation.APPEND
        return Summary(operation=op, **props)

    def requirements(self) -> tuple[TableRequirement, ...]:
        """What the catalog's swap checks (spec "Optimistic Concurrency"): same table, ``main`` still at the
        base snapshot, the current schema unchanged."""
        # PyIceberg's pydantic models take field names (populate_by_name); without the pydantic mypy plugin their types know only the aliases
        return (
            AssertTableUUID(uuid=self.md.table_uuid),
            AssertRefSnapshotId(ref="main", snapshot_id=self.base_snapshot_id),  # type: ignore[call-arg]
            AssertCurrentSchemaId(current_schema_id=self.md.current_schema_id),  # type: ignore[call-arg]
        )

    # ------------------------------------------------------------------------------- clean up

    def discard(self) -> None:
        """Delete every file this attempt wrote (after a lost race: none is referenced by the table)."""
        delete_quietly(self.io, self.written)


# ----------------------------------------------------------------------------------- helpers


def manifest_entry(
    fv: int,
    status: ManifestEntryStatus,
    snapshot_id: int | None,
    sequence_number: int | None,
    file_sequence_number: int | None,
    data_file: DataFile,
) -> ManifestEntry:
    """A ``manifest_entry`` record in the layout of format version ``fv``."""
    return compat.record(
        ManifestEntry,
        fv,
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=sequence_number,
        file_sequence_number=file_sequence_number,
        data_file=data_file,
    )


def schema_updates(
    md: TableMetadata, versions: list[Schema] | None, properties: dict[str, str] | None
) -> tuple[tuple[TableUpdate, ...], int]:
    """(metadata updates, schema id the snapshot is written under) for new schema ``versions`` (each added
    unless its fields equal the previous one's; the last made current, with a renewed
    ``schema.name-mapping.default``) and table ``properties`` (spec "Schemas", "Column Projection")."""
    updates: list[TableUpdate] = []
    schema_id = md.current_schema_id
    props = dict(properties or {})
    last = tuple(md.schema().fields)
    next_id = max(s.schema_id for s in md.schemas) + 1
    new = None
    for version in versions or []:
        if tuple(version.fields) == last:
            continue
        schema_id, next_id = next_id, next_id + 1
        new = Schema(*version.fields, schema_id=schema_id, identifier_field_ids=[])
        updates.append(AddSchemaUpdate(schema_=new))  # type: ignore[call-arg]  # by field name (populate_by_name): mypy sees the alias only
        last = tuple(version.fields)
    if schema_id != md.current_schema_id and new is not None:
        updates.append(SetCurrentSchemaUpdate(schema_id=-1))  # type: ignore[call-arg]  # by field name, as above
        props["schema.name-mapping.default"] = create_mapping_from_schema(new).model_dump_json()
    if props:
        updates.append(SetPropertiesUpdate(updates=props))
    return tuple(updates), schema_id


def schema_list(schema: Schema | Sequence[Schema] | None) -> list[Schema]:
    """``schema`` as a list of schema versions (none, one, or several in order)."""
    if schema is None:
        return []
    return [schema] if isinstance(schema, Schema) else list(schema)


def as_bitmap(positions: BitMap64 | Iterable[int]) -> BitMap64:
    return positions if isinstance(positions, BitMap64) else BitMap64(positions)


_NOT_CARRIED = (SUMMARY_COMMIT_ID, SUMMARY_DELETE_LOG, SUMMARY_DELETE_LOG_ROWS)


def find_commit(md: TableMetadata, commit_id: str) -> int | None:
    """The id of the snapshot whose summary carries ``mooncake.commit-id`` ``commit_id``, if any."""
    for s in md.snapshots:
        if s.summary and s.summary.additional_properties.get(SUMMARY_COMMIT_ID) == commit_id:
            return s.snapshot_id
    return None


def delete_quietly(io: FileIO, locations: Iterable[str]) -> None:
    """Delete ``locations``, best effort: a missing file is fine, another failure is logged."""
    for location in locations:
        try:
            io.delete(location)
        except FileNotFoundError:
            pass
        except Exception as e:
            logger.warning("could not delete %s: %s", location, e)


def summary_counts(
    added_data: list[DataFile],
    removed_data: list[DataFile],
    added_deletes: list[DataFile],
    removed_deletes: list[DataFile],
    live_data: list[DataFile],
    live_deletes: list[DataFile],
) -> dict[str, str]:
    """Snapshot summary metrics (spec Appendix F names), as strings; zero 'added/removed' values left out.
    A delete file listed for several data files counts once in the sizes."""

    def size(files: list[DataFile]) -> int:
        return sum(f.file_size_in_bytes for f in files)

    def distinct(files: list[DataFile]) -> list[DataFile]:
        return list({f.file_path: f for f in files}.values())

    def dvs(files: list[DataFile]) -> int:
        return sum(1 for f in files if f.file_format == FileFormat.PUFFIN)

    props: dict[str, int] = {
        "added-data-files": len(added_data),
        "deleted-data-files": len(removed_data),
        "added-records": sum(f.record_count for f in added_data),
        "deleted-records": sum(f.record_count for f in removed_data),
        "added-files-size": size(added_data) + size(distinct(added_deletes)),
        "removed-files-size": size(removed_data) + size(distinct(removed_deletes)),
        "added-delete-files": len(added_deletes),
        "removed-delete-files": len(removed_deletes),
        "added-dvs": dvs(added_deletes),
        "removed-dvs": dvs(removed_deletes),
        "added-position-delete-files": len(added_deletes) - dvs(added_deletes),
        "removed-position-delete-files": len(removed_deletes) - dvs(removed_deletes),
        "added-position-deletes": sum(f.record_count for f in added_deletes),
        "removed-position-deletes": sum(f.record_count for f in removed_deletes),
    }
    out = {k: str(v) for k, v in props.items() if v}
    out.update(
        {
            "total-data-files": str(len(live_data)),
            "total-delete-files": str(len(live_deletes)),
            "total-records": str(sum(f.record_count for f in live_data)),
            "total-files-size": str(size(live_data) + size(distinct(live_deletes))),
            "total-position-deletes": str(sum(f.record_count for f in live_deletes)),
            "total-equality-deletes": "0",
        }
    )
    return out
