"""DuckDB type handlers of :class:`~mooncake_assets.dagster.resources.io_manager.MooncakeDuckDBIOManager`, one per type.

Each handler stores an output as the DuckDB table ``<schema>.<table>`` of its TableSlice (replaced
whole when the asset is unpartitioned; partitioned outputs insert their slice, which the I/O manager
deleted first) and loads an input by running the slice's SELECT (projection and partition filter
included) on the connection it is given: the asset database for downstream tables, an in-memory
connection holding a union-read view for mirror assets.

Output metadata: ``dagster/row_count`` and ``dagster/column_schema`` (column names and DuckDB types).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import dagster as dg
import duckdb
import pyarrow as pa

from mooncake_assets.dagster.compat import DbTypeHandler, DuckDbClient, TableSlice


def _target(table_slice: TableSlice) -> str:
    return f"{table_slice.schema}.{table_slice.table}"


def write_arrow(table_slice: TableSlice, data: pa.Table, connection: duckdb.DuckDBPyConnection) -> Mapping:
    """Store ``data`` as the slice's table; returns row count and column schema metadata."""
    tmp = f"__mooncake_out_{uuid.uuid4().hex[:12]}"
    connection.register(tmp, data)
    try:
        if table_slice.partition_dimensions:
            connection.execute(f"CREATE TABLE IF NOT EXISTS {_target(table_slice)} AS SELECT * FROM {tmp} LIMIT 0")
            connection.execute(f"INSERT INTO {_target(table_slice)} BY NAME SELECT * FROM {tmp}")
        else:
            connection.execute(f"CREATE OR REPLACE TABLE {_target(table_slice)} AS SELECT * FROM {tmp}")
        rel = connection.sql(f"SELECT * FROM {tmp} LIMIT 0")
        columns = [dg.TableColumn(name=n, type=str(t)) for n, t in zip(rel.columns, rel.types)]
    finally:
        connection.unregister(tmp)
    return {
        "dagster/row_count": data.num_rows,
        "dagster/column_schema": dg.TableSchema(columns=columns),
    }


def select(table_slice: TableSlice, connection: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyRelation:
    """The slice's rows as a relation on ``connection`` (projection and partition filter applied)."""
    return connection.sql(DuckDbClient.get_select_statement(table_slice))


class ArrowTableTypeHandler(DbTypeHandler[pa.Table]):
    """``pyarrow.Table`` ⇄ DuckDB table."""

    def handle_output(self, context, table_slice: TableSlice, obj: pa.Table, connection):
        return write_arrow(table_slice, obj, connection)

    def load_input(self, context, table_slice: TableSlice, connection) -> pa.Table:
        return select(table_slice, connection).to_arrow_table()

    @property
    def supported_types(self) -> Sequence[type]:
        return [pa.Table]


class PandasDataFrameTypeHandler(DbTypeHandler):
    """``pandas.DataFrame`` ⇄ DuckDB table (through Arrow; the index is not stored)."""

    def handle_output(self, context, table_slice: TableSlice, obj, connection):
        return write_arrow(table_slice, pa.Table.from_pandas(obj, preserve_index=False), connection)

    def load_input(self, context, table_slice: TableSlice, connection):
        return select(table_slice, connection).df()

    @property
    def supported_types(self) -> Sequence[type]:
        import pandas as pd

        return [pd.DataFrame]


class PolarsDataFrameTypeHandler(DbTypeHandler):
    """``polars.DataFrame`` ⇄ DuckDB table (through Arrow)."""

    def handle_output(self, context, table_slice: TableSlice, obj, connection):
        return write_arrow(table_slice, obj.to_arrow(), connection)

    def load_input(self, context, table_slice: TableSlice, connection):
        import polars as pl

        return pl.from_arrow(select(table_slice, connection).to_arrow_table())

    @property
    def supported_types(self) -> Sequence[type]:
        import polars as pl

        return [pl.DataFrame]


class DuckDBRelationTypeHandler(DbTypeHandler[duckdb.DuckDBPyRelation]):
    """``duckdb.DuckDBPyRelation`` ⇄ DuckDB table.

    An output relation may belong to any connection (it is read as Arrow). An input relation is
    materialized into a private in-memory connection, so it stays valid after the I/O manager has
    closed (or released) the connection it was read from."""

    def handle_output(self, context, table_slice: TableSlice, obj: duckdb.DuckDBPyRelation, connection):
        return write_arrow(table_slice, obj.to_arrow_table(), connection)

    def load_input(self, context, table_slice: TableSlice, connection) -> duckdb.DuckDBPyRelation:
        data = select(table_slice, connection).to_arrow_table()
        return duckdb.connect().from_arrow(data)

    @property
    def supported_types(self) -> Sequence[type]:
        return [duckdb.DuckDBPyRelation]


def default_type_handlers() -> list[DbTypeHandler]:
    return [
        ArrowTableTypeHandler(),
        PandasDataFrameTypeHandler(),
        PolarsDataFrameTypeHandler(),
        DuckDBRelationTypeHandler(),
    ]
