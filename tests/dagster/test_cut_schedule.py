"""A schedule that takes a consistent cut, and a run whose mirror inputs are all read at it: two assets
in separate steps read two mirrors while the source keeps changing between them, and both see Postgres
at the cut's LSN (pgbench's invariant: the accounts' total equals the tellers' total)."""

import dagster as dg
import psycopg
import pyarrow as pa
import pytest

from mooncake_assets.dagster.jobs.cuts import build_cut_schedule
from mooncake_assets.dagster.resources.io_manager import CUT_TAG

from .conftest import tpcb

ACCOUNTS = dg.AssetKey(["mirror", "pgbench_accounts"])
TELLERS = dg.AssetKey(["mirror", "pgbench_tellers"])


def _pg_totals(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as c:
        return c.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(tbalance) FROM pgbench_tellers)"
        ).fetchone()


def _assets(dsn: str, seen: dict):
    @dg.asset(ins={"accounts": dg.AssetIn(key=ACCOUNTS, metadata={"columns": ["abalance"]})})
    def account_total(accounts: pa.Table) -> None:
        seen["accounts"] = sum(accounts.column("abalance").to_pylist())
        tpcb(dsn, 10, seed=len(seen) + 7)  # the source moves on before the next step reads

    @dg.asset(deps=[account_total], ins={"tellers": dg.AssetIn(key=TELLERS, metadata={"columns": ["tbalance"]})})
    def teller_total(tellers: pa.Table) -> None:
        seen["tellers"] = sum(tellers.column("tbalance").to_pylist())

    return account_total, teller_total


def test_schedule_cut_pins_every_step_of_the_run(mc):
    mc.materialize("mirror/pgbench_accounts", "mirror/pgbench_tellers")
    tpcb(mc.dsn, 20)
    seen: dict = {}
    assets = _assets(mc.dsn, seen)
    job = dg.define_asset_job("totals", selection=[a.key for a in assets])
    schedule = build_cut_schedule(job, "0 * * * *")
    with dg.build_schedule_context(instance=mc.instance, resources={"replication": mc.replication}) as ctx:
        req = schedule(ctx)
    if not isinstance(req, dg.RunRequest):
        req = next(iter(req))
    at_cut = _pg_totals(mc.dsn)  # nothing written since the cut was taken
    tag = req.tags[CUT_TAG]
    assert tag.startswith("lsn-") and req.run_key == tag

    res = mc.run_with_mirrors(*assets, tables=["pgbench_accounts", "pgbench_tellers"], tags=req.tags)
    assert res.success
    assert (seen["accounts"], seen["tellers"]) == at_cut  # both steps at the cut, though writes came between
    assert _pg_totals(mc.dsn) != at_cut  # the source did change between the steps

    # without the tag each step reads the current LSN: the second step sees the writes the first made
    seen.clear()
    assert mc.run_with_mirrors(*assets, tables=["pgbench_accounts", "pgbench_tellers"]).success
    assert seen["accounts"] != seen["tellers"]


def test_a_bad_cut_tag_is_refused(mc):
    mc.materialize("mirror/pgbench_accounts")
    seen: dict = {}

    @dg.asset(ins={"accounts": dg.AssetIn(key=ACCOUNTS)})
    def probe(accounts: pa.Table) -> None:
        seen["n"] = accounts.num_rows

    with pytest.raises(Exception, match="is not a cut"):
        mc.run_with_mirrors(probe, tables=["pgbench_accounts"], tags={CUT_TAG: "yesterday"})
    with pytest.raises(Exception, match="no retained snapshot"):
        mc.run_with_mirrors(probe, tables=["pgbench_accounts"], tags={CUT_TAG: "lsn-0-1"})
    assert "n" not in seen
