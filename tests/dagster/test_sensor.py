"""replication_sensor, evaluated tick by tick with Dagster's own tools (build_sensor_context +
evaluate_tick) against the real service: observations, maintenance requests with run keys, the cursor,
restart of a killed service, and no second request while a run is in flight."""

import json
import time

import dagster as dg
import psycopg

from mooncake_assets.engine.service.process import kill_service, service_pid

from .conftest import PGBENCH, tpcb


def tick(env, cursor=None):
    """One sensor evaluation; returns (SensorExecutionData, cursor dict)."""
    sensor = env.defs.resolve_sensor_def("replication_sensor")
    with dg.build_sensor_context(
        instance=env.instance, cursor=cursor, definitions=env.defs, resources={"replication": env.replication}
    ) as ctx:
        data = sensor.evaluate_tick(ctx)
    return data, json.loads(data.cursor)


def requests_by_table(data) -> dict:
    return {r.tags["mooncake/table"]: r for r in data.run_requests}


def observations(data) -> dict:
    return {
        e.asset_key.path[-1]: {k: v.value for k, v in e.metadata.items()}
        for e in data.asset_events
        if isinstance(e, dg.AssetObservation)
    }


def test_sensor_observes_and_requests_maintenance(mc):
    env = mc.rebuild(
        flush_buffer_rows=20,
        persist_pending_deletes=15,
        index_merge_blocks=3,
        min_request_interval_s=0,
        persist_max_age_s=0.5,
    )
    env.mirror_all()
    tpcb(env.dsn, 30)
    env.union_barrier()
    data, cur = tick(env)
    obs = observations(data)
    assert set(obs) == set(PGBENCH)
    acc = obs["pgbench_accounts"]
    for k in (
        "source_lsn",
        "applied_lsn",
        "flush_lsn",
        "lag_bytes",
        "lag_seconds",
        "buffer_rows",
        "buffer_bytes",
        "data_files",
        "index_blocks",
        "pending_deletes",
    ):
        assert k in acc, k
    assert acc["buffer_rows"] == 30 and acc["pending_deletes"] >= 15 and acc["data_files"] == 1
    reqs = requests_by_table(data)
    a = reqs["pgbench_accounts"]
    assert a.asset_selection == [
        dg.AssetKey(["flush", "pgbench_accounts"]),
        dg.AssetKey(["deletion_vectors", "pgbench_accounts"]),
    ]
    assert a.job_name == "full_optimize_job"  # two kinds of work for one table: one run
    last_change = next(t for t in env.replication.status()["tables"] if t["name"] == "pgbench_accounts")[
        "last_change_lsn"
    ]
    assert a.run_key == f"flush+deletion_vectors/pgbench_accounts/{last_change}"
    h = reqs["pgbench_history"]
    assert h.asset_selection == [dg.AssetKey(["flush", "pgbench_history"])] and h.job_name == "flush_job"
    assert "buffer 30 rows" in h.tags["mooncake/reason"]
    assert cur["ticks"] == 1 and cur["pid"] == service_pid(env.settings) and cur["restarts"] == 0

    # nothing changed: the same run keys again (Dagster launches a run key once), and the cursor moves on
    data2, cur2 = tick(env, data.cursor)
    assert requests_by_table(data2)["pgbench_accounts"].run_key == a.run_key
    assert cur2["ticks"] == 2

    # the requested runs do the work; the next tick asks for nothing more for accounts, except by age
    env.materialize("flush/pgbench_accounts", "deletion_vectors/pgbench_accounts", "flush/pgbench_history")
    with psycopg.connect(env.dsn, autocommit=True) as c:
        c.execute("INSERT INTO pgbench_history (tid, bid, aid, delta) VALUES (1, 1, 1, 1)")
    env.union_barrier()
    data3, cur3 = tick(env, data2.cursor)
    assert "pgbench_accounts" not in requests_by_table(data3)
    assert "pgbench_history" in cur3["tables"] and "dirty_since" in cur3["tables"]["pgbench_history"]
    time.sleep(0.6)
    data4, _ = tick(env, data3.cursor)
    h = requests_by_table(data4)["pgbench_history"]
    assert h.asset_selection == [dg.AssetKey(["deletion_vectors", "pgbench_history"])]
    assert "unpersisted changes" in h.tags["mooncake/reason"]

    # index blocks above the limit: index_merge, with `full` so the merge happens below the policy's limit
    for i in range(3):
        tpcb(env.dsn, 3, seed=i)
        env.materialize("flush/pgbench_accounts")
    data5, _ = tick(env, data4.cursor)
    a = requests_by_table(data5)["pgbench_accounts"]
    assert dg.AssetKey(["index_merge", "pgbench_accounts"]) in a.asset_selection
    assert a.run_config["ops"]["index_merge__pgbench_accounts"]["config"]["full"] is True


