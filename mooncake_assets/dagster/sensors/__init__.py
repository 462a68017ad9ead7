"""Sensors of mooncake-assets: ``replication_sensor``."""

from .replication import (
    DEFAULT_INTERVAL_S,
    SENSOR_NAME,
    SensorCursor,
    build_replication_sensor,
    busy_tables,
    evaluate,
    observation,
    plan_maintenance,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "SENSOR_NAME",
    "SensorCursor",
    "build_replication_sensor",
    "busy_tables",
    "evaluate",
    "observation",
    "plan_maintenance",
]
