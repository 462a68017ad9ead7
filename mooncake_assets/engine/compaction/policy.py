"""Maintenance policy of one mirrored table: data compaction, index merge, snapshot retention.

docs/architecture.md#maintenance; Paimon's universal compaction (``compaction.size-ratio``,
``compaction.max-size-amplification-percent``, ``num-sorted-run.compaction-trigger``,
``target-file-size``; full compaction) and index merge when there are many blocks. Every field is documented with its unit and range, as
moonlink's ``compaction_config.rs`` does; bad values raise ``ValueError`` (permanent: fix the setting).

Where a table's policy comes from (:func:`policy_for`): the defaults below, overridden by
``Settings.extra["maintenance"]`` (every table of the state dir), overridden by
``Settings.extra["maintenance_tables"][<table>]`` (one table). Both are plain JSON objects in
``<state>/settings.json`` with the field names below, e.g.::

    {"extra": {"maintenance": {"target_file_bytes": 67108864},
               "maintenance_tables": {"orders": {"delete_ratio_percent": 10}}}}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..index import IndexMergePolicy

__all__ = ["MaintenancePolicy", "policy_for", "table_policy"]


@dataclass(frozen=True)
class MaintenancePolicy:
    """Per-table maintenance policy (all sizes in bytes, shares in percent, times in seconds).

    Data compaction (``mooncake compact``), universal style over the table's *small*
    files — persisted files whose live bytes (file bytes × live rows / rows) are below
    ``target_file_bytes``; files sorted by live bytes, smallest first, play the role of Paimon's sorted
    runs, newest first (with deletion vectors no file shadows another, so only sizes matter):

    ``target_file_bytes``: size a rewrite aims each new file at (bytes, ≥ 1024; default 128 MiB,
      Paimon ``target-file-size``). An output is closed once its written bytes reach it, so every
      output of a run but the last holds at least this much and is not small (no rewrite loops).
    ``size_ratio_percent``: a run of the smallest files grows by the next larger file while that file's
      live bytes are at most (100 + this)% of the run's total (percent, ≥ 0; default 1, Paimon
      ``compaction.size-ratio``).
    ``max_size_amplification_percent``: rewrite every small file when the live bytes of all of them but
      the largest exceed this share of the largest's (percent, ≥ 0; default 200, Paimon
      ``compaction.max-size-amplification-percent``).
    ``file_count_trigger``: the size-amplification and size-ratio checks run only when the table has at
      least this many small files; the size-ratio run then starts from enough of the smallest files to
      bring the count back under it (count, ≥ 1; default 5, Paimon
      ``num-sorted-run.compaction-trigger``). After compaction reaches its fixpoint a table has fewer
      small files than this (or fewer than ``min_files_per_run``).
    ``min_files_per_run``: fewest files a size-ratio run starts with and may rewrite (count, ≥ 2;
      default 2).
    ``max_files_per_run``: most files one compaction rewrites (count, ≥ 2; default 32; bounds one
      run's time; ``--full`` ignores it).
    ``delete_ratio_percent``: a persisted file whose deleted share of rows reaches this is rewritten
      whatever its size (percent, 0–100; default 30; 0 turns the trigger off).
    ``persist_first``: ``mooncake compact`` persists the table first when it has unpersisted changes,
      so that every delete up to now is dropped by the rewrite (compaction only ever rewrites persisted
      files, and drops only persisted deletes). The service's own ``maintenance: auto`` compaction does
      not: it persists on its own schedule and compacts what is persisted by then.

    Index merge (``mooncake merge-index``; :class:`~mooncake_assets.engine.index.IndexMergePolicy`):

    ``index_max_blocks``: IndexBlocks a table may have without a merge (count, ≥ 1; default 16).
    ``index_max_blocks_per_merge``: most blocks merged into one at a time (count, ≥ 2; default 32).

    Retention and cleanup (Iceberg "Snapshot Retention Policy"):

    ``snapshot_retention_s``: snapshots younger than this are kept, so readers that planned on them can
      finish (seconds, ≥ 0; default 900). Files only expired snapshots referenced are deleted.
    ``retain_snapshots``: newest snapshots always kept whatever their age (count, ≥ 1; default 5).
    ``orphan_grace_s``: a file under the table location that no snapshot references is deleted once it
      is older than this (seconds, ≥ 0; default 600), so in-flight writes are never taken; at service
      start (nothing in flight) every orphan goes.
    ``keep_cuts``: consistent cuts (tags ``lsn-X-Y``, ``mooncake cut``) an expiry keeps per table, the
      newest by LSN; older cut tags are removed and their snapshots expire like any other (count, ≥ 0;
      default 24).
    ``cut_max_age_s``: a cut's tag is written with ``max-ref-age-ms`` of this, so it goes once its
      snapshot is that old, here and in any engine's expiry (seconds, ≥ 0; default 0: no age limit).
    ``auto_interval_s``: in ``maintenance: auto``, how often the service checks a table for index merge,
      compaction and expiry (seconds, ≥ 0; default 5).
    ``worker_nice``: in ``maintenance: auto``, how much lower the CPU priority of a compaction's rewrite
      and index rebuild, and of an index merge (a child process in a session of its own, whose
      autogroup gets the same nice value: :mod:`~mooncake_assets.engine.workers`), is than the
      service's (nice steps, 0–19; default 10; 0: in the service's maintenance thread): on a machine
      that Postgres keeps busy, compaction takes the CPU the apply loop leaves instead of stalling it
      (Linux nice, sched(7)). Its swap under the service lock runs at full priority.
    """

    target_file_bytes: int = 128 << 20
    size_ratio_percent: float = 1.0
    max_size_amplification_percent: float = 200.0
    file_count_trigger: int = 5
    min_files_per_run: int = 2
    max_files_per_run: int = 32
    delete_ratio_percent: float = 30.0
    persist_first: bool = True
    index_max_blocks: int = 16
    index_max_blocks_per_merge: int = 32
    snapshot_retention_s: float = 900.0
    retain_snapshots: int = 5
    orphan_grace_s: float = 600.0
    keep_cuts: int = 24
    cut_max_age_s: float = 0.0
    auto_interval_s: float = 5.0
    worker_nice: int = 10

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rng: str) -> None:
            if not ok:
                raise ValueError(f"maintenance policy: {name} must be {rng}, found {getattr(self, name)!r}")

        need(self.target_file_bytes >= 1024, "target_file_bytes", "≥ 1024 (bytes)")
        need(self.size_ratio_percent >= 0, "size_ratio_percent", "≥ 0 (percent)")
        need(self.max_size_amplification_percent >= 0, "max_size_amplification_percent", "≥ 0 (percent)")
        need(self.file_count_trigger >= 1, "file_count_trigger", "≥ 1 (files)")
        need(self.min_files_per_run >= 2, "min_files_per_run", "≥ 2 (files)")
        need(
            self.max_files_per_run >= max(2, self.min_files_per_run), "max_files_per_run", "≥ min_files_per_run (files)"
        )
        need(0 <= self.delete_ratio_percent <= 100, "delete_ratio_percent", "in 0–100 (percent)")
        need(self.snapshot_retention_s >= 0, "snapshot_retention_s", "≥ 0 (seconds)")
        need(self.retain_snapshots >= 1, "retain_snapshots", "≥ 1 (snapshots)")
        need(self.orphan_grace_s >= 0, "orphan_grace_s", "≥ 0 (seconds)")
        need(self.keep_cuts >= 0, "keep_cuts", "≥ 0 (cuts)")
        need(self.cut_max_age_s >= 0, "cut_max_age_s", "≥ 0 (seconds)")
        need(self.auto_interval_s >= 0, "auto_interval_s", "≥ 0 (seconds)")
        need(0 <= self.worker_nice <= 19, "worker_nice", "in 0–19 (nice steps)")
        IndexMergePolicy(self.index_max_blocks, self.index_max_blocks_per_merge)  # validates both

    @property
    def index_merge(self) -> IndexMergePolicy:
        """The index package's merge policy with this table's limits."""
        return IndexMergePolicy(self.index_max_blocks, self.index_max_blocks_per_merge)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> MaintenancePolicy:
        """From a JSON object of field names; unknown names raise ``ValueError`` (a typo must not be
        ignored silently)."""
        d = dict(d or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(
                f"maintenance policy: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        out: dict[str, Any] = {}
        for k, v in d.items():
            default: Any = known[k].default  # every field has a default
            try:
                out[k] = type(default)(v) if not isinstance(default, bool) else bool(v)
            except (TypeError, ValueError):
                raise ValueError(f"maintenance policy: {k} must be a {type(default).__name__}, found {v!r}") from None
        return cls(**out)

    def merged(self, overrides: Mapping[str, Any] | None) -> MaintenancePolicy:
        """This policy with ``overrides`` (field name → value) applied."""
        if not overrides:
            return self
        return MaintenancePolicy.from_dict({**asdict(self), **dict(overrides)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def policy_for(settings: object, table: str) -> MaintenancePolicy:
    """The policy of ``table`` under ``settings`` (an object whose ``extra`` mapping may hold
    ``maintenance`` and ``maintenance_tables``; see the module docstring for the precedence)."""
    extra = getattr(settings, "extra", None) or {}
    return table_policy(extra.get("maintenance"), extra.get("maintenance_tables"), table)


def table_policy(
    defaults: Mapping[str, Any] | None, per_table: Mapping[str, Mapping[str, Any]] | None, table: str
) -> MaintenancePolicy:
    """The policy of ``table``: :class:`MaintenancePolicy`'s defaults, overridden by ``defaults``
    (field name → value), then by ``per_table[table]``."""
    base = MaintenancePolicy.from_dict(dict(defaults or {}))
    return base.merged((per_table or {}).get(table))
