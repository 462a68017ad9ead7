"""Reading one snapshot: its manifests, live data files and delete entries, and the positions those delete.

Spec sections (Iceberg table spec v3): "Manifest Lists" and "Manifests" (which entries are live),
"Scan Planning" (a delete file applies to a data file whose data sequence number is <= its own),
"Deletion Vectors" (a DV names its data file in ``referenced_data_file``; its blob sits at
``content_offset``/``content_size_in_bytes`` of a Puffin file) and "Position Delete Files" (v2: the
``file_path`` column; a file naming one data file has equal ``file_path`` bounds).

Manifests and delete files are immutable, so what is parsed from them is cached per reader (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import decode_deletion_vector, read_puffin

from .manifest import ManifestInfo, data_file_field, read_manifest_entries, read_manifest_list
from .names import SUMMARY_DELETE_LOG, SUMMARY_INDEX_FILE
from .position_deletes import FILE_PATH_FIELD_ID, decode_position_deletes

CACHE_MANIFESTS = 1024
"""Parsed manifests kept per reader."""

CACHE_DELETES = 4096
"""Decoded delete sets kept per reader."""

CACHE_MANIFEST_LISTS = 256
"""Parsed manifest lists kept per reader (one per snapshot; a manifest list is written once under a
name of its own and never changed, spec "Manifest Lists", so its path identifies its contents)."""


@dataclass
class LiveEntry:
    """A live (ADDED or EXISTING) manifest entry and the manifest holding it."""

    entry: ManifestEntry
    manifest: str

    @property
    def sequence_number(self) -> int:
        """The entry's data sequence number (0 when unknown)."""
        return self.entry.sequence_number or 0


@dataclass
class SnapshotFiles:
    """The parsed manifests of one snapshot.

    ``manifests``: as listed; ``entries``: manifest path -> every entry (DELETED included); ``data``:
    data file location -> its live entry; ``deletes``: live position-delete entries (DVs or v2 files).
    ``manifests`` and each ``entries`` value are tuples: the reader's caches share them between the
    snapshots it parses, so no caller may change them.
    """

    manifests: tuple[ManifestInfo, ...]
    entries: dict[str, tuple[ManifestEntry, ...]]
    data: dict[str, LiveEntry]
    deletes: list[LiveEntry]


def _cache_put(cache: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)


def read_all(io: FileIO, location: str) -> bytes:
    """The whole file at ``location``."""
    with io.new_input(location).open() as stream:
        return stream.read()


