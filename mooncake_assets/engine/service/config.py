"""The replicator service's configuration: one immutable value, built by the application.

The service reads nothing else: no settings file, no environment (credentials of an object store
excepted: the storage layer reads them from the process environment, see ``engine/storage``). The
application resolves its own settings (state directory, ``settings.json``, environment, command line)
and hands the result over as a :class:`ServiceConfig` (the application's ``Settings.service_config()``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compaction.policy import MaintenancePolicy, table_policy

__all__ = ["ServiceConfig", "default_copy_parallel"]


def default_copy_parallel() -> int:
    """``min(4, cores)``: the initial copy's default number of connections (cores as
    ``os.cpu_count()``; 1 when unknown)."""
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class ServiceConfig:
    """What one replicator service runs with.

    Paths and names:

    - ``state_dir``: the state directory (``tables.json`` registry, ``tables/<name>`` staging, marks).
    - ``socket_path``: the Unix socket of the Arrow Flight front.
    - ``dsn``: libpq conninfo of the source Postgres, resolved (an embedded cluster already started).
    - ``publication``: an administrator's publication the stream reads and never alters; None: the
      service keeps its own and adds each mirrored table to it.
    - ``catalog_uri``: the Iceberg SQL catalog's SQLAlchemy URI; ``warehouse_uri``: where table files
      go (``file://``, ``s3://``, ``gs://``, ``abfs://``…); ``s3_endpoint``, ``s3_region``,
      ``s3_allow_http``: S3 options (None: environment, then defaults; see ``engine/storage/config.py``).

    Policy (units in the field names; 0 turns a check off):

    - ``maintenance``: ``auto`` (the service flushes and persists by policy) or ``dagster`` (the
      Dagster assets drive persists; the service only flushes at its memory cap).
    - ``flush_rows`` / ``flush_bytes``: buffered rows / Arrow bytes of one table that trigger a flush.
    - ``persist_interval_s``: ``auto``: a dirty table is persisted at most this often.
    - ``verify_interval_s``: the scheduled check of every mirror against its source.
    - ``warn_persist_age_s`` / ``warn_slot_wal_bytes``: thresholds of ``status``' warnings.
    - ``catalog_wait_s``: how long a schema change waits for the source's catalogs to show its
      transaction (``SourceCatalog``).
    - ``publication_check_s``: how often the stream checks every mirrored table is still published.
    - ``maintenance_policy`` / ``maintenance_tables``: the compaction and index-merge policy (field
      name → value) and per-table overrides (table → field name → value), see :meth:`policy`.

    Apply:

    - ``apply_mode``: how committed transactions are applied — ``change`` (row-wise, one change at a
      time: ``MirrorTable.apply``), ``run`` (columnar runs: ``MirrorTable.apply_run``) or ``auto``
      (the default: runs for a transaction whose runs hold ``apply_run_min_rows`` changes or more on
      average, row-wise otherwise — a run's fixed cost makes short ones slower than row-wise, see
      ``engine/table/apply_bench.py``). The results are the same; only the CPU cost differs.
    - ``decoder``: ``native`` (the default: the compiled receive loop and decoder,
      ``engine/cdc/_native.pyx``; the committed transactions of one read batch applied together as
      batch runs, ``engine/service/native_batch.py``) or ``python`` (the reference decoder,
      ``pgoutput.parse_message`` + ``TransactionAssembler``). Same results. ``native`` falls back to
      ``python`` (logged) where the compiled loop cannot run (no psycopg binary libpq, not Linux).
    - ``native_run_min_rows``: with ``decoder=native`` and ``apply_mode=auto``, a batch run shorter
      than this is applied row by row.

    Memory (``engine/service/memory.py``):

    - ``memory_limit``: the budget in bytes for open transactions, MemSlices and their indexes (None:
      ``default_memory_limit()``, a quarter of MemTotal); below ``MIN_MEMORY_LIMIT`` is a ``ValueError``.
      Past shares of it committed buffers flush early, open transactions spill to
      ``<state_dir>/spill``, and last the stream stops reading (backpressure).

    Table discovery (``engine/service/discovery.py``):

    - ``table_patterns``: ``{"schemas": [...], "tables": [...], "exclude": [...]}`` glob patterns
      (:class:`~..pg.patterns.TableSelection`); with ``discover_interval_s`` > 0 the service looks
      every that many seconds for source tables they pick that are not mirrored yet and mirrors each
      as create-table does (mirror name :func:`~..pg.patterns.mirror_name`). 0 (the default): off.
    - ``discover_retry_s``: a table discovery could not mirror is tried again after this many
      seconds (None: ``max(60, 10 * discover_interval_s)``, :func:`.discovery.retry_after_s`).
    - ``discover_reload``: called before each look; returns new patterns (as ``table_patterns``) when
      the sources file they came from was edited, else None (the application's
      ``config.patterns_reloader``): an edited ``mooncake.yaml`` takes effect without a restart.

    Initial copy:

    - ``copy_parallel``: connections create-table's initial copy reads the table's CTID ranges on, at
      the slot's exported snapshot (``engine/cdc/copy.py``); 1: one COPY of the whole table. Default
      :func:`default_copy_parallel` (``min(4, cores)``).
    """

    state_dir: Path
    dsn: str
    socket_path: Path
    catalog_uri: str
    warehouse_uri: str
    publication: str | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_allow_http: bool | None = None
    maintenance: str = "auto"
    flush_rows: int = 200_000
    flush_bytes: int = 256 << 20
    persist_interval_s: float = 10.0
    verify_interval_s: float = 600.0
    warn_persist_age_s: float = 600.0
    warn_slot_wal_bytes: int = 1 << 30
    catalog_wait_s: float = 60.0
    publication_check_s: float = 2.0
    maintenance_policy: Mapping[str, Any] = field(default_factory=dict)
    maintenance_tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    apply_mode: str = "auto"
    apply_run_min_rows: int = 512
    decoder: str = "native"
    native_run_min_rows: int = 64
    memory_limit: int | None = None
    copy_parallel: int = field(default_factory=default_copy_parallel)
    table_patterns: Mapping[str, Any] = field(default_factory=dict)
    discover_interval_s: float = 0.0
    discover_retry_s: float | None = None
    discover_reload: Callable[[], Mapping[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        if self.apply_mode not in ("change", "run", "auto"):
            raise ValueError(f"apply_mode must be change, run or auto, found {self.apply_mode!r}")
        if self.decoder not in ("native", "python"):
            raise ValueError(f"decoder must be native or python, found {self.decoder!r}")
        from .memory import check_memory_limit, default_memory_limit

        limit = default_memory_limit() if self.memory_limit is None else int(self.memory_limit)
        object.__setattr__(self, "memory_limit", check_memory_limit(limit))
        if self.discover_interval_s < 0:
            raise ValueError(f"discover_interval_s must be 0 (off) or more, found {self.discover_interval_s!r}")
        if self.copy_parallel < 1:
            raise ValueError(f"copy_parallel must be 1 or more, found {self.copy_parallel!r}")
        object.__setattr__(self, "state_dir", Path(self.state_dir))
        object.__setattr__(self, "socket_path", Path(self.socket_path))

    def policy(self, table: str) -> MaintenancePolicy:
        """The maintenance policy of ``table``: the defaults, then ``maintenance_policy``, then the
        table's entry of ``maintenance_tables`` (``ValueError`` for an unknown field or a bad value)."""
        return table_policy(self.maintenance_policy, self.maintenance_tables, table)
