"""The Dagster resources of mooncake-assets: the service client and the DuckDB I/O manager."""

from .incremental import CURSORS, DELETES, INCREMENTAL, MirrorChanges, read_mirror_at
from .io_manager import MIRROR_TABLE, MirrorDbClient, MooncakeDuckDBIOManager
from .replication import (
    DEFAULT_TABLES,
    MaintenanceThresholds,
    ReplicationResource,
    TableSpec,
    lag_bytes,
    lsn_int,
    parse_tables,
)
from .type_handlers import (
    ArrowTableTypeHandler,
    DuckDBRelationTypeHandler,
    PandasDataFrameTypeHandler,
    PolarsDataFrameTypeHandler,
    default_type_handlers,
)

__all__ = [
    "CURSORS",
    "DELETES",
    "INCREMENTAL",
    "MirrorChanges",
    "read_mirror_at",
    "MIRROR_TABLE",
    "MirrorDbClient",
    "MooncakeDuckDBIOManager",
    "DEFAULT_TABLES",
    "MaintenanceThresholds",
    "ReplicationResource",
    "TableSpec",
    "lag_bytes",
    "lsn_int",
    "parse_tables",
    "ArrowTableTypeHandler",
    "DuckDBRelationTypeHandler",
    "PandasDataFrameTypeHandler",
    "PolarsDataFrameTypeHandler",
    "default_type_handlers",
]
