"""Incremental mirror inputs: a downstream asset gets the change feed since its last successful run, and an
aggregate maintained from it equals the full recompute — across persists, a compaction, a service restart
and a failed run (real Postgres, real service, assets materialized in-process)."""

import threading

import dagster as dg
import duckdb
import psycopg
import pyarrow as pa

from mooncake_assets.dagster.assets.analytics import fold_account_changes
from mooncake_assets.dagster.resources import CURSORS, DELETES, INCREMENTAL, MirrorChanges
from mooncake_assets.engine.service.process import stop_service

from .conftest import tpcb

KEY = "analytics/branch_balances_incremental"
OP = "analytics__branch_balances_incremental"
ACCOUNTS = dg.AssetKey(["mirror", "pgbench_accounts"])
BRANCHES = dg.AssetKey(["mirror", "pgbench_branches"])


def _meta(res, key: str) -> dict:
    return {
        k: v.value
        for e in res.get_asset_materialization_events()
        if e.asset_key.to_user_string() == key
        for k, v in e.materialization.metadata.items()
    }


def _pg_balances(mc) -> list[tuple]:
    return [
        tuple(map(int, r))
        for r in mc.pg_rows("SELECT bid, count(*), sum(abalance) FROM pgbench_accounts GROUP BY bid ORDER BY bid")
    ]


def _stored(mc, table: str = "analytics.branch_balances_incremental") -> list[tuple]:
    con = duckdb.connect(mc.config.database, read_only=True)
    try:
        return [
            tuple(map(int, r))
            for r in con.execute(f"SELECT bid, accounts, balance FROM {table} ORDER BY bid").fetchall()
        ]
    finally:
        con.close()


def _cursor(mc, op: str = OP, input_name: str = "accounts") -> str | None:
    con = duckdb.connect(mc.config.database, read_only=True)
    try:
        row = con.execute(f"SELECT lsn FROM {CURSORS} WHERE op = ? AND input = ?", [op, input_name]).fetchone()
        return row[0] if row else None
    finally:
        con.close()


def _persisted(mc) -> None:
    """Everything committed in Postgres so far applied and persisted."""
    mc.union_barrier()
    mc.replication.persist("pgbench_accounts")


def _run(mc, results: list | None = None) -> dict:
    """Materialize the incremental asset with its check; both succeed; returns its metadata (and
    appends the run's result to ``results``)."""
    res = mc.materialize(KEY, checks=True)
    assert res.success
    if results is not None:
        results.append(res)
    checks = res.get_asset_check_evaluations()
    assert [c.check_name for c in checks] == ["matches_full_recompute"]
    assert all(c.passed for c in checks), [c.metadata for c in checks]
    return _meta(res, KEY)


def _accounts_churn(mc, seed: int) -> None:
    """New accounts and closed ones (the per-branch count changes too), besides balance updates."""
    with psycopg.connect(mc.dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO pgbench_accounts VALUES (%s, 2, %s, ''), (%s, 1, 5, '')", (5000 + seed, seed, 6000 + seed)
        )
        c.execute("DELETE FROM pgbench_accounts WHERE aid = %s", (seed * 7,))


def test_incremental_aggregate_equals_full_recompute(mc):
    mc.materialize("mirror/pgbench_accounts")
    _persisted(mc)
    first = _run(mc)
    assert first["full_read"] is True and first["mooncake/since"] == "" and first["changed_rows"] == 2000
    assert _stored(mc) == _pg_balances(mc)
    assert _cursor(mc) == first["mooncake/lsn"]

    # a pgbench-style workload, persisted between the two materializations: only the changes are read
    tpcb(mc.dsn, 40, seed=1)
    _accounts_churn(mc, 1)
    _persisted(mc)
    runs: list = []
    second = _run(mc, runs)
    assert second["full_read"] is False and second["mooncake/since"] == first["mooncake/lsn"]
    assert 0 < second["changed_rows"] <= 2 * 40 + 3
    # pgbench_accounts has the default replica identity: the updated rows' old values were read back
    # from the data files, and the run's log says so and what would avoid it
    read_back = [
        e.asset_observation_data.asset_observation.metadata["mooncake/deleted_rows_read"].value
        for e in runs[0].all_events
        if e.event_type_value == "ASSET_OBSERVATION"
        and "mooncake/deleted_rows_read" in e.asset_observation_data.asset_observation.metadata
    ]
    assert read_back and read_back[0] > 0, read_back
    logs = [r.user_message for r in mc.instance.all_logs(runs[0].run_id)]
    assert any(
        "deleted rows of pgbench_accounts were read back from its data files" in m
        and "ALTER TABLE public.pgbench_accounts REPLICA IDENTITY FULL" in m
        and 'input metadata "mooncake/deletes": "keys"' in m
        for m in logs
    ), [m for m in logs if "note" in m]
    assert _stored(mc) == _pg_balances(mc)

    # changes not persisted yet are not read; the run is empty and keeps its result
    tpcb(mc.dsn, 10, seed=2)
    mc.union_barrier()
    third = _run(mc)
    assert third["mooncake/since"] == third["mooncake/lsn"] == second["mooncake/lsn"] and third["changed_rows"] == 0
    _persisted(mc)
    assert _run(mc)["changed_rows"] > 0
    assert _stored(mc) == _pg_balances(mc)

    # a full compaction between two materializations: rewritten rows cancel, the result stays exact
    before = _cursor(mc)
    for seed in (3, 4):
        tpcb(mc.dsn, 20, seed=seed)
        _persisted(mc)
    comp = mc.replication.compact("pgbench_accounts", full=True)
    assert comp["compacted"] and comp["files_in"] >= 2, comp  # the range below spans a real rewrite
    tpcb(mc.dsn, 15, seed=5)
    _accounts_churn(mc, 5)
    _persisted(mc)
    after = _run(mc)
    assert after["mooncake/since"] == before and after["changed_rows"] <= 2 * 55 + 3
    assert _stored(mc) == _pg_balances(mc)

    # a service restart (changes committed while it is down are replayed from the slot)
    before = _cursor(mc)
    tpcb(mc.dsn, 10, seed=6)
    _persisted(mc)
    stop_service(mc.settings)
    tpcb(mc.dsn, 10, seed=7)
    _accounts_churn(mc, 7)
    mc.replication.ensure_running()
    _persisted(mc)
    restarted = _run(mc)
    assert restarted["mooncake/since"] == before and restarted["full_read"] is False
    assert _stored(mc) == _pg_balances(mc)


