"""An Iceberg **v2** table written the way Flink's upsert sink writes a CDC stream: one data file and one
equality-delete file per commit. The union-read bench reads it with DuckDB's ``iceberg_scan``, the
reader users of such a table run (:mod:`.union_read`).

Neither PyIceberg (0.12: it reads no equality deletes and writes none) nor DuckDB writes equality
deletes, so the files are written here with PyArrow and the table's metadata with the engine's own
manifest writers (:mod:`mooncake_assets.engine.iceberg.manifest`, which drive PyIceberg's Avro writer
through the version-gated ``compat`` module) and committed through PyIceberg's catalog
(``Catalog.create_table``, ``Catalog.commit_table`` by way of
:func:`~mooncake_assets.engine.iceberg.catalog.commit_metadata`).

What is written (Iceberg table spec, format version 2):

- "Equality Delete Files": a Parquet file with the key column only (``aid``, field id 1, its
  ``PARQUET:field_id`` set); its manifest entry has ``content = 2`` (EQUALITY_DELETES) and
  ``equality_ids = [1]`` (``data_file`` field 135, required when content is 2). A data row is deleted
  when its key equals a delete row's and, per "Scan Planning", the data file's data sequence number is
  strictly less than the delete file's (so the commit's own new versions survive its deletes).
- "Manifests": per commit one manifest with manifest metadata ``content = data`` for the data file and
  one with ``content = deletes`` for the delete file; entries ADDED, their sequence numbers inherited
  ("Sequence Number Inheritance"). "Manifest Lists": the earlier manifests carried unchanged plus the two
  new ones (``content`` 0 and 1), as an append-style RowDelta does below the manifest-merge threshold.
- "Snapshots": the first commit (the initial copy) is an ``append``; every later one an ``overwrite``
  with the Appendix F summary metrics (``added-equality-delete-files``, ``added-equality-deletes``, ...).
- Table: ``format-version = 2``, the key as the schema's ``identifier-field-ids``,
  ``write.upsert.enabled = true`` (Iceberg docs, "Flink Writes", upsert mode: every upserted key is written
  to the checkpoint's equality-delete file, its new version to the data file).

Flink writes a position delete against the checkpoint's own data file when a key is upserted twice in
one checkpoint; here the writer keeps only the last version of a key per commit instead, which reads
the same (one live version per key).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, DataFileContent, ManifestContent, ManifestEntryStatus
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, AssertTableUUID, SetSnapshotRefUpdate

from ..engine.iceberg.catalog import commit_metadata
from ..engine.iceberg.datafile import data_file_from_parquet_metadata, iceberg_arrow_schema
from ..engine.iceberg.manifest import read_manifest_list, set_data_file_field, write_manifest, write_manifest_list
from ..engine.iceberg.producer import manifest_entry
from ..engine.table.disk_files import write_parquet

__all__ = ["FlinkUpsertTable", "FORMAT_VERSION"]

FORMAT_VERSION = 2


@dataclass
class CommitFiles:
    """One commit's files: its data sequence number and the local paths of its data and delete files."""

    sequence_number: int
    data: list[str]
    deletes: list[str]


@dataclass
class CommitStats:
    """What the table holds: commits, data files, equality-delete files and their rows."""

    commits: int = 0
    data_files: int = 0
    equality_delete_files: int = 0
    equality_delete_rows: int = 0


