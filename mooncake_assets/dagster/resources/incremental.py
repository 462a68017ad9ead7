"""Incremental mirror inputs: a downstream asset reads only what changed in a mirror since its last run.

An input from a mirror asset is **incremental** when its ``AssetIn`` metadata has
``"mooncake/incremental": True`` or its parameter is typed :class:`MirrorChanges`; it loads as a
:class:`MirrorChanges` (docs/changes.md, "Incremental assets in Dagster")::

    @dg.asset(ins={"accounts": dg.AssetIn(key=["mirror", "pgbench_accounts"],
                                          metadata={"mooncake/incremental": True, "columns": ["bid", "abalance"]})})
    def balances(accounts: MirrorChanges) -> pa.Table:
        ...  # accounts.previous (this asset's stored output) + accounts.rows (the changes) -> new output

**Cursor.** Per (downstream op, input) the I/O manager keeps the LSN the last successful
materialization consumed, in the asset database's table ``mooncake_state.cursors`` (:data:`CURSORS`).
The next load hands over exactly the change feed since then: ``changes(cursor, until)`` of the
service (``_change``/``_commit_lsn`` columns), where ``until`` is a persisted cut (the table's
current Iceberg snapshot; with several incremental inputs in one step, a consistent cut taken for the
step, so all of them end at one LSN). The first load (no cursor, or a cursor the service no longer
has history for, or a stored output that is gone) is the whole table read from the snapshot at
``until`` (``engine/read/cuts.py:read_snapshot``), every row an ``insert``.

**Deletes as keys.** With input metadata ``"mooncake/deletes": "keys"`` the feed's ``delete`` rows
carry only the primary key, their other columns null (``engine/table/change_keys.py``: far cheaper
for the service than reading each deleted row back); fold them by key. ``columns`` metadata must then
name the key columns too. A mirror without a primary key fails the load with the service's one-line
error.

**Commit.** The new cursor is written when the step stores its output through this I/O manager, in
the same DuckDB transaction as the output table, so the stored output and the cursor always belong
together; a step that fails before that leaves the cursor where it was and the next run reads the
same changes again (up to a later ``until``). The output's table is recorded with the cursor, and
the next load passes it back as :attr:`MirrorChanges.previous`. Pending cursors are kept per process
(:data:`_PENDING`), not per I/O manager: with a sources file each source's mirrors load through that
source's I/O manager (``io_manager__<source>``) while the downstream asset's output is usually
stored by another (``io_manager``); whichever Mooncake I/O manager stores the step's output commits
the cursors read from the same asset database.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import duckdb
import pyarrow as pa

INCREMENTAL = "mooncake/incremental"  # input metadata that asks for changes instead of a full read
DELETES = "mooncake/deletes"  # input metadata: "rows" (default) or "keys": deleted rows as their primary key only
CURSORS = "mooncake_state.cursors"  # the cursor table of the asset database
CHANGE = "_change"
COMMIT_LSN = "_commit_lsn"

_CURSOR_DDL = f"""
CREATE SCHEMA IF NOT EXISTS mooncake_state;
CREATE TABLE IF NOT EXISTS {CURSORS} (
    op VARCHAR NOT NULL, input VARCHAR NOT NULL, mirror VARCHAR NOT NULL, lsn VARCHAR NOT NULL,
    output VARCHAR NOT NULL, run_id VARCHAR, updated_at TIMESTAMPTZ, PRIMARY KEY (op, input))
