"""The scheduled verify's checksum query (engine/service/verifier.py) on its own, in DuckDB: user
columns named like the query's own names must not change the grouping (a fresh-user trial found
``GROUP BY r`` bound to a column ``r``)."""

import duckdb
import pyarrow as pa

from mooncake_assets.engine.service.verifier import RANGES, _add, checksum_sql


def _sums(table: pa.Table, columns, key):
    con = duckdb.connect()
    con.register("b", table)
    acc: dict = {}
    _add(acc, con.execute(checksum_sql("b", columns, key)).fetchall())
    return acc


def test_columns_named_like_the_query_aliases():
    t = pa.table(
        {
            "id": list(range(200)),
            "r": [i % 3 for i in range(200)],
            "n": ["x"] * 200,
            "h": [1.5] * 200,
            "b": [True] * 200,
        }
    )
    cols = ["id", "r", "n", "h", "b"]
    acc = _sums(t, cols, ["id"])
    assert sum(v[0] for v in acc.values()) == 200
    assert set(acc) <= set(range(RANGES)) and len(acc) > 1  # grouped by the key's hash, not by column r
    # order-independent, and one changed value changes the sum of its range
    assert _sums(t.take(list(reversed(range(200)))), cols, ["id"]) == acc
    t2 = t.set_column(1, "r", pa.array([9] + [i % 3 for i in range(1, 200)]))
    acc2 = _sums(t2, cols, ["id"])
    assert {k: v[0] for k, v in acc2.items()} == {k: v[0] for k, v in acc.items()} and acc2 != acc


def test_no_key_groups_by_the_whole_row():
    t = pa.table({"r": [1, 1, 2], "n": ["a", "a", None]})
    acc = _sums(t, ["r", "n"], [])
    assert sum(v[0] for v in acc.values()) == 3
