"""The Iceberg side of one mirrored table: create, commit, load the persisted state, expire, drop.

Spec sections followed (Iceberg table spec, format v2 and v3): "Optimistic Concurrency", "Sequence Numbers",
"Row Lineage", "Manifests", "Manifest Lists", "Scan Planning" (which deletes apply to which data file),
"Deletion Vectors" / Puffin ``deletion-vector-v1``, "Position Delete Files", "Snapshot Retention Policy".

Layout under the table location::

    data/<name>.parquet                 data files (``upload_data_file``)
    data/<snapshot>-<uuid>-deletes.puffin   v3: the deletion vectors written by one commit, one blob each
    data/<uuid>-deletes.parquet         v2: one position-delete file per data file (its whole delete set)
    index/<snapshot>-<uuid>.puffin      the mooncake hash index (blob ``mooncake-hash-index-v1``), referenced
                                        from the snapshot summary ``mooncake.index-file``, never a manifest entry
    metadata/…                          metadata JSON, manifest lists (``snap-*.avro``), manifests (``*-m<i>.avro``)

Invariant kept by every commit: at most one live delete entry (one DV, or one position-delete file) per data
file; a new one is the union of the old one and the new positions, and the old entry is marked DELETED in
the same snapshot. A data file removed by a commit loses its delete entry in that same commit.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSchemaUpdate,
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotsUpdate,
    SetCurrentSchemaUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
)
from pyiceberg.types import PrimitiveType
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import (
    PuffinBlob,
    decode_deletion_vector,
    deletion_vector_blob,
    read_puffin,
    write_puffin,
)

from .catalog import (
    SwapConflict,
    _is_rest,
    check_catalog_supports,
    commit_metadata,
    new_metadata_location,
    split_identifier,
    write_metadata,
)
from .datafile import data_file_from_parquet, data_file_from_parquet_metadata, iceberg_arrow_schema
from .errors import CommitConflict, CommitStateUnknown
from .manifest import (
    ManifestInfo,
    data_file_field,
    new_data_file,
    read_manifest_entries,
    read_manifest_list,
    unassigned_row_count,
    write_manifest,
    write_manifest_list,
)
from .position_deletes import (
    FILE_PATH_FIELD_ID,
    decode_position_deletes,
    encode_position_deletes,
    position_delete_data_file,
)

logger = logging.getLogger(__name__)

DELETE_FORMATS = {"deletion-vectors": 3, "position-deletes": 2}
"""``delete_format`` -> table format version: DVs in Puffin need v3; Parquet position deletes are v2."""

INDEX_BLOB_TYPE = "mooncake-hash-index-v1"
SUMMARY_INDEX_FILE = "mooncake.index-file"
SUMMARY_COMMIT_ID = "mooncake.commit-id"
SUMMARY_FLUSH_LSN = "mooncake.flush-lsn"
PROPERTY_DELETE_FORMAT = "mooncake.delete-format"
CREATED_BY = "mooncake-assets"

_OPERATIONS = {op.value: op for op in Operation}
_CACHE_MANIFESTS = 1024  # parsed manifests kept per table object (manifests are immutable)
_CACHE_DELETES = 4096  # decoded delete sets kept per table object (delete files are immutable)


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


@dataclass
class _Live:
    """A live manifest entry and the manifest holding it."""

    entry: ManifestEntry
    manifest: str


@dataclass
class _SnapshotFiles:
    """The parsed manifests of one snapshot."""

    manifests: list[ManifestInfo]
    entries: dict[str, list[ManifestEntry]]
    data: dict[str, _Live]
    deletes: list[_Live]


@dataclass
class _Request:
    add_files: list[str]
    deletes: dict[str, BitMap64]
    remove_files: list[str]
    index_blob: bytes | None
    summary: dict[str, str]
    operation: Operation | None
    commit_id: str
    schema: list[Schema] | None = None
    properties: dict[str, str] | None = None


class IcebergMirrorTable:
    """One mirrored table's Iceberg side. Every state change is one Iceberg commit (one snapshot).

    Attributes: ``catalog``, ``identifier`` (``"namespace.table"``), ``location`` (table base URI),
    ``format_version`` (3 for ``deletion-vectors``, 2 for ``position-deletes``), ``delete_format``,
    ``commit_attempts`` (tries per commit before ``CommitConflict``, default 5),
    ``manifest_merge_threshold`` (when a snapshot has this many data — or delete — manifests, the next
    commit rewrites them into one; default 32, so planning cost stays bounded), ``before_swap``
    (test/fault-injection hook: called after every file of a commit is written and right before the
    pointer swap, with the new metadata location or None; whatever it raises propagates and the table
    keeps its previous snapshot).
    """

    commit_attempts: int = 5
    manifest_merge_threshold: int = 32
    before_swap: Callable[[str | None], None] | None = None

    def __init__(self, catalog: Catalog, identifier: str, table: Table) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self._table = table
        self._prepared: dict[str, DataFile] = {}
        self._manifest_cache: OrderedDict[str, list[ManifestEntry]] = OrderedDict()
        self._delete_cache: OrderedDict[tuple, BitMap64] = OrderedDict()

    # ----------------------------------------------------------------- create / load

    @classmethod
    def create(
        cls,
        catalog: Catalog,
        identifier: str,
        arrow_schema: pa.Schema,
        *,
        delete_format: str = "deletion-vectors",
        properties: dict[str, str] | None = None,
    ) -> IcebergMirrorTable:
        """Create the Iceberg table (unpartitioned, unsorted) and its namespace if needed.

        ``arrow_schema``: the mirrored columns; non-nullable fields become required columns; field ids
        are assigned fresh (1..n). ``delete_format``: ``"deletion-vectors"`` (format v3, DVs in Puffin)
        or ``"position-deletes"`` (format v2, Parquet position-delete files). ``properties``: extra table
        properties. The table gets ``schema.name-mapping.default`` so files written without field ids
        still resolve by name. Raises ``TableAlreadyExistsError`` if the identifier exists,
        ``ValueError`` for an unknown delete format, ``UnsupportedCatalog`` for v3 on a catalog other
        than SQL/REST.
        """
        if delete_format not in DELETE_FORMATS:
            raise ValueError(f"delete_format: expected one of {sorted(DELETE_FORMATS)}, found {delete_format!r}")
        format_version = DELETE_FORMATS[delete_format]
        check_catalog_supports(catalog, format_version)
        namespace, name = split_identifier(identifier)
        if catalog.table_exists(identifier):
            raise TableAlreadyExistsError(
                f"Iceberg table {identifier} already exists; open it with IcebergMirrorTable.load or drop it first"
            )
        catalog.create_namespace_if_not_exists(namespace)
        schema = Catalog._convert_schema_if_needed(arrow_schema, format_version)
        props = {
            "format-version": str(format_version),
            PROPERTY_DELETE_FORMAT: delete_format,
            "write.delete.mode": "merge-on-read",
            "write.update.mode": "merge-on-read",
            **(properties or {}),
        }
        if _is_rest(catalog):
            table = catalog.create_table(identifier, schema=arrow_schema, properties=props)
            props_mapping = create_mapping_from_schema(table.schema()).model_dump_json()
            with table.transaction() as tx:
                tx.set_properties({"schema.name-mapping.default": props_mapping})
            return cls(catalog, identifier, catalog.load_table(identifier))
        location = cls._default_location(catalog, namespace, name)
        metadata = new_table_metadata(schema, UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, location, props)
        mapping = create_mapping_from_schema(metadata.schema()).model_dump_json()
        metadata = metadata.model_copy(
            update={"properties": {**metadata.properties, "schema.name-mapping.default": mapping}}
        )
        if format_version >= 3:
            metadata = metadata.model_copy(update={"next_row_id": 0})
        metadata_location = new_metadata_location(metadata, 0)
        io = load_file_io({**catalog.properties, **metadata.properties}, metadata_location)
        write_metadata(io, metadata, metadata_location)
        try:
            catalog.register_table(identifier, metadata_location)
        except TableAlreadyExistsError:
            _delete_quietly(io, [metadata_location])
            raise TableAlreadyExistsError(
                f"Iceberg table {identifier} already exists; open it with IcebergMirrorTable.load or drop it first"
            ) from None
        return cls.load(catalog, identifier)

    @staticmethod
    def _default_location(catalog: Catalog, namespace: str, name: str) -> str:
        ns_location = catalog.load_namespace_properties(namespace).get("location")
        if ns_location:
            return f"{ns_location.rstrip('/')}/{name}"
        warehouse = catalog.properties.get("warehouse")
        if not warehouse:
            raise ValueError("catalog has no 'warehouse' property and the namespace has no 'location'")
        return f"{warehouse.rstrip('/')}/{namespace}/{name}"

    @classmethod
    def load(cls, catalog: Catalog, identifier: str) -> IcebergMirrorTable:
        """Open an existing table. Raises ``NoSuchTableError`` if it does not exist, ``ValueError`` if its
        format version is not 2 or 3."""
        table = catalog.load_table(identifier)
        if table.format_version not in (2, 3):
            raise ValueError(f"{identifier}: expected an Iceberg format v2 or v3 table, found v{table.format_version}")
        return cls(catalog, identifier, table)

    # ----------------------------------------------------------------- properties

    @property
    def table(self) -> Table:
        """The PyIceberg ``Table`` as of the last load/commit (``refresh()`` to reload)."""
        return self._table

    @property
    def location(self) -> str:
        return self._table.metadata.location

    @property
    def format_version(self) -> int:
        return self._table.format_version

    @property
    def delete_format(self) -> str:
        return "deletion-vectors" if self.format_version >= 3 else "position-deletes"

    @property
    def metadata_location(self) -> str:
        """Location of the current metadata JSON (what ``iceberg_scan`` takes)."""
        return self._table.metadata_location

    @property
    def schema(self) -> Schema:
        return self._table.schema()

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema to write data files with: table columns carrying ``PARQUET:field_id``."""
        return iceberg_arrow_schema(self.schema)

    def refresh(self) -> IcebergMirrorTable:
        """Reload the table metadata from the catalog; returns self."""
        self._table = self.catalog.load_table(self.identifier)
        return self

    @property
    def io(self) -> FileIO:
        return self._table.io

    # ----------------------------------------------------------------- data files

    def known_field_ids(self, schema: Schema | Sequence[Schema] | None = None) -> set[int]:
        """Every field id of the table's schemas (all of them: files keep the ids they were written
        with), plus those of ``schema`` (one or several about to be committed)."""
        ids: set[int] = set()
        for s in self._table.metadata.schemas + _schema_list(schema):
            ids.update(index_by_id(s))
        return ids

    def upload_data_file(self, local_path: str, *, overwrite: bool = False,
                         schema: Schema | Sequence[Schema] | None = None) -> str:
        """Copy a local Parquet file to ``<location>/data/<basename>`` through the table's FileIO.

        Returns the location as Iceberg records it (``file://…`` or ``s3://…``). The footer is checked
        against the table schema first (``ValueError`` on a mismatch; ``schema``: a schema the same
        commit will add, whose new field ids the file may carry) and its metrics are kept for the
        commit that adds the file. Raises ``FileExistsError`` when the destination exists and
        ``overwrite`` is False (data files are immutable once written).
        """
        size = os.path.getsize(local_path)
        provider = load_location_provider(self.location, self._table.metadata.properties)
        location = provider.new_data_location(os.path.basename(local_path))
        data_file = data_file_from_parquet_metadata(
            location, size, pq.read_metadata(local_path), self.schema, self._table.metadata.properties, self.format_version,
            known_field_ids=self.known_field_ids(schema),
        )
        output = self.io.new_output(location)
        with open(local_path, "rb") as src, output.create(overwrite=overwrite) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        self._prepared[location] = data_file
        return location

    # ----------------------------------------------------------------- commit

    def commit(
        self,
        *,
        add_files: Iterable[str] = (),
        deletes: Mapping[str, BitMap64 | Iterable[int]] | None = None,
        remove_files: Iterable[str] = (),
        index_blob: bytes | None = None,
        summary: Mapping[str, str] | None = None,
        operation: str | None = None,
        schema: Schema | Sequence[Schema] | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> int:
        """Commit one snapshot; returns its id.

        ``schema``: make this the table's current schema in the same commit (schema evolution: the
        caller keeps field ids stable and gives new fields fresh ids; added as a new schema unless its
        fields equal the current one's) — the snapshot records it, and ``schema.name-mapping.default``
        is renewed. A list adds each version in order (files written under an intermediate version
        keep its field ids, which the table then knows) and makes the last one current.
        ``properties``: table properties to set in the same commit.

        ``add_files``: locations from ``upload_data_file`` (metrics from the Parquet footer).
        ``deletes``: data file location -> NEW deleted row positions (0-based); merged with the file's
        current deletes so the new snapshot has at most one DV (v3) / position-delete file (v2) per data
        file; the old delete entry is marked DELETED. Files being added in this commit may be named too.
        ``remove_files``: live data files to drop (their deletes go with them). ``index_blob``: saved as
        a ``mooncake-hash-index-v1`` Puffin blob under ``<location>/index/``, referenced by summary
        ``mooncake.index-file``; without it the previous snapshot's index reference carries over (as do
        all its ``mooncake.*`` summary properties unless ``summary`` overrides them). ``summary``: extra
        snapshot summary properties (strings). ``operation``: override the snapshot operation
        (``append``/``replace``/``overwrite``/``delete``); by default ``append`` (only adds, or nothing),
        ``delete`` (only deletes/removals), ``overwrite`` (adds with deletes/removals).

        Concurrency: on a pointer conflict the table is reloaded, the request is re-checked and re-applied
        to the new state (deletes re-merged with the new DVs) and retried up to ``commit_attempts`` times
        with backoff; then ``CommitConflict(retryable=True)``. If the request no longer fits the table
        (a file to add is already live, a file to remove or delete from is gone) ``CommitConflict(
        retryable=False)``. Each call carries a ``mooncake.commit-id``; a retry that finds it already
        committed returns that snapshot instead of committing twice. ``CommitStateUnknown`` when the
        catalog failed mid-swap and the commit is not visible on reload (files kept; reload and check
        ``state()`` before retrying). Raises ``ValueError`` for positions beyond a file's
        ``record_count`` or non-string summary values.
        """
        if operation is not None and operation not in _OPERATIONS:
            raise ValueError(f"operation: expected one of {sorted(_OPERATIONS)}, found {operation!r}")
        summary = dict(summary or {})
        for k, v in summary.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"summary: expected string keys and values, found {k!r}: {v!r}")
        req = _Request(
            add_files=list(dict.fromkeys(add_files)),
            deletes={k: _as_bitmap(v) for k, v in (deletes or {}).items()},
            remove_files=list(dict.fromkeys(remove_files)),
            index_blob=index_blob,
            summary=summary,
            operation=_OPERATIONS[operation] if operation else None,
            commit_id=uuid.uuid4().hex,
            schema=_schema_list(schema) or None,
            properties=dict(properties) if properties else None,
        )
        both = set(req.add_files) & set(req.remove_files)
        if both:
            raise ValueError(f"commit: files both added and removed: {sorted(both)}")
        for location in req.add_files:
            if location not in self._prepared:
                self._prepared[location] = data_file_from_parquet(
                    self.io, location, self.schema, self._table.metadata.properties, self.format_version,
                    self.known_field_ids(schema),
                )
        last_conflict: Exception | None = None
        for attempt in range(1, self.commit_attempts + 1):
            self.refresh()
            table = self._table
            done = _find_commit(table.metadata, req.commit_id)
            if done is not None:
                return done
            written: list[str] = []
            try:
                snapshot_id, updates, requirements = self._prepare(table, req, attempt, written)
                new_metadata, new_location = commit_metadata(
                    self.catalog, table, requirements, updates, before_swap=self.before_swap
                )
            except CommitStateUnknown:
                done = _find_commit(self.refresh().table.metadata, req.commit_id)
                if done is not None:
                    return done
                raise  # not visible now; the attempt's files are kept (the swap may still be in flight)
            except SwapConflict as e:
                last_conflict = e
                # Defence in depth: only delete the attempt's files once the table shows it did not land.
                done = _find_commit(self.refresh().table.metadata, req.commit_id)
                if done is not None:
                    return done
                _delete_quietly(table.io, written)
                logger.info("%s: commit attempt %d lost a race (%s); retrying", self.identifier, attempt, e)
                time.sleep(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))
                continue
            self._table = Table(
                identifier=table._identifier,
                metadata=new_metadata,
                metadata_location=new_location,
                io=table.io,
                catalog=self.catalog,
            )
            for location in req.add_files:
                self._prepared.pop(location, None)
            return snapshot_id
        raise CommitConflict(
            f"{self.identifier}: commit lost the race {self.commit_attempts} times in a row ({last_conflict}); "
            "nothing was committed, calling commit again may succeed",
            retryable=True,
        )

    def _prepare(self, table: Table, req: _Request, attempt: int, written: list[str]):
        """Check ``req`` against ``table`` and write every file of the new snapshot except the metadata JSON."""
        md = table.metadata
        fv = md.format_version
        io = table.io
        base = md.current_snapshot()
        current = self._snapshot_files(io, md, base)

        # -- validate against the current state (re-done on every attempt)
        for location in req.add_files:
            if location in current.data:
                raise CommitConflict(f"{self.identifier}: data file {location} is already in the table", retryable=False)
        for location in req.remove_files:
            if location not in current.data:
                raise CommitConflict(
                    f"{self.identifier}: data file {location} to remove is not in the table (removed concurrently?)",
                    retryable=False,
                )
        removed = set(req.remove_files)
        new_files = {loc: self._prepared[loc] for loc in req.add_files}
        record_counts = {loc: live.entry.data_file.record_count for loc, live in current.data.items()}
        record_counts.update({loc: df.record_count for loc, df in new_files.items()})
        for location, positions in req.deletes.items():
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

        sequence_number = md.next_sequence_number()
        schema_updates, schema_id = self._schema_updates(md, req)
        snapshot_id = md.new_snapshot_id()
        data_seq = {loc: live.entry.sequence_number for loc, live in current.data.items()}

        # -- which delete entries go, which delete sets are written anew
        targets = self._delete_targets(io, current, fv)  # id(entry) -> set of data files it covers
        by_file: dict[str, list[_Live]] = {}
        for live in current.deletes:
            for target in targets[id(live.entry)]:
                by_file.setdefault(target, []).append(live)
        new_sets: dict[str, BitMap64] = {}
        for location, positions in req.deletes.items():
            if location in removed or not positions:
                continue
            existing = self._deleted(io, by_file.get(location, []), location, fv, data_seq.get(location, sequence_number))
            merged = existing | positions
            if len(merged) != len(existing) or len(by_file.get(location, [])) > 1:
                new_sets[location] = merged
        dropped: dict[int, _Live] = {}
        for location in list(new_sets) + list(removed):
            for live in by_file.get(location, []):
                dropped[id(live.entry)] = live
        # a dropped delete file that also covers other data files (only foreign v2 files do) must have
        # those files' deletes rewritten too, or they would be lost
        pending = list(dropped.values())
        while pending:
            live = pending.pop()
            for other in targets[id(live.entry)]:
                if other in removed or other in new_sets or other not in current.data:
                    continue
                new_sets[other] = self._deleted(io, by_file.get(other, []), other, fv, data_seq[other])
                for more in by_file.get(other, []):
                    if id(more.entry) not in dropped:
                        dropped[id(more.entry)] = more
                        pending.append(more)
        new_sets = {loc: bm for loc, bm in new_sets.items() if len(bm)}

        # -- write delete files and the index
        new_delete_files = self._write_delete_files(io, new_sets, snapshot_id, written)
        summary_props = {
            k: v for k, v in (base.summary.additional_properties if base and base.summary else {}).items()
            if k.startswith("mooncake.") and k != SUMMARY_COMMIT_ID
        }
        if req.index_blob is not None:
            summary_props[SUMMARY_INDEX_FILE] = self._write_index(io, req.index_blob, snapshot_id, sequence_number, written)
        summary_props.update(req.summary)
        summary_props[SUMMARY_COMMIT_ID] = req.commit_id
        summary_props.setdefault("engine-name", CREATED_BY)

        # -- manifests
        manifest_n = 0

        def next_manifest_location() -> str:
            nonlocal manifest_n
            manifest_n += 1
            loc = load_location_provider(md.location, md.properties).new_metadata_location(
                f"{snapshot_id}-{attempt}-{uuid.uuid4().hex[:8]}-m{manifest_n - 1}.avro"
            )
            written.append(loc)
            return loc

        listed: list[tuple[ManifestInfo, int]] = []
        if new_files:
            entries = [_entry(fv, ManifestEntryStatus.ADDED, snapshot_id, None, None, df) for df in new_files.values()]
            info = self._write_manifest(io, md, next_manifest_location(), ManifestContent.DATA, snapshot_id, sequence_number, entries)
            listed.append((info, sum(df.record_count for df in new_files.values())))
        dropped_entries = {id(live.entry) for live in dropped.values()}

        def carried(e: ManifestEntry, is_data: bool) -> ManifestEntry:
            gone = (e.data_file.file_path in removed) if is_data else (id(e) in dropped_entries)
            if gone:  # removed by this snapshot: DELETED, keeping its sequence numbers (spec)
                return _entry(fv, ManifestEntryStatus.DELETED, snapshot_id, e.sequence_number, e.file_sequence_number, e.data_file)
            return _entry(fv, ManifestEntryStatus.EXISTING, e.snapshot_id, e.sequence_number, e.file_sequence_number, e.data_file)

        kept: dict[ManifestContent, list[tuple[ManifestInfo, int]]] = {ManifestContent.DATA: [], ManifestContent.DELETES: []}
        for content in (ManifestContent.DATA, ManifestContent.DELETES):
            is_data = content == ManifestContent.DATA
            manifests = [m for m in current.manifests if m.content == content and m.live_files > 0]
            if len(manifests) >= self.manifest_merge_threshold:
                # merge every manifest of this content into one (DELETED history of older snapshots dropped)
                merged = [
                    carried(e, is_data)
                    for m in manifests
                    for e in current.entries[m.path]
                    if e.status != ManifestEntryStatus.DELETED
                ]
                info = self._write_manifest(io, md, next_manifest_location(), content, snapshot_id, sequence_number, merged)
                kept[content].append((info, unassigned_row_count(io, info, fv, merged) if is_data else 0))
                continue
            for manifest in manifests:
                entries = current.entries[manifest.path]
                live = [e for e in entries if e.status != ManifestEntryStatus.DELETED]
                if is_data:
                    touched = any(e.data_file.file_path in removed for e in live)
                else:
                    touched = any(id(e) in dropped_entries for e in live)
                if not touched:
                    unassigned = 0 if (manifest.first_row_id is not None or not is_data) else unassigned_row_count(io, manifest, fv, None)
                    kept[content].append((manifest, unassigned))
                    continue
                rewritten = [carried(e, is_data) for e in live]  # DELETED history of older snapshots dropped
                info = self._write_manifest(io, md, next_manifest_location(), content, snapshot_id, sequence_number, rewritten)
                kept[content].append((info, unassigned_row_count(io, info, fv, rewritten) if is_data else 0))
        kept_data, kept_deletes = kept[ManifestContent.DATA], kept[ManifestContent.DELETES]
        listed.extend(kept_data)
        if new_delete_files:
            entries = [_entry(fv, ManifestEntryStatus.ADDED, snapshot_id, None, None, df) for df in new_delete_files]
            info = self._write_manifest(io, md, next_manifest_location(), ManifestContent.DELETES, snapshot_id, sequence_number, entries)
            listed.append((info, 0))
        listed.extend(kept_deletes)

        manifest_list = load_location_provider(md.location, md.properties).new_metadata_location(
            f"snap-{snapshot_id}-{attempt}-{uuid.uuid4()}.avro"
        )
        written.append(manifest_list)
        first_row_id = (md.next_row_id or 0) if fv >= 3 else None
        added_rows = write_manifest_list(
            io,
            manifest_list,
            format_version=fv,
            snapshot_id=snapshot_id,
            parent_snapshot_id=base.snapshot_id if base else None,
            sequence_number=sequence_number,
            first_row_id=first_row_id,
            manifests=listed,
        )

        # -- snapshot summary and operation
        removed_deletes = [live.entry.data_file for live in dropped.values()]
        added_data = list(new_files.values())
        removed_data = [current.data[loc].entry.data_file for loc in req.remove_files]
        live_data = [live.entry.data_file for loc, live in current.data.items() if loc not in removed] + added_data
        dropped_ids = {id(d) for d in removed_deletes}
        live_deletes = [l.entry.data_file for l in current.deletes if id(l.entry.data_file) not in dropped_ids] + new_delete_files
        props = _summary_counts(added_data, removed_data, new_delete_files, removed_deletes, live_data, live_deletes)
        props.update(summary_props)
        if req.operation is not None:
            op = req.operation
        elif added_data and (removed_data or new_delete_files or removed_deletes):
            op = Operation.OVERWRITE
        elif removed_data or new_delete_files or removed_deletes:
            op = Operation.DELETE
        else:
            op = Operation.APPEND
        snapshot = Snapshot(
            snapshot_id=snapshot_id,
            parent_snapshot_id=base.snapshot_id if base else None,
            sequence_number=sequence_number,
            timestamp_ms=max(int(time.time() * 1000), md.last_updated_ms),
            manifest_list=manifest_list,
            summary=Summary(operation=op, **props),
            schema_id=schema_id,
            first_row_id=first_row_id,
            added_rows=added_rows if fv >= 3 else None,
        )
        updates = schema_updates + (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot_id),
        )
        requirements = (
            AssertTableUUID(uuid=md.table_uuid),
            AssertRefSnapshotId(ref="main", snapshot_id=base.snapshot_id if base else None),
            AssertCurrentSchemaId(current_schema_id=md.current_schema_id),
        )
        return snapshot_id, updates, requirements

    @staticmethod
    def _schema_updates(md: TableMetadata, req: _Request) -> tuple[tuple, int]:
        """(metadata updates, schema id the snapshot is written under) for ``req.schema``/``properties``."""
        updates: list = []
        schema_id = md.current_schema_id
        props = dict(req.properties or {})
        last = tuple(md.schema().fields)
        next_id = max(s.schema_id for s in md.schemas) + 1
        for version in req.schema or []:
            if tuple(version.fields) == last:
                continue
            schema_id, next_id = next_id, next_id + 1
            new = Schema(*version.fields, schema_id=schema_id, identifier_field_ids=[])
            updates.append(AddSchemaUpdate(schema_=new))
            last = tuple(version.fields)
        if schema_id != md.current_schema_id:
            updates.append(SetCurrentSchemaUpdate(schema_id=-1))
            props["schema.name-mapping.default"] = create_mapping_from_schema(new).model_dump_json()
        if props:
            updates.append(SetPropertiesUpdate(updates=props))
        return tuple(updates), schema_id

    def _write_manifest(self, io, md: TableMetadata, location, content, snapshot_id, sequence_number, entries) -> ManifestInfo:
        return write_manifest(
            io,
            location,
            format_version=md.format_version,
            schema=md.schema(),
            spec=md.spec(),
            content=content,
            snapshot_id=snapshot_id,
            sequence_number=sequence_number,
            entries=entries,
        )

    def _write_delete_files(self, io: FileIO, new_sets: dict[str, BitMap64], snapshot_id: int, written: list[str]) -> list[DataFile]:
        """v3: one Puffin file holding the ``deletion-vector-v1`` blob of each data file; v2: one Parquet
        position-delete file per data file. Returns their ``data_file`` records."""
        if not new_sets:
            return []
        provider = load_location_provider(self.location, self._table.metadata.properties)
        if self.format_version >= 3:
            # One Puffin file per data file's DV. The spec allows several DV blobs in one Puffin file,
            # but DuckDB's iceberg extension (1.5.5) applied the wrong positions to such files (seen
            # here: 99,378 rows instead of 100,000), so every reader gets the simplest layout.
            records = []
            for loc in sorted(new_sets):
                data, metas = write_puffin([deletion_vector_blob(loc, new_sets[loc])], {"created-by": CREATED_BY})
                meta = metas[0]
                location = provider.new_data_location(f"{snapshot_id}-{uuid.uuid4()}-deletes.puffin")
                written.append(location)
                with io.new_output(location).create(overwrite=False) as out:
                    out.write(data)
                records.append(
                    new_data_file(
                        3,
                        content=DataFileContent.POSITION_DELETES,
                        file_path=location,
                        file_format=FileFormat.PUFFIN,
                        record_count=len(new_sets[loc]),
                        file_size_in_bytes=len(data),
                        referenced_data_file=loc,
                        content_offset=meta.offset,
                        content_size_in_bytes=meta.length,
                        sort_order_id=None,
                        equality_ids=None,
                        key_metadata=None,
                    )
                )
                self._cache_put(self._delete_cache, (location, meta.offset, loc), new_sets[loc], _CACHE_DELETES)
            return records
        records = []
        for loc in sorted(new_sets):
            data = encode_position_deletes(loc, new_sets[loc])
            location = provider.new_data_location(f"{uuid.uuid4()}-deletes.parquet")
            written.append(location)
            with io.new_output(location).create(overwrite=False) as out:
                out.write(data)
            records.append(position_delete_data_file(location, len(data), loc, new_sets[loc]))
            self._cache_put(self._delete_cache, (location, None, loc), new_sets[loc], _CACHE_DELETES)
        return records

    def _write_index(self, io: FileIO, blob: bytes, snapshot_id: int, sequence_number: int, written: list[str]) -> str:
        data, _ = write_puffin(
            [PuffinBlob(type=INDEX_BLOB_TYPE, fields=[], data=bytes(blob), snapshot_id=snapshot_id, sequence_number=sequence_number)],
            {"created-by": CREATED_BY},
        )
        location = f"{self.location.rstrip('/')}/index/{snapshot_id}-{uuid.uuid4()}.puffin"
        written.append(location)
        with io.new_output(location).create(overwrite=False) as out:
            out.write(data)
        return location

    # ----------------------------------------------------------------- reading snapshots

    def _snapshot_files(self, io: FileIO, md: TableMetadata, snapshot: Snapshot | None) -> _SnapshotFiles:
        if snapshot is None:
            return _SnapshotFiles([], {}, {}, [])
        fv = md.format_version
        manifests = read_manifest_list(io, snapshot.manifest_list, fv)
        entries: dict[str, list[ManifestEntry]] = {}
        data: dict[str, _Live] = {}
        deletes: list[_Live] = []
        for manifest in manifests:
            cached = self._manifest_cache.get(manifest.path)
            if cached is None:
                cached = read_manifest_entries(io, manifest, fv)
                self._cache_put(self._manifest_cache, manifest.path, cached, _CACHE_MANIFESTS)
            entries[manifest.path] = cached
            for e in cached:
                if e.status == ManifestEntryStatus.DELETED:
                    continue
                content = e.data_file.content
                if content == DataFileContent.DATA:
                    if e.data_file.file_path in data:
                        raise ValueError(f"{self.identifier}: data file {e.data_file.file_path} is listed twice in one snapshot")
                    data[e.data_file.file_path] = _Live(e, manifest.path)
                elif content == DataFileContent.POSITION_DELETES:
                    deletes.append(_Live(e, manifest.path))
                else:
                    raise ValueError(
                        f"{self.identifier}: equality delete file {e.data_file.file_path} found; mirrors never write "
                        "equality deletes and cannot apply them"
                    )
        return _SnapshotFiles(manifests, entries, data, deletes)

    def _delete_targets(self, io: FileIO, snap: _SnapshotFiles, fv: int) -> dict[int, set[str]]:
        """For each live delete entry (by ``id``), the data files it deletes rows from."""
        out: dict[int, set[str]] = {}
        for live in snap.deletes:
            df = live.entry.data_file
            ref = data_file_field(df, "referenced_data_file", fv)
            if ref is None and df.lower_bounds and df.upper_bounds:
                lo, hi = df.lower_bounds.get(FILE_PATH_FIELD_ID), df.upper_bounds.get(FILE_PATH_FIELD_ID)
                if lo is not None and lo == hi:
                    ref = lo.decode("utf-8")
            if ref is not None:
                out[id(live.entry)] = {ref}
            elif df.file_format == FileFormat.PUFFIN:
                puffin = read_puffin(_read_all(io, df.file_path))
                out[id(live.entry)] = {b.properties.get("referenced-data-file") for b in puffin.blobs} - {None}
            else:
                out[id(live.entry)] = set(decode_position_deletes(_read_all(io, df.file_path)))
        return out

    def _deleted(self, io: FileIO, lives: list[_Live], target: str, fv: int, data_sequence_number: int) -> BitMap64:
        """Union of the positions that the delete entries ``lives`` delete in data file ``target``,
        counting only those whose data sequence number is >= the data file's (spec "Scan Planning")."""
        out = BitMap64()
        for live in lives:
            if (live.entry.sequence_number or 0) < data_sequence_number:
                continue
            out |= self._delete_set(io, live.entry.data_file, target, fv)
        return out

    def _delete_set(self, io: FileIO, df: DataFile, target: str, fv: int) -> BitMap64:
        offset = data_file_field(df, "content_offset", fv)
        key = (df.file_path, offset, target)
        cached = self._delete_cache.get(key)
        if cached is not None:
            return cached
        if df.file_format == FileFormat.PUFFIN:
            size = data_file_field(df, "content_size_in_bytes", fv)
            if offset is not None and size is not None:
                with io.new_input(df.file_path).open() as stream:
                    stream.seek(offset)
                    blob = stream.read(size)
                result = decode_deletion_vector(blob)
            else:
                puffin = read_puffin(_read_all(io, df.file_path))
                result = BitMap64()
                for meta in puffin.blobs:
                    if meta.properties.get("referenced-data-file") == target:
                        result |= decode_deletion_vector(puffin.blob_data(meta))
        else:
            result = decode_position_deletes(_read_all(io, df.file_path), target).get(target, BitMap64())
        self._cache_put(self._delete_cache, key, result, _CACHE_DELETES)
        return result

    @staticmethod
    def _cache_put(cache: OrderedDict, key, value, limit: int) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > limit:
            cache.popitem(last=False)

    def state(self, snapshot_id: int | None = None) -> PersistedState:
        """The persisted state of the current snapshot (or of ``snapshot_id``, time travel), reloaded from the
        catalog. Raises ``ValueError`` for an unknown ``snapshot_id``."""
        self.refresh()
        table = self._table
        md = table.metadata
        fv = md.format_version
        if snapshot_id is None:
            snapshot = md.current_snapshot()
        else:
            snapshot = md.snapshot_by_id(snapshot_id)
            if snapshot is None:
                raise ValueError(f"{self.identifier}: no snapshot {snapshot_id} (expired?)")
        if snapshot is None:
            return PersistedState(None, 0, {}, {}, None, table.metadata_location, fv)
        io = table.io
        snap = self._snapshot_files(io, md, snapshot)
        targets = self._delete_targets(io, snap, fv)
        by_file: dict[str, list[_Live]] = {}
        for live in snap.deletes:
            for target in targets[id(live.entry)]:
                by_file.setdefault(target, []).append(live)
        schema = md.schema()
        files = {}
        for location, live in snap.data.items():
            df = live.entry.data_file
            seq = live.entry.sequence_number or 0
            lives = by_file.get(location, [])
            deleted = self._deleted(io, lives, location, fv, seq)
            applicable = [l for l in lives if (l.entry.sequence_number or 0) >= seq]
            files[location] = DataFileState(
                location=location,
                record_count=df.record_count,
                file_size_in_bytes=df.file_size_in_bytes,
                deleted=deleted,
                sequence_number=seq,
                delete_file=applicable[-1].entry.data_file.file_path if applicable else None,
                lower_bounds=_decode_bounds(schema, df.lower_bounds),
                upper_bounds=_decode_bounds(schema, df.upper_bounds),
            )
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if snapshot.summary:
            summary["operation"] = snapshot.summary.operation.value
        index_blob = None
        if index_location := summary.get(SUMMARY_INDEX_FILE):
            puffin = read_puffin(_read_all(io, index_location))
            blobs = [b for b in puffin.blobs if b.type == INDEX_BLOB_TYPE]
            if not blobs:
                raise ValueError(f"{self.identifier}: index file {index_location} has no {INDEX_BLOB_TYPE} blob")
            index_blob = puffin.blob_data(blobs[0])
        return PersistedState(
            snapshot_id=snapshot.snapshot_id,
            sequence_number=snapshot.sequence_number or 0,
            summary=summary,
            data_files=files,
            index_blob=index_blob,
            metadata_location=table.metadata_location,
            format_version=fv,
        )

    # ----------------------------------------------------------------- maintenance

    def _files_of(self, io: FileIO, md: TableMetadata, snapshot: Snapshot) -> set[str]:
        """Every file a snapshot needs: manifest list, manifests, live data and delete files, index file."""
        snap = self._snapshot_files(io, md, snapshot)
        files = {snapshot.manifest_list}
        files.update(m.path for m in snap.manifests)
        files.update(snap.data)
        files.update(live.entry.data_file.file_path for live in snap.deletes)
        if snapshot.summary and (index := snapshot.summary.additional_properties.get(SUMMARY_INDEX_FILE)):
            files.add(index)
        return files

    def expire_snapshots(self, older_than_ms: int, retain_last: int = 1, *, delete_files: bool = False) -> list[str]:
        """Remove snapshots older than ``older_than_ms`` (epoch milliseconds) from the table metadata in one
        commit, keeping the newest ``retain_last`` (>= 1) snapshots of ``main`` and every snapshot a branch
        or tag points to (spec "Snapshot Retention Policy").

        Returns the locations (sorted) of files that only expired snapshots referenced: manifest lists,
        manifests, data and delete files, index Puffin files. They are deleted here only if
        ``delete_files``; otherwise that is the caller's choice (readers of an expired snapshot that
        started before this call may still need them). Retries on conflict like ``commit``.
        """
        if retain_last < 1:
            raise ValueError(f"retain_last: expected >= 1, found {retain_last}")
        last_conflict: Exception | None = None
        for attempt in range(1, self.commit_attempts + 1):
            self.refresh()
            table = self._table
            md = table.metadata
            keep: set[int] = set()
            for ref in md.refs.values():
                keep.add(ref.snapshot_id)
            current = md.current_snapshot()
            chain = []
            while current is not None:
                chain.append(current)
                current = md.snapshot_by_id(current.parent_snapshot_id) if current.parent_snapshot_id is not None else None
            keep.update(s.snapshot_id for s in chain[:retain_last])
            keep.update(s.snapshot_id for s in md.snapshots if s.timestamp_ms >= older_than_ms)
            expired = [s for s in md.snapshots if s.snapshot_id not in keep]
            if not expired:
                return []
            io = table.io
            kept_files: set[str] = set()
            for s in md.snapshots:
                if s.snapshot_id in keep:
                    kept_files |= self._files_of(io, md, s)
            candidates: set[str] = set()
            for s in expired:
                candidates |= self._files_of(io, md, s)
            orphans = sorted(candidates - kept_files)
            base = md.current_snapshot()
            try:
                new_metadata, new_location = commit_metadata(
                    self.catalog,
                    table,
                    (
                        AssertTableUUID(uuid=md.table_uuid),
                        AssertRefSnapshotId(ref="main", snapshot_id=base.snapshot_id if base else None),
                    ),
                    (RemoveSnapshotsUpdate(snapshot_ids=[s.snapshot_id for s in expired]),),
                    before_swap=self.before_swap,
                )
            except SwapConflict as e:
                last_conflict = e
                time.sleep(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))
                continue
            self._table = Table(
                identifier=table._identifier, metadata=new_metadata, metadata_location=new_location, io=io, catalog=self.catalog
            )
            if delete_files:
                _delete_quietly(io, orphans)
            return orphans
        raise CommitConflict(
            f"{self.identifier}: expire_snapshots lost the race {self.commit_attempts} times ({last_conflict})",
            retryable=True,
        )

    def drop(self, purge: bool = True) -> None:
        """Drop the table from the catalog; with ``purge``, delete every file of every snapshot, the index
        files, all metadata JSON files, and (local warehouses) the table directory. Raises
        ``NoSuchTableError`` if it is already gone."""
        table = self.catalog.load_table(self.identifier)
        md = table.metadata
        io = table.io
        files: set[str] = set()
        if purge:
            for s in md.snapshots:
                files |= self._files_of(io, md, s)
                snap = self._snapshot_files(io, md, s)
                for entries in snap.entries.values():
                    files.update(e.data_file.file_path for e in entries)
            files.update(entry.metadata_file for entry in md.metadata_log)
            files.add(table.metadata_location)
        self.catalog.drop_table(self.identifier)
        if purge:
            _delete_quietly(io, sorted(files))
            location = md.location
            if location.startswith("file://") or location.startswith("/"):
                shutil.rmtree(location[len("file://"):] if location.startswith("file://") else location, ignore_errors=True)


