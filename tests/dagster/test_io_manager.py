"""MooncakeDuckDBIOManager: mirror inputs are union reads at the current LSN (read-your-writes), with
projection and partition filters; outputs are DuckDB tables; four in-memory types."""

import threading

import dagster as dg
import duckdb
import pandas as pd
import polars as pl
import psycopg
import pyarrow as pa

from .conftest import tpcb

ACCOUNTS = dg.AssetKey(["mirror", "pgbench_accounts"])


def _rows(table: pa.Table, cols=("aid", "bid", "abalance")) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in cols)))


def test_union_read_is_read_your_writes(mc):
    """Right after a commit (no waiting), a step reading the mirror sees it — with the rows spread over
    persisted files with deletion vectors, staged files with pending deletes and the in-memory buffer."""
    mc.materialize("mirror/pgbench_accounts")
    seen = {}

    @dg.asset(ins={"accounts": dg.AssetIn(key=ACCOUNTS, metadata={"columns": ["aid", "bid", "abalance"]})})
    def probe(context: dg.AssetExecutionContext, accounts: pa.Table) -> None:
        seen["table"] = accounts

    with psycopg.connect(mc.dsn, autocommit=True) as c:
        for step, op in enumerate(["persist", "flush", None, None]):
            c.execute("UPDATE pgbench_accounts SET abalance = abalance + %s WHERE aid %% 7 = %s", (step + 1, step))
            c.execute("INSERT INTO pgbench_accounts VALUES (%s, 1, %s, '')", (10_000 + step, step))
            c.execute("DELETE FROM pgbench_accounts WHERE aid = %s", (100 + step,))
            expected = sorted(c.execute("SELECT aid, bid, abalance FROM pgbench_accounts").fetchall())
            res = mc.run_with_mirrors(probe)  # immediately: the I/O manager waits for the source's LSN
            assert res.success
            assert seen["table"].column_names == ["aid", "bid", "abalance"]  # projection
            assert _rows(seen["table"]) == expected, f"step {step}: union read differs from Postgres"
            if op:
                getattr(mc.replication, op)("pgbench_accounts")
    st = mc.replication.table_status("pgbench_accounts")
    assert st["buffer_rows"] > 0 and st["data_files"] >= 2  # the last reads really were union reads


def test_partition_filter_and_projection(mc):
    """A partitioned asset reading an unpartitioned mirror with ``partition_expr`` gets its partition only."""
    mc.materialize("mirror/pgbench_accounts")
    got = {}

    @dg.asset(
        partitions_def=dg.StaticPartitionsDefinition(["1", "2"]),
        ins={"accounts": dg.AssetIn(key=ACCOUNTS, metadata={"columns": ["aid", "abalance"], "partition_expr": "bid"})},
    )
    def per_branch(context: dg.AssetExecutionContext, accounts: pl.DataFrame) -> None:
        got[context.partition_key] = accounts

    for key in ("1", "2"):
        assert mc.run_with_mirrors(per_branch, partition_key=key).success
    assert got["1"].columns == ["aid", "abalance"]
    ids = {k: sorted(v["aid"].to_list()) for k, v in got.items()}
    assert ids["1"] == list(range(1, 1001)) and ids["2"] == list(range(1001, 2001))


def test_type_handlers_round_trip(mc):
    """Mirror inputs load as pyarrow, pandas, polars and DuckDB relations; each type's output is stored as
    a DuckDB table and read back by a downstream asset through dagster-duckdb's path."""
    mc.materialize("mirror/pgbench_tellers")
    tellers = dg.AssetKey(["mirror", "pgbench_tellers"])
    cols = {"columns": ["tid", "bid", "tbalance"]}
    expected = sorted(mc.pg_rows("SELECT tid, bid, tbalance FROM pgbench_tellers"))

    @dg.asset(key_prefix="t", ins={"m": dg.AssetIn(key=tellers, metadata=cols)})
    def as_arrow(m: pa.Table) -> pa.Table:
        assert isinstance(m, pa.Table)
        return m

    @dg.asset(key_prefix="t", ins={"m": dg.AssetIn(key=tellers, metadata=cols)})
    def as_pandas(m: pd.DataFrame) -> pd.DataFrame:
        assert isinstance(m, pd.DataFrame)
        return m

    @dg.asset(key_prefix="t", ins={"m": dg.AssetIn(key=tellers, metadata=cols)})
    def as_polars(m: pl.DataFrame) -> pl.DataFrame:
        assert isinstance(m, pl.DataFrame)
        return m

    @dg.asset(key_prefix="t", ins={"m": dg.AssetIn(key=tellers, metadata=cols)})
    def as_relation(m: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
        assert isinstance(m, duckdb.DuckDBPyRelation)
        return m.filter("tid > 0")

    back = {}

    @dg.asset(key_prefix="t")
    def read_back(
        as_arrow: pa.Table, as_pandas: pd.DataFrame, as_polars: pl.DataFrame, as_relation: duckdb.DuckDBPyRelation
    ) -> None:
        back.update(
            arrow=as_arrow,
            pandas=pa.Table.from_pandas(as_pandas),
            polars=as_polars.to_arrow(),
            relation=as_relation.to_arrow_table(),
        )

    res = mc.run_with_mirrors(as_arrow, as_pandas, as_polars, as_relation, read_back, tables=["pgbench_tellers"])
    assert res.success
    for kind, table in back.items():
        assert sorted(zip(*(table.column(c).to_pylist() for c in ("tid", "bid", "tbalance")))) == expected, kind
    mats = {e.asset_key.to_user_string(): e.materialization.metadata for e in res.get_asset_materialization_events()}
    assert mats["t/as_pandas"]["dagster/row_count"].value == 20
    assert [c.name for c in mats["t/as_polars"]["dagster/column_schema"].value.columns] == ["tid", "bid", "tbalance"]
    con = duckdb.connect(mc.config.database, read_only=True)
    assert con.execute("SELECT count(*) FROM t.as_relation").fetchone()[0] == 20
    con.close()


def test_demo_assets_consistent_under_load(mc):
    """branch_balances and teller_activity read several mirrors at one LSN while pgbench-style
    transactions commit: every branch's and teller's balance equals its history's deltas."""
    mc.mirror_all()
    stop = threading.Event()

    def load():
        seed = 100
        while not stop.is_set():
            tpcb(mc.dsn, 5, seed=seed)
            seed += 1

    th = threading.Thread(target=load)
    th.start()
    try:
        for _ in range(2):
            res = mc.materialize("analytics/branch_balances", "analytics/teller_activity")
            assert res.success
            meta = {
                e.asset_key.to_user_string(): e.materialization.metadata for e in res.get_asset_materialization_events()
            }
            b, t = meta["analytics/branch_balances"], meta["analytics/teller_activity"]
            assert b["balanced_branches"].value == b["branches"].value == 2
            assert t["balanced_tellers"].value == t["tellers"].value == 20
            assert b["total_account_balance"].value == b["total_branch_balance"].value
            mc.replication.flush("pgbench_history")
    finally:
        stop.set()
        th.join()
    con = duckdb.connect(mc.config.database, read_only=True)
    assert con.execute("SELECT count(*) FROM analytics.teller_activity").fetchone()[0] == 20
    con.close()
