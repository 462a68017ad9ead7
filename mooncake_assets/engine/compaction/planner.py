"""Which files a data compaction rewrites, and why (docs/architecture.md#maintenance).

:func:`plan_compaction` takes the table's persisted files as :class:`FileStats` and a
:class:`~.policy.MaintenancePolicy` and returns a :class:`CompactionPlan`: the files to rewrite, in a
stable order, each with the reasons it was picked, plus the checks that did not fire (what
``mooncake compact --dry-run`` prints).

Checks, in order (universal compaction as in Paimon/RocksDB, over *small* files: live bytes <
``target_file_bytes``, sorted by live bytes ascending — with deletion vectors no file shadows another,
so size is the only order that matters, and it is the same after a restart):

1. **delete ratio** (any size): deleted rows / rows ≥ ``delete_ratio_percent``;
2. **size amplification**: with ≥ ``file_count_trigger`` small files, when the live bytes of all but
   the largest small file exceed ``max_size_amplification_percent`` of the largest's: all small files;
3. **size ratio / file count**: with ≥ ``file_count_trigger`` small files, a run is seeded with the
   smallest ``max(min_files_per_run, count − trigger + 1)`` files (Paimon's file-count rule: enough to
   bring the count under the trigger) and grows by the next larger file while that file is at most
   (100 + ``size_ratio_percent``)% of the run so far (Paimon's size-ratio rule between neighbouring
   runs). Seeding with two files rather than one is where this differs from Paimon, whose runs are in
   age order: in size order the second file is never smaller than the first, so a 1% ratio would
   almost never let a run start.

``full``: every file (Paimon "full compaction"). The run is capped at ``max_files_per_run`` (delete-ratio
files first, the highest ratio first) except for ``full``. Nothing is picked when the result would be a
single file that has no deleted row (rewriting it changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .policy import MaintenancePolicy

__all__ = ["FileStats", "CompactionPlan", "plan_compaction"]


@dataclass(frozen=True)
class FileStats:
    """What the planner knows of one persisted data file: ``name``; ``rows`` (all, deleted included);
    ``deleted`` (rows deleted: persisted DV, pending position deletes, or all after a TRUNCATE);
    ``size_bytes`` (the Parquet file's bytes)."""

    name: str
    rows: int
    deleted: int
    size_bytes: int

    @property
    def live_rows(self) -> int:
        return max(self.rows - self.deleted, 0)

    @property
    def delete_ratio_percent(self) -> float:
        return 100.0 * self.deleted / self.rows if self.rows else 0.0

    @property
    def live_bytes(self) -> int:
        """Bytes the live rows take, estimated as file bytes × live share."""
        return int(self.size_bytes * self.live_rows / self.rows) if self.rows else 0


@dataclass
class CompactionPlan:
    """``files``: names to rewrite, in rewrite order; ``reasons``: name → list of reasons (text);
    ``checks``: one line per check saying whether it fired and why; ``full``: a full compaction."""

    files: list[str] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)
    full: bool = False

    def __bool__(self) -> bool:
        return bool(self.files)

    def describe(self, stats: dict[str, FileStats]) -> list[dict[str, Any]]:
        """Per picked file: name, rows, deleted, bytes, live_bytes, delete_ratio_percent, reasons."""
        out: list[dict[str, Any]] = []
        for n in self.files:
            s = stats[n]
            out.append(
                {
                    "file": n,
                    "rows": s.rows,
                    "deleted": s.deleted,
                    "bytes": s.size_bytes,
                    "live_bytes": s.live_bytes,
                    "delete_ratio_percent": round(s.delete_ratio_percent, 1),
                    "reasons": self.reasons.get(n, []),
                }
            )
        return out


def _mib(b: float) -> str:
    return f"{b / (1 << 20):.2f} MiB" if b >= 1 << 20 else f"{b / 1024:.1f} KiB"


def _size_ratio_run(small: list[FileStats], start: int, ratio: float, count: int = 1) -> int:
    """Length of the run starting at ``start`` holding at least ``count`` files, grown while the next
    file's live bytes ≤ (100 + ratio)% of the run's total."""
    n = min(start + count, len(small))
    total = sum(f.live_bytes for f in small[start:n])
    while n < len(small) and small[n].live_bytes * 100.0 <= total * (100.0 + ratio):
        total += small[n].live_bytes
        n += 1
    return n - start


def _add(plan: CompactionPlan, f: FileStats, why: str) -> None:
    """Pick ``f`` (once, in first-picked order) and record ``why``."""
    if f.name not in plan.reasons:
        plan.files.append(f.name)
        plan.reasons[f.name] = []
    plan.reasons[f.name].append(why)


def _plan_full(plan: CompactionPlan, files: list[FileStats]) -> CompactionPlan:
    """``full``: every persisted file, unless that is a single file without deletes."""
    plan.files = [f.name for f in files]
    plan.reasons = {f.name: ["full compaction"] for f in files}
    plan.checks.append(f"full: every one of {len(files)} persisted file(s)")
    if len(files) == 1 and files[0].deleted == 0:
        plan.checks.append("full: a single file without deletes; nothing to gain")
        plan.files, plan.reasons = [], {}
    return plan


