"""``MooncakeDuckDBIOManager``: dagster-duckdb's I/O manager, with mirror assets read by union reads.

- **Outputs** of downstream assets are DuckDB tables ``<schema>.<table>`` in ``database``, exactly as
  dagster-duckdb stores them (schema: ``schema`` metadata, else the I/O manager's ``schema``, else the
  asset key's prefix; partitioned outputs replace their slice, selected by ``partition_expr``).
- **Inputs** from a DuckDB table are read back as dagster-duckdb reads them.
- **Inputs from a mirror asset** (definition metadata ``mooncake/table``) are a union read of the
  mirror through the replicator service: persisted and freshly flushed Parquet files with their
  deletion vectors applied, plus the in-memory rows, registered as a view in a private in-memory
  DuckDB connection. Read-your-writes (``read_your_writes``, default on): before the first mirror
  input of a step the service is made to apply everything committed in Postgres up to
  ``pg_current_wal_lsn()`` (``TimeoutError`` after the resource's ``wait_timeout_s``); the other mirror
  inputs of the same step are read at the same LSN, so joins between mirrors see one point in history.
  The ``columns`` input metadata projects (only those columns are read); partition filters apply both
  when the mirror asset itself is partitioned (its ``partition_expr`` metadata, dagster-duckdb's rule)
  and when a partitioned asset reads an unpartitioned mirror with ``partition_expr`` in the input's
  metadata (``AssetIn(metadata={"partition_expr": "bid"})``: the rows of the run's partition(s) only;
  a time-window partition selects ``start <= expr < end``).

The LSN each mirror input was read at is logged as input metadata (``mooncake/lsn``).
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg
import duckdb
import pyarrow as pa
from dagster._core.definitions.partitions.definition import TimeWindowPartitionsDefinition
from dagster._core.definitions.partitions.definition import MultiPartitionsDefinition
from dagster._core.storage.db_io_manager import DbIOManager, DbTypeHandler, TablePartitionDimension, TableSlice
from dagster_duckdb import DuckDBIOManager
from dagster_duckdb.io_manager import DuckDbClient
from pydantic import Field

from mooncake_assets.engine.service import ServiceError

from .replication import ReplicationResource
from .type_handlers import default_type_handlers

MIRROR_TABLE = "mooncake/table"  # definition metadata that marks a mirror asset (value: the mirror's name)


class MooncakeDbIOManager(DbIOManager):
    """The I/O manager object (see the module docstring); built by :class:`MooncakeDuckDBIOManager`."""

    def __init__(self, *, replication: ReplicationResource, read_your_writes: bool = True, **kw):
        super().__init__(**kw)
        self._replication = replication
        self._read_your_writes = read_your_writes
        self._pins: dict[tuple[str, str], str] = {}  # (run id, step key) -> LSN of the step's mirror reads

    def load_input(self, context: dg.InputContext) -> object:
        upstream = context.upstream_output
        table = (upstream.definition_metadata or {}).get(MIRROR_TABLE) if upstream is not None else None
        if not table:
            return super().load_input(context)
        obj_type = context.dagster_type.typing_type
        load_type = self._default_load_type if obj_type is Any and self._default_load_type is not None else obj_type
        self._check_supported_type(load_type)
        handler = self._resolve_handler(load_type)
        table_slice = self._get_table_slice(context, upstream)
        if not table_slice.partition_dimensions:
            table_slice = table_slice._replace(partition_dimensions=_input_partition_dimensions(context))
        return self._load_mirror(context, str(table), table_slice, handler)

    def _load_mirror(self, context: dg.InputContext, table: str, table_slice: TableSlice,
                     handler: DbTypeHandler) -> object:
        con = duckdb.connect()
        try:
            reader = self._replication.union_reader(con=con, read_your_writes=self._read_your_writes)
            view = f"mirror_{table}"
            read_columns = _read_columns(table_slice)
            key = _step_key(context)
            pinned = self._pins.get(key) if key else None
            if pinned is None:
                barrier = reader.barrier()
                if barrier:
                    context.log.debug(f"read-your-writes: the service has applied the source up to {barrier}")
                rs = reader.register(table, lsn=None, view=view, columns=read_columns)
                if key:
                    self._pins[key] = rs["lsn"]
            else:
                try:
                    rs = reader.register(table, lsn=pinned, view=view, columns=read_columns)
                except ServiceError as e:
                    if "cannot read at LSN" not in str(e):
                        raise
                    context.log.warning(f"mirror {table}: cannot be read at this step's LSN {pinned} ({e}); "
                                        "reading it at its current LSN instead")
                    rs = reader.register(table, lsn=None, view=view, columns=read_columns)
            local = table_slice._replace(table=view, schema="temp", database=None)
            obj = handler.load_input(context, local, con)  # a relation is materialized into its own connection
        finally:
            con.close()
        try:
            context.add_input_metadata({"mooncake/lsn": rs["lsn"], "mooncake/table": table,
                                        "mooncake/files": len(rs["files"]), "mooncake/memory_rows": rs.get("mem_rows", 0)})
        except Exception:  # metadata is best effort (not every context records input metadata)
            pass
        return obj


def _step_key(context: dg.InputContext) -> tuple[str, str] | None:
    try:
        step = context.step_context
        return (step.run_id, step.step.key)
    except Exception:  # an input context built outside a run (tests): no pinning
        return None


def _read_columns(table_slice: TableSlice) -> list[str] | None:
    """Columns the union view needs: the projection plus the partition columns it filters on (None:
    all, e.g. when a partition expression is not a plain column name)."""
    if not table_slice.columns:
        return None
    cols = list(table_slice.columns)
    for dim in table_slice.partition_dimensions or []:
        if not dim.partition_expr.isidentifier():
            return None
        if dim.partition_expr not in cols:
            cols.append(dim.partition_expr)
    return cols


def _input_partition_dimensions(context: dg.InputContext) -> list[TablePartitionDimension]:
    """Filter of an unpartitioned mirror read by a partitioned asset with ``partition_expr`` on its input."""
    expr = (context.definition_metadata or {}).get("partition_expr")
    if not expr or not context.has_partition_key:
        return []
    step = context.step_context
    pdef = step.run_partitions_def
    if isinstance(pdef, MultiPartitionsDefinition) or not isinstance(expr, str):
        raise ValueError(f"input {context.name}: a 'partition_expr' on the input of a mirror supports a single "
                         "partition dimension (a column or SQL expression as text)")
    if isinstance(pdef, TimeWindowPartitionsDefinition):
        return [TablePartitionDimension(partition_expr=expr, partitions=step.partition_time_window)]
    keys = pdef.get_partition_keys_in_range(step.partition_key_range) if pdef is not None else [context.partition_key]
    return [TablePartitionDimension(partition_expr=expr, partitions=list(keys))]


class MooncakeDuckDBIOManager(DuckDBIOManager):
    """dagster-duckdb's I/O manager whose inputs from mirror assets are union reads (module docstring).

    Handles ``pyarrow.Table`` (the default load type), ``pandas.DataFrame``, ``polars.DataFrame`` and
    ``duckdb.DuckDBPyRelation``."""

    replication: dg.ResourceDependency[ReplicationResource]
    read_your_writes: bool = Field(True, description="Wait until the service has applied every commit the source "
                                                     "had when a step first reads a mirror (read-your-writes).")

    @staticmethod
    def type_handlers() -> Sequence[DbTypeHandler]:
        return default_type_handlers()

    @staticmethod
    def default_load_type() -> type | None:
        return pa.Table

    def create_io_manager(self, context) -> MooncakeDbIOManager:
        return MooncakeDbIOManager(
            replication=self.replication,
            read_your_writes=self.read_your_writes,
            db_client=DuckDbClient(),
            database=self.database,
            schema=self.schema_,
            type_handlers=self.type_handlers(),
            default_load_type=self.default_load_type(),
            io_manager_name="MooncakeDuckDBIOManager",
        )
