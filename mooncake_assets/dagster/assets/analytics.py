"""The demo's downstream assets, built from the pgbench mirrors through ``MooncakeDuckDBIOManager``.

Every input is a union read of a mirror (projected to the columns it needs); the inputs of one step are
read at the same LSN, so the pgbench invariants hold exactly in the results even while pgbench runs:
a branch's balance equals the sum of its history deltas, and so does a teller's.

- ``analytics/branch_balances`` (pandas → DuckDB table ``analytics.branch_balances``): per branch, its
  accounts and their balance, the branch balance and the sum of its history deltas.
- ``analytics/teller_activity`` (polars → ``analytics.teller_activity``): per teller, transactions,
  sum of deltas, last transaction time, and its balance.
"""

import dagster as dg
import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa

from .factory import mirror_key

PGBENCH = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@dg.asset(
    key=["analytics", "branch_balances"],
    group_name="analytics",
    kinds={"duckdb", "pandas"},
    ins={
        "accounts": dg.AssetIn(key=mirror_key("pgbench_accounts"), metadata={"columns": ["bid", "abalance"]}),
        "branches": dg.AssetIn(key=mirror_key("pgbench_branches"), metadata={"columns": ["bid", "bbalance"]}),
        "history": dg.AssetIn(key=mirror_key("pgbench_history"), metadata={"columns": ["bid", "delta"]}),
    },
    description="Per branch: accounts and their balance, branch balance, and the sum of its history deltas "
    "(equal to the branch balance when the mirrors are read at one LSN).",
)
def branch_balances(
    context: dg.AssetExecutionContext, accounts: duckdb.DuckDBPyRelation, branches: pd.DataFrame, history: pa.Table
) -> pd.DataFrame:
    con = duckdb.connect()
    con.register("accounts", accounts.to_arrow_table())
    con.register("branches", branches)
    con.register("history", history)
    df = con.execute("""
        SELECT b.bid,
               coalesce(a.accounts, 0)::BIGINT        AS accounts,
               coalesce(a.account_balance, 0)::BIGINT AS account_balance,
               b.bbalance::BIGINT                     AS branch_balance,
               coalesce(h.history_delta, 0)::BIGINT   AS history_delta,
               b.bbalance = coalesce(h.history_delta, 0) AS balanced
        FROM branches b
        LEFT JOIN (SELECT bid, count(*) AS accounts, sum(abalance) AS account_balance FROM accounts GROUP BY bid) a USING (bid)
        LEFT JOIN (SELECT bid, sum(delta) AS history_delta FROM history GROUP BY bid) h USING (bid)
        ORDER BY b.bid""").df()
    context.add_output_metadata(
        {
            "branches": len(df),
            "balanced_branches": int(df["balanced"].sum()),
            "total_account_balance": int(df["account_balance"].sum()),
            "total_branch_balance": int(df["branch_balance"].sum()),
            "preview": dg.MetadataValue.md(_markdown(df.head(10))),
        }
    )
    return df


@dg.asset(
    key=["analytics", "teller_activity"],
    group_name="analytics",
    kinds={"duckdb", "polars"},
    ins={
        "tellers": dg.AssetIn(key=mirror_key("pgbench_tellers"), metadata={"columns": ["tid", "bid", "tbalance"]}),
        "history": dg.AssetIn(key=mirror_key("pgbench_history"), metadata={"columns": ["tid", "delta", "mtime"]}),
    },
    description="Per teller: transactions, sum of deltas, last transaction time and balance (balanced when "
    "the teller's balance equals its history's deltas).",
)
def teller_activity(context: dg.AssetExecutionContext, tellers: pl.DataFrame, history: pl.DataFrame) -> pl.DataFrame:
    per_teller = history.group_by("tid").agg(
        pl.len().alias("transactions"),
        pl.col("delta").sum().alias("delta_sum"),
        pl.col("mtime").max().alias("last_transaction"),
    )
    df = (
        tellers.join(per_teller, on="tid", how="left")
        .with_columns(
            pl.col("transactions").fill_null(0).cast(pl.Int64), pl.col("delta_sum").fill_null(0).cast(pl.Int64)
        )
        .with_columns((pl.col("tbalance") == pl.col("delta_sum")).alias("balanced"))
        .sort("tid")
    )
    context.add_output_metadata(
        {
            "tellers": df.height,
            "balanced_tellers": int(df["balanced"].sum()),
            "transactions": int(df["transactions"].sum()),
        }
    )
    return df


def _markdown(df: pd.DataFrame) -> str:
    rows = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    rows += ["| " + " | ".join(map(str, r)) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def analytics_assets(table_names) -> list[dg.AssetsDefinition]:
    """The demo's downstream assets whose mirrors are all configured."""
    names = set(table_names)
    out = []
    if {"pgbench_accounts", "pgbench_branches", "pgbench_history"} <= names:
        out.append(branch_balances)
    if {"pgbench_tellers", "pgbench_history"} <= names:
        out.append(teller_activity)
    return out