def test_failed_materialization_does_not_advance_cursor(mc):
    mc.materialize("mirror/pgbench_accounts")
    _persisted(mc)
    seen: list[MirrorChanges] = []
    fail = {"now": False}

    @dg.asset(
        key=["t", "balances"],
        ins={
            "accounts": dg.AssetIn(key=ACCOUNTS, metadata={INCREMENTAL: True, "columns": ["bid", "abalance", "filler"]})
        },
    )
    def balances(accounts: MirrorChanges) -> pa.Table:
        seen.append(accounts)
        assert accounts.rows.column_names == ["bid", "abalance", "filler", "_change", "_commit_lsn"]
        if fail["now"]:
            raise RuntimeError("the asset fails after reading its changes")
        return fold_account_changes(accounts.previous, accounts.rows)

    assert mc.run_with_mirrors(balances, tables=["pgbench_accounts"]).success
    start = _cursor(mc, "t__balances")
    assert seen[-1].full and seen[-1].until == start

    tpcb(mc.dsn, 30, seed=11)
    _persisted(mc)
    fail["now"] = True
    res = mc.run_with_mirrors(balances, tables=["pgbench_accounts"], raise_on_error=False)
    assert not res.success
    failed = seen[-1]
    assert failed.since == start and failed.until != start and failed.rows.num_rows > 0
    assert _cursor(mc, "t__balances") == start  # not advanced
    assert _stored(mc, "t.balances") != _pg_balances(mc)  # the stored result is the first run's

    tpcb(mc.dsn, 10, seed=12)
    _persisted(mc)
    fail["now"] = False
    assert mc.run_with_mirrors(balances, tables=["pgbench_accounts"]).success
    again = seen[-1]
    assert again.since == start and again.previous is not None  # the same changes again, and the later ones
    assert [(f.name, f.type) for f in seen[0].rows.schema] == [(f.name, f.type) for f in again.rows.schema]
    assert _cursor(mc, "t__balances") == again.until
    assert _stored(mc, "t.balances") == _pg_balances(mc)


def test_incremental_inputs_of_one_step_end_at_one_lsn(mc):
    """Two incremental inputs of one step end at one consistent cut: with pgbench transactions committing
    meanwhile, the total of the accounts' balances still equals the total of the branches' balances."""
    mc.materialize("mirror/pgbench_accounts", "mirror/pgbench_branches")
    seen = []

    def total(prev: int, ch: MirrorChanges, col: str) -> int:
        ins, dels = ch.inserts.column(col).to_pylist(), ch.deletes.column(col).to_pylist()
        return prev + sum(ins) - sum(dels)

    @dg.asset(
        key=["t", "totals"],
        ins={
            "accounts": dg.AssetIn(key=ACCOUNTS, metadata={INCREMENTAL: True, "columns": ["abalance"]}),
            "branches": dg.AssetIn(key=BRANCHES, metadata={"columns": ["bbalance"]}),
        },
    )
    def totals(accounts: MirrorChanges, branches: MirrorChanges) -> pa.Table:  # typed: incremental too
        assert accounts.until == branches.until
        prev = accounts.previous.to_pylist()[0] if accounts.previous is not None else {"a": 0, "b": 0}
        a, b = total(prev["a"], accounts, "abalance"), total(prev["b"], branches, "bbalance")
        seen.append((accounts, branches, a, b))
        return pa.table({"a": [a], "b": [b]})

    stop = threading.Event()

    def load():
        seed = 200
        while not stop.is_set():
            tpcb(mc.dsn, 3, seed=seed)
            seed += 1

    th = threading.Thread(target=load)
    th.start()
    try:
        for _ in range(3):
            res = mc.run_with_mirrors(totals, tables=["pgbench_accounts", "pgbench_branches"])
            assert res.success
            accounts, branches, a, b = seen[-1]
            assert a == b, (accounts.until, a, b)
    finally:
        stop.set()
        th.join()
    assert seen[0][0].full and not seen[-1][0].full and seen[-1][0].since == seen[-2][0].until
    assert seen[-1][0].rows.num_rows < 2000  # the last run read changes only


