"""The Dagster definitions without any service or Postgres: configuration, asset graph, jobs, schedules,
sensor, and the sensor's maintenance rules."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from mooncake_assets.dagster.definitions import DagsterConfig, build_definitions, load_config
from mooncake_assets.dagster.jobs.maintenance import DEFAULT_CRON
from mooncake_assets.dagster.resources import MaintenanceThresholds, TableSpec, parse_tables
from mooncake_assets.dagster.sensors.replication import SensorCursor, plan_maintenance

from ..helpers import REPO
from .conftest import PGBENCH

KINDS = ["flush", "deletion_vectors", "index_merge", "compaction"]


def test_table_specs():
    assert parse_tables("orders, sales.customers ,items=inventory.items_v2") == [
        TableSpec("orders", "public.orders"),
        TableSpec("customers", "sales.customers"),
        TableSpec("items", "inventory.items_v2"),
    ]
    with pytest.raises(ValueError, match="letters, digits"):
        TableSpec.parse("bad-name=public.x")
    with pytest.raises(ValueError, match="unique"):
        parse_tables("a,public.a")


def test_load_config_from_env_and_settings(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "settings.json").write_text(
        json.dumps(
            {
                "extra": {
                    "dagster": {
                        "tables": ["a", "b"],
                        "sensor_interval_s": 30,
                        "schedules": {"compaction": "15 * * * *"},
                        "thresholds": {"flush_buffer_rows": 7},
                    }
                }
            }
        )
    )
    cfg = load_config({"MOONCAKE_STATE_DIR": str(state)})
    assert [t.name for t in cfg.tables] == ["a", "b"] and cfg.sensor_interval_s == 30
    assert cfg.cron["compaction"] == "15 * * * *" and cfg.cron["deletion_vectors"] == DEFAULT_CRON["deletion_vectors"]
    assert cfg.thresholds == {"flush_buffer_rows": 7} and cfg.automation
    assert cfg.database == str(state / "dagster.duckdb")
    cfg = load_config(
        {
            "MOONCAKE_STATE_DIR": str(state),
            "MOONCAKE_TABLES": "x=s.y",
            "MOONCAKE_SENSOR_INTERVAL_S": "5",
            "MOONCAKE_SCHEDULE_INDEX_MERGE": "off",
            "MOONCAKE_DAGSTER_AUTOMATION": "off",
        }
    )
    assert cfg.tables == [TableSpec("x", "s.y")] and cfg.sensor_interval_s == 5
    assert cfg.cron["index_merge"] == "" and not cfg.automation
    defs = build_definitions(cfg)
    assert "index_merge_schedule" not in {s.name for s in defs.schedules}
    assert all(s.default_status == dg.DefaultScheduleStatus.STOPPED for s in defs.schedules)
    assert defs.resolve_sensor_def("replication_sensor").default_status == dg.DefaultSensorStatus.STOPPED
    (state / "settings.json").write_text(json.dumps({"extra": {"dagster": {"thresholds": {"flush_buffer_rows": -1}}}}))
    with pytest.raises(Exception, match="flush_buffer_rows"):
        load_config({"MOONCAKE_STATE_DIR": str(state)})


def test_asset_graph_lineage_kinds_and_checks(tmp_path):
    defs = build_definitions(DagsterConfig(state_dir=tmp_path, tables=parse_tables(PGBENCH)))
    graph = defs.resolve_asset_graph()
    deps = {
        k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys} for k in graph.get_all_asset_keys()
    }
    for t in PGBENCH:
        assert deps[f"mirror/{t}"] == {f"postgres/public/{t}"}
        chain = [f"mirror/{t}"] + [f"{k}/{t}" for k in KINDS]
        for up, down in zip(chain, chain[1:]):
            assert deps[down] == {up}
        spec = graph.get(dg.AssetKey(["mirror", t]))
        assert {"postgres", "iceberg", "duckdb"} <= set(spec.kinds)
        assert spec.metadata["mooncake/table"] == t and spec.group_name == "mirror"
        assert graph.get(dg.AssetKey(["flush", t])).group_name == "flush"
        checks = {c.name for c in graph.get_check_keys_for_assets({dg.AssetKey(["mirror", t])})}
        assert checks == {"mirror_matches_source", "replication_lag"}
    assert deps["analytics/branch_balances"] == {
        "mirror/pgbench_accounts",
        "mirror/pgbench_branches",
        "mirror/pgbench_history",
    }
    assert deps["analytics/teller_activity"] == {"mirror/pgbench_tellers", "mirror/pgbench_history"}
    # other tables: no demo assets
    other = build_definitions(DagsterConfig(state_dir=tmp_path, tables=parse_tables("orders")))
    assert {k.to_user_string() for k in other.resolve_asset_graph().get_all_asset_keys()} == {
        "postgres/public/orders",
        "mirror/orders",
        *(f"{k}/orders" for k in KINDS),
    }


def test_jobs_schedules_and_sensor_defaults(tmp_path):
    defs = build_definitions(DagsterConfig(state_dir=tmp_path, tables=parse_tables(PGBENCH)))
    schedules = {s.name: s for s in defs.schedules}
    assert schedules["deletion_vectors_schedule"].cron_schedule == "* * * * *"
    assert schedules["index_merge_schedule"].cron_schedule == "*/10 * * * *"
    assert schedules["compaction_schedule"].cron_schedule == "0 * * * *"
    assert {"flush_schedule", "full_optimize_schedule"} <= set(schedules)
    assert all(s.default_status == dg.DefaultScheduleStatus.RUNNING for s in schedules.values())
    sensor = defs.resolve_sensor_def("replication_sensor")
    assert sensor.minimum_interval_seconds == 10 and sensor.default_status == dg.DefaultSensorStatus.RUNNING
    full = defs.resolve_job_def("full_optimize_job")
    assert {k.to_user_string() for k in full.asset_layer.selected_asset_keys} == {
        f"{k}/{t}" for k in KINDS for t in PGBENCH
    }
    for kind in KINDS:
        job = defs.resolve_job_def(f"{kind}_job")
        assert {k.path[0] for k in job.asset_layer.selected_asset_keys} == {kind}


def test_the_cut_schedule_is_off_by_default_and_turned_on_by_a_cron(tmp_path):
    """``MOONCAKE_SCHEDULE_CUT`` / settings.json ``schedules.cut``: the schedule
    ``analytics_at_cut_schedule`` over the job ``analytics_at_cut`` (the analytics assets), running
    under automation; absent by default, with ``off``, and without analytics assets."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    env = {"MOONCAKE_STATE_DIR": str(state), "MOONCAKE_TABLES": ",".join(PGBENCH)}
    assert "analytics_at_cut_schedule" not in {s.name for s in build_definitions(load_config(env)).schedules}
    assert "analytics_at_cut_schedule" not in {
        s.name for s in build_definitions(load_config({**env, "MOONCAKE_SCHEDULE_CUT": "off"})).schedules
    }
    defs = build_definitions(load_config({**env, "MOONCAKE_SCHEDULE_CUT": "*/15 * * * *"}))
    sched = {s.name: s for s in defs.schedules}["analytics_at_cut_schedule"]
    assert sched.cron_schedule == "*/15 * * * *" and sched.job_name == "analytics_at_cut"
    assert sched.default_status == dg.DefaultScheduleStatus.RUNNING
    assert sched.required_resource_keys == {"replication"}
    job = defs.resolve_job_def("analytics_at_cut")
    assert {k.path[0] for k in job.asset_layer.selected_asset_keys} == {"analytics"}
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} >= {
        "analytics/branch_balances",
        "analytics/teller_activity",
    }
    (state / "settings.json").write_text(json.dumps({"extra": {"dagster": {"schedules": {"cut": "5 * * * *"}}}}))
    off = build_definitions(load_config({**env, "MOONCAKE_DAGSTER_AUTOMATION": "off"}))
    sched = {s.name: s for s in off.schedules}["analytics_at_cut_schedule"]
    assert sched.cron_schedule == "5 * * * *" and sched.default_status == dg.DefaultScheduleStatus.STOPPED
    no_analytics = build_definitions(load_config({**env, "MOONCAKE_TABLES": "orders"}))
    assert "analytics_at_cut_schedule" not in {s.name for s in no_analytics.schedules}


