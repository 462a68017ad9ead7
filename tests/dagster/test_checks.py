"""The mirror assets' checks: mirror_matches_source and replication_lag pass when they should and fail
when they should, evaluated by Dagster (check-only runs)."""

import dagster as dg
import psycopg

from mooncake_assets.engine.service.process import stop_service

from .conftest import tpcb

ACCOUNTS = dg.AssetKey(["mirror", "pgbench_accounts"])


def run_check(env, name: str) -> dg.AssetCheckEvaluation:
    """Execute one check of mirror/pgbench_accounts (not the asset) in a Dagster run."""
    key = dg.AssetCheckKey(ACCOUNTS, name)
    res = dg.materialize(
        [env.defs.get_assets_def(ACCOUNTS), *env.defs.asset_checks],
        selection=dg.AssetSelection.checks(key),
        resources=env.defs.resources,
        instance=env.instance,
    )
    assert res.success
    (ev,) = [e for e in res.get_asset_check_evaluations() if e.asset_check_key == key]
    assert not res.get_asset_materialization_events()  # only the check ran
    return ev


def test_mirror_matches_source_passes_then_catches_lost_changes(mc):
    """It passes on a live mirror under writes; it fails, naming the rows, when changes were lost: the
    service was stopped, rows changed, and the replication slot was dropped meanwhile (as an operator or
    ``max_slot_wal_keep_size`` would), so the restarted service streams from a new slot."""
    mc.materialize("mirror/pgbench_accounts")
    tpcb(mc.dsn, 30)
    ev = run_check(mc, "mirror_matches_source")
    assert ev.passed, ev.description
    assert ev.metadata["source_rows"].value == ev.metadata["mirror_rows"].value == 2000

    slot = mc.replication.status()["slot"]
    mc.materialize("deletion_vectors/pgbench_accounts")  # durable up to here; what follows is lost
    stop_service(mc.settings)
    with psycopg.connect(mc.dsn, autocommit=True) as c:
        c.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= 25")
        c.execute("DELETE FROM pgbench_accounts WHERE aid > 1990")
        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    ev = run_check(mc, "mirror_matches_source")  # the check starts the service again
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
    assert ev.metadata["source_rows"].value == 1990 and ev.metadata["mirror_rows"].value == 2000
    assert ev.metadata["missing_rows"].value == 25 and ev.metadata["extra_rows"].value == 35
    assert "MISMATCH" in ev.description


def test_replication_lag_passes_warns_and_fails(mc):
    mc.materialize("mirror/pgbench_accounts")
    tpcb(mc.dsn, 10)
    ev = run_check(mc, "replication_lag")
    assert ev.passed, ev.description
    assert ev.metadata["lag_bytes"].value < 16 << 20 and ev.metadata["basis"].value == "applied"

    stop_service(mc.settings)  # nobody applies changes now: the lag is measured from the slot's durable LSN
    ev = run_check(mc, "replication_lag")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.WARN, ev.description
    assert "not answering" in ev.metadata["basis"].value

    with psycopg.connect(mc.dsn, autocommit=True) as c:
        c.execute("UPDATE pgbench_accounts SET filler = repeat('x', 84)")  # ~ 2000 rows of WAL
    strict = mc.rebuild(lag_warn_bytes=1_000, lag_fail_bytes=50_000)
    ev = run_check(strict, "replication_lag")
    assert not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR, ev.description
    assert ev.metadata["lag_bytes"].value > 50_000