def _pick_delete_ratio(plan: CompactionPlan, files: list[FileStats], policy: MaintenancePolicy) -> None:
    """1. Files whose delete ratio reaches ``policy.delete_ratio_percent`` (highest first)."""
    thr = policy.delete_ratio_percent
    if thr > 0:
        hot = sorted(
            (f for f in files if f.rows and f.delete_ratio_percent >= thr),
            key=lambda f: (-f.delete_ratio_percent, f.name),
        )
        for f in hot:
            _add(plan, f, f"delete ratio {f.delete_ratio_percent:.1f}% ≥ {thr:g}%")
        plan.checks.append(f"delete ratio ≥ {thr:g}%: {len(hot)} file(s)")
    else:
        plan.checks.append("delete ratio: off")


def _pick_size_amplification(plan: CompactionPlan, small: list[FileStats], policy: MaintenancePolicy) -> bool:
    """2. All small files when the others' live bytes exceed the largest's by the policy; True if picked."""
    largest = small[-1].live_bytes
    rest = sum(f.live_bytes for f in small[:-1])
    amp = 100.0 * rest / largest if largest else float("inf")
    if len(small) >= 2 and amp > policy.max_size_amplification_percent:
        for f in small:
            _add(
                plan,
                f,
                f"size amplification {amp:.0f}% > {policy.max_size_amplification_percent:g}% "
                f"({_mib(rest)} over the largest small file's {_mib(largest)})",
            )
        plan.checks.append(
            f"size amplification {amp:.0f}% > {policy.max_size_amplification_percent:g}%: all {len(small)} small files"
        )
        return True
    plan.checks.append(f"size amplification {amp:.0f}% ≤ {policy.max_size_amplification_percent:g}%")
    return False


def _pick_size_ratio(plan: CompactionPlan, small: list[FileStats], policy: MaintenancePolicy) -> None:
    """3. Size ratio / file count: the smallest small files, grown within ``size_ratio_percent``."""
    trig = policy.file_count_trigger
    if len(small) < policy.min_files_per_run:
        plan.checks.append(f"size ratio: {len(small)} small file(s) < min_files_per_run {policy.min_files_per_run}")
        return
    seed = max(policy.min_files_per_run, len(small) - trig + 1)
    n = _size_ratio_run(small, 0, policy.size_ratio_percent, seed)
    run = small[:n]
    if len(small) > trig:
        why = (
            f"file count: {len(small)} small files > trigger {trig}; the {seed} smallest, grown to "
            f"{n} by the {policy.size_ratio_percent:g}% size ratio"
        )
    else:
        why = (
            f"size ratio: the {seed} smallest small files grown to {n} within "
            f"{policy.size_ratio_percent:g}% ({_mib(sum(x.live_bytes for x in run))})"
        )
    for f in run:
        _add(plan, f, why)
    plan.checks.append(why)


def _pick_universal(plan: CompactionPlan, files: list[FileStats], policy: MaintenancePolicy) -> None:
    """The universal checks over small files (live bytes < target), smallest first."""
    target = policy.target_file_bytes
    small = sorted((f for f in files if f.live_bytes < target), key=lambda f: (f.live_bytes, f.name))
    trig = policy.file_count_trigger
    if len(small) < trig:
        plan.checks.append(f"universal: {len(small)} small file(s) (< {_mib(target)} live) < trigger {trig}")
        return
    if not _pick_size_amplification(plan, small, policy):
        _pick_size_ratio(plan, small, policy)


def _cap(plan: CompactionPlan, files: list[FileStats], policy: MaintenancePolicy) -> None:
    """Cap at ``max_files_per_run``; drop a pick of one clean file (nothing to gain from rewriting it)."""
    if len(plan.files) > policy.max_files_per_run:
        dropped = plan.files[policy.max_files_per_run :]
        plan.files = plan.files[: policy.max_files_per_run]
        for name in dropped:
            plan.reasons.pop(name, None)
        plan.checks.append(f"capped at max_files_per_run = {policy.max_files_per_run} ({len(dropped)} left for later)")
    by_name = {f.name: f for f in files}
    if len(plan.files) == 1 and by_name[plan.files[0]].deleted == 0:
        plan.checks.append("one file without deletes picked; nothing to gain")
        plan.files, plan.reasons = [], {}


def plan_compaction(files: list[FileStats], policy: MaintenancePolicy, full: bool = False) -> CompactionPlan:
    """The files to rewrite now (see the module docstring). ``files``: the table's persisted files."""
    plan = CompactionPlan(full=full)
    if full:
        return _plan_full(plan, files)
    _pick_delete_ratio(plan, files, policy)
    _pick_universal(plan, files, policy)
    _cap(plan, files, policy)
    return plan