class SnapshotReader:
    """Reads snapshots of one table through ``io``, caching parsed manifest lists, manifests and decoded
    delete sets (immutable files, by path).

    ``identifier``: the table's name, for error messages.
    """

    def __init__(self, identifier: str) -> None:
        self.identifier = identifier
        self._manifests: OrderedDict[str, tuple[ManifestEntry, ...]] = OrderedDict()
        self._lists: OrderedDict[tuple[str, int], tuple[ManifestInfo, ...]] = OrderedDict()
        self._deletes: OrderedDict[tuple[Any, ...], BitMap64] = OrderedDict()

    def files(self, io: FileIO, md: TableMetadata, snapshot: Snapshot | None) -> SnapshotFiles:
        """The manifests and live entries of ``snapshot`` (empty for None). Raises ``ValueError`` for a data
        file listed twice or an equality delete file (mirrors never write them and cannot apply them)."""
        if snapshot is None:
            return SnapshotFiles((), {}, {}, [])
        fv = md.format_version
        manifests = self._lists.get((snapshot.manifest_list, fv))
        if manifests is None:
            manifests = tuple(read_manifest_list(io, snapshot.manifest_list, fv))
            _cache_put(self._lists, (snapshot.manifest_list, fv), manifests, CACHE_MANIFEST_LISTS)
        out = SnapshotFiles(manifests, {}, {}, [])
        for manifest in manifests:
            entries = self._manifests.get(manifest.path)
            if entries is None:
                entries = tuple(read_manifest_entries(io, manifest, fv))
                _cache_put(self._manifests, manifest.path, entries, CACHE_MANIFESTS)
            out.entries[manifest.path] = entries
            for e in entries:
                if e.status != ManifestEntryStatus.DELETED:
                    self._add_live(out, LiveEntry(e, manifest.path))
        return out

    def _add_live(self, out: SnapshotFiles, live: LiveEntry) -> None:
        df = live.entry.data_file
        if df.content == DataFileContent.DATA:
            if df.file_path in out.data:
                raise ValueError(f"{self.identifier}: data file {df.file_path} is listed twice in one snapshot")
            out.data[df.file_path] = live
        elif df.content == DataFileContent.POSITION_DELETES:
            out.deletes.append(live)
        else:
            raise ValueError(
                f"{self.identifier}: equality delete file {df.file_path} found; mirrors never write "
                "equality deletes and cannot apply them"
            )

    def delete_targets(self, io: FileIO, snap: SnapshotFiles, fv: int) -> dict[int, set[str]]:
        """For each live delete entry (by ``id`` of the entry), the data files it deletes rows from: the
        DV's ``referenced_data_file``, else equal ``file_path`` bounds, else the file's contents."""
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
                puffin = read_puffin(read_all(io, df.file_path))
                out[id(live.entry)] = cast(  # None is subtracted
                    set[str], {b.properties.get("referenced-data-file") for b in puffin.blobs} - {None}
                )
            else:
                out[id(live.entry)] = set(decode_position_deletes(read_all(io, df.file_path)))
        return out

    def deletes_by_file(
        self, io: FileIO, snap: SnapshotFiles, fv: int
    ) -> tuple[dict[int, set[str]], dict[str, list[LiveEntry]]]:
        """(``delete_targets``, data file location -> the live delete entries naming it)."""
        targets = self.delete_targets(io, snap, fv)
        by_file: dict[str, list[LiveEntry]] = {}
        for live in snap.deletes:
            for target in targets[id(live.entry)]:
                by_file.setdefault(target, []).append(live)
        return targets, by_file

    def deleted(self, io: FileIO, lives: list[LiveEntry], target: str, fv: int, data_sequence_number: int) -> BitMap64:
        """Union of the positions that the delete entries ``lives`` delete in data file ``target``, counting
        only those whose data sequence number is >= the data file's (spec "Scan Planning")."""
        out = BitMap64()
        for live in lives:
            if live.sequence_number < data_sequence_number:
                continue
            out |= self.delete_set(io, live.entry.data_file, target, fv)
        return out

    def delete_set(self, io: FileIO, df: DataFile, target: str, fv: int) -> BitMap64:
        """The positions delete file ``df`` deletes in ``target``: its DV blob (read at ``content_offset``
        when known), or its v2 rows for ``target``."""
        offset = data_file_field(df, "content_offset", fv)
        key = (df.file_path, offset, target)
        cached = self._deletes.get(key)
        if cached is not None:
            return cached
        if df.file_format == FileFormat.PUFFIN:
            size = data_file_field(df, "content_size_in_bytes", fv)
            if offset is not None and size is not None:
                with io.new_input(df.file_path).open() as stream:
                    stream.seek(offset)
                    result = decode_deletion_vector(stream.read(size))
            else:
                puffin = read_puffin(read_all(io, df.file_path))
                result = BitMap64()
                for meta in puffin.blobs:
                    if meta.properties.get("referenced-data-file") == target:
                        result |= decode_deletion_vector(puffin.blob_data(meta))
        else:
            result = decode_position_deletes(read_all(io, df.file_path), target).get(target, BitMap64())
        self.remember_deletes(df.file_path, offset, target, result)
        return result

    def remember_deletes(self, location: str, offset: int | None, target: str, positions: BitMap64) -> None:
        """Cache the positions a delete file just written here deletes in ``target`` (saves re-reading it)."""
        _cache_put(self._deletes, (location, offset, target), positions, CACHE_DELETES)

    def files_of(self, io: FileIO, md: TableMetadata, snapshot: Snapshot) -> set[str]:
        """Every file a snapshot needs: manifest list, manifests, live data and delete files, index file,
        delete log."""
        snap = self.files(io, md, snapshot)
        files = {snapshot.manifest_list}
        files.update(m.path for m in snap.manifests)
        files.update(snap.data)
        files.update(live.entry.data_file.file_path for live in snap.deletes)
        if snapshot.summary and (index := snapshot.summary.additional_properties.get(SUMMARY_INDEX_FILE)):
            files.add(index)
        if snapshot.summary and (log := snapshot.summary.additional_properties.get(SUMMARY_DELETE_LOG)):
            files.add(log)
        return files
