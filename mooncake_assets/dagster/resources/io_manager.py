"""``MooncakeDuckDBIOManager``: dagster-duckdb's I/O manager, with mirror assets read by union reads.

- **Outputs** of downstream assets are DuckDB tables ``<schema>.<table>`` in ``database``, exactly as
  dagster-duckdb stores them (schema: ``schema`` metadata, else the I/O manager's ``schema``, else the
  asset key's prefix; partitioned outputs replace their slice, selected by ``partition_expr``).
- **Inputs** from a DuckDB table are read back as dagster-duckdb reads them.
- **Inputs from a mirror asset** (definition metadata ``mooncake/table``) are a union read of the
  mirror through the replicator service: persisted and freshly flushed Parquet files with their
  deletion vectors applied, plus the in-memory rows, registered as a view in a private in-memory
  DuckDB connection (one long-lived union reader per I/O manager: its connection, views and caches
  of unchanged files are reused by the next mirror input). Read-your-writes (``read_your_writes``, default on): before the first mirror
  input of a step the service is made to apply everything committed in Postgres up to
  ``pg_current_wal_lsn()`` (``TimeoutError`` after the resource's ``wait_timeout_s``); the other mirror
  inputs of the same step are read at the same LSN, so joins between mirrors see one point in history.
  The ``columns`` input metadata projects (only those columns are read); partition filters apply both
  when the mirror asset itself is partitioned (its ``partition_expr`` metadata, dagster-duckdb's rule)
  and when a partitioned asset reads an unpartitioned mirror with ``partition_expr`` in the input's
  metadata (``AssetIn(metadata={"partition_expr": "bid"})``: the rows of the run's partition(s) only;
  a time-window partition selects ``start <= expr < end``).

The LSN each mirror input was read at is logged as input metadata (``mooncake/lsn``).

**A run at one cut**: when the run is tagged ``mooncake/cut`` (a cut tag ``lsn-X-Y`` or its LSN
``X/Y``; ``jobs/cuts.py`` schedules such runs), every non-incremental mirror input of every step is
read at that cut's Iceberg snapshot instead (``engine/read/cuts.py:read_snapshot``), with the same
projection and partition filters, so all the run's assets see one LSN.

Built on dagster-duckdb's extension points only: the I/O manager is dagster-duckdb's ``DbIOManager``
with the type handlers of ``type_handlers.py`` and :class:`MirrorDbClient`, whose connection for a
mirror input holds the union read (the names Dagster does not export come from
``mooncake_assets.dagster.compat``). Example, as ``mooncake_assets.dagster.definitions`` binds it::

    replication = ReplicationResource(state_dir=".mooncake", tables=["pgbench_accounts"])
    io_manager = MooncakeDuckDBIOManager(database=".mooncake/dagster.duckdb", replication=replication)

    @dg.asset(ins={"accounts": dg.AssetIn(key=["mirror", "pgbench_accounts"],
                                          metadata={"columns": ["bid", "abalance"]})})
    def balances(accounts: pa.Table) -> pa.Table:  # a union read of the mirror, two columns
        ...
"""

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import dagster as dg
import duckdb
import pyarrow as pa
from dagster_duckdb import DuckDBIOManager
from pydantic import Field

from mooncake_assets.dagster.compat import (
    DbClient,
    DbIOManager,
    DbTypeHandler,
    DuckDbClient,
    TablePartitionDimension,
    TableSlice,
)
from mooncake_assets.engine.service import ServiceError

from .incremental import CursorKeeper, asset_database, is_incremental
from .replication import ReplicationResource
from .type_handlers import default_type_handlers

MIRROR_TABLE = "mooncake/table"  # definition metadata that marks a mirror asset (value: the mirror's name)
CUT_TAG = "mooncake/cut"  # run tag: every mirror input of the run is read at this consistent cut (lsn-X-Y or X/Y)