def test_sensor_starts_and_restarts_the_service(mc):
    """First tick: nothing runs, so the sensor starts the service and asks for the mirrors (initial
    copies). After a SIGKILL the next tick restarts it and says so."""
    assert not mc.replication.ping()
    data, cur = tick(mc)
    assert mc.replication.ping() and cur["pid"] == service_pid(mc.settings) and cur["restarts"] == 0
    reqs = requests_by_table(data)
    assert set(reqs) == set(PGBENCH)
    assert reqs["pgbench_accounts"].job_name == "mirror_job"
    assert reqs["pgbench_accounts"].asset_selection == [dg.AssetKey(["mirror", "pgbench_accounts"])]
    mc.mirror_all()

    old = service_pid(mc.settings)
    kill_service(mc.settings)
    assert not mc.replication.ping()
    data, cur = tick(mc, data.cursor)
    assert mc.replication.ping()
    new = service_pid(mc.settings)
    assert new != old and cur["pid"] == new and cur["restarts"] == 1
    obs = observations(data)
    assert set(obs) == set(PGBENCH)  # the mirrors are back (restored from Iceberg)
    assert obs["pgbench_accounts"]["service"].startswith(f"restarted: the service (pid {old}) had stopped answering")
    assert not data.run_requests or all(r.job_name != "mirror_job" for r in data.run_requests)


def test_no_second_request_while_a_run_is_in_flight(mc):
    env = mc.rebuild(flush_buffer_rows=5, min_request_interval_s=0)
    env.materialize("mirror/pgbench_accounts", "mirror/pgbench_history")
    tpcb(env.dsn, 10)
    env.union_barrier()
    job = env.defs.resolve_job_def("flush_job")
    run = env.instance.create_run_for_job(
        job_def=job,
        status=dg.DagsterRunStatus.NOT_STARTED,
        asset_selection=frozenset({dg.AssetKey(["flush", "pgbench_accounts"])}),
    )
    data, _ = tick(env)
    reqs = requests_by_table(data)
    assert "pgbench_accounts" not in reqs  # its flush run exists and has not finished
    assert "pgbench_history" in reqs  # other tables are not held up

    env.instance.report_run_canceled(run)  # the queued run goes away: the sensor asks again
    data, _ = tick(env, data.cursor)
    assert requests_by_table(data)["pgbench_accounts"].asset_selection == [dg.AssetKey(["flush", "pgbench_accounts"])]

    # a schedule's run of a whole maintenance job (no asset selection) holds every table
    run = env.instance.create_run_for_job(
        job_def=job, status=dg.DagsterRunStatus.STARTED, tags={"mooncake/maintenance": "flush"}
    )
    data, _ = tick(env, data.cursor)
    assert not data.run_requests
    env.instance.report_run_failed(run)


def test_sensor_reports_a_schema_change_the_mirror_cannot_follow(mc):
    """A followable change (ADD COLUMN on branches) is just evolution; an unfollowable one (history's
    filler char(22) → integer) stops only that mirror, and the sensor's observation and log say which
    table, column and LSN."""
    env = mc.rebuild(min_request_interval_s=0)
    env.mirror_all()
    with psycopg.connect(env.dsn, autocommit=True) as c:
        c.execute("ALTER TABLE pgbench_branches ADD COLUMN region text DEFAULT 'north'")
        c.execute("UPDATE pgbench_branches SET bbalance = bbalance + 1 WHERE bid = 1")
        c.execute("ALTER TABLE pgbench_history ALTER COLUMN filler TYPE integer USING NULL")
        c.execute("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (1, 1, 1, 1, now())")
    env.union_barrier()
    data, _ = tick(env)
    obs = observations(data)
    err = obs["pgbench_history"].get("error", "")
    assert "table pgbench_history" in err and "column filler changed type" in err and "LSN " in err, obs[
        "pgbench_history"
    ]
    assert "error" not in obs["pgbench_branches"] and "error" not in obs["pgbench_accounts"]
    assert "pgbench_history" not in requests_by_table(data)
    rows = env.replication.union_reader().query("SELECT bid, region FROM pgbench_branches ORDER BY bid")
    assert rows.column("region").to_pylist() == ["north"] * rows.num_rows


def test_sensor_makes_a_mirror_created_outside_dagster_visible(mc):
    """A mirror created with the CLI is not "Never materialized" with checks "Not
    evaluated" while observations arrive: the sensor records it once and evaluates replication_lag."""
    env = mc.rebuild()
    env.replication.ensure_running()
    client = env.replication.client()
    client.call("create_table", dst="pgbench_branches", src="public.pgbench_branches", timeout=600)
    data, _ = tick(env)
    mats = [e for e in data.asset_events if isinstance(e, dg.AssetMaterialization)]
    assert [m.asset_key for m in mats] == [dg.AssetKey(["mirror", "pgbench_branches"])], data.asset_events
    assert "found mirrored" in mats[0].metadata["recorded_by"].value
    checks = [e for e in data.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    assert [(c.asset_key, c.check_name) for c in checks] == [
        (dg.AssetKey(["mirror", "pgbench_branches"]), "replication_lag")
    ]
    assert checks[0].passed, checks[0].description
    # once Dagster has a materialization of the mirror, the sensor records none of its own
    env.materialize("mirror/pgbench_branches")
    data2, _ = tick(env, data.cursor)
    assert not [
        e
        for e in data2.asset_events
        if isinstance(e, dg.AssetMaterialization) and e.asset_key == dg.AssetKey(["mirror", "pgbench_branches"])
    ]
    assert any(isinstance(e, dg.AssetCheckEvaluation) for e in data2.asset_events)