"""


@dataclass(frozen=True)
class MirrorChanges:
    """What an incremental mirror input loads as.

    - ``table``: the mirror's name;
    - ``since``: the LSN (``X/Y``) the previous successful materialization consumed; None when this is
      a full read (first run, or history since the cursor is gone): then ``rows`` is the whole table;
    - ``until``: the LSN this load reaches (a persisted cut); the new cursor once the step succeeds;
    - ``rows``: Arrow table of the input's columns (``columns`` metadata, default all) plus ``_change``
      (``insert``/``delete``) and ``_commit_lsn`` (``X/Y`` or null): the change feed over
      ``[since, until)`` (docs/changes.md), or on a full read every row as an ``insert`` (null LSN);
    - ``previous``: this step's output as stored by the last successful materialization (the one
      that consumed ``since``), read back from the asset database; None on a full read.

    Applying ``rows`` to the table read at ``since`` gives the table read at ``until``; so an asset
    that folds ``rows`` into ``previous`` (None: an empty result) keeps its output equal to a full
    recompute at ``until``."""

    table: str
    since: str | None
    until: str
    rows: pa.Table
    previous: pa.Table | None = None

    @property
    def full(self) -> bool:
        """True when ``rows`` is the whole table (no ``since``)."""
        return self.since is None

    @property
    def inserts(self) -> pa.Table:
        """The ``insert`` rows (without ``_change``/``_commit_lsn``)."""
        return _side(self.rows, "insert")

    @property
    def deletes(self) -> pa.Table:
        """The ``delete`` rows (without ``_change``/``_commit_lsn``)."""
        return _side(self.rows, "delete")


def _side(rows: pa.Table, kind: str) -> pa.Table:
    import pyarrow.compute as pc

    picked = rows.filter(pc.equal(rows.column(CHANGE), kind))
    return picked.drop_columns([c for c in (CHANGE, COMMIT_LSN) if c in picked.column_names])


def is_incremental(context: dg.InputContext) -> bool:
    """Whether an input asks for changes: ``mooncake/incremental`` metadata, or typed :class:`MirrorChanges`."""
    if (context.definition_metadata or {}).get(INCREMENTAL):
        return True
    try:
        return context.dagster_type.typing_type is MirrorChanges
    except Exception:  # an input context without a Dagster type
        return False


def deletes_mode(context: dg.InputContext) -> str:
    """The input's ``mooncake/deletes`` metadata: ``rows`` (default) or ``keys``; ``ValueError`` (one
    line naming the input) for another value."""
    mode = str((context.definition_metadata or {}).get(DELETES) or "rows")
    if mode not in ("rows", "keys"):
        raise ValueError(f"input {context.name}: metadata {DELETES} must be 'rows' or 'keys', not {mode!r}")
    return mode


def incremental_inputs(op_def: dg.OpDefinition) -> list[str]:
    """The names of ``op_def``'s incremental inputs (same rule as :func:`is_incremental`)."""
    out = []
    for name, inp in op_def.ins.items():
        if (inp.metadata or {}).get(INCREMENTAL) or getattr(inp.dagster_type, "typing_type", None) is MirrorChanges:
            out.append(name)
    return out


def as_inserts(table: pa.Table) -> pa.Table:
    """A full read as a feed: ``table`` plus ``_change`` = ``insert`` and a null ``_commit_lsn``."""
    n = table.num_rows
    return table.append_column(CHANGE, pa.array(["insert"] * n, pa.string())).append_column(
        COMMIT_LSN, pa.nulls(n, pa.string())
    )


def project(feed: pa.Table, columns: list[str] | None) -> pa.Table:
    """``feed`` with only ``columns`` (plus ``_change``/``_commit_lsn``); all when ``columns`` is empty."""
    if not columns:
        return feed
    missing = [c for c in columns if c not in feed.column_names]
    if missing:
        raise ValueError(f"the mirror has no column {', '.join(map(repr, missing))} (columns: {feed.column_names})")
    return feed.select([*columns, CHANGE, COMMIT_LSN])


# ---------------------------------------------------------------------- cursor table
def read_cursor(con: duckdb.DuckDBPyConnection, op: str, input_name: str) -> dict[str, Any] | None:
    """The cursor row ``{"mirror", "lsn", "output", "run_id"}`` of (op, input), None when there is none."""
    try:
        row = con.execute(
            f"SELECT mirror, lsn, output, run_id FROM {CURSORS} WHERE op = ? AND input = ?", [op, input_name]
        ).fetchone()
    except duckdb.CatalogException:  # no cursor table yet
        return None
    return None if row is None else dict(zip(("mirror", "lsn", "output", "run_id"), row))


def write_cursors(con: duckdb.DuckDBPyConnection, rows: list[dict[str, str]], output: str, run_id: str) -> None:
    """Upsert cursor rows (each ``{"op", "input", "mirror", "lsn"}``) naming ``output`` (``schema.table``)."""
    con.execute(_CURSOR_DDL)
    now = datetime.now(UTC)
    for r in rows:
        con.execute(
            f"INSERT OR REPLACE INTO {CURSORS} VALUES (?, ?, ?, ?, ?, ?, ?)",
            [r["op"], r["input"], r["mirror"], r["lsn"], output, run_id, now],
        )