def test_lost_history_or_output_means_a_full_read(mc):
    """When the cursor's history is gone (the mirror was dropped and created again) or the stored output is
    gone, the next run reads the whole table again, and its result is still exact; a partitioned asset
    cannot have an incremental input."""
    mc.materialize("mirror/pgbench_accounts")
    _persisted(mc)
    assert _run(mc)["full_read"] is True
    tpcb(mc.dsn, 20, seed=31)
    mc.union_barrier()
    mc.replication.drop_table("pgbench_accounts")
    mc.replication.create_table("pgbench_accounts")
    _persisted(mc)
    again = _run(mc)  # the feed refuses the old cursor ("no changes before …"): a full read
    assert again["full_read"] is True and again["changed_rows"] == 2000
    assert _stored(mc) == _pg_balances(mc)

    con = duckdb.connect(mc.config.database)
    con.execute("DROP TABLE analytics.branch_balances_incremental")
    con.close()
    tpcb(mc.dsn, 5, seed=32)
    _persisted(mc)
    assert _run(mc)["full_read"] is True
    assert _stored(mc) == _pg_balances(mc)

    @dg.asset(
        partitions_def=dg.StaticPartitionsDefinition(["1", "2"]),
        ins={"accounts": dg.AssetIn(key=ACCOUNTS, metadata={INCREMENTAL: True})},
    )
    def per_branch(accounts: MirrorChanges) -> None:
        pass

    res = mc.run_with_mirrors(per_branch, tables=["pgbench_accounts"], partition_key="1", raise_on_error=False)
    assert not res.success
    errors = [e.event_specific_data.error.to_string() for e in res.all_events if e.is_step_failure]
    assert any("a partitioned asset cannot have one" in m for m in errors), errors


def test_deletes_as_keys_input_folds_by_key(mc):
    """Input metadata ``mooncake/deletes: keys``: the feed's deletes carry only the key (other columns
    null); an asset that folds them by key keeps (aid, abalance) equal to Postgres across updates,
    deletes and inserts."""
    mc.materialize("mirror/pgbench_accounts")
    _persisted(mc)
    seen: list[MirrorChanges] = []

    @dg.asset(
        key=["t", "by_key"],
        ins={
            "accounts": dg.AssetIn(
                key=ACCOUNTS, metadata={INCREMENTAL: True, DELETES: "keys", "columns": ["aid", "abalance"]}
            )
        },
    )
    def by_key(accounts: MirrorChanges) -> pa.Table:
        seen.append(accounts)
        rows = accounts.rows.to_pylist()
        state = {} if accounts.previous is None else dict(zip(*accounts.previous.to_pydict().values()))
        for r in rows:  # deletes come before a key's insert
            if r["_change"] == "delete":
                del state[r["aid"]]
        state.update((r["aid"], r["abalance"]) for r in rows if r["_change"] == "insert")
        return pa.table({"aid": list(state), "abalance": list(state.values())})

    assert mc.run_with_mirrors(by_key, tables=["pgbench_accounts"]).success
    tpcb(mc.dsn, 30, seed=41)
    _accounts_churn(mc, 41)
    _persisted(mc)
    assert mc.run_with_mirrors(by_key, tables=["pgbench_accounts"]).success
    got = seen[-1]
    assert not got.full and got.previous is not None
    dels = [r for r in got.rows.to_pylist() if r["_change"] == "delete"]
    assert len(dels) >= 31 and all(r["abalance"] is None and r["aid"] is not None for r in dels)
    _, full = mc.replication.changes("pgbench_accounts", got.since, got.until)
    full_dels = {r["aid"] for r in full.to_pylist() if r["_change"] == "delete"}
    extra = {r["aid"] for r in dels} - full_dels  # only an UPDATE that left the row as it was (seeded: none)
    assert full_dels <= {r["aid"] for r in dels} and len(dels) == len(full_dels) + len(extra)
    assert extra <= {r["aid"] for r in got.rows.to_pylist() if r["_change"] == "insert"}
    con = duckdb.connect(mc.config.database, read_only=True)
    try:
        stored = sorted(con.execute("SELECT aid, abalance FROM t.by_key").fetchall())
    finally:
        con.close()
    assert stored == sorted(tuple(r) for r in mc.pg_rows("SELECT aid, abalance FROM pgbench_accounts"))
