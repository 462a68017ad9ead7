"""`mooncake demo --dagster`: the demo with its maintenance done by materializing the Dagster assets, the
downstream assets read through the I/O manager, the checks, and the same last line as verify."""

import dagster as dg
import pytest

from mooncake_assets.engine.service.process import stop_service

from ..helpers import make_settings, mooncake


@pytest.mark.slow
def test_demo_dagster_end_to_end(pg_dsn, state_dir):
    s = make_settings(state_dir, pg_dsn)
    try:
        r = mooncake(s, "demo", "--dagster", "--seconds", "6", "--clients", "2", timeout=600)
        out = r.stdout
        assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
        assert out.strip().splitlines()[-1].startswith("verified: 4/4 tables match at LSN "), out[-2000:]
        assert out.count(": flush/* (4 tables), 4/4 assets materialized") >= 2
        assert out.count(": deletion_vectors/* (4 tables), 4/4 assets materialized") >= 2
        assert "full optimize (flush → deletion vectors → index merge → compaction), 16/16 assets materialized" in out
        assert "analytics/branch_balances: 1/1 branches balanced" in out
        assert "analytics/teller_activity: 10/10 tellers balanced" in out
        assert out.count(":mirror_matches_source passed") == 4 and out.count(":replication_lag passed") == 4
        assert "FAILED" not in out
        # the runs are recorded in <state>/dagster, the DAGSTER_HOME `mooncake ui` uses
        instance = dg.DagsterInstance.from_config(str(state_dir / "dagster"))
        try:
            assert len(instance.get_runs()) >= 7
            ev = instance.get_latest_materialization_event(dg.AssetKey(["compaction", "pgbench_accounts"]))
            assert ev is not None
        finally:
            instance.dispose()
    finally:
        stop_service(s)
