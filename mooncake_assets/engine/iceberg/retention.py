"""Which snapshots expire and which files go with them; which files a dropped table leaves behind.

Spec section: "Snapshot Retention Policy" (snapshots a branch or tag points to are kept; ``main`` keeps
its newest ``retain_last`` ancestors; the rest older than the cut-off expire). A file is an orphan of
expiry when only expired snapshots reference it.

Cut tags (``cuts.py``) are refs like any other, so their snapshots stay; an expiry also drops the
cut tags beyond the newest ``keep_cuts`` and refs past their ``max-ref-age-ms`` (:func:`~.cuts.cuts_to_drop`),
whose snapshots may then expire.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from .cuts import cuts_to_drop
from .snapshots import SnapshotReader


@dataclass(frozen=True)
class ExpiryPlan:
    """``expired``: snapshot ids to remove (none: nothing to do). ``orphans``: sorted locations of the files
    only those snapshots reference (manifest lists, manifests, data and delete files, index files).
    ``refs``: names of the refs (cut tags, aged refs) the expiry removes first."""

    expired: list[int]
    orphans: list[str]
    refs: list[str] = field(default_factory=list)


def kept_snapshots(
    md: TableMetadata, older_than_ms: int, retain_last: int, drop_refs: Collection[str] = ()
) -> set[int]:
    """Ids of the snapshots that stay: every ref's (but those of ``drop_refs``), the newest ``retain_last``
    of ``main``'s chain, and those at or after ``older_than_ms`` (epoch milliseconds)."""
    keep = {ref.snapshot_id for name, ref in md.refs.items() if name not in drop_refs}
    chain = []
    current = md.current_snapshot()
    while current is not None:
        chain.append(current)
        current = md.snapshot_by_id(current.parent_snapshot_id) if current.parent_snapshot_id is not None else None
    keep.update(s.snapshot_id for s in chain[:retain_last])
    keep.update(s.snapshot_id for s in md.snapshots if s.timestamp_ms >= older_than_ms)
    return keep


def plan_expiry(
    reader: SnapshotReader,
    table: Table,
    older_than_ms: int,
    retain_last: int,
    keep_cuts: int | None = None,
    now_ms: int | None = None,
) -> ExpiryPlan:
    """What ``expire_snapshots(older_than_ms, retain_last, keep_cuts=…)`` removes from ``table`` as loaded.
    ``now_ms``: the time refs' ``max-ref-age-ms`` is measured at (default: now)."""
    md, io = table.metadata, table.io
    refs = cuts_to_drop(md, keep_cuts, int(time.time() * 1000) if now_ms is None else now_ms)
    keep = kept_snapshots(md, older_than_ms, retain_last, refs)
    expired = [s for s in md.snapshots if s.snapshot_id not in keep]
    if not expired:
        return ExpiryPlan([], [], refs)
    kept_files: set[str] = set()
    for s in md.snapshots:
        if s.snapshot_id in keep:
            kept_files |= reader.files_of(io, md, s)
    candidates: set[str] = set()
    for s in expired:
        candidates |= reader.files_of(io, md, s)
    return ExpiryPlan([s.snapshot_id for s in expired], sorted(candidates - kept_files), refs)


def all_files(reader: SnapshotReader, table: Table) -> list[str]:
    """Every file of ``table`` the metadata knows (for a purge): each snapshot's files and every entry of
    its manifests (DELETED ones too), every metadata JSON of the log and the current one; sorted."""
    md, io = table.metadata, table.io
    files: set[str] = set()
    for s in md.snapshots:
        files |= reader.files_of(io, md, s)
        snap = reader.files(io, md, s)
        for entries in snap.entries.values():
            files.update(e.data_file.file_path for e in entries)
    files.update(entry.metadata_file for entry in md.metadata_log)
    files.add(table.metadata_location)
    return sorted(files)
