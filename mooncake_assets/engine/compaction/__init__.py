"""Data compaction, index merge and cleanup of mirrored tables (docs/architecture.md#maintenance).

* :class:`MaintenancePolicy`, :func:`policy_for` — the per-table policy, every field with its unit
  (``policy``);
* :func:`plan_compaction`, :class:`FileStats`, :class:`CompactionPlan` — which files and why
  (``planner``: delete ratio, Paimon-style size amplification / size ratio / file count, full);
* :func:`rewrite_files` — live rows into new files of a target size with the old→new PositionMap
  (``rewriter``);
* :func:`compact`, :func:`merge_index`, :func:`expire_and_clean`, :func:`cleanup_after_restore` — the
  runs on a MirrorTable, heavy work outside the service lock (``runner``);
* :class:`BackgroundMaintenance` — the service's ``maintenance: auto`` driver (``background``);
* :func:`fault` — ``MOONCAKE_FAULT`` crash points for tests (``faults``).
"""

from ..faults import fault
from .background import BackgroundMaintenance
from .planner import CompactionPlan, FileStats, plan_compaction
from .policy import MaintenancePolicy, policy_for
from .rewriter import RewriteInput, RewriteOutput, RewriteResult, rewrite_files
from .runner import clean_local, cleanup_after_restore, compact, expire_and_clean, file_stats, find_orphans, merge_index

__all__ = [
    "BackgroundMaintenance",
    "CompactionPlan",
    "FileStats",
    "MaintenancePolicy",
    "RewriteInput",
    "RewriteOutput",
    "RewriteResult",
    "cleanup_after_restore",
    "clean_local",
    "compact",
    "expire_and_clean",
    "fault",
    "file_stats",
    "find_orphans",
    "merge_index",
    "plan_compaction",
    "policy_for",
    "rewrite_files",
]