def read_output(con: duckdb.DuckDBPyConnection, output: str) -> pa.Table | None:
    """The stored output table ``output`` (``schema.table``), None when it is gone."""
    schema, _, table = output.partition(".")
    try:
        return con.execute(f'SELECT * FROM "{schema}"."{table}"').to_arrow_table()
    except duckdb.CatalogException:
        return None


# ---------------------------------------------------------------------- loading and committing
def _history_gone(e: Exception) -> bool:
    """A feed refused because the cursor is no longer a cut the service keeps (then: read it all again)."""
    text = str(e)
    return "no changes before" in text or "is not a cut" in text


class _PendingCursors:
    """Cursors read by steps still running, waiting for their output: ``(run id, step key)`` → rows
    ``{"op", "input", "mirror", "lsn", "database"}`` (``database``: the asset database the cursor was
    read from, where it must be written back). One per process, shared by every I/O manager."""

    def __init__(self):
        self._rows: dict[tuple[str, str], list[dict[str, str]]] = {}
        self._lock = threading.Lock()

    def of(self, step: tuple[str, str] | None, database: str | None = None) -> list[dict[str, str]]:
        """The step's rows (of ``database`` only, when given)."""
        if step is None:
            return []
        with self._lock:
            rows = list(self._rows.get(step, []))
        return rows if database is None else [r for r in rows if r["database"] == database]

    def put(self, step: tuple[str, str], row: dict[str, str]) -> None:
        """Add ``row``, replacing the step's row of the same input."""
        with self._lock:
            mine = [p for p in self._rows.get(step, []) if p["input"] != row["input"]]
            self._rows[step] = [*mine, row]

    def drop(self, step: tuple[str, str] | None, database: str | None = None) -> None:
        """Forget the step's rows (of ``database`` only, when given)."""
        if step is None:
            return
        with self._lock:
            left = [] if database is None else [r for r in self._rows.get(step, []) if r["database"] != database]
            if left:
                self._rows[step] = left
            else:
                self._rows.pop(step, None)


_PENDING = _PendingCursors()


def asset_database(context: dg.InputContext | dg.OutputContext) -> str | None:
    """The asset database of the I/O manager handling ``context`` (its ``database`` config)."""
    try:
        return str(context.resource_config["database"])
    except Exception:  # a context built outside a run
        return None


