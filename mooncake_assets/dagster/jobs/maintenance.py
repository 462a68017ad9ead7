"""Maintenance jobs and their schedules.

One job per kind of work over every configured table — ``flush_job``, ``deletion_vectors_job``,
``index_merge_job``, ``compaction_job`` — and ``full_optimize_job`` (all four, in lineage order per
table). They run in process: each step is one call to the service, which does the work. ``mirror_job``
materializes the ``mirror/<t>`` assets (the sensor asks for it when a configured table is not mirrored).

Schedules (cron, UTC; every one configurable, see ``mooncake_assets/dagster/definitions.py``):
deletion vectors every minute, index merge every 10 minutes, compaction hourly, flush every 5 minutes,
full optimize daily at 03:00. A scheduled tick is skipped while a run of the same job is still queued or running.
"""

from collections.abc import Mapping

import dagster as dg

KINDS = ("flush", "deletion_vectors", "index_merge", "compaction")
FULL_OPTIMIZE = "full_optimize"
MIRROR_JOB = "mirror"

DEFAULT_CRON: dict[str, str] = {
    "flush": "*/5 * * * *",
    "deletion_vectors": "* * * * *",
    "index_merge": "*/10 * * * *",
    "compaction": "0 * * * *",
    FULL_OPTIMIZE: "0 3 * * *",
}

ACTIVE_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]

MAINTENANCE_TAG = "mooncake/maintenance"


def job_name(kind: str) -> str:
    """The unsuffixed job of a maintenance ``kind`` (``<kind>_job``, every source's tables), the one the
    sensors run; per-source jobs are ``<kind>_job__<source>`` (:func:`build_maintenance_jobs`)."""
    return f"{kind}_job"


def build_maintenance_jobs(source: str | None = None) -> dict:
    """``{kind: job}`` for each kind plus ``full_optimize``; jobs select assets by key prefix, so they
    cover whatever tables are configured. ``source`` (a sources file's): jobs ``<kind>_job__<source>``
    over that source's assets only (keys ``<kind>/<source>/…``)."""
    suffix = "" if source is None else f"__{source}"
    of = "every mirrored table" if source is None else f"every mirrored table of source {source}"

    def prefix(kind: str) -> list[str]:
        return [kind] if source is None else [kind, source]

    jobs = {}
    for kind in KINDS:
        jobs[kind] = dg.define_asset_job(
            job_name(kind) + suffix,
            selection=dg.AssetSelection.key_prefixes(prefix(kind)),
            executor_def=dg.in_process_executor,
            tags={MAINTENANCE_TAG: kind},
            description=f"{kind.replace('_', ' ')} of {of} (one service call per table).",
        )
    jobs[FULL_OPTIMIZE] = dg.define_asset_job(
        job_name(FULL_OPTIMIZE) + suffix,
        selection=dg.AssetSelection.key_prefixes(*(prefix(k) for k in KINDS)),
        executor_def=dg.in_process_executor,
        tags={MAINTENANCE_TAG: FULL_OPTIMIZE},
        description=f"Flush, persist deletion vectors, merge index blocks and compact {of}, in order.",
    )
    return jobs


def build_mirror_job(selection=None):
    """``mirror_job``: materializes ``mirror/<t>`` (the sensor uses it for tables not mirrored yet);
    ``selection``: other mirror assets (a sources file's, keyed ``<source>/<schema>/<table>``)."""
    return dg.define_asset_job(
        job_name(MIRROR_JOB),
        selection=selection if selection is not None else dg.AssetSelection.key_prefixes("mirror"),
        executor_def=dg.in_process_executor,
        description="Make sure every configured table is mirrored (initial copy the first time).",
    )


def active_runs(instance: dg.DagsterInstance, job: str | None = None, limit: int = 500) -> list[dg.DagsterRun]:
    """Runs that are queued or in flight (optionally of one job)."""
    filters = dg.RunsFilter(statuses=ACTIVE_STATUSES, job_name=job)
    return list(instance.get_runs(filters=filters, limit=limit))


def build_schedules(
    jobs: Mapping, cron: Mapping[str, str] | None = None, running: bool = True, source: str | None = None
) -> list[dg.ScheduleDefinition]:
    """A schedule per job (``cron`` overrides :data:`DEFAULT_CRON`; an empty string disables one), named
    ``<kind>_schedule`` (``<kind>_schedule__<source>`` for the jobs of one source)."""
    cron = {**DEFAULT_CRON, **(cron or {})}
    status = dg.DefaultScheduleStatus.RUNNING if running else dg.DefaultScheduleStatus.STOPPED
    out = []
    for kind, job in jobs.items():
        if not cron.get(kind):
            continue
        out.append(_schedule(kind, job, cron[kind], status, "" if source is None else f"__{source}"))
    return out


def _schedule(kind: str, job, cron: str, status, suffix: str = "") -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"{kind}_schedule{suffix}",
        cron_schedule=cron,
        job=job,
        default_status=status,
        description=f"Runs {job.name} on '{cron}' (UTC), skipping a tick while the previous run is active.",
    )
    def _fn(context: dg.ScheduleEvaluationContext):
        busy = active_runs(context.instance, job.name, limit=1)
        if busy:
            return dg.SkipReason(f"{job.name} run {busy[0].run_id} is still {busy[0].status.value.lower()}")
        return dg.RunRequest(tags={MAINTENANCE_TAG: kind, "mooncake/trigger": "schedule"})

    return _fn
