"""Dagster assets of mooncake-assets (docs/architecture.md#dagster): per configured table ``mirror/<t>`` and its maintenance
(``flush/<t>`` → ``deletion_vectors/<t>`` → ``index_merge/<t>`` → ``compaction/<t>``), their asset checks,
and the demo's downstream assets."""

from ..keys import ONE_SOURCE, SourceKeys
from .analytics import (
    PGBENCH,
    analytics_assets,
    analytics_checks,
    branch_balances,
    branch_balances_incremental,
    teller_activity,
)
from .checks import build_mirror_checks, build_mirror_matches_source, build_replication_lag
from .factory import (
    MAINTENANCE_KINDS,
    MIRROR,
    build_maintenance_asset,
    build_mirror_asset,
    build_table_assets,
    maintenance_key,
    mirror_key,
    source_key,
)

__all__ = [
    "PGBENCH",
    "analytics_assets",
    "analytics_checks",
    "branch_balances_incremental",
    "branch_balances",
    "teller_activity",
    "build_mirror_checks",
    "build_mirror_matches_source",
    "build_replication_lag",
    "MAINTENANCE_KINDS",
    "MIRROR",
    "ONE_SOURCE",
    "SourceKeys",
    "build_maintenance_asset",
    "build_mirror_asset",
    "build_table_assets",
    "maintenance_key",
    "mirror_key",
    "source_key",
]