class CursorKeeper:
    """The incremental side of the I/O manager: loads :class:`MirrorChanges` and commits cursors.

    ``replication``: the :class:`~mooncake_assets.dagster.resources.replication.ReplicationResource`.
    Per step (``(run id, step key)``) it keeps the cut LSN its incremental inputs end at (when there
    are several); the cursors waiting for the step's output are kept per process (:data:`_PENDING`):
    :meth:`commit` writes those of the output's asset database in the output's DuckDB transaction,
    :meth:`forget` drops them."""

    def __init__(self, replication):
        self._replication = replication
        self._until: dict[tuple[str, str], str] = {}  # step -> the consistent cut its incremental inputs end at
        self._catalog = None

    @staticmethod
    def pending(step: tuple[str, str] | None, database: str | None = None) -> list[dict[str, str]]:
        """The step's cursors waiting for its output (read from ``database`` only, when given)."""
        return _PENDING.of(step, database)

    def forget(self, step: tuple[str, str] | None, database: str | None = None) -> None:
        _PENDING.drop(step, database)
        self._until.pop(step, None)

    def _step_cut(self, context: dg.InputContext, step: tuple[str, str] | None) -> str | None:
        """The LSN every incremental input of the step ends at when it has several (a consistent cut
        taken once for the step: every mirror committed and tagged at one LSN), else None (the table's
        current snapshot)."""
        if step is None or len(incremental_inputs(context.op_def)) < 2:
            return None
        if step not in self._until:
            res = self._replication.call("cut", timeout=self._replication.call_timeout_s)
            self._until[step] = res["lsn"]
            context.log.info(f"incremental inputs of this step end at the consistent cut {res['tag']}")
        return self._until[step]

    def snapshot(self, table: str, lsn: str | None, columns: list[str] | None) -> tuple[pa.Table, str]:
        """The whole mirror at a persisted cut (``lsn``; None: its current snapshot) and that cut's LSN."""
        from mooncake_assets.engine.iceberg import make_catalog
        from mooncake_assets.engine.lsn import Lsn
        from mooncake_assets.engine.read.cuts import read_snapshot
        from mooncake_assets.engine.service.registry import NAMESPACE
        from mooncake_assets.engine.storage import catalog_properties

        if self._catalog is None:
            s = self._replication.settings()
            self._catalog = make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s))
        data, at = read_snapshot(
            self._catalog, NAMESPACE, table, None if lsn is None else int(Lsn.parse(lsn)), columns or None
        )
        return data, str(at)

    def load(self, context: dg.InputContext, step, table: str, columns: list[str] | None, connect) -> MirrorChanges:
        """The :class:`MirrorChanges` of input ``context`` (mirror ``table``); ``connect()``: a context
        manager yielding the asset database's connection. The cursor found is kept as pending for the
        step (:meth:`commit`)."""
        from mooncake_assets.engine.service import ServiceError

        if context.has_partition_key:
            raise ValueError(
                f"input {context.name}: incremental mirror inputs keep one cursor per asset; "
                "a partitioned asset cannot have one"
            )
        op = context.op_def.name
        deletes = deletes_mode(context)
        with connect() as con:
            cursor = read_cursor(con, op, context.name)
            previous = read_output(con, cursor["output"]) if cursor and cursor["mirror"] == table else None
        until = self._step_cut(context, step)
        out = None
        read_back = 0
        if cursor is not None and previous is not None:
            try:
                sources: dict = {}
                end, feed = self._replication.changes(
                    table, cursor["lsn"], until or "persisted", deletes=deletes, sources=sources
                )
                out = MirrorChanges(table, cursor["lsn"], str(end), project(feed, columns), previous)
                read_back = _note_read_back(context, table, sources)
            except ServiceError as e:
                if not _history_gone(e):
                    raise
                context.log.warning(f"mirror {table}: {e}; reading the whole table again")
        elif cursor is not None:
            context.log.warning(
                f"mirror {table}: the output stored with this input's cursor ({cursor['output']}) is gone "
                "or read another mirror; reading the whole table again"
            )
        if out is None:
            data, at = self.snapshot(table, until, columns)
            out = MirrorChanges(table, None, at, as_inserts(data), None)
        if step is not None:
            row = {
                "op": op,
                "input": context.name,
                "mirror": table,
                "lsn": out.until,
                "database": asset_database(context),
            }
            _PENDING.put(step, row)
        _input_metadata(context, out, read_back)
        return out

    def commit(
        self, con: duckdb.DuckDBPyConnection, step, output: str, run_id: str, database: str | None = None
    ) -> None:
        """Write the step's pending cursors read from ``database`` (None: all) with ``output``
        (``schema.table``) on ``con``, inside the output's transaction."""
        rows = _PENDING.of(step, database)
        if rows:
            write_cursors(con, rows, output, run_id)


def _note_read_back(context: dg.InputContext, table: str, sources: dict) -> int:
    """Warn in the run's log when the feed read whole deleted rows back from data files because the
    source's replica identity sends only keys (what to do about it: ``identity_note``); returns how
    many rows it read back."""
    from mooncake_assets.engine.table.changes import identity_note

    note = identity_note(sources, table, f'input metadata "{DELETES}": "keys"')  # (None when deletes are keys)
    if note:
        context.log.warning(f"input {context.name}: {note}")
    return int(sources.get("rows_read") or 0)


def _input_metadata(context: dg.InputContext, out: MirrorChanges, read_back: int = 0) -> None:
    import pyarrow.compute as pc

    inserts = int(pc.sum(pc.equal(out.rows.column(CHANGE), "insert")).as_py() or 0)
    try:
        context.add_input_metadata(
            {
                "mooncake/table": out.table,
                "mooncake/since": out.since or "",
                "mooncake/lsn": out.until,
                "mooncake/full_read": out.full,
                "mooncake/inserts": inserts,
                "mooncake/deletes": out.rows.num_rows - inserts,
                "mooncake/deleted_rows_read": read_back,  # whole deleted rows read back from data files
            }
        )
    except Exception:  # metadata is best effort (not every context records input metadata)
        pass


def read_mirror_at(replication, table: str, lsn: str | None, columns: list[str] | None = None) -> pa.Table:
    """The whole mirror ``table`` at the persisted cut ``lsn`` (``X/Y``; None: its current snapshot),
    read from the warehouse (``engine/read/cuts.py:read_snapshot``); e.g. to check an incremental
    result against a full recompute at the LSN it reached. ``LookupError`` when no retained snapshot is
    at ``lsn``."""
    return CursorKeeper(replication).snapshot(table, lsn, columns)[0]
