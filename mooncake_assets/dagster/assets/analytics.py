"""The demo's downstream assets, built from the pgbench mirrors through ``MooncakeDuckDBIOManager``.

Every input is a union read of a mirror (projected to the columns it needs); the inputs of one step are
read at the same LSN, so the pgbench invariants hold exactly in the results even while pgbench runs:
a branch's balance equals the sum of its history deltas, and so does a teller's.

- ``analytics/branch_balances`` (pandas → DuckDB table ``analytics.branch_balances``): per branch, its
  accounts and their balance, the branch balance and the sum of its history deltas.
- ``analytics/teller_activity`` (polars → ``analytics.teller_activity``): per teller, transactions,
  sum of deltas, last transaction time, and its balance.
- ``analytics/branch_balances_incremental`` (pyarrow → ``analytics.branch_balances_incremental``):
  per branch its accounts and their balance, maintained **incrementally** from the change feed of
  ``pgbench_accounts`` (an incremental input, ``resources/incremental.py``): each run adds the changes
  since the previous run to the previous result. Its check ``matches_full_recompute`` recomputes
  the same aggregate from the whole mirror read at the LSN the run reached and fails on any
  difference.
"""

import dagster as dg
import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa

from ..resources.incremental import INCREMENTAL, MirrorChanges
from ..resources.replication import ReplicationResource
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


INCREMENTAL_BALANCES = dg.AssetKey(["analytics", "branch_balances_incremental"])
_BALANCE_SCHEMA = pa.schema([("bid", pa.int64()), ("accounts", pa.int64()), ("balance", pa.int64())])


def account_balances(accounts: pa.Table) -> pa.Table:
    """The full recompute: per ``bid`` of ``accounts`` (columns ``bid``, ``abalance``) the number of
    accounts and the sum of their balances, ordered by ``bid`` (schema :data:`_BALANCE_SCHEMA`)."""
    con = duckdb.connect()
    con.register("accounts", accounts)
    return con.execute(
        "SELECT bid::BIGINT AS bid, count(*)::BIGINT AS accounts, sum(abalance)::BIGINT AS balance "
        "FROM accounts GROUP BY bid ORDER BY bid"
    ).to_arrow_table()


def fold_account_changes(previous: pa.Table | None, rows: pa.Table) -> pa.Table:
    """``previous`` (the :func:`account_balances` of the table at the feed's ``since``; None: empty)
    with the change feed ``rows`` (``bid``, ``abalance``, ``_change``) applied: an ``insert`` adds an
    account and its balance to its branch, a ``delete`` takes them away; branches left without
    accounts are dropped. Equals :func:`account_balances` of the table at the feed's ``until``."""
    con = duckdb.connect()
    con.register("prev", previous if previous is not None else _BALANCE_SCHEMA.empty_table())
    con.register("feed", rows)
    return con.execute("""
        SELECT bid, accounts, balance FROM (
            SELECT coalesce(p.bid, d.bid)::BIGINT                        AS bid,
                   (coalesce(p.accounts, 0) + coalesce(d.accounts, 0))::BIGINT AS accounts,
                   (coalesce(p.balance, 0) + coalesce(d.balance, 0))::BIGINT   AS balance
            FROM prev p
            FULL OUTER JOIN (
                SELECT bid::BIGINT AS bid,
                       sum(CASE WHEN _change = 'insert' THEN 1 ELSE -1 END) AS accounts,
                       sum(CASE WHEN _change = 'insert' THEN abalance ELSE -abalance END) AS balance
                FROM feed GROUP BY bid) d ON p.bid = d.bid)
        WHERE accounts <> 0
        ORDER BY bid""").to_arrow_table()


@dg.asset(
    key=INCREMENTAL_BALANCES,
    group_name="analytics",
    kinds={"duckdb", "pyarrow"},
    ins={
        "accounts": dg.AssetIn(
            key=mirror_key("pgbench_accounts"), metadata={INCREMENTAL: True, "columns": ["bid", "abalance"]}
        )
    },
    description="Per branch: accounts and their balance, maintained incrementally from the change feed of "
    "pgbench_accounts (each run reads only the rows persisted since the previous run).",
)
def branch_balances_incremental(context: dg.AssetExecutionContext, accounts: MirrorChanges) -> pa.Table:
    out = fold_account_changes(accounts.previous, accounts.rows)
    context.add_output_metadata(
        {
            "mooncake/lsn": accounts.until,
            "mooncake/since": accounts.since or "",
            "full_read": accounts.full,
            "changed_rows": accounts.rows.num_rows,
            "branches": out.num_rows,
            "total_balance": int(sum(v or 0 for v in out.column("balance").to_pylist())),
        }
    )
    return out


@dg.asset_check(
    asset=INCREMENTAL_BALANCES,
    name="matches_full_recompute",
    description="The incremental result equals the aggregate recomputed from the whole mirror at the LSN "
    "the incremental run reached.",
    required_resource_keys={"replication"},
)
def matches_full_recompute(context: dg.AssetCheckExecutionContext, branch_balances_incremental: pa.Table):
    from ..resources.incremental import read_mirror_at

    replication: ReplicationResource = context.resources.replication
    event = context.instance.get_latest_materialization_event(INCREMENTAL_BALANCES)
    meta = event.asset_materialization.metadata if event and event.asset_materialization else {}
    lsn = meta["mooncake/lsn"].value if "mooncake/lsn" in meta else None
    if not lsn:
        return dg.AssetCheckResult(passed=False, description="the materialization records no mooncake/lsn")
    try:
        full = account_balances(read_mirror_at(replication, "pgbench_accounts", str(lsn), ["bid", "abalance"]))
    except LookupError as e:  # the snapshot at that LSN expired since
        return dg.AssetCheckResult(passed=False, description=f"cannot recompute at LSN {lsn}: {e}")
    got = sorted(branch_balances_incremental.cast(_BALANCE_SCHEMA).to_pylist(), key=lambda r: r["bid"])
    want = sorted(full.cast(_BALANCE_SCHEMA).to_pylist(), key=lambda r: r["bid"])
    differ = [r["bid"] for r in got if r not in want] + [r["bid"] for r in want if r not in got]
    return dg.AssetCheckResult(
        passed=not differ,
        metadata={
            "lsn": dg.MetadataValue.text(str(lsn)),
            "branches": len(want),
            "differing_branches": dg.MetadataValue.text(", ".join(map(str, sorted(set(differ)))) or "none"),
        },
    )


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
    if "pgbench_accounts" in names:
        out.append(branch_balances_incremental)
    return out


def analytics_checks(table_names) -> list[dg.AssetChecksDefinition]:
    """The asset checks of :func:`analytics_assets`' assets for the same tables."""
    return [matches_full_recompute] if "pgbench_accounts" in set(table_names) else []
