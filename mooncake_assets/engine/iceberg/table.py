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

Modules: this one is the table-facing entry points (create, load, upload, commit, state, expire,
drop); ``producer.py`` produces one snapshot in phases; ``snapshots.py`` reads one; ``writers.py`` and
``manifest.py`` write the files; ``catalog.py`` swaps the pointer; ``compat.py`` holds every use of
PyIceberg's internals.

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
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import TableAlreadyExistsError
from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.name_mapping import create_mapping_from_schema
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    TableRequirement,
    TableUpdate,
)
from pyroaring import BitMap64

import mooncake_assets.engine.iceberg.compat as compat

from .catalog import (
    SwapConflict,
    check_catalog_supports,
    commit_metadata,
    new_metadata_location,
    split_identifier,
    write_metadata,
)
from .cuts import tag_updates
from .datafile import data_file_from_parquet, data_file_from_parquet_metadata, iceberg_arrow_schema
from .errors import CommitConflict, CommitStateUnknown
from .lineage import FileLineage, live_file_lineage
from .names import (
    CREATED_BY,
    DELETE_FORMATS,
    INDEX_BLOB_TYPE,
    PROPERTY_DELETE_FORMAT,
    SUMMARY_COMMIT_ID,
    SUMMARY_FLUSH_LSN,
    SUMMARY_INDEX_FILE,
)
from .producer import CommitRequest, SnapshotProducer, delete_quietly, find_commit, schema_list
from .retention import ExpiryPlan, all_files, plan_expiry
from .snapshots import SnapshotReader
from .state import DataFileState, PersistedState, read_state

__all__ = [
    "CREATED_BY",
    "DELETE_FORMATS",
    "INDEX_BLOB_TYPE",
    "PROPERTY_DELETE_FORMAT",
    "SUMMARY_COMMIT_ID",
    "SUMMARY_FLUSH_LSN",
    "SUMMARY_INDEX_FILE",
    "DataFileState",
    "IcebergMirrorTable",
    "PersistedState",
]