# --------------------------------------------------------------------- helpers


def _entry(fv: int, status: ManifestEntryStatus, snapshot_id, sequence_number, file_sequence_number, data_file: DataFile) -> ManifestEntry:
    return ManifestEntry.from_args(
        _table_format_version=fv,
        status=status,
        snapshot_id=snapshot_id,
        sequence_number=sequence_number,
        file_sequence_number=file_sequence_number,
        data_file=data_file,
    )


def _schema_list(schema) -> list[Schema]:
    if schema is None:
        return []
    return [schema] if isinstance(schema, Schema) else list(schema)


def _as_bitmap(positions) -> BitMap64:
    if isinstance(positions, BitMap64):
        return positions
    return BitMap64(positions)


def _find_commit(md: TableMetadata, commit_id: str) -> int | None:
    for s in md.snapshots:
        if s.summary and s.summary.additional_properties.get(SUMMARY_COMMIT_ID) == commit_id:
            return s.snapshot_id
    return None


def _read_all(io: FileIO, location: str) -> bytes:
    with io.new_input(location).open() as stream:
        return stream.read()


def _delete_quietly(io: FileIO, locations: Iterable[str]) -> None:
    for location in locations:
        try:
            io.delete(location)
        except FileNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - cleanup of orphans is best effort
            logger.warning("could not delete %s: %s", location, e)


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
            except Exception:  # noqa: BLE001 - a bound we cannot decode is just not offered
                continue
    return out


