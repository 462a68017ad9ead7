"""A schedule that takes a consistent cut and runs a job whose mirror reads are pinned to it.

Each tick asks the service for a cut (every mirror committed to Iceberg at one LSN and tagged
``lsn-X-Y``, as ``mooncake cut``) and requests one run of ``job`` tagged ``mooncake/cut=<tag>``. The
:class:`~mooncake_assets.dagster.resources.io_manager.MooncakeDuckDBIOManager` reads every mirror
input of that run at the cut's snapshots, so all the run's assets see Postgres at one LSN, whatever
step or process reads them. The run key is the tag: a tick that finds no new commit makes the same
cut again, and Dagster does not launch a second run for it.

Example::

    job = dg.define_asset_job("reports", selection=["daily_report", "branch_totals"])
    schedule = build_cut_schedule(job, "0 * * * *")
    dg.Definitions(assets=..., jobs=[job], schedules=[schedule], resources={"replication": ..., "io_manager": ...})

The default definitions (``mooncake_assets.definitions``) add one, ``analytics_at_cut_schedule`` over
the job ``analytics_at_cut`` (the ``analytics`` assets), when ``MOONCAKE_SCHEDULE_CUT`` (or
settings.json ``extra.dagster.schedules.cut``) is a cron expression; see
:mod:`mooncake_assets.dagster.definitions`.
"""

import dagster as dg

from mooncake_assets.dagster.resources.io_manager import CUT_TAG
from mooncake_assets.dagster.resources.replication import ReplicationResource


def take_cut(replication: ReplicationResource, tables: list[str] | None = None) -> dict:
    """A consistent cut through the service (what ``mooncake cut --json`` prints): ``tag``
    (``lsn-X-Y``), ``lsn`` (``X/Y``), ``tables`` (per mirror: ``committed``, …), ``seconds``.
    ``tables`` None: every mirror. Read-your-writes: every commit the source had
    (``pg_current_wal_lsn()``) when this is called is in the cut (the service waits up to the
    resource's ``wait_timeout_s`` for it). Raises the service's ``ServiceError`` when it cannot cut."""
    from mooncake_assets.engine.read import current_wal_lsn

    barrier = current_wal_lsn(replication.source_dsn())
    return replication.call(
        "cut",
        timeout=replication.call_timeout_s,
        tables=tables or None,
        wait_lsn=barrier,
        timeout_s=replication.wait_timeout_s,
    )


CUT_JOB = "analytics_at_cut"  # the default definitions' job of the cut schedule (``schedules.cut``)


def build_cut_schedule(
    job,
    cron_schedule: str,
    name: str | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.STOPPED,
) -> dg.ScheduleDefinition:
    """A schedule (cron, UTC) whose every tick (``job``: a job definition or ``define_asset_job``'s)
    takes a cut (:func:`take_cut`) and requests a run of ``job`` tagged ``mooncake/cut=<tag>`` (run
    key: the tag). Named ``<job>_at_cut`` unless ``name``; ``default_status``: Dagster's (stopped
    until turned on, as Dagster's own default). Needs the ``replication`` resource."""

    @dg.schedule(
        job=job,
        cron_schedule=cron_schedule,
        name=name or f"{job.name}_at_cut",
        execution_timezone="UTC",
        default_status=default_status,
    )
    def _at_cut(context: dg.ScheduleEvaluationContext, replication: ReplicationResource):
        cut = take_cut(replication)
        context.log.info(f"cut {cut['tag']} at LSN {cut['lsn']}")
        return dg.RunRequest(run_key=cut["tag"], tags={CUT_TAG: cut["tag"]})

    return _at_cut