class FlinkUpsertTable:
    """A v2 table with the upsert sink's layout (module docstring), built commit by commit.

    ``catalog``: a PyIceberg catalog (the bench uses a SQLite ``SqlCatalog``); ``identifier``:
    ``"namespace.table"``; ``schema``: the Iceberg schema, its ``identifier_field_ids`` the key (the
    equality fields); ``files_dir``: where the data and delete files are written (any local directory;
    manifests go under the table location's ``metadata/``). Raises what PyIceberg's ``create_table``
    raises (``TableAlreadyExistsError``).
    """

    def __init__(self, catalog: Catalog, identifier: str, schema: Schema, files_dir: Path) -> None:
        if not schema.identifier_field_ids:
            raise ValueError("FlinkUpsertTable: the schema needs identifier_field_ids (the upsert key)")
        namespace = identifier.rsplit(".", 1)[0]
        catalog.create_namespace_if_not_exists(namespace)
        self.catalog = catalog
        self.identifier = identifier
        self.table: Table = catalog.create_table(
            identifier,
            schema=schema,
            properties={
                "format-version": str(FORMAT_VERSION),
                "write.upsert.enabled": "true",
                "write.delete.mode": "merge-on-read",
                "write.update.mode": "merge-on-read",
            },
        )
        self.files_dir = Path(files_dir)
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.stats = CommitStats()
        self.commits: list[CommitFiles] = []  # every commit's files, oldest first
        self._files = 0

    @property
    def metadata_location(self) -> str:
        """The current metadata JSON (what ``iceberg_scan`` takes)."""
        return self.table.metadata_location

    @property
    def equality_ids(self) -> list[int]:
        return list(self.table.schema().identifier_field_ids)

    def arrow_schema(self) -> pa.Schema:
        """The data files' Arrow schema (the table's columns with ``PARQUET:field_id``)."""
        return iceberg_arrow_schema(self.table.schema())

    def key_arrow_schema(self) -> pa.Schema:
        """The equality-delete files' Arrow schema: the key columns only, with their field ids."""
        return iceberg_arrow_schema(self._key_schema())

    def _key_schema(self) -> Schema:
        s = self.table.schema()
        return Schema(*[s.find_field(i) for i in self.equality_ids], schema_id=s.schema_id)

    # ------------------------------------------------------------------------------ writing files

    def write_data_file(self, rows: pa.Table, path: Path | None = None) -> str:
        """Write ``rows`` (the table's columns, by name) as a Parquet data file; returns its path."""
        path = path or self._new_path("data")
        write_parquet(rows.select(self.arrow_schema().names).cast(self.arrow_schema()), path)
        return str(path)

    def write_equality_delete_file(self, keys: pa.Table) -> str:
        """Write an equality-delete file of ``keys`` (the key columns, by name); returns its path."""
        path = self._new_path("eq-deletes")
        ks = self.key_arrow_schema()
        write_parquet(keys.select(ks.names).cast(ks), path)
        return str(path)

    def _new_path(self, kind: str) -> Path:
        self._files += 1
        return self.files_dir / f"{self._files:05d}-{kind}-{uuid.uuid4().hex[:8]}.parquet"

    # ------------------------------------------------------------------------------ commits

    def append(self, data_paths: Sequence[str]) -> int:
        """Commit the data files (already written, e.g. an initial copy) as one ``append``; returns the
        snapshot id."""
        return self._commit([self._data_file(p, DataFileContent.DATA) for p in data_paths], [], list(data_paths), [])

    def upsert(self, rows: pa.Table) -> int:
        """One checkpoint's commit: ``rows`` (one version per key) as a data file, their keys as an
        equality-delete file, both in one ``overwrite`` snapshot; returns its id."""
        data = self.write_data_file(rows)
        deletes = self.write_equality_delete_file(
            rows.select([self._key_schema().find_column_name(i) for i in self.equality_ids])
        )
        return self._commit(
            [self._data_file(data, DataFileContent.DATA)],
            [self._data_file(deletes, DataFileContent.EQUALITY_DELETES)],
            [data],
            [deletes],
        )

    def _data_file(self, path: str, content: DataFileContent) -> DataFile:
        """The ``data_file`` record (metrics from the Parquet footer) of a data or equality-delete file."""
        p = Path(path)
        schema = self.table.schema() if content == DataFileContent.DATA else self._key_schema()
        df = data_file_from_parquet_metadata(
            "file://" + str(p.resolve()),
            p.stat().st_size,
            pq.read_metadata(p),
            schema,
            self.table.metadata.properties,
            FORMAT_VERSION,
        )
        if content == DataFileContent.EQUALITY_DELETES:
            set_data_file_field(df, "content", DataFileContent.EQUALITY_DELETES, FORMAT_VERSION)
            set_data_file_field(df, "equality_ids", self.equality_ids, FORMAT_VERSION)
        return df

    def _commit(
        self, data: list[DataFile], deletes: list[DataFile], data_paths: list[str], delete_paths: list[str]
    ) -> int:
        """One snapshot adding ``data`` and ``deletes`` (module docstring; ``*_paths``: their local
        paths, for :attr:`commits`); returns its id."""
        md = self.table.metadata
        io = self.table.io
        base = md.current_snapshot()
        snapshot_id = md.new_snapshot_id()
        seq = md.next_sequence_number()
        provider = load_location_provider(md.location, md.properties)
        manifests = [(m, 0) for m in read_manifest_list(io, base.manifest_list, FORMAT_VERSION)] if base else []
        for content, files in ((ManifestContent.DATA, data), (ManifestContent.DELETES, deletes)):
            if files:
                loc = provider.new_metadata_location(f"{uuid.uuid4()}-m{int(content)}.avro")
                entries = [
                    manifest_entry(FORMAT_VERSION, ManifestEntryStatus.ADDED, snapshot_id, None, None, f) for f in files
                ]
                info = write_manifest(
                    io,
                    loc,
                    format_version=FORMAT_VERSION,
                    schema=md.schema(),
                    spec=md.spec(),
                    content=content,
                    snapshot_id=snapshot_id,
                    sequence_number=seq,
                    entries=entries,
                )
                manifests.append((info, 0))
        manifest_list = provider.new_metadata_location(f"snap-{snapshot_id}-1-{uuid.uuid4()}.avro")
        write_manifest_list(
            io,
            manifest_list,
            format_version=FORMAT_VERSION,
            snapshot_id=snapshot_id,
            parent_snapshot_id=base.snapshot_id if base else None,
            sequence_number=seq,
            first_row_id=None,
            manifests=manifests,
        )
        # PyIceberg's pydantic models take field names (populate_by_name)
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=snapshot_id,
            parent_snapshot_id=base.snapshot_id if base else None,
            sequence_number=seq,
            timestamp_ms=max(int(time.time() * 1000), md.last_updated_ms),
            manifest_list=manifest_list,
            summary=self._summary(base, data, deletes),
            schema_id=md.current_schema_id,
        )
        updates = (
            AddSnapshotUpdate(snapshot=snapshot),
            SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=snapshot_id),  # type: ignore[call-arg, arg-type]
        )
        requirements = (
            AssertTableUUID(uuid=md.table_uuid),
            AssertRefSnapshotId(ref="main", snapshot_id=base.snapshot_id if base else None),  # type: ignore[call-arg]
        )
        commit_metadata(self.catalog, self.table, requirements, updates)
        self.table = self.catalog.load_table(self.identifier)
        self.commits.append(CommitFiles(seq, [str(p) for p in data_paths], [str(p) for p in delete_paths]))
        self.stats.commits += 1
        self.stats.data_files += len(data)
        self.stats.equality_delete_files += len(deletes)
        self.stats.equality_delete_rows += sum(d.record_count for d in deletes)
        return snapshot_id

    @staticmethod
    def _summary(base: Snapshot | None, data: list[DataFile], deletes: list[DataFile]) -> Summary:
        """Snapshot summary (spec "Snapshots"; metric names of Appendix F), totals carried from ``base``."""
        prev = base.summary.additional_properties if base and base.summary else {}
        added = {
            "added-data-files": len(data),
            "added-records": sum(d.record_count for d in data),
            "added-delete-files": len(deletes),
            "added-equality-delete-files": len(deletes),
            "added-equality-deletes": sum(d.record_count for d in deletes),
            "added-files-size": sum(d.file_size_in_bytes for d in data + deletes),
        }
        totals = {
            "total-data-files": "added-data-files",
            "total-records": "added-records",
            "total-delete-files": "added-delete-files",
            "total-equality-deletes": "added-equality-deletes",
            "total-files-size": "added-files-size",
        }
        props = {k: str(v) for k, v in added.items() if v}
        for total, add in totals.items():
            props[total] = str(int(prev.get(total, 0)) + added[add])
        props["total-position-deletes"] = prev.get("total-position-deletes", "0")
        op = Operation.OVERWRITE if deletes else Operation.APPEND
        return Summary(operation=op, **props)
