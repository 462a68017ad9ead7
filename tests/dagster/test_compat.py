"""mooncake_assets.dagster.compat: what the Dagster layer takes from Dagster beyond its public exports.

Each test pins one thing the module's docstring says is relied on; a Dagster or dagster-duckdb
upgrade that changes it fails here, by name, before it breaks the I/O manager. No Postgres needed.
"""

import inspect
from contextlib import contextmanager

import dagster as dg
import duckdb

from mooncake_assets.dagster import compat
from mooncake_assets.dagster.compat import (
    DbClient,
    DbIOManager,
    DbTypeHandler,
    DuckDbClient,
    TablePartitionDimension,
    TableSlice,
)


def test_versions_are_the_ones_the_module_was_written_for():
    assert compat.version_mismatches() == []


def test_slice_shapes():
    assert TableSlice._fields == ("table", "schema", "database", "columns", "partition_dimensions")
    assert TablePartitionDimension._fields == ("partition_expr", "partitions")
    s = TableSlice(table="t", schema="s")
    assert (s.database, s.columns, s.partition_dimensions) == (None, None, None)


def test_extension_point_signatures():
    assert set(DbTypeHandler.__abstractmethods__) == {"handle_output", "load_input", "supported_types"}
    for name in ("delete_table_slice", "ensure_schema_exists", "get_select_statement", "connect"):
        assert callable(getattr(DbClient, name)), name
    params = inspect.signature(DbIOManager.__init__).parameters
    assert {"type_handlers", "db_client", "database", "schema", "io_manager_name", "default_load_type"} <= set(params)
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in params if p != "self")


def test_duckdb_select_statement_of_a_slice():
    """The SELECT the mirror client builds its filtered view from (projection, static and time-window
    partitions written by dagster-duckdb)."""
    assert DuckDbClient.get_select_statement(TableSlice(table="t", schema="s")) == "SELECT * FROM s.t"
    assert (
        DuckDbClient.get_select_statement(TableSlice(table="t", schema="s", columns=["a", "b"]))
        == "SELECT a, b FROM s.t"
    )
    sl = TableSlice(
        table="t",
        schema="temp",
        partition_dimensions=[TablePartitionDimension(partition_expr="bid", partitions=["1", "o'k"])],
    )
    assert DuckDbClient.get_select_statement(sl) == "SELECT * FROM temp.t WHERE\nbid in ('1', 'o''k')"
    window = dg.TimeWindowPartitionsDefinition(cron_schedule="0 0 * * *", start="2026-01-01", fmt="%Y-%m-%d")
    tw = window.time_window_for_partition_key("2026-01-02")
    sl = TableSlice(table="t", schema="s", partition_dimensions=[TablePartitionDimension("ts", tw)])
    assert (
        DuckDbClient.get_select_statement(sl)
        == "SELECT * FROM s.t WHERE\nts >= '2026-01-02 00:00:00' AND ts < '2026-01-03 00:00:00'"
    )


class _Recorder(DbClient):
    """A database client that records what DbIOManager asks of it (an in-memory DuckDB behind it)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.con = duckdb.connect()

    @contextmanager
    def connect(self, context, table_slice):
        self.calls.append(("connect", "input" if isinstance(context, dg.InputContext) else "output", table_slice))
        yield self.con

    def ensure_schema_exists(self, context, table_slice, connection):
        self.calls.append(("ensure_schema_exists", table_slice, connection is self.con))

    def delete_table_slice(self, context, table_slice, connection):
        self.calls.append(("delete_table_slice", table_slice, connection is self.con))

    @staticmethod
    def get_select_statement(table_slice):
        return DuckDbClient.get_select_statement(table_slice)


class _IntHandler(DbTypeHandler[int]):
    def __init__(self, calls):
        self.calls = calls

    def handle_output(self, context, table_slice, obj, connection):
        self.calls.append(("handle_output", table_slice, obj))
        return {}

    def load_input(self, context, table_slice, connection):
        self.calls.append(("load_input", table_slice))
        return 41

    @property
    def supported_types(self):
        return [int]


def test_db_io_manager_hands_the_connected_slice_to_the_handler():
    """DbIOManager connects with the slice it builds and gives the handler that same slice: the mirror
    client's connection for a slice is what the handler's SELECT runs on."""
    client = _Recorder()
    manager = DbIOManager(type_handlers=[_IntHandler(client.calls)], db_client=client, database="db")

    @dg.asset(key=["s", "up"])
    def up() -> int:
        return 1

    seen = {}

    @dg.asset(ins={"up": dg.AssetIn(key=["s", "up"], metadata={"columns": ["a"]})})
    def down(up: int) -> None:
        seen["up"] = up

    res = dg.materialize([up, down], resources={"io_manager": dg.IOManagerDefinition.hardcoded_io_manager(manager)})
    assert res.success and seen["up"] == 41
    out_slice = TableSlice(table="up", schema="s", database="db", columns=None, partition_dimensions=[])
    in_slice = out_slice._replace(columns=["a"])
    assert client.calls[:4] == [
        ("connect", "output", out_slice),
        ("ensure_schema_exists", out_slice, True),
        ("delete_table_slice", out_slice, True),
        ("handle_output", out_slice, 1),
    ]
    assert client.calls[4:] == [("connect", "input", in_slice), ("load_input", in_slice)]