class MirrorDbClient(DbClient):
    """dagster-duckdb's database client, whose connection for an input from a mirror asset is a union read.

    Outputs and other inputs go to the asset database through dagster-duckdb's ``DuckDbClient``. For an
    input from a mirror asset (definition metadata ``mooncake/table``), :meth:`connect` yields a private
    in-memory DuckDB connection in which the slice's ``<schema>.<table>`` is a view over the union read
    of the mirror (the input's own ``partition_expr`` filter applied), so the type handler runs its usual
    SELECT on it. The LSN of a step's first mirror input is kept (``(run id, step key)`` → LSN), and the
    step's other mirror inputs are read at it.

    The client keeps **one** :class:`~mooncake_assets.engine.read.UnionReader` (made on the first mirror
    input) for every mirror input it loads: its DuckDB connection is the private connection yielded,
    so the union views, Parquet footers and decoded deletion vectors of files that did not change are
    not built again; the slice's view is dropped after each load. Loads are serialized (one lock)."""

    def __init__(self, replication: ReplicationResource, read_your_writes: bool = True):
        self._replication = replication
        self._read_your_writes = read_your_writes
        self._pins: dict[tuple[str, str], str] = {}  # (run id, step key) -> LSN of the step's mirror reads
        self._reader = None  # the long-lived UnionReader, made on the first mirror input
        self._lock = threading.Lock()
        self.cursors = CursorKeeper(replication)  # incremental inputs (incremental.py)
        self._in_txn: set[int] = set()  # id() of output connections with a transaction open for cursors

    def delete_table_slice(self, context: dg.OutputContext, table_slice: TableSlice, connection) -> None:
        """dagster-duckdb's; then, when the step has cursors to commit, a transaction opens for the
        output and the cursors (committed by :meth:`connect`)."""
        DuckDbClient.delete_table_slice(context, table_slice, connection)
        if self.cursors.pending(_step_key(context), asset_database(context)):
            connection.execute("BEGIN TRANSACTION")
            self._in_txn.add(id(connection))

    @staticmethod
    def ensure_schema_exists(context: dg.OutputContext, table_slice: TableSlice, connection) -> None:
        DuckDbClient.ensure_schema_exists(context, table_slice, connection)

    @staticmethod
    def get_select_statement(table_slice: TableSlice) -> str:
        return DuckDbClient.get_select_statement(table_slice)

    @contextmanager
    def connect(
        self, context: dg.InputContext | dg.OutputContext, table_slice: TableSlice
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """The asset database's connection, or for a mirror input a connection holding its union read."""
        table = _mirror_of(context)
        if isinstance(context, dg.OutputContext):
            with self._output_connection(context, table_slice) as con:
                yield con
            return
        if table is None:
            with DuckDbClient.connect(context, table_slice) as con:
                yield con
            return
        cut = _run_cut(context)
        if cut is not None:
            with self._lock, self._cut_connection(context, table, table_slice, cut) as con:
                yield con
            return
        with self._lock:
            if self._reader is None:
                self._reader = self._replication.union_reader(read_your_writes=self._read_your_writes)
            reader = self._reader
            con = reader.con
            try:
                rs = self._register_mirror(context, reader, table, table_slice)
                yield con  # the handler materializes what it loads: nothing refers to the slice view afterwards
            finally:
                con.execute(f"DROP VIEW IF EXISTS {_ident(table_slice.schema)}.{_ident(table_slice.table)}")
        _add_read_metadata(context, table, rs)

    @contextmanager
    def _cut_connection(self, context: dg.InputContext, table: str, table_slice: TableSlice, cut: str):
        """A private DuckDB connection in which the slice's view is over ``table``'s Iceberg snapshot
        at the run's cut ``cut`` (:func:`~mooncake_assets.engine.read.cuts.read_snapshot`, no service
        asked); the input's partition filter applies as for a union read. ``LookupError`` (one line)
        when the mirror has no snapshot at that cut (not in it, or expired)."""
        input_dims = [] if table_slice.partition_dimensions else _input_partition_dimensions(context)
        columns = _read_columns(table_slice.columns, [*(table_slice.partition_dimensions or []), *input_dims])
        data, at = self.cursors.snapshot(table, cut, columns)
        con = duckdb.connect()
        try:
            con.register("mirror_snapshot", data)
            over = DuckDbClient.get_select_statement(
                TableSlice(table="mirror_snapshot", schema="main", partition_dimensions=input_dims)
            )
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(table_slice.schema)}")
            con.execute(f"CREATE VIEW {_ident(table_slice.schema)}.{_ident(table_slice.table)} AS {over}")
            yield con
        finally:
            con.close()
        try:
            context.add_input_metadata({"mooncake/lsn": at, "mooncake/table": table, "mooncake/cut": cut})
        except Exception:  # best effort, as _add_read_metadata
            pass

    @contextmanager
    def _output_connection(self, context: dg.OutputContext, table_slice: TableSlice):
        """The asset database's connection for an output; the step's pending cursors are committed in
        the output's transaction (opened by :meth:`delete_table_slice`), or rolled back with it."""
        step = _step_key(context)
        with DuckDbClient.connect(context, table_slice) as con:
            try:
                yield con
            except BaseException:
                if id(con) in self._in_txn:
                    self._in_txn.discard(id(con))
                    con.execute("ROLLBACK")
                raise
            if id(con) in self._in_txn:
                self._in_txn.discard(id(con))
                output = f"{table_slice.schema}.{table_slice.table}"
                self.cursors.commit(con, step, output, step[0] if step else "", asset_database(context))
                con.execute("COMMIT")
                self.cursors.forget(step, asset_database(context))

    def load_changes(self, context: dg.InputContext):
        """An incremental input (:mod:`.incremental`): the mirror's changes since the cursor of (op, input)."""
        table = _mirror_of(context)
        columns = (context.definition_metadata or {}).get("columns")
        with self._lock:
            return self.cursors.load(
                context,
                _step_key(context),
                table,
                list(columns) if columns else None,
                lambda: DuckDbClient.connect(context, None),
            )

    def _register_mirror(self, context: dg.InputContext, reader, table: str, table_slice: TableSlice) -> dict:
        """Create the union view of ``table`` and, over it, the slice's view; returns the ReadState read."""
        input_dims = [] if table_slice.partition_dimensions else _input_partition_dimensions(context)
        union_view = f"mirror_{table}"
        columns = _read_columns(table_slice.columns, [*(table_slice.partition_dimensions or []), *input_dims])
        rs = self._read_state(context, reader, table, union_view, columns)
        con = reader.con
        over_union = DuckDbClient.get_select_statement(
            TableSlice(table=union_view, schema="temp", partition_dimensions=input_dims)
        )  # a TEMP view
        con.execute(f"CREATE SCHEMA IF NOT EXISTS {_ident(table_slice.schema)}")
        con.execute(f"CREATE OR REPLACE VIEW {_ident(table_slice.schema)}.{_ident(table_slice.table)} AS {over_union}")
        return rs

    def _read_state(self, context: dg.InputContext, reader, table: str, view: str, columns: list[str] | None) -> dict:
        """Register the union view ``view`` of ``table`` in ``reader`` (the kept UnionReader): at the step's
        LSN when it has one, else after the read-your-writes barrier at the service's current LSN (which
        becomes the step's)."""
        key = _step_key(context)
        pinned = self._pins.get(key) if key else None
        if pinned is None:
            barrier = reader.barrier_lsn()  # waited for in the same round trip as the ReadState
            rs = reader.register(table, lsn=None, view=view, columns=columns, wait_lsn=barrier)
            if barrier:
                context.log.debug(f"read-your-writes: the service has applied the source up to {barrier}")
            if key:
                self._pins[key] = str(rs.lsn)
            return rs
        try:
            return reader.register(table, lsn=pinned, view=view, columns=columns)
        except ServiceError as e:
            if "cannot read at LSN" not in str(e):
                raise
            context.log.warning(
                f"mirror {table}: cannot be read at this step's LSN {pinned} ({e}); "
                "reading it at its current LSN instead"
            )
            return reader.register(table, lsn=None, view=view, columns=columns)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _mirror_of(context: dg.InputContext | dg.OutputContext) -> str | None:
    """The mirror an input reads (its upstream asset's ``mooncake/table`` metadata), else None."""
    if not isinstance(context, dg.InputContext) or context.upstream_output is None:
        return None
    table = (context.upstream_output.definition_metadata or {}).get(MIRROR_TABLE)
    return str(table) if table else None