logger = logging.getLogger(__name__)


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

    Longer than ~400 lines because every change of the table's metadata (commit, expiry, tag) shares
    its reload / compare-and-swap / retry state (the loaded ``Table``, the uploaded-not-committed
    files, the snapshot reader's caches); the phases of a commit live in ``producer.py``, reading in
    ``snapshots.py``, expiry planning in ``retention.py`` and cut tags in ``cuts.py``.
    """

    commit_attempts: int = 5
    manifest_merge_threshold: int = 32
    before_swap: Callable[[str | None], None] | None = None

    def __init__(self, catalog: Catalog, identifier: str, table: Table) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self._table = table
        self._prepared: dict[str, DataFile] = {}  # uploaded, not committed yet: location -> its record
        self._reader = SnapshotReader(identifier)

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
        schema = compat.iceberg_schema(arrow_schema, format_version)
        props = {
            "format-version": str(format_version),
            PROPERTY_DELETE_FORMAT: delete_format,
            "write.delete.mode": "merge-on-read",
            "write.update.mode": "merge-on-read",
            **(properties or {}),
        }
        if compat.is_rest_catalog(catalog):
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
            delete_quietly(io, [metadata_location])
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
        for s in self._table.metadata.schemas + schema_list(schema):
            ids.update(index_by_id(s))
        return ids

    def upload_data_file(
        self, local_path: str, *, overwrite: bool = False, schema: Schema | Sequence[Schema] | None = None
    ) -> str:
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
            location,
            size,
            pq.read_metadata(local_path),
            self.schema,
            self._table.metadata.properties,
            self.format_version,
            known_field_ids=self.known_field_ids(schema),
        )
        output = self.io.new_output(location)
        with open(local_path, "rb") as src, output.create(overwrite=overwrite) as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        self._prepared[location] = data_file
        return location

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
        request = CommitRequest.of(
            add_files=add_files,
            deletes=deletes,
            remove_files=remove_files,
            index_blob=index_blob,
            summary=summary,
            operation=operation,
            schema=schema,
            properties=properties,
        )
        for location in request.add_files:
            if location not in self._prepared:
                self._prepared[location] = data_file_from_parquet(
                    self.io,
                    location,
                    self.schema,
                    self._table.metadata.properties,
                    self.format_version,
                    self.known_field_ids(schema),
                )
        last_conflict: Exception | None = None
        for attempt in range(1, self.commit_attempts + 1):
            try:
                return self._commit_attempt(request, attempt)
            except SwapConflict as e:
                last_conflict = e
                logger.info("%s: commit attempt %d lost a race (%s); retrying", self.identifier, attempt, e)
                _backoff(attempt)
        raise CommitConflict(
            f"{self.identifier}: commit lost the race {self.commit_attempts} times in a row ({last_conflict}); "
            "nothing was committed, calling commit again may succeed",
            retryable=True,
        )

    def _commit_attempt(self, request: CommitRequest, attempt: int) -> int:
        """One try of ``request``: reload, produce the snapshot on the table as it is now, swap the pointer.
        Returns the snapshot id (also when an earlier try turns out to have landed). Raises
        ``SwapConflict`` after deleting this try's files when another writer moved the pointer first."""
        self.refresh()
        done = find_commit(self._table.metadata, request.commit_id)
        if done is not None:
            return done
        new_files = {location: self._prepared[location] for location in request.add_files}
        producer = SnapshotProducer(
            self._table,
            self._reader,
            request,
            new_files,
            attempt=attempt,
            manifest_merge_threshold=self.manifest_merge_threshold,
        )
        try:
            produced = producer.produce()
            new_metadata, new_location = commit_metadata(
                self.catalog, self._table, produced.requirements, produced.updates, before_swap=self.before_swap
            )
        except CommitStateUnknown:
            if (done := self._landed(request.commit_id)) is not None:
                return done
            raise  # not visible now; the attempt's files are kept (the swap may still be in flight)
        except SwapConflict:
            # Defence in depth: only delete the attempt's files once the table shows it did not land.
            if (done := self._landed(request.commit_id)) is not None:
                return done
            producer.discard()
            raise
        self._table = compat.table_at(self._table, new_metadata, new_location, self.catalog)
        for location in request.add_files:
            self._prepared.pop(location, None)
        return produced.snapshot_id

    def _landed(self, commit_id: str) -> int | None:
        """Reload; the snapshot id of the commit ``commit_id`` if the table now has it."""
        return find_commit(self.refresh().table.metadata, commit_id)

    # ----------------------------------------------------------------- reading snapshots

    def state(self, snapshot_id: int | None = None, index: bool = True, refresh: bool = True) -> PersistedState:
        """The persisted state of the current snapshot (or of ``snapshot_id``, time travel), reloaded from the
        catalog (``refresh`` False: from the metadata as loaded last, for a caller that just reloaded it);
        ``index`` False: without the index blob (:func:`.state.read_state`). Raises ``ValueError`` for an
        unknown ``snapshot_id``."""
        if refresh:
            self.refresh()
        md = self._table.metadata
        if snapshot_id is None:
            snapshot = md.current_snapshot()
        else:
            snapshot = md.snapshot_by_id(snapshot_id)
            if snapshot is None:
                raise ValueError(f"{self.identifier}: no snapshot {snapshot_id} (expired?)")
        return read_state(self._reader, self._table, snapshot, index)

    def row_lineage(self, locations: Iterable[str]) -> dict[str, FileLineage]:
        """:func:`.lineage.live_file_lineage` of this table (the table as loaded last looked at first)."""
        return live_file_lineage(self.catalog, self.identifier, self._table, self.format_version, locations)

    def files_of(
        self, snapshot: Snapshot, *, io: FileIO | None = None, metadata: TableMetadata | None = None
    ) -> set[str]:
        """Every file ``snapshot`` needs: manifest list, manifests, live data and delete files, index file.
        ``io``/``metadata``: of the table as loaded last, unless given."""
        return self._reader.files_of(io or self.io, metadata or self._table.metadata, snapshot)

    # ----------------------------------------------------------------- maintenance

    def expire_snapshots(
        self,
        older_than_ms: int,
        retain_last: int = 1,
        *,
        delete_files: bool = False,
        keep_cuts: int | None = None,
    ) -> list[str]:
        """Remove snapshots older than ``older_than_ms`` (epoch milliseconds) from the table metadata in one
        commit, keeping the newest ``retain_last`` (>= 1) snapshots of ``main`` and every snapshot a branch
        or tag points to (spec "Snapshot Retention Policy"). The same commit first removes the cut tags
        beyond the newest ``keep_cuts`` (None: all kept) and every ref past its ``max-ref-age-ms``
        (``cuts.cuts_to_drop``); their snapshots then expire like any other.

        Returns the locations (sorted) of files that only expired snapshots referenced: manifest lists,
        manifests, data and delete files, index Puffin files. They are deleted here only if
        ``delete_files``; otherwise that is the caller's choice (readers of an expired snapshot that
        started before this call may still need them). Retries on conflict like ``commit``.
        """
        if retain_last < 1:
            raise ValueError(f"retain_last: expected >= 1, found {retain_last}")
        plans: list[ExpiryPlan] = []

        def plan(table: Table) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]] | None:
            p = plan_expiry(self._reader, table, older_than_ms, retain_last, keep_cuts)
            plans[:] = [p]
            if not p.expired and not p.refs:
                return None
            base = table.metadata.current_snapshot()
            # PyIceberg's pydantic models take field names too (populate_by_name); without the pydantic
            # mypy plugin its types know only the aliases (snapshot-id)
            requirements = (
                AssertTableUUID(uuid=table.metadata.table_uuid),
                AssertRefSnapshotId(ref="main", snapshot_id=base.snapshot_id if base else None),  # type: ignore[call-arg]
            )
            updates: tuple[TableUpdate, ...] = tuple(RemoveSnapshotRefUpdate(ref_name=n) for n in p.refs)  # type: ignore[call-arg]
            if p.expired:
                updates += (RemoveSnapshotsUpdate(snapshot_ids=p.expired),)  # type: ignore[call-arg]  # as above
            return requirements, updates

        if not self._commit_updates("expire_snapshots", plan):
            return []
        if delete_files:
            delete_quietly(self.io, plans[0].orphans)
        return plans[0].orphans

    def tag(self, name: str, snapshot_id: int, *, max_ref_age_ms: int | None = None) -> None:
        """Point the tag ``name`` at ``snapshot_id`` in one commit (spec "Snapshot References": a ref of type
        ``tag``; ``max_ref_age_ms``: its max age, None for none). Setting a tag again to the same snapshot is
        a no-op; a tag pointing elsewhere is moved. Through the same compare-and-swap as ``commit``
        (PyIceberg's ``ManageSnapshots.create_tag`` commits through ``catalog.commit_table``, which cannot
        write v3 metadata in PyIceberg 0.12). Raises ``ValueError`` for an unknown snapshot,
        ``CommitConflict`` after ``commit_attempts`` lost races."""

        def plan(table: Table) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]] | None:
            updates = tag_updates(table.metadata, name, snapshot_id, max_ref_age_ms)
            if not updates:
                return None
            return (AssertTableUUID(uuid=table.metadata.table_uuid),), updates

        self._commit_updates(f"tag {name!r}", plan)

    def _commit_updates(
        self,
        what: str,
        plan: Callable[[Table], tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...]] | None],
    ) -> bool:
        """A metadata-only commit: per attempt, reload and ask ``plan`` for (requirements, updates) on the
        table as it is now (None: nothing to do, returns False), then swap; True once it landed. Retries a
        lost race up to ``commit_attempts`` times with backoff, then ``CommitConflict`` naming ``what``."""
        last_conflict: Exception | None = None
        for attempt in range(1, self.commit_attempts + 1):
            table = self.refresh().table
            todo = plan(table)
            if todo is None:
                return False
            try:
                new_metadata, new_location = commit_metadata(
                    self.catalog, table, todo[0], todo[1], before_swap=self.before_swap
                )
            except SwapConflict as e:
                last_conflict = e
                _backoff(attempt)
                continue
            self._table = compat.table_at(table, new_metadata, new_location, self.catalog)
            return True
        raise CommitConflict(
            f"{self.identifier}: {what} lost the race {self.commit_attempts} times ({last_conflict})",
            retryable=True,
        )

    def drop(self, purge: bool = True) -> None:
        """Drop the table from the catalog; with ``purge``, delete every file of every snapshot, the index
        files, all metadata JSON files, and (local warehouses) the table directory. Raises
        ``NoSuchTableError`` if it is already gone."""
        table = self.catalog.load_table(self.identifier)
        files = all_files(self._reader, table) if purge else []
        self.catalog.drop_table(self.identifier)
        if purge:
            delete_quietly(table.io, files)
            location = table.metadata.location
            if location.startswith("file://") or location.startswith("/"):
                shutil.rmtree(
                    location[len("file://") :] if location.startswith("file://") else location, ignore_errors=True
                )


def _backoff(attempt: int) -> None:
    """Sleep before retry ``attempt + 1``: exponential from 40 ms, capped at 1 s, jittered by 0.5-1.5x."""
    time.sleep(min(1.0, 0.02 * 2**attempt) * (0.5 + random.random()))
