"""Maintenance jobs and schedules of mooncake-assets."""

from .maintenance import (
    ACTIVE_STATUSES,
    DEFAULT_CRON,
    FULL_OPTIMIZE,
    KINDS,
    MAINTENANCE_TAG,
    MIRROR_JOB,
    active_runs,
    build_maintenance_jobs,
    build_mirror_job,
    build_schedules,
    job_name,
)

__all__ = [
    "ACTIVE_STATUSES",
    "DEFAULT_CRON",
    "FULL_OPTIMIZE",
    "KINDS",
    "MAINTENANCE_TAG",
    "MIRROR_JOB",
    "active_runs",
    "build_maintenance_jobs",
    "build_mirror_job",
    "build_schedules",
    "job_name",
]
