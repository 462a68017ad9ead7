"""Persist: what one Iceberg commit of a mirrored table carries, and its bookkeeping afterwards.

A persist makes everything applied up to an LSN durable in ONE Iceberg commit (an ``overwrite`` or
``append`` snapshot, Iceberg spec "Snapshots"): the staged data files it adds, per data file the
deletes applied since the last commit (merged into that file's one deletion vector, Iceberg v3
"Deletion Vectors"), the files whose every row is deleted removed, the FileIndex as a blob, and the
snapshot summary property ``mooncake.flush-lsn`` (the slot may be confirmed up to it once the commit
landed). :func:`build_payload` gathers that into a :class:`PersistPayload` without changing the
table; the table's Iceberg side commits it; only then does :func:`apply_persist` move the files'
state (locations set, pending deletes committed, dropped files
retired), so a failed upload or commit leaves everything as it was and the next persist retries it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from pyroaring import BitMap64

from ..lsn import Lsn
from .disk_files import DiskFileSet
from .pending_deletes import PendingDeletes

__all__ = ["PersistPayload", "build_payload", "apply_persist", "INDEX_SAVE_INTERVAL_S"]

#: a persist of a table with an exact key (one integer column) saves the whole FileIndex
#: (``mooncake.index-file``, about 10 bytes per row of the table) when the last save is at least this
#: old (seconds), or the table has a new schema or no commit yet; its other persists carry the saved
#: one over (other tables save it at every persist). A restart re-indexes the data files the saved index
#: does not cover from their key columns (:meth:`~.mirror.MirrorTable.restore`), so this bounds that
#: work (the files persisted in the last minute) while a persist's cost stops growing with the table.
INDEX_SAVE_INTERVAL_S = 60.0


@dataclass(frozen=True)
class PersistPayload:
    """One persist's commit (module docstring).

    ``lsn``: the flush LSN it makes durable; ``add``: (file name, warehouse location) of the data
    files it adds; ``deletes``: data file location → positions newly deleted in it; ``remove``:
    locations of persisted files whose rows are all deleted; ``gone``: names of the table's files
    whose rows are all deleted (persisted or only staged: they leave the table); ``schemas``: the
    Iceberg schemas the commit adds (oldest first; None: unchanged); ``properties``: table
    properties to set (None: none); ``summary``: snapshot summary properties; ``index_blob``: the
    FileIndex as :meth:`DiskFileSet.index_blob` bytes, or None: the commit carries the last saved one
    over (:data:`INDEX_SAVE_INTERVAL_S`).
    """

    lsn: Lsn
    add: tuple[tuple[str, str], ...] = ()
    deletes: dict[str, BitMap64] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    schemas: Any = None
    properties: dict[str, str] | None = None
    summary: dict[str, str] = field(default_factory=dict)
    index_blob: bytes | None = None

    @property
    def new_deletes(self) -> int:
        """Positions newly in deletion vectors: the sum over ``deletes`` (data file location -> positions)."""
        return sum(len(b) for b in self.deletes.values())


def build_payload(
    disk: DiskFileSet,
    lsn: int,
    source: str,
    uploaded: dict[str, str],
    upload: Callable[[str], str],
    schemas: Any = None,
    properties: dict[str, str] | None = None,
    with_index: bool = True,
) -> PersistPayload:
    """The :class:`PersistPayload` of ``disk`` at ``lsn`` (changes nothing of ``disk``); ``with_index``:
    it carries the whole FileIndex (else the last saved one stays the snapshot's).

    ``uploaded``: staged files already copied to the warehouse (name → location); ``upload(local
    path) -> location`` copies the others (overwriting: an earlier failed persist may have copied
    them, names are unique). Raises what ``upload`` raises."""
    add: list[tuple[str, str]] = []
    deletes: dict[str, BitMap64] = {}
    remove: list[str] = []
    for f in list(disk.files.values()):
        if disk.fully_deleted(f):
            if f.persisted:
                remove.append(cast(str, f.location))  # persisted: it has a location
            continue
        loc = f.location
        if not f.persisted:
            loc = uploaded.get(f.name) or upload(cast(str, f.local_path))  # staged: it has a local copy
            add.append((f.name, loc))
        if f.pending:
            deletes[cast(str, loc)] = BitMap64(f.pending.bitmap)
    gone = tuple(f.name for f in disk.files.values() if disk.fully_deleted(f))
    return PersistPayload(
        lsn=Lsn(lsn),
        add=tuple(add),
        deletes=deletes,
        remove=tuple(remove),
        gone=gone,
        schemas=schemas,
        properties=properties,
        summary={"mooncake.flush-lsn": str(Lsn(lsn)), "mooncake.source": source},
        index_blob=disk.index_blob() if with_index else None,
    )


def apply_persist(disk: DiskFileSet, payload: PersistPayload, now: float | None = None) -> int:
    """After ``payload`` was committed (or had nothing to commit): added files get their locations and
    their staged copies retire, pending deletes become committed, files whose rows are all deleted
    leave the set. Returns the LSN reads must now be at or above (committed deletes lose their LSN):
    the table's ``flushed_lsn`` is raised to it."""
    now = time.time() if now is None else now
    files = disk.files
    for name, loc in payload.add:
        files[name].location = loc
    gone = [files.pop(name) for name in payload.gone]
    for name, _ in payload.add:
        f = files[name]
        if f.local_path:
            disk.retire(f.local_path, now)
            f.local_path = None
    floor = 0
    for f in files.values():
        if f.pending:
            floor = max(floor, f.pending.max_lsn() + 1)
            f.committed |= f.pending.bitmap
            f.pending = PendingDeletes()
    for f in gone:
        floor = max(floor, f.truncated_lsn + 1, f.pending.max_lsn() + 1)
        if f.local_path:
            disk.retire(f.local_path, now)
    disk.gc_retired()
    return floor