def _run_cut(context: dg.InputContext) -> str | None:
    """The LSN (``X/Y``) of the run's ``mooncake/cut`` tag (a cut tag ``lsn-X-Y`` or an LSN), else None."""
    from mooncake_assets.engine.iceberg.cuts import parse_cut_tag

    try:
        tag = context.step_context.dagster_run.tags.get(CUT_TAG)
    except Exception:  # an input context built outside a run (tests)
        return None
    if not tag:
        return None
    lsn = parse_cut_tag(str(tag))
    if lsn is None:
        raise ValueError(f"run tag {CUT_TAG}={tag!r} is not a cut (lsn-X-Y or X/Y; see `mooncake list-cuts`)")
    return str(lsn)


def _add_read_metadata(context: dg.InputContext, table: str, rs: dict) -> None:
    try:
        context.add_input_metadata(
            {
                "mooncake/lsn": str(rs.lsn),
                "mooncake/table": table,
                "mooncake/files": len(rs.files),
                "mooncake/memory_rows": rs.mem_rows or 0,
            }
        )
    except Exception:  # metadata is best effort (not every context records input metadata)
        pass


def _step_key(context: dg.InputContext | dg.OutputContext) -> tuple[str, str] | None:
    try:
        step = context.step_context
        return (step.run_id, step.step.key)
    except Exception:  # an input context built outside a run (tests): no pinning
        return None


