"""The service's own maintenance in ``maintenance: auto`` (docs/architecture.md#processes): index merge, data compaction and snapshot expiry, off the apply loop.

:meth:`BackgroundMaintenance.tick` is called by the replication thread (under the service lock) every
half second per table; it only looks (block count, the compaction plan from in-memory file stats, time
since the last expiry) and, when something is due, starts a worker thread for that table. The worker
runs :func:`.runner.compact`, :func:`.runner.merge_index` and :func:`.runner.expire_and_clean`, which
take the service lock only for their snapshots and swaps, so the apply loop keeps going. A failure is
logged and kept in :attr:`BackgroundMaintenance.errors` (``list-tables --json``: ``maintenance.error``)
and retried after a backoff (5 s doubling to 5 min); it never stops replication of the table.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from .planner import plan_compaction
from .policy import MaintenancePolicy
from .runner import compact, expire_and_clean, file_stats, merge_index

if TYPE_CHECKING:
    from ..table.mirror import MirrorTable

__all__ = ["BackgroundMaintenance"]

log = logging.getLogger("mooncake.maintenance")

EXPIRE_EVERY_S = 60.0


class BackgroundMaintenance:
    """Per-table background maintenance (see module docstring).

    ``lock``: the service lock; ``policy_of``: table name → :class:`MaintenancePolicy`.
    ``errors``: table name → last error text; ``runs``: table name → number of finished worker runs.
    """

    def __init__(self, lock: AbstractContextManager[object], policy_of: Callable[[str], MaintenancePolicy]) -> None:
        self.lock = lock
        self.policy_of = policy_of
        self._busy: dict[str, threading.Thread] = {}
        self._last_check: dict[str, float] = {}
        self._last_expire: dict[str, float] = {}
        self._stop = threading.Event()
        self.errors: dict[str, str] = {}
        self.runs: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}

    def tick(self, table: MirrorTable) -> None:
        """Look at ``table`` (caller holds the service lock) and start a worker if something is due."""
        if self._stop.is_set():
            return
        th = self._busy.get(table.name)
        if th is not None and th.is_alive():
            return
        now = time.time()
        try:
            policy = self.policy_of(table.name)
        except ValueError as e:
            self.errors[table.name] = str(e)
            return
        if now - self._last_check.get(table.name, 0.0) < policy.auto_interval_s or now < self._retry_at.get(
            table.name, 0.0
        ):
            return
        self._last_check[table.name] = now
        merge = len(table.file_index.blocks) > policy.index_max_blocks
        plan = plan_compaction(list(file_stats(table, committed_only=True).values()), policy)
        expire = now - self._last_expire.get(table.name, 0.0) >= max(EXPIRE_EVERY_S, policy.auto_interval_s)
        if not (merge or plan or expire):
            return
        th = threading.Thread(
            target=self._work,
            args=(table, policy, bool(plan), merge, expire),
            name=f"mooncake-maintenance-{table.name}",
            daemon=True,
        )
        self._busy[table.name] = th
        th.start()

    def _work(
        self, table: MirrorTable, policy: MaintenancePolicy, do_compact: bool, do_merge: bool, do_expire: bool
    ) -> None:
        try:
            if do_compact and not self._stop.is_set():
                # the service persists by its own policy; compaction takes what is persisted by now
                r = compact(
                    table,
                    lock=self.lock,
                    policy=policy,
                    expire=False,
                    persist_first=False,
                    nice=policy.worker_nice,
                    save_index=False,
                )
                if r.get("compacted"):
                    log.info(
                        "table %s: compacted %s files into %s (%s rows dropped) in %.2fs (rewrite %.2fs, upload "
                        "%.2fs, index %.2fs, commit %.2fs), lock held %.3fs",
                        table.name,
                        r["files_in"],
                        r["files_out"],
                        r["deleted_rows_dropped"],
                        r["seconds"],
                        r.get("rewrite_seconds", 0.0),
                        r.get("upload_seconds", 0.0),
                        r.get("index_seconds", 0.0),
                        r.get("commit_seconds", 0.0),
                        r["lock_seconds"],
                    )
            if not self._stop.is_set() and (do_merge or len(table.file_index.blocks) > policy.index_max_blocks):
                merge_index(table, lock=self.lock, policy=policy, nice=policy.worker_nice)
            if do_expire and not self._stop.is_set():
                expire_and_clean(table, policy=policy)
                self._last_expire[table.name] = time.time()
            self.errors.pop(table.name, None)
            self._failures.pop(table.name, None)
        except Exception as e:
            self.errors[table.name] = f"{type(e).__name__}: {e}"
            n = self._failures[table.name] = self._failures.get(table.name, 0) + 1
            self._retry_at[table.name] = time.time() + min(300.0, 5.0 * 2 ** (n - 1))  # back off: 5 s, 10 s, … 5 min
            log.exception(
                "table %s: background maintenance failed (replication continues; retry in %.0fs)",
                table.name,
                self._retry_at[table.name] - time.time(),
            )
        finally:
            self.runs[table.name] = self.runs.get(table.name, 0) + 1

    def stop(self, timeout: float = 10.0) -> None:
        """Let running workers finish their current step (up to ``timeout`` seconds each)."""
        self._stop.set()
        for th in list(self._busy.values()):
            th.join(timeout)
