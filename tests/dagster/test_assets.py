"""The mirror and maintenance assets, materialized with Dagster against the real service and Postgres."""

import psycopg
import pytest

from mooncake_assets.verify import verify

from .conftest import tpcb


def _meta(res, key: str) -> dict:
    for e in res.get_asset_materialization_events():
        if e.asset_key.to_user_string() == key:
            return {k: v.value for k, v in e.materialization.metadata.items()}
    raise AssertionError(f"{key} was not materialized")


def _matches(mc, reader="union", names=("pgbench_accounts",)) -> str:
    results, lsn = verify(mc.settings, list(names), reader, mc.replication.client() if reader == "union" else None)
    assert all(r.match for r in results), [r.line() for r in results]
    return lsn


def _skip_if_missing(res, what: str):
    if res.success:
        return
    msgs = [ev.step_failure_data.error.message for ev in res.all_events if ev.is_step_failure]
    if any("has no attribute" in m or "unknown maintenance" in m or "unknown action" in m for m in msgs):
        pytest.skip(f"the service does not implement {what} yet: {msgs[0].strip()[:200]}")
    raise AssertionError(f"{what} failed: {msgs}")


def test_mirror_asset_creates_the_mirror(mc):
    """mirror/<t> starts the service, copies the table, and reports rows, LSNs and the column schema; its
    checks pass; a second materialization does not copy again."""
    res = mc.materialize("mirror/pgbench_accounts", "mirror/pgbench_history", checks=True)
    acc = _meta(res, "mirror/pgbench_accounts")
    assert acc["initial_copy/rows"] == 2000 and acc["dagster/row_count"] == 2000
    assert acc["service"].startswith("started")
    cols = [(c.name, c.type) for c in acc["dagster/column_schema"].columns]
    assert cols == [("aid", "integer"), ("bid", "integer"), ("abalance", "integer"), ("filler", "character(84)")]
    assert "primary key" in acc["dagster/column_schema"].columns[0].constraints.other
    hist = _meta(res, "mirror/pgbench_history")
    assert hist["initial_copy/replica_identity"] == "f"  # no primary key: the whole row is the key
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in res.get_asset_check_evaluations()}
    assert checks == {
        (t, c): True
        for t in ("pgbench_accounts", "pgbench_history")
        for c in ("mirror_matches_source", "replication_lag")
    }
    tpcb(mc.dsn, 10)
    again = _meta(mc.materialize("mirror/pgbench_accounts"), "mirror/pgbench_accounts")
    assert not any(k.startswith("initial_copy/") for k in again) and "service" not in again
    assert again["buffer_rows"] == 10 and again["pending_deletes"] == 10  # the updates are in, as of the source's LSN


def test_flush_and_deletion_vectors_assets(mc):
    mc.materialize("mirror/pgbench_accounts")
    tpcb(mc.dsn, 40)
    with psycopg.connect(mc.dsn, autocommit=True) as c:
        c.execute("DELETE FROM pgbench_accounts WHERE aid BETWEEN 1 AND 50")
        end = str(c.execute("SELECT pg_current_wal_lsn()").fetchone()[0])
    mc.replication.wait_lsn(end)  # the buffer as the flush will find it (the stream applies in batches)
    before = mc.replication.table_status("pgbench_accounts")
    flush = _meta(mc.materialize("flush/pgbench_accounts"), "flush/pgbench_accounts")
    assert flush["rows"] == before["buffer_rows"] > 0 and flush["files"] == 1 and flush["bytes"] > 0
    assert "| staged |" in flush["data_files_table"] and flush["duration_s"] >= 0
    assert mc.replication.table_status("pgbench_accounts")["buffer_rows"] == 0
    _matches(mc)

    dv = _meta(mc.materialize("deletion_vectors/pgbench_accounts"), "deletion_vectors/pgbench_accounts")
    assert dv["files"] == 1 and dv["deletion_vectors"] >= 1 and dv["pending_deletes_before"] >= 50
    assert dv["flush_lsn"] == dv["lsn"] and dv["flush_lsn"] != before["flush_lsn"]
    assert "| staged |" not in dv["data_files_table"] and "| iceberg |" in dv["data_files_table"]
    after = mc.replication.table_status("pgbench_accounts")
    assert after["pending_deletes"] == 0 and after["buffer_rows"] == 0
    _matches(mc, reader="pyiceberg")  # the commit is a real Iceberg snapshot with Puffin deletion vectors


def test_index_merge_and_compaction_assets(mc):
    mc.materialize("mirror/pgbench_accounts")
    for i in range(4):  # four flush+persist rounds: 5 index blocks, 5 files, deletes spread over them
        tpcb(mc.dsn, 25, seed=i)
        assert mc.materialize("flush/pgbench_accounts", "deletion_vectors/pgbench_accounts").success
    st = mc.replication.table_status("pgbench_accounts")
    assert st["index_blocks"] == 5 and st["data_files"] == 5

    res = mc.materialize(
        "index_merge/pgbench_accounts",
        raise_on_error=False,
        run_config={"ops": {"index_merge__pgbench_accounts": {"config": {"full": True}}}},
    )
    _skip_if_missing(res, "merge_index")
    merge = _meta(res, "index_merge/pgbench_accounts")
    assert merge["index_blocks_before"] == 5 and merge["index_blocks"] == 1
    _matches(mc)

    res = mc.materialize(
        "compaction/pgbench_accounts",
        raise_on_error=False,
        run_config={"ops": {"compaction__pgbench_accounts": {"config": {"full": True}}}},
    )
    _skip_if_missing(res, "compact")
    comp = _meta(res, "compaction/pgbench_accounts")
    assert comp["data_files_before"] == 5 and comp["data_files"] < 5 and comp["deleted_rows_before"] > 0
    assert comp["rows"] == 2000 and "| iceberg |" in comp["data_files_table"]
    tpcb(mc.dsn, 10, seed=99)  # keeps replicating onto the compacted files
    _matches(mc)
    mc.replication.persist("pgbench_accounts")
    _matches(mc, reader="pyiceberg")


def test_maintenance_of_an_unmirrored_table_fails_clearly(mc):
    res = mc.materialize("flush/pgbench_tellers", raise_on_error=False)
    assert not res.success
    msg = [ev.step_failure_data.error.message for ev in res.all_events if ev.is_step_failure][0]
    assert "materialize mirror/pgbench_tellers first" in msg
