"""Data compaction and index merge of one :class:`~mooncake_assets.engine.table.mirror.MirrorTable`
while replication goes on (docs/architecture.md#maintenance).

The service lock (``lock``: the one the apply loop holds per batch of transactions) is held only for
two short moments; the heavy work runs without it:

1. **snapshot** (lock): persist first if the table has unpersisted changes (``persist_first``), pick
   files by policy (persisted files only); the table hands out a frozen
   :class:`~mooncake_assets.engine.table.maintenance.CompactionInput` (each picked file with a copy of
   its committed deletion vector, the IndexBlocks that cover them, the table's live file names);
2. **work** (no lock): rewrite the live rows (:func:`.rewriter.rewrite_files`, keeping the old→new
   :class:`~mooncake_assets.engine.index.PositionMap`), rebuild the index of those blocks in one
   linear pass (``FileIndex.build_from_compaction``: entries of rewritten rows move, entries of
   dropped rows and of files no longer in the table go, others stay) — both in a child process of
   lower priority in ``maintenance: auto`` (:mod:`.worker`) — and upload the new files to the
   warehouse;
3. **swap** (lock): the work's :class:`~mooncake_assets.engine.table.maintenance.CompactionResult`
   goes back to the table, which re-maps the deletes that arrived meanwhile — positions of the old files deleted by
   transactions applied during step 2 (pending, keeping their commit LSNs) or committed by a persist
   during step 2 (they go into the new files' deletion vectors); a delete whose row has no new
   position is dropped and counted — then ONE Iceberg commit (operation ``replace``: new files and
   their DVs added, old files removed, the new index blob, ``mooncake.flush-lsn`` unchanged), then the
   table applies the swap of files and blocks (nothing here changes a table's state itself). A reader's ReadState is taken under the same lock, so it sees
   the old files or the new ones, never a mix.

Visibility: the rewrite drops only rows whose delete was already persisted, and a persist advances
``flushed_lsn`` past every delete it makes permanent, so at any LSN a read may still ask for
(≥ ``flushed_lsn``) the new files show exactly what the old ones did; ``flushed_lsn`` and ``flush_lsn``
do not move.

Old data files stay in the warehouse while older snapshots reference them; :func:`expire_and_clean`
expires snapshots past the retention and deletes the files only they referenced, plus orphans (files
under the table location no snapshot references: a crashed persist or compaction leaves them).

Errors: a failure before the commit deletes what the run wrote and re-raises (the table is unchanged;
retrying may help when the cause was temporary). ``CommitStateUnknown`` from the catalog keeps the
written files (the commit may have landed; the next restart reloads the truth).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pyroaring import BitMap64

from ..faults import fault
from ..iceberg.errors import CommitStateUnknown
from ..index import IndexBlock
from ..table.maintenance import CompactionResult
from .planner import FileStats, plan_compaction
from .policy import MaintenancePolicy
from .rewriter import RewriteInput, RewriteResult
from .worker import Reindex, compact_in_child, merge_in_child

if TYPE_CHECKING:
    from ..table.maintenance import CompactionInput, PreparedSwap
    from ..table.mirror import MirrorTable
    from .planner import CompactionPlan

#: the service lock (or None: a private one)
_Lock = AbstractContextManager[object]

__all__ = ["compact", "merge_index", "expire_and_clean", "clean_local", "file_stats", "maintenance_lock"]

log = logging.getLogger("mooncake.compaction")

_locks: weakref.WeakKeyDictionary[object, threading.Lock] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def maintenance_lock(table: MirrorTable) -> threading.Lock:
    """The per-table lock that lets one merge or compaction run at a time (both swap IndexBlocks)."""
    with _locks_guard:
        lk = _locks.get(table)
        if lk is None:
            lk = _locks[table] = threading.Lock()
        return lk


class _Timed:
    """A lock wrapper that adds up how long it was held (the apply loop's stall)."""

    def __init__(self, lock: _Lock | None) -> None:
        self.lock: _Lock = lock if lock is not None else threading.RLock()
        self.held = 0.0
        self.longest = 0.0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            t = time.perf_counter()
            try:
                yield
            finally:
                d = time.perf_counter() - t
                self.held += d
                self.longest = max(self.longest, d)


def file_stats(table: MirrorTable, committed_only: bool = True) -> dict[str, FileStats]:
    """Planner view of the table's persisted, not truncated files (call under the service lock).

    ``committed_only``: count only persisted deletes (what a rewrite drops); else pending ones too (what
    a rewrite would drop after a persist)."""
    return {
        f.name: FileStats(f.name, f.num_rows, len(f.committed) if committed_only else f.deleted_count(), f.size_bytes)
        for f in table.files.values()
        if f.persisted and not f.truncated_lsn
    }


def _record(table: MirrorTable, op: str, report: dict[str, Any]) -> dict[str, Any]:
    last = getattr(table, "last_maintenance", None)
    if not isinstance(last, dict):
        last = {}
        table.last_maintenance = last
    last[op] = {k: v for k, v in report.items() if k not in ("files", "checks", "policy", "reasons")}
    last[op]["at"] = round(time.time(), 3)
    return report


# ------------------------------------------------------------------------------------ index helpers


def _new_block_path(table: MirrorTable) -> Path:
    return table.dir / "index" / f"{uuid.uuid4().hex}.idx"


# ------------------------------------------------------------------------------------ index merge


def _pick_blocks(table: MirrorTable, policy: MaintenancePolicy, full: bool) -> tuple[list[IndexBlock], str]:
    """The IndexBlocks :func:`merge_index` merges now (under the service lock), and why."""
    blocks_before = len(table.file_index.blocks)
    pick: list[IndexBlock]
    if full:
        pick = list(table.file_index.blocks)[: policy.index_max_blocks_per_merge] if blocks_before > 1 else []
        reason = (
            f"full: {len(pick)} of {blocks_before} blocks" if pick else f"{blocks_before} block(s); nothing to merge"
        )
    else:
        pick = policy.index_merge.pick(table.file_index)
        reason = (
            f"{blocks_before} blocks > index_max_blocks {policy.index_max_blocks}: merging {len(pick)}"
            if pick
            else f"{blocks_before} blocks ≤ index_max_blocks {policy.index_max_blocks}"
        )
    return pick, reason


def merge_index(
    table: MirrorTable,
    *,
    lock: _Lock | None = None,
    policy: MaintenancePolicy | None = None,
    full: bool = False,
    nice: int = 0,
) -> dict[str, Any]:
    """Merge the table's IndexBlocks by policy (:class:`IndexMergePolicy`: more
    than ``index_max_blocks`` blocks → the smallest ``index_max_blocks_per_merge`` into one); ``full``:
    merge up to ``index_max_blocks_per_merge`` blocks whenever there are two or more.

    The merge is ``FileIndex.build_from_merge`` (k-way by hash), or ``build_from_compaction`` with an
    empty map when some merged block still has entries of files that left the table (those entries
    are dropped). Built without the service lock (``nice`` > 0: in the child process of that lower
    priority, :func:`~.worker.merge_in_child`); the swap takes it. The merged index reaches Iceberg
    with the next persist (until then a restart reloads the unmerged blocks, which are equivalent).

    Returns (JSON-serializable) ``{"merged", "blocks_in", "blocks_out", "blocks_before",
    "blocks_after", "entries_in", "entries_out", "dead_entries_dropped", "seconds", "lock_seconds",
    "reason"}``.
    """
    policy = policy or MaintenancePolicy()
    t0 = time.time()
    lk = _Timed(lock)
    with maintenance_lock(table):
        with lk():
            blocks_before = len(table.file_index.blocks)
            pick, reason = _pick_blocks(table, policy, full)
            inp = table.index_merge_input(pick)
        if not pick:
            return _record(
                table,
                "merge_index",
                {
                    "merged": False,
                    "blocks_in": 0,
                    "blocks_out": 0,
                    "blocks_before": blocks_before,
                    "blocks_after": blocks_before,
                    "entries_in": 0,
                    "entries_out": 0,
                    "dead_entries_dropped": 0,
                    "seconds": round(time.time() - t0, 4),
                    "lock_seconds": round(lk.held, 4),
                    "reason": reason,
                },
            )
        entries_in = sum(b.num_entries for b in inp.blocks)
        new = merge_in_child(list(inp.blocks), inp.live, _new_block_path(table), nice)
        fault("merge_index:after_index_rebuilt")
        try:
            with lk():
                table.apply_index_merge(inp.blocks, new)
                blocks_after = len(table.file_index.blocks)
        except BaseException:
            new.unlink()
            raise
    return _record(
        table,
        "merge_index",
        {
            "merged": True,
            "blocks_in": len(pick),
            "blocks_out": 1,
            "blocks_before": blocks_before,
            "blocks_after": blocks_after,
            "entries_in": entries_in,
            "entries_out": new.num_entries,
            "dead_entries_dropped": entries_in - new.num_entries,
            "seconds": round(time.time() - t0, 4),
            "lock_seconds": round(lk.held, 4),
            "reason": reason,
        },
    )


# ------------------------------------------------------------------------------------ compaction


def _policy_summary(p: MaintenancePolicy) -> dict[str, Any]:
    return {
        k: getattr(p, k)
        for k in (
            "target_file_bytes",
            "size_ratio_percent",
            "max_size_amplification_percent",
            "file_count_trigger",
            "min_files_per_run",
            "max_files_per_run",
            "delete_ratio_percent",
        )
    }


def _dry_run(
    table: MirrorTable, lk: _Timed, policy: MaintenancePolicy, full: bool, persist_first: bool
) -> dict[str, Any]:
    """:func:`compact` with ``dry_run``: plan only (nothing persisted or written); its report shape."""
    with lk():
        stats = file_stats(table, committed_only=not persist_first)
        unpersisted = sum(1 for f in table.files.values() if not f.persisted)
    plan = plan_compaction(list(stats.values()), policy, full)
    checks = list(plan.checks)
    if unpersisted:
        checks.append(
            f"{unpersisted} unpersisted file(s) not considered"
            + (" (a real run persists first)" if persist_first else "")
        )
    return {
        "dry_run": True,
        "full": full,
        "picked": len(plan.files),
        "files": plan.describe(stats),
        "checks": checks,
        "policy": _policy_summary(policy),
    }


def _expire_after(table: MirrorTable, policy: MaintenancePolicy) -> dict[str, Any]:
    """Cleanup after a committed compaction, best effort: its counts, or ``{"error": ...}``."""
    try:
        return expire_and_clean(table, policy=policy)
    except Exception as e:  # cleanup is best effort; the compaction itself is committed
        log.warning("table %s: cleanup after compaction failed: %s", table.name, e)
        return {"error": f"{type(e).__name__}: {e}"}


def compact(
    table: MirrorTable,
    *,
    lock: _Lock | None = None,
    policy: MaintenancePolicy | None = None,
    full: bool = False,
    dry_run: bool = False,
    persist_first: bool | None = None,
    expire: bool = True,
    nice: int = 0,
    save_index: bool = True,
) -> dict[str, Any]:
    """Compact the table's data files by policy (``full``: every persisted file) — see the module
    docstring for the steps, :mod:`.planner` for the choice.

    ``lock``: the service lock (None: a private one, for single-threaded use). ``dry_run``: only plan
    (no persist, nothing written) and return ``{"dry_run": True, "picked", "files": [{file, rows,
    deleted, bytes, live_bytes, delete_ratio_percent, reasons}], "checks", "policy"}``.
    ``persist_first``: default from the policy. ``expire``: afterwards, expire snapshots and delete
    files no snapshot needs (:func:`expire_and_clean`). ``nice``: run the rewrite and the index
    rebuild in a child process of that much lower CPU priority (:func:`~.worker.compact_in_child`; 0:
    in this thread). The upload runs in this thread at its priority: a thread of lower priority that
    the kernel deschedules while it holds the GIL stalls the apply loop (priority inversion).
    ``save_index`` False (the service's own compactions): the commit saves the FileIndex only when
    due (``MirrorTable.index_save_due``), else carries the saved one over.

    Returns (JSON-serializable): ``compacted`` (bool), ``files_in``, ``files_out``, ``rows_in``,
    ``rows_out``, ``bytes_in``, ``bytes_out``, ``deleted_rows_dropped`` (rows the old DVs deleted, not
    rewritten), ``deletes_remapped`` (deletes that arrived during the run, moved to new positions),
    ``deletes_dropped`` (of those, rows with no new position), ``files_removed_meanwhile`` (inputs a
    persist removed during the run, every row deleted: their rows are deleted in the new files too),
    ``blocks_in``, ``blocks_out``,
    ``index_entries_in``, ``index_entries_out``, ``rewrite_seconds``, ``upload_seconds``,
    ``index_seconds``, ``commit_seconds``, ``lock_seconds`` (total time the service lock was held,
    persist included), ``swap_seconds`` (the final swap's hold), ``persist_seconds``, ``seconds``,
    ``snapshot_id``, ``reasons`` (per file), ``checks``, ``expired`` (cleanup counts).
    """
    policy = policy or MaintenancePolicy()
    persist_first = policy.persist_first if persist_first is None else persist_first
    t0 = time.time()
    lk = _Timed(lock)
    if dry_run:
        return _dry_run(table, lk, policy, full, persist_first)

    with maintenance_lock(table):
        persist_s = 0.0
        with lk():
            # a schema change not committed yet goes first: the rewritten files use the new layout
            if (persist_first and table.is_dirty()) or getattr(table, "schema_pending", False):
                tp = time.perf_counter()
                table.persist()
                persist_s = time.perf_counter() - tp
            stats = file_stats(table)
            plan = plan_compaction(list(stats.values()), policy, full)
            if not plan:
                report = {
                    "compacted": False,
                    "checks": plan.checks,
                    "files_in": 0,
                    "files_out": 0,
                    "seconds": round(time.time() - t0, 4),
                    "lock_seconds": round(lk.held, 4),
                    "persist_seconds": round(persist_s, 4),
                }
                return _record(table, "compact", report)
            # the files, their committed DVs, their IndexBlocks, and the layout the Iceberg table has now: a
            # schema change during the rewrite must not put field ids into the outputs that the table does
            # not know yet (they stay readable by id either way)
            inp = table.compaction_input(plan.files)
        report = _work_and_swap(table, lk, policy, plan, inp, nice, save_index)
        report["persist_seconds"] = round(persist_s, 4)
    if expire:
        report["expired"] = _expire_after(table, policy)
    report["seconds"] = round(time.time() - t0, 4)
    report["lock_seconds"] = round(lk.held, 4)
    return _record(table, "compact", report)


def _work(
    table: MirrorTable, policy: MaintenancePolicy, inp: CompactionInput, nice: int = 0
) -> tuple[RewriteResult, CompactionResult, float, float]:
    """The heavy part, without the lock: rewrite the live rows of ``inp.files`` and rebuild the
    IndexBlock of ``inp.blocks`` in one pass (``nice`` > 0: both in the child process of that lower
    priority, :func:`~.worker.compact_in_child`), then upload the new files. Returns (RewriteResult,
    CompactionResult, upload seconds, index seconds); on failure deletes what it wrote and re-raises."""
    ice = table.iceberg
    lineage = inp.lineage
    inputs = [
        RewriteInput(
            f.name, f.path, f.rows, BitMap64(f.committed), f.size_bytes, lineage.get(f.name) if lineage else None
        )
        for f in inp.files
    ]
    reindex = (
        Reindex(tuple(str(b.path) for b in inp.blocks), frozenset(inp.live), str(_new_block_path(table)))
        if inp.blocks
        else None
    )
    uploaded: list[str] = []
    done = compact_in_child(  # nice > 0: in a child process of that priority, its own GIL (worker.py says why)
        inputs,
        table.dir / "compaction",
        inp.schema,
        policy.target_file_bytes,
        nice,
        io=ice.io,
        defaults=inp.defaults,
        lineage=lineage is not None,
        reindex=reindex,
    )
    rw = done.rewrite
    assert rw.position_map is not None  # rewrite_files always sets it
    new_block = None
    try:
        if done.block is not None:
            new_block = IndexBlock.open(done.block)
        t_up = time.perf_counter()
        for o in rw.outputs:
            uploaded.append(ice.upload_data_file(o.path))
        upload_s = time.perf_counter() - t_up
        fault("compaction:after_files_written")
        fault("compaction:after_index_rebuilt")
    except BaseException:
        _discard(ice, uploaded, new_block if new_block is not None else done.block, rw)
        raise
    res = CompactionResult(
        outputs=tuple((o.name, o.rows, o.size_bytes, loc) for o, loc in zip(rw.outputs, uploaded)),
        position_map=rw.position_map,
        new_block=new_block,
    )
    return rw, res, upload_s, done.index_seconds


def _discard(ice: Any, uploaded: list[str], block: IndexBlock | str | None, rw: RewriteResult | None) -> None:
    """Delete what a compaction that will not commit wrote: the ``uploaded`` data files, the new
    IndexBlock (opened, or only its file's path when opening it failed) and the rewrite's local files."""
    for loc in uploaded:
        with contextlib.suppress(Exception):
            ice.io.delete(loc)
    if isinstance(block, IndexBlock):
        block.unlink()
    elif block is not None:
        with contextlib.suppress(OSError):
            os.unlink(block)
    _drop_local(rw)


def _drop_local(rw: RewriteResult | None) -> None:
    if rw is not None:
        for o in rw.outputs:
            with contextlib.suppress(OSError):
                os.unlink(o.path)


def _commit_swap(table: MirrorTable, prep: PreparedSwap, res: CompactionResult) -> int:
    """ONE Iceberg commit (operation ``replace``) of a prepared swap; returns the snapshot id."""
    ice = table.iceberg
    previous_hook = ice.before_swap

    def hook(location: str | None) -> None:
        if previous_hook is not None:
            previous_hook(location)
        fault("compaction:before_commit")

    ice.before_swap = hook
    try:
        return cast(  # the new snapshot's id
            int,
            ice.commit(
                add_files=[o[3] for o in res.outputs],
                deletes=prep.adds,
                remove_files=list(prep.remove),
                index_blob=prep.index_blob,
                operation="replace",
            ),
        )
    finally:
        ice.before_swap = previous_hook


def _work_and_swap(
    table: MirrorTable,
    lk: _Timed,
    policy: MaintenancePolicy,
    plan: CompactionPlan,
    inp: CompactionInput,
    nice: int = 0,
    save_index: bool = True,
) -> dict[str, Any]:
    rw, res, upload_s, index_s = _work(table, policy, inp, nice)
    committed = False
    try:
        with lk():  # -- swap (lock): the table prepares, the commit lands, the table applies
            t_swap = time.perf_counter()
            prep = table.prepare_compaction(inp, res, save_index)
            t_c = time.perf_counter()
            snapshot_id = _commit_swap(table, prep, res)
            committed = True
            commit_s = time.perf_counter() - t_c
            fault("compaction:after_commit")
            table.apply_compaction(inp, res, prep)
            swap_s = time.perf_counter() - t_swap
    except BaseException as e:
        if not committed and not isinstance(e, CommitStateUnknown):
            _discard(table.iceberg, [o[3] for o in res.outputs], res.new_block, None)
        raise
    finally:
        _drop_local(rw)
    new_block = res.new_block
    return {
        "compacted": True,
        "full": plan.full,
        "files_in": len(inp.files),
        "files_out": len(rw.outputs),
        "rows_in": rw.rows_in,
        "rows_out": rw.rows_out,
        "bytes_in": rw.bytes_in,
        "bytes_out": rw.bytes_out,
        "deleted_rows_dropped": rw.rows_dropped,
        "deletes_remapped": prep.remapped,
        "deletes_dropped": prep.dropped,
        "files_removed_meanwhile": prep.vanished,
        "blocks_in": len(inp.blocks),
        "blocks_out": 1 if new_block is not None else 0,
        "index_entries_in": sum(b.num_entries for b in inp.blocks) if new_block is not None else 0,
        "index_entries_out": new_block.num_entries if new_block is not None else 0,
        "rewrite_seconds": round(rw.seconds, 4),
        "upload_seconds": round(upload_s, 4),
        "index_seconds": round(index_s, 4),
        "commit_seconds": round(commit_s, 4),
        "swap_seconds": round(swap_s, 4),
        "snapshot_id": snapshot_id,
        "reasons": {n: plan.reasons.get(n, []) for n in plan.files},
        "checks": plan.checks,
    }


# ------------------------------------------------------------------------------------ cleanup


def _strip(loc: str) -> str:
    return loc[len("file://") :] if loc.startswith("file://") else loc


def _referenced(ice: Any) -> set[str]:
    """Every file the table's current metadata needs: per snapshot its manifest list, manifests, live
    data and delete files and index Puffin; the current metadata JSON and the metadata log."""
    ice.refresh()
    table = ice.table
    md = table.metadata
    refs: set[str] = set()
    for s in md.snapshots:
        refs |= {_strip(x) for x in ice.files_of(s, io=table.io, metadata=md)}
    refs.add(_strip(table.metadata_location))
    refs |= {_strip(e.metadata_file) for e in md.metadata_log}
    return refs


def _list_files(ice: Any, min_age_s: float) -> list[str]:
    """Files under the table's ``data/``, ``index/`` and ``metadata/`` older than ``min_age_s``: local
    paths for a local warehouse (pyarrow's local filesystem), ``scheme://bucket/key`` otherwise (listed
    through the table's own fsspec FileIO, so an S3 endpoint and credentials are the ones the table
    uses); empty for a FileIO that cannot list."""
    import pyarrow.fs as pafs

    loc = ice.location
    io = ice.io
    now = time.time()
    local = loc.startswith("file://") or loc.startswith("/")
    if not local:  # an object store: its FileIO is PyIceberg's FsspecFileIO (storage.fileio; s3fs, gcsfs, adlfs)
        if hasattr(io, "get_fs"):
            return _list_fsspec(io, loc, min_age_s, now)
        return []  # a FileIO that cannot list: nothing is listed, nothing deleted
    fs, base = pafs.LocalFileSystem(), _strip(loc)
    out = []
    for sub in ("data", "index", "metadata"):
        for info in fs.get_file_info(
            pafs.FileSelector(f"{base.rstrip('/')}/{sub}", recursive=True, allow_not_found=True)
        ):
            if info.type != pafs.FileType.File:
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            if now - mtime >= min_age_s:
                out.append(info.path)
    return out


def _mtime(info: dict[str, Any]) -> float:
    """Modification time (epoch seconds) of an fsspec ``info`` entry (s3fs ``LastModified``, gcsfs
    ``updated``, adlfs ``last_modified``); 0.0 when the store gives none."""
    import datetime as _dt

    for k in ("LastModified", "last_modified", "updated", "mtime", "timeCreated", "creation_time"):
        v = info.get(k)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                v = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
            except ValueError:
                continue
        if isinstance(v, _dt.datetime):
            return (v if v.tzinfo else v.replace(tzinfo=_dt.UTC)).timestamp()
    return 0.0


def _list_fsspec(io: Any, loc: str, min_age_s: float, now: float) -> list[str]:
    """``_list_files`` through the FileIO's fsspec filesystem. Listed keys come back as ``bucket/key``;
    they are turned into URIs with the table location's own ``scheme://netloc`` (so an
    ``abfss://container@account…`` location matches the URIs its metadata references)."""
    from urllib.parse import urlsplit

    parts = urlsplit(loc)
    fs = io.get_fs(parts.scheme, None)
    root = fs._strip_protocol(loc).rstrip("/")  # bucket/prefix
    bucket = root.split("/", 1)[0]
    out = []
    for sub in ("data", "index", "metadata"):
        try:
            found = fs.find(f"{root}/{sub}", detail=True)
        except FileNotFoundError:
            continue
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            if now - _mtime(info) >= min_age_s:
                key = path.split("/", 1)[1] if path.startswith(bucket + "/") else path
                out.append(f"{parts.scheme}://{parts.netloc}/{key}")
    return out


def find_orphans(ice: Any, min_age_s: float = 0.0) -> list[str]:
    """Files under the table location (``data/``, ``index/``, ``metadata/``) that no snapshot of the
    current metadata references and that are older than ``min_age_s`` seconds: local paths for a local
    warehouse, URIs otherwise (delete them with the table's FileIO)."""
    listed = _list_files(ice, min_age_s)
    if not listed:
        return []
    refs = _referenced(ice)  # after listing: a file committed meanwhile is referenced by now
    return sorted(p for p in listed if p not in refs and not p.endswith("version-hint.text"))


def _delete_files(ice: Any, paths: Iterable[str]) -> None:
    for p in paths:
        with contextlib.suppress(Exception):
            if "://" in p:
                ice.io.delete(p)
            else:
                os.unlink(p)


def expire_and_clean(
    table: MirrorTable, *, policy: MaintenancePolicy | None = None, orphan_grace_s: float | None = None
) -> dict[str, Any]:
    """Expire snapshots older than ``snapshot_retention_s`` (keeping the newest ``retain_snapshots``, and
    the newest ``keep_cuts`` cut tags' snapshots),
    delete the files only they referenced, then delete orphans older than ``orphan_grace_s`` (default:
    the policy's).

    Runs on its own :class:`IcebergMirrorTable` instance (own caches, no shared state with the service's),
    without the service lock: the expiry is a compare-and-swap commit like a persist's, so whichever of
    the two loses the race re-reads the metadata and retries. Returns ``{"snapshots_expired",
    "files_deleted", "orphans_deleted"}``.
    """
    from ..iceberg import IcebergMirrorTable

    policy = policy or MaintenancePolicy()
    grace = policy.orphan_grace_s if orphan_grace_s is None else orphan_grace_s
    main = table.iceberg
    ice = IcebergMirrorTable.load(main.catalog, main.identifier)
    md = ice.table.metadata
    cutoff = int((time.time() - policy.snapshot_retention_s) * 1000)
    expired = files = 0
    if len(md.snapshots) > policy.retain_snapshots and any(x.timestamp_ms < cutoff for x in md.snapshots):
        before = len(md.snapshots)
        gone = ice.expire_snapshots(
            cutoff, retain_last=policy.retain_snapshots, delete_files=False, keep_cuts=policy.keep_cuts
        )
        expired = before - len(ice.table.metadata.snapshots)
        for loc in gone:
            with contextlib.suppress(Exception):
                ice.io.delete(loc)
        files = len(gone)
    orphans = find_orphans(ice, grace)
    _delete_files(ice, orphans)
    if orphans:
        log.info("table %s: deleted %d orphan file(s)", table.name, len(orphans))
    return {"snapshots_expired": expired, "files_deleted": files, "orphans_deleted": len(orphans)}


def clean_local(table: MirrorTable) -> dict[str, Any]:
    """At service start (nothing in flight): delete leftovers of a crashed run — compaction outputs
    under ``<table>/compaction/`` and IndexBlock files under ``<table>/index/`` that the restored
    FileIndex does not use. Returns ``{"local_files_deleted"}``."""
    n = 0
    keep = {Path(b.path).name for b in table.file_index.blocks}
    for p in (table.dir / "index").glob("*"):
        if p.is_file() and p.name not in keep:
            p.unlink(missing_ok=True)
            n += 1
    comp = table.dir / "compaction"
    if comp.is_dir():
        for p in comp.glob("*"):
            if p.is_file():
                p.unlink(missing_ok=True)
                n += 1
    return {"local_files_deleted": n}


def cleanup_after_restore(
    table: MirrorTable, policy: MaintenancePolicy | None = None, interrupted: bool = True
) -> dict[str, Any]:
    """:func:`clean_local` plus warehouse orphans of any age (call at service start only).
    ``interrupted``: the last run did not stop cleanly (logged as a warning; else files left unused
    by a clean run, e.g. replaced index blocks, are removed with an info line)."""
    out = clean_local(table)
    try:
        orphans = find_orphans(table.iceberg, 0.0)
        _delete_files(table.iceberg, orphans)
        out["orphans_deleted"] = len(orphans)
    except Exception as e:  # never block a restart on cleanup
        log.warning("table %s: orphan cleanup at start failed: %s", table.name, e)
        out["orphans_error"] = f"{type(e).__name__}: {e}"
    if (out.get("orphans_deleted") or out["local_files_deleted"]) and interrupted:
        log.warning("table %s: removed leftovers of an interrupted run: %s", table.name, out)
    elif out.get("orphans_deleted") or out["local_files_deleted"]:
        log.info("table %s: removed files no snapshot or index uses: %s", table.name, out)
    return out