def _read_columns(columns: Sequence[str] | None, dims: Sequence[TablePartitionDimension]) -> list[str] | None:
    """Columns the union view needs: the projection ``columns`` plus the partition columns ``dims`` filter
    on (None: all, e.g. when a partition expression is not a plain column name)."""
    if not columns:
        return None
    cols = list(columns)
    for dim in dims:
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
    if isinstance(pdef, dg.MultiPartitionsDefinition) or not isinstance(expr, str):
        raise ValueError(
            f"input {context.name}: a 'partition_expr' on the input of a mirror supports a single "
            "partition dimension (a column or SQL expression as text)"
        )
    if isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        return [TablePartitionDimension(partition_expr=expr, partitions=step.partition_time_window)]
    keys = pdef.get_partition_keys_in_range(step.partition_key_range) if pdef is not None else [context.partition_key]
    return [TablePartitionDimension(partition_expr=expr, partitions=list(keys))]


class MooncakeDuckDBIOManager(DuckDBIOManager):
    """dagster-duckdb's I/O manager whose inputs from mirror assets are union reads (module docstring).

    Handles ``pyarrow.Table`` (the default load type), ``pandas.DataFrame``, ``polars.DataFrame`` and
    ``duckdb.DuckDBPyRelation``."""

    replication: dg.ResourceDependency[ReplicationResource]
    read_your_writes: bool = Field(
        True,
        description="Wait until the service has applied every commit the source "
        "had when a step first reads a mirror (read-your-writes).",
    )

    @staticmethod
    def type_handlers() -> Sequence[DbTypeHandler]:
        return default_type_handlers()

    @staticmethod
    def default_load_type() -> type | None:
        return pa.Table

    def create_io_manager(self, context) -> DbIOManager:
        return MooncakeDbIOManager(
            db_client=MirrorDbClient(self.replication, read_your_writes=self.read_your_writes),
            database=self.database,
            schema=self.schema_,
            type_handlers=self.type_handlers(),
            default_load_type=self.default_load_type(),
            io_manager_name="MooncakeDuckDBIOManager",
        )


class MooncakeDbIOManager(DbIOManager):
    """dagster-duckdb's ``DbIOManager`` whose incremental mirror inputs (:mod:`.incremental`) load as
    :class:`~.incremental.MirrorChanges` through :meth:`MirrorDbClient.load_changes`; every other
    input and every output goes through ``DbIOManager`` unchanged."""

    def __init__(self, *, db_client: MirrorDbClient, **kw):
        super().__init__(db_client=db_client, **kw)
        self._mirror_client = db_client

    def load_input(self, context: dg.InputContext) -> object:
        if _mirror_of(context) is not None and is_incremental(context):
            return self._mirror_client.load_changes(context)
        return super().load_input(context)