def test_plan_maintenance_rules():
    th = MaintenanceThresholds(
        flush_buffer_bytes=1000, flush_buffer_rows=0, persist_pending_deletes=10, persist_max_age_s=60
    )
    quiet = {"buffer_rows": 5, "buffer_bytes": 999, "pending_deletes": 9, "index_blocks": 16}
    assert plan_maintenance(quiet, th, age_s=59) == []
    kinds = lambda st, **kw: [k for k, _ in plan_maintenance(st, th, **kw)]
    assert kinds({**quiet, "buffer_bytes": 1000}) == ["flush"]
    assert kinds({**quiet, "pending_deletes": 10}) == ["deletion_vectors"]
    assert kinds(quiet, age_s=60) == ["deletion_vectors"]
    assert kinds({**quiet, "index_blocks": 17}) == ["index_merge"]  # the policy's limit (16) by default
    assert kinds({**quiet, "index_blocks": 3}, index_max_blocks=2) == ["index_merge"]
    own = MaintenanceThresholds(index_merge_blocks=4)
    assert [k for k, _ in plan_maintenance({"index_blocks": 4}, own)] == ["index_merge"]
    plan = {"picked": 2, "files": [{"reasons": ["delete ratio 50% ≥ 30%"]}, {"reasons": ["delete ratio 40% ≥ 30%"]}]}
    ((kind, reason),) = plan_maintenance({}, th, compaction_plan=plan)
    assert kind == "compaction" and "2 file(s)" in reason
    assert plan_maintenance({}, th, compaction_plan={"picked": 0}) == []
    gone = {"picked": 1, "files": [{"delete_ratio_percent": 100.0, "reasons": ["delete ratio 100% ≥ 30%"]}]}
    assert plan_maintenance({}, th, compaction_plan=gone) == []  # persist drops a wholly deleted file
    assert SensorCursor.load("not json").ticks == 0