def _summary_counts(added_data, removed_data, added_deletes, removed_deletes, live_data, live_deletes) -> dict[str, str]:
    """Snapshot summary metrics (spec Appendix F names), as strings; zero 'added/removed' values left out."""

    def dvs(files):
        return [f for f in files if f.file_format == FileFormat.PUFFIN]

    def pos_files(files):
        return [f for f in files if f.file_format != FileFormat.PUFFIN]

    props: dict[str, int] = {
        "added-data-files": len(added_data),
        "deleted-data-files": len(removed_data),
        "added-records": sum(f.record_count for f in added_data),
        "deleted-records": sum(f.record_count for f in removed_data),
        "added-files-size": sum(f.file_size_in_bytes for f in added_data)
        + sum(f.file_size_in_bytes for f in {f.file_path: f for f in added_deletes}.values()),
        "removed-files-size": sum(f.file_size_in_bytes for f in removed_data)
        + sum(f.file_size_in_bytes for f in {f.file_path: f for f in removed_deletes}.values()),
        "added-delete-files": len(added_deletes),
        "removed-delete-files": len(removed_deletes),
        "added-dvs": len(dvs(added_deletes)),
        "removed-dvs": len(dvs(removed_deletes)),
        "added-position-delete-files": len(pos_files(added_deletes)),
        "removed-position-delete-files": len(pos_files(removed_deletes)),
        "added-position-deletes": sum(f.record_count for f in added_deletes),
        "removed-position-deletes": sum(f.record_count for f in removed_deletes),
    }
    out = {k: str(v) for k, v in props.items() if v}
    out.update(
        {
            "total-data-files": str(len(live_data)),
            "total-delete-files": str(len(live_deletes)),
            "total-records": str(sum(f.record_count for f in live_data)),
            "total-files-size": str(
                sum(f.file_size_in_bytes for f in live_data)
                + sum(f.file_size_in_bytes for f in {f.file_path: f for f in live_deletes}.values())
            ),
            "total-position-deletes": str(sum(f.record_count for f in live_deletes)),
            "total-equality-deletes": "0",
        }
    )
    return out
