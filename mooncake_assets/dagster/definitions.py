"""The Dagster definitions of mooncake-assets: :func:`load_config` and :func:`build_definitions`.

``workspace.yaml`` (``dagster dev -w workspace.yaml``) loads ``mooncake_assets.definitions``, whose
``defs`` is ``build_definitions(load_config())``; ``mooncake demo --dagster`` and the tests build their
own from a :class:`DagsterConfig`.

Loading contacts nothing (no service, no Postgres): the configuration comes from the environment and
the state directory's ``settings.json`` (key ``extra.dagster``), the environment winning:

=================================  ===========================================  =====================================
environment                        settings.json ``extra.dagster``              default
=================================  ===========================================  =====================================
``MOONCAKE_STATE_DIR``             —                                            ``./.mooncake``
``MOONCAKE_TABLES`` (comma-sep.)   ``tables`` (list)                            the four pgbench tables
``MOONCAKE_SENSOR_INTERVAL_S``     ``sensor_interval_s``                        10 (seconds)
``MOONCAKE_SCHEDULE_<KIND>``       ``schedules.<kind>``                         ``jobs.maintenance.DEFAULT_CRON``
                                                                                (cron; ``off`` disables one)
``MOONCAKE_SCHEDULE_CUT``          ``schedules.cut``                            ``off``; a cron: the schedule
                                                                                ``analytics_at_cut_schedule``
``MOONCAKE_DAGSTER_AUTOMATION``    ``automation``                               ``on``: sensor and schedules run by
                                                                                default (``off``: stopped)
``MOONCAKE_DUCKDB``                ``database``                                 ``<state>/dagster.duckdb``
—                                  ``thresholds`` (MaintenanceThresholds        see ``MaintenanceThresholds``
                                   fields)
=================================  ===========================================  =====================================

``schedules.cut``: every tick takes a consistent cut (every mirror committed to Iceberg at one LSN,
tagged ``lsn-X-Y``; ``jobs.cuts.build_cut_schedule``) and runs the job ``analytics_at_cut`` (the
``analytics`` assets) tagged with it, so all of its mirror reads are of Postgres at that LSN. Off by
default: a cut commits every mirror on each tick. Not built without analytics assets, nor with a
sources file (a cut is of one service's mirrors).

A table is ``name`` (source ``public.name``), ``schema.table`` or ``name=schema.table``. The DSN,
warehouse and catalog are the state directory's (``mooncake`` settings and ``MOONCAKE_PG_DSN`` etc.).

**With a sources file** (``$MOONCAKE_CONFIG``, or ``./mooncake.yaml`` when ``MOONCAKE_STATE_DIR`` is
not set; docs/sources.md) the definitions cover every source instead: per source, the mirrors its
state directory's ``tables.json`` lists (what ``mooncake sync`` created — so a definitions reload
picks up new tables, no restart), keyed ``<source>/<schema>/<table>`` (maintenance
``<kind>/<source>/<schema>/<table>``, see ``mooncake_assets.dagster.keys``), a resource
``replication__<source>`` whose DSN is the source's ``dsn_env`` variable (``dg.EnvVar``: read when a
run needs it, never at load), an I/O manager ``io_manager__<source>`` that loads its mirrors, a
sensor ``replication_sensor__<source>``, asset checks, maintenance jobs and schedules of its own
(``<kind>_job__<source>``, ``<kind>_schedule__<source>``) and the job ``chunked_copy__<source>``
(docs/scaling.md). ``MOONCAKE_TABLES`` and settings.json's ``extra.dagster``
do not apply then; the sensor interval, schedules, automation and ``MOONCAKE_DUCKDB`` (default
``<state_root>/dagster.duckdb``) come from the environment as above.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from mooncake_assets.config import load_settings
from mooncake_assets.dagster.jobs.chunked import build_chunked_copy_job
from mooncake_assets.dagster.jobs.cuts import CUT_JOB, build_cut_schedule
from mooncake_assets.dagster.jobs.maintenance import (
    DEFAULT_CRON,
    build_maintenance_jobs,
    build_mirror_job,
    build_schedules,
)
from mooncake_assets.dagster.keys import SourceKeys
from mooncake_assets.dagster.resources.io_manager import MooncakeDuckDBIOManager
from mooncake_assets.dagster.resources.replication import (
    DEFAULT_TABLES,
    MaintenanceThresholds,
    ReplicationResource,
    TableSpec,
    parse_tables,
)
from mooncake_assets.dagster.sensors.replication import DEFAULT_INTERVAL_S, build_replication_sensor

from .assets import analytics_assets, analytics_checks, build_mirror_checks, build_table_assets


@dataclass
class DagsterConfig:
    """What the Dagster layer is built from (see the module docstring for where each value comes from)."""

    state_dir: Path
    tables: list[TableSpec] = field(default_factory=lambda: parse_tables(DEFAULT_TABLES))
    sensor_interval_s: int = DEFAULT_INTERVAL_S
    cron: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CRON))
    automation: bool = True
    database: str | None = None
    thresholds: dict = field(default_factory=dict)
    catalog_uri: str | None = None
    sources: list[SourceDefs] = field(default_factory=list)  # a sources file's: then ``tables`` is unused
    config_file: Path | None = None


@dataclass
class SourceDefs:
    """One source of a sources file as the definitions see it: its name, state directory, DSN variable,
    warehouse and catalog (the file's; None: the state directory's defaults) and its mirrors (from
    ``<state_dir>/tables.json``)."""

    name: str
    state_dir: Path
    dsn_env: str
    tables: list[TableSpec] = field(default_factory=list)
    warehouse: str | None = None
    catalog: str | None = None

    @property
    def keys(self) -> SourceKeys:
        return SourceKeys(self.name, {t.name: t.source_parts for t in self.tables})


def _flag(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() not in ("0", "off", "false", "no", "stopped")


def load_config(environ: Mapping[str, str] | None = None) -> DagsterConfig:
    """The configuration from ``environ`` (default ``os.environ``) and settings.json. Raises ``ValueError``
    naming the bad value (e.g. a malformed table entry)."""
    env = os.environ if environ is None else environ
    from mooncake_assets.sources import find_config

    path = find_config(None, env)
    if path is not None:
        return _sources_config(path, env)
    settings = load_settings(env.get("MOONCAKE_STATE_DIR") or None)
    saved = (settings.extra or {}).get("dagster", {}) if isinstance(settings.extra, dict) else {}
    tables = env.get("MOONCAKE_TABLES") or saved.get("tables") or list(DEFAULT_TABLES)
    common = _automation(env, saved)
    database = env.get("MOONCAKE_DUCKDB") or saved.get("database") or str(settings.state_dir / "dagster.duckdb")
    return DagsterConfig(
        state_dir=settings.state_dir,
        tables=parse_tables(tables),
        database=database,
        catalog_uri=settings.catalog,
        **common,
    )


def _automation(env: Mapping[str, str], saved: Mapping) -> dict:
    """``cron``, ``sensor_interval_s``, ``automation`` and ``thresholds`` from the environment beating
    ``saved`` (settings.json ``extra.dagster``; ``{}`` with a sources file)."""
    cron = dict(DEFAULT_CRON)
    cron.update(saved.get("schedules", {}))
    for kind in (*DEFAULT_CRON, "cut"):
        v = env.get(f"MOONCAKE_SCHEDULE_{kind.upper()}")
        if v is not None:
            cron[kind] = v
    cron = {k: ("" if v.strip().lower() in ("", "off", "none") else v.strip()) for k, v in cron.items()}
    interval = env.get("MOONCAKE_SENSOR_INTERVAL_S") or saved.get("sensor_interval_s") or DEFAULT_INTERVAL_S
    try:
        interval = int(float(interval))
    except ValueError:
        raise ValueError(f"MOONCAKE_SENSOR_INTERVAL_S must be a number of seconds, not {interval!r}") from None
    automation = _flag(env.get("MOONCAKE_DAGSTER_AUTOMATION", saved.get("automation", True)))
    thresholds = dict(saved.get("thresholds", {}))
    MaintenanceThresholds(**thresholds)  # fail at load time on a bad threshold, naming it
    return {"sensor_interval_s": interval, "cron": cron, "automation": automation, "thresholds": thresholds}


def _sources_config(path: Path, env: Mapping[str, str]) -> DagsterConfig:
    """The configuration of a sources file (see the module docstring); reads the file and each source's
    ``tables.json``, contacts nothing. Raises ``ValueError`` (a :class:`~mooncake_assets.sources.
    ConfigError` naming the file and key, or naming an unreadable ``tables.json``)."""
    import json

    from mooncake_assets.sources import load_config as load_sources

    cfg = load_sources(path)
    sources = []
    for src in cfg.sources.values():
        reg = src.state_dir / "tables.json"
        try:
            mirrors = json.loads(reg.read_text()).get("tables", {}) if reg.exists() else {}
        except (OSError, ValueError) as e:
            raise ValueError(f"source {src.name}: cannot read {reg}: {e}") from None
        tables = [TableSpec(name, m["source"]) for name, m in sorted(mirrors.items())]
        sources.append(SourceDefs(src.name, src.state_dir, src.dsn_env, tables, src.warehouse, src.catalog))
    return DagsterConfig(
        state_dir=cfg.state_root,
        tables=[],
        database=env.get("MOONCAKE_DUCKDB") or str(cfg.state_root / "dagster.duckdb"),
        sources=sources,
        config_file=cfg.path,
        **_automation(env, {}),
    )


def build_definitions(config: DagsterConfig) -> dg.Definitions:
    """Assets, checks, jobs, schedules, the sensor and the resources for ``config`` (with sources: see
    :func:`_build_sources`)."""
    if config.sources:
        return _build_sources(config)
    replication = ReplicationResource(
        state_dir=str(config.state_dir),
        tables=[str(t) for t in config.tables],
        thresholds=MaintenanceThresholds(**config.thresholds),
    )
    io_manager = MooncakeDuckDBIOManager(
        database=config.database or str(config.state_dir / "dagster.duckdb"), replication=replication
    )
    jobs = build_maintenance_jobs()
    mirror_job = build_mirror_job()
    all_jobs = [*jobs.values(), mirror_job]
    analytics = analytics_assets(t.name for t in config.tables)
    cut_jobs, cut_schedules = _cut_schedule(config, bool(analytics))
    return dg.Definitions(
        assets=[*build_table_assets(config.tables, config.catalog_uri), *analytics],
        asset_checks=[*build_mirror_checks(config.tables), *analytics_checks(t.name for t in config.tables)],
        jobs=[*all_jobs, *cut_jobs, build_chunked_copy_job(None, "replication")],
        schedules=[*build_schedules(jobs, config.cron, running=config.automation), *cut_schedules],
        sensors=[build_replication_sensor(all_jobs, config.sensor_interval_s, running=config.automation)],
        resources={"replication": replication, "io_manager": io_manager},
        executor=dg.in_process_executor,
    )


def _cut_schedule(config: DagsterConfig, has_analytics: bool) -> tuple[list, list]:
    """([the job ``analytics_at_cut``], [its cut schedule]) when ``config.cron["cut"]`` is a cron and
    there are analytics assets; else ``([], [])``. Running by default when ``config.automation``."""
    cron = config.cron.get("cut", "")
    if not cron or not has_analytics:
        return [], []
    job = dg.define_asset_job(CUT_JOB, selection=dg.AssetSelection.groups("analytics"))
    status = dg.DefaultScheduleStatus.RUNNING if config.automation else dg.DefaultScheduleStatus.STOPPED
    return [job], [build_cut_schedule(job, cron, name=f"{CUT_JOB}_schedule", default_status=status)]


def dagster_home(state_dir: str | os.PathLike) -> Path:
    """``<state>/dagster``: the DAGSTER_HOME of ``mooncake ui`` and ``mooncake demo --dagster`` (created,
    with a dagster.yaml that turns telemetry off, when missing)."""
    from mooncake_assets.engine.private import ensure_private_dir

    home = ensure_private_dir(state_dir) / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return home


def dagster_instance(state_dir: str | os.PathLike) -> dg.DagsterInstance:
    """The Dagster instance of :func:`dagster_home`: where ``mooncake demo --dagster`` records its runs, so
    they show in ``mooncake ui``."""
    return dg.DagsterInstance.from_config(str(dagster_home(state_dir)))


def materialize_keys(
    defs: dg.Definitions,
    keys,
    instance: dg.DagsterInstance | None = None,
    raise_on_error: bool = True,
    tags: Mapping[str, str] | None = None,
    run_config: Mapping | None = None,
    log_level: str | None = None,
    checks: bool = True,
) -> dg.ExecuteInProcessResult:
    """Materialize the assets ``keys`` (AssetKeys or "a/b" strings) of ``defs`` in this process, with the
    resources bound in ``defs`` (the ``mooncake demo --dagster`` way); ``checks``: run their asset checks
    too. ``run_config``: e.g. ``{"ops": {"compaction__t": {"config": {"full": True}}}}``; ``log_level``: of
    the run's console log (default Dagster's, DEBUG)."""
    keys = [k if isinstance(k, dg.AssetKey) else dg.AssetKey.from_user_string(k) for k in keys]
    if log_level:
        run_config = {**(run_config or {}), "loggers": {"console": {"config": {"log_level": log_level}}}}
    selection = dg.AssetSelection.assets(*keys)
    if not checks:
        selection = selection.without_checks()
    return dg.materialize(
        [*defs.assets, *defs.asset_checks],
        selection=selection,
        resources=defs.resources,
        instance=instance,
        raise_on_error=raise_on_error,
        tags=tags,
        run_config=run_config,
    )


def _build_sources(config: DagsterConfig) -> dg.Definitions:
    """The definitions of a sources file: per source its mirror and maintenance assets, checks, resource,
    I/O manager, sensor, maintenance jobs ``<kind>_job__<source>`` with their schedules
    ``<kind>_schedule__<source>`` and the job ``chunked_copy__<source>``; the maintenance jobs without a
    suffix (the sensors' and the UI's) cover all sources."""
    database = config.database or str(config.state_dir / "dagster.duckdb")
    thresholds = MaintenanceThresholds(**config.thresholds)
    jobs = build_maintenance_jobs()
    mirror_job = build_mirror_job(dg.AssetSelection.groups("mirror"))
    all_jobs = [*jobs.values(), mirror_job]
    assets: list = []
    checks: list = []
    sensors = []
    resources: dict = {}
    for src in config.sources:
        keys = src.keys
        replication = ReplicationResource(
            state_dir=str(src.state_dir),
            tables=[str(t) for t in src.tables],
            dsn=dg.EnvVar(src.dsn_env),
            warehouse=src.warehouse,
            catalog=src.catalog,
            thresholds=thresholds,
        )
        resources[keys.resource_key] = replication
        resources[keys.io_manager_key] = MooncakeDuckDBIOManager(database=database, replication=replication)
        resources.setdefault("io_manager", resources[keys.io_manager_key])
        catalog = src.catalog or f"sqlite:///{src.state_dir / 'catalog.db'}"
        assets += build_table_assets(src.tables, catalog if catalog.startswith("sqlite:") else None, keys)
        checks += build_mirror_checks(src.tables, keys)
        sensors.append(
            build_replication_sensor(
                all_jobs,
                config.sensor_interval_s,
                running=config.automation,
                name=f"replication_sensor__{src.name}",
                keys=keys,
            )
        )
    per_source = [build_chunked_copy_job(src.name, src.keys.resource_key) for src in config.sources]
    # schedules per source: each source's maintenance jobs over its own assets, on the configured crons
    schedules: list = []
    for src in config.sources:
        own = build_maintenance_jobs(src.name)
        per_source += own.values()
        schedules += build_schedules(own, config.cron, running=config.automation, source=src.name)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[*all_jobs, *per_source],
        schedules=schedules,
        sensors=sensors,
        resources=resources,
        executor=dg.in_process_executor,
    )