def test_definitions_validate_without_service_or_postgres(tmp_path):
    """`dagster definitions validate -w workspace.yaml` (as CI runs it) with an empty state dir and other
    tables: it loads, and starts nothing."""
    state = tmp_path / "state"
    env = dict(
        os.environ,
        MOONCAKE_STATE_DIR=str(state),
        MOONCAKE_TABLES="orders,crm.customers",
        DAGSTER_HOME=str(tmp_path / "home"),
    )
    (tmp_path / "home").mkdir()
    env.pop("MOONCAKE_PG_DSN", None)
    r = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Validation successful" in r.stdout + r.stderr
    assert not (state / "pg").exists() and not (state / "service.pid").exists()


def test_definitions_from_a_sources_file(tmp_path):
    """A sources file: per source its mirrors (from its tables.json), keyed <source>/<schema>/<table>, its
    own resource, I/O manager and sensor; nothing is contacted and no DSN variable is read at load."""
    (tmp_path / "mooncake.yaml").write_text(
        "sources:\n  a: {dsn_env: A_DSN, tables: ['public.*']}\n  b: {dsn_env: B_DSN, schemas: [sales]}\n"
    )
    for src, tables in (("a", {"orders": "public.orders"}), ("b", {"sales__q1": "sales.q1"})):
        d = tmp_path / ".mooncake" / src
        d.mkdir(parents=True)
        (d / "tables.json").write_text(json.dumps({"tables": {n: {"source": s} for n, s in tables.items()}}))
    cfg = load_config({"MOONCAKE_CONFIG": str(tmp_path / "mooncake.yaml")})
    assert [s.name for s in cfg.sources] == ["a", "b"] and cfg.database == str(
        tmp_path / ".mooncake" / "dagster.duckdb"
    )
    defs = build_definitions(cfg)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"a/public/orders", "b/sales/q1", "postgres/a/public/orders", "flush/b/sales/q1"} <= keys
    assert {
        p.to_user_string() for p in graph.get(dg.AssetKey(["deletion_vectors", "b", "sales", "q1"])).parent_keys
    } == {"flush/b/sales/q1"}
    assert {"replication__a", "replication__b", "io_manager__a", "io_manager__b", "io_manager"} <= set(defs.resources)
    for src in ("a", "b"):
        assert defs.resolve_sensor_def(f"replication_sensor__{src}").required_resource_keys == {f"replication__{src}"}
    # checks and schedules per source: each source's maintenance jobs select its own assets only
    for src, key in (("a", "a/public/orders"), ("b", "b/sales/q1")):
        assert {
            c.asset_key.to_user_string()
            for c in defs.resolve_asset_graph().asset_check_keys
            if c.asset_key.path[0] == src
        } == {key}
        flush = defs.resolve_job_def(f"flush_job__{src}")
        assert {k.to_user_string() for k in flush.asset_layer.selected_asset_keys} == {f"flush/{key}"}
        sched = {s.name: s for s in defs.schedules}[f"compaction_schedule__{src}"]
        assert sched.job_name == f"compaction_job__{src}" and sched.cron_schedule == "0 * * * *"
        assert defs.resolve_job_def(f"chunked_copy__{src}").executor_def.name == "chunked_copy_executor"
    mirror_job = defs.resolve_job_def("mirror_job")
    assert {k.to_user_string() for k in mirror_job.asset_layer.selected_asset_keys} == {"a/public/orders", "b/sales/q1"}
    # the one-source mode is untouched when a state directory is named
    one = load_config({"MOONCAKE_STATE_DIR": str(tmp_path / "one"), "MOONCAKE_TABLES": "x"})
    assert not one.sources and [t.name for t in one.tables] == ["x"]
