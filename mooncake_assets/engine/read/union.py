"""Union read through DuckDB (docs/architecture.md#union-read).

For each mirrored table the reader asks the service for a ReadState at one LSN — the data files
(persisted in Iceberg or flushed and staged locally), each with its deleted positions as a portable
Roaring bitmap, and a Flight ticket for the committed in-memory rows — and registers a DuckDB view
named after the table. Applying the deletions is where a union read wins or loses, so the view is
built from per-file plans (:mod:`.plan`):

- files without deletes: **one** plain ``read_parquet([...])`` (projection, filter and row-group
  pushdown as for any Parquet scan);
- a file with deletes is split at its row groups: row groups whose rows are all deleted are not
  read at all, row groups without deletes are read plainly (a ``file_row_number BETWEEN`` range, which
  DuckDB prunes row groups with), and only the row groups with some deletes pay for the positions;
- the positions are applied one of two ways (``mode``):

  ``lazy``  — in DuckDB: ``get_bit(<DV as a BIT string>, file_row_number) = 0``, the files' bitmaps
             joined on ``file_index`` to one shared scan of the files read whole (or to a
             file's own branches when it has row groups to skip). The view stays lazy: DuckDB pushes
             projections and filters into the Parquet scan and tests positions only on the rows that
             survive them (selective queries, ``LIMIT``, arbitrary SQL over :meth:`register`).
  ``arrow`` — in PyArrow, when the columns a query needs are known: each file's surviving row groups
             are read (only those columns, decoded on Arrow's threads) and a keep mask built from the bitmap is
             attached as a column that DuckDB filters on. For scans, the cheapest (no hash table, no
             per-row function call).
  ``anti``  — the baseline: one ``ANTI JOIN`` on ``file_row_number`` per file with deletes.

- the in-memory rows: the Arrow table from Flight, ``UNION ALL BY NAME``.

After a schema change (the ReadState carries ``fields``) files have several layouts: every
``read_parquet`` gets a ``schema`` map (field id → today's name, type and default), and ``arrow``
reads go the ``lazy`` way (PyArrow's column reads go by name).

:meth:`query` picks the mode per statement from DuckDB's own parse tree (``json_serialize_sql``):
a statement without ``WHERE``/``HAVING``/``QUALIFY``/join conditions/``LIMIT``/``SAMPLE`` reads whole
tables, so it gets ``arrow`` with the referenced columns only; any other statement gets ``lazy``,
except when the files with deletes hold at most :data:`MEM_TABLE_ROWS` live rows in all: then
``arrow``, whose rows a long-lived reader holds as a DuckDB table until a vector changes (a scan of
it costs less per query than the bitmap join of ``lazy``).
Both modes return the same rows (tests/engine/test_union_read.py checks every mode against the
expected rows). Only the tables a statement names are registered.

**Read-your-writes**: with a DSN, the reader first asks Postgres for ``pg_current_wal_lsn()`` (or,
when it cannot connect, e.g. without the password only the service was given, the service's view of
it from ``status``) and waits (``wait_timeout`` seconds, then ``TimeoutError`` naming both LSNs) until the service has
applied every commit before it.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast

import duckdb
import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import FrozenBitMap64

from ..storage.arrow_fs import arrow_source
from ..storage.duckdb_s3 import ensure_duckdb_store, sql_str
from ..storage.stores import kind_of_scheme, scheme
from ..table.read_state import FileState, ReadField, ReadState
from .cache import DEFAULT_BUDGET, ReadCache
from .missing import MirrorNotReadable, explain_missing, missing_table
from .plan import FilePlan
from .sandbox import confine_to_service
from .source_lsn import SourceLsn

MODES = ("auto", "lazy", "arrow", "anti")
# DuckDB scans registered Arrow tables through Acero, which warns once per batch about buffers that
# arrived unaligned from Flight's IPC stream; they are read correctly on every platform we run on.
os.environ.setdefault("ACERO_ALIGNMENT_HANDLING", "ignore")

_POOL: ThreadPoolExecutor | None = None
#: in-memory rows up to this many are held as a DuckDB temp table between queries (UnionReader._keep_mem_table)
MEM_TABLE_ROWS = 65_536
PARALLEL_ROWS = 200_000  # read object-store files with deletes side by side when they hold at least this many rows


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)), thread_name_prefix="mooncake-read")
    return _POOL


def current_wal_lsn(dsn: str) -> str:
    """``pg_current_wal_lsn()`` of the source, as ``X/Y`` text."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return cast(tuple[str], c.execute("SELECT pg_current_wal_lsn()::text").fetchone())[0]  # one row


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


class ReadOnlyError(ValueError):
    """A statement that is not a read (``DELETE``, ``COPY … TO``, DDL…): mirrors are changed through
    their source only."""


#: The statement types (DuckDB's ``StatementType`` names, as ``extract_statements`` reports them) that
#: :meth:`UnionReader.query` runs; any other is refused with :class:`ReadOnlyError`.
READ_STATEMENTS = ("SELECT", "EXPLAIN")


def refused_statement(sql: str, con: duckdb.DuckDBPyConnection) -> str | None:
    """The first statement type of ``sql`` that is not a SELECT or EXPLAIN (DuckDB's own statement types,
    from ``extract_statements``; ``FROM t``, ``SHOW``, ``DESCRIBE`` and ``SUMMARIZE`` are SELECTs), as
    words (``"DELETE"``, ``"COPY"``); None when every one is a read, or when DuckDB cannot parse ``sql``
    (its own error then reports it when the query runs)."""
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error:
        return None
    for st in statements:
        kind = st.type.name
        if kind not in READ_STATEMENTS:
            return kind.replace("_", " ")
    return None


def check_read_only(sql: str, con: duckdb.DuckDBPyConnection) -> None:
    """Raise :class:`ReadOnlyError` unless every statement of ``sql`` is a read (:func:`refused_statement`)."""
    _raise_refused(refused_statement(sql, con))


def _raise_refused(kind: str | None) -> None:
    if kind is not None:
        raise ReadOnlyError(
            f"queries are read-only: {kind} is refused (mirrors change "
            "only through their source table in Postgres; run SELECT or EXPLAIN)"
        )


def execute_arrow(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None) -> pa.Table:
    """The Arrow result of ``sql`` (with ``params``) on ``con``. DuckDB 1.5 may push a join's bloom
    filter into the scan of a registered Arrow table (the files with deletes, the in-memory rows),
    which its PyArrow scan refuses ("Pushdown Filter Type BLOOM_FILTER is not currently supported in
    PyArrow Scans"); such a statement is run again with the join filter pushdown optimizer off, for
    this statement only (the same rows; only the plan differs)."""

    def run() -> pa.Table:
        return (con.execute(sql, params) if params else con.execute(sql)).to_arrow_table()

    try:
        return run()
    except duckdb.NotImplementedException as e:
        if "BLOOM_FILTER" not in str(e):
            raise
    row = con.execute("SELECT current_setting('disabled_optimizers')").fetchone()
    before = str(row[0]) if row and row[0] else ""
    off = ",".join(x for x in (before, "join_filter_pushdown") if x)
    con.execute(f"SET disabled_optimizers = '{off}'")
    try:
        return run()
    finally:
        con.execute(f"SET disabled_optimizers = '{before}'")


class StatementInfo:
    """What a SQL statement needs from the mirrored tables, read from DuckDB's parse tree.

    ``tables``: lower-cased names of every base table referenced; ``columns``: lower-cased names of
    every column referenced anywhere (a superset of what any one table needs), None when some
    ``*``/``COLUMNS(...)`` needs them all; ``whole``: True when nothing restricts the rows read
    (no WHERE/HAVING/QUALIFY/join condition/LIMIT/SAMPLE). ``parsed``: False when DuckDB could not
    serialize the statement (not a SELECT): then nothing is known and everything is assumed needed.
    ``refused``: the first statement type that is not a read (:func:`refused_statement`), else None.
    """

    def __init__(self, sql: str, con: duckdb.DuckDBPyConnection):
        self.refused = refused_statement(sql, con)
        self.tables: set[str] = set()
        self.columns: set[str] | None = set()
        self.whole = True
        self.parsed = False
        try:
            doc = json.loads(cast(tuple[str], con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone())[0])
        except duckdb.Error:
            doc = {"error": True}
        if doc.get("error"):
            self.columns = None
            self.whole = False
            return
        self.parsed = True
        self._walk(doc.get("statements", []))

    def _walk(self, node: Any) -> None:
        if isinstance(node, list):
            for x in node:
                self._walk(x)
            return
        if not isinstance(node, dict):
            return
        cls = node.get("class")
        if cls == "COLUMN_REF":
            if self.columns is not None:
                self.columns.update(str(n).lower() for n in node.get("column_names", []))
        elif cls in ("STAR", "COLUMNS"):
            self.columns = None
        if node.get("type") == "BASE_TABLE" and node.get("table_name"):
            self.tables.add(str(node["table_name"]).lower())
        if node.get("type") in ("LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER"):
            self.whole = False
        for key in ("where_clause", "having", "qualify", "condition", "sample"):
            if node.get(key) is not None:
                self.whole = False
        if node.get("using_columns"):
            self.whole = False
        for v in node.values():
            if isinstance(v, (dict, list)):
                self._walk(v)


class ReadStateSource(Protocol):
    """What a union read needs from the replication service (the service's Flight client is one; tests
    pass in-process doubles). LSNs are Postgres ``X/Y`` text."""

    def read_state(self, table: str, lsn: str | None = None) -> ReadState: ...

    def fetch(self, ticket: str) -> pa.Table: ...

    def status(self) -> dict[str, Any]: ...

    def wait_lsn(self, lsn: str, timeout: float = 30.0) -> dict[str, Any]: ...


class BatchedStateSource(ReadStateSource, Protocol):
    """A source that answers a union read in one round trip (the service's ``read_states`` action,
    :meth:`~..service.client.ServiceClient.read_states`): wait for ``wait_lsn``, then the ReadStates of
    ``tables`` (or of the mirrors whose lower-cased names are in ``match``; None: all) at ``lsn``, each
    with its in-memory rows in ``mem``. Readers use it when their client has it."""

    def read_states(
        self,
        tables: list[str] | None = None,
        match: list[str] | None = None,
        lsn: str | None = None,
        wait_lsn: str | None = None,
        timeout: float = 30.0,
    ) -> list[ReadState]: ...


class UnionReader:
    """Registers mirrored tables as DuckDB views over one ReadState each and runs SQL on them.

    ``client``: a :class:`ReadStateSource` (the service's ``ServiceClient``, or anything with ``read_state(table, lsn)``, ``fetch(ticket)``,
    ``status()`` and ``wait_lsn(lsn, timeout)``; None when only :meth:`register_state` is used);
    ``dsn``: the source DSN for the read-your-writes barrier (None = no barrier);
    ``con``: an existing DuckDB connection to register into (else a new one, with DuckDB's Parquet
    metadata cache on); ``mode``: how deletes are
    applied (module docstring): ``auto`` (per statement), ``lazy``, ``arrow`` or ``anti``;
    ``cache_bytes``: the byte budget of the reader's :class:`~.cache.ReadCache`; ``hold_rows``: keep,
    between queries, the live rows already read from files with deletes (and a view's registration
    while its ReadState is the same object); False: every query reads them again, as a query after a
    change must (what the benchmark's ratios against a clean Parquet scan time).

    **Keep one reader** for many queries: it keeps, between them, its DuckDB connection (and the views,
    whose DDL is re-run only when a table's files or layout changed), one Postgres connection for the
    read-your-writes barrier, and its :class:`~.cache.ReadCache` (Parquet footers, decoded deletion
    vectors, plans and keep masks of the files still read). Per query it then pays one
    ``pg_current_wal_lsn()`` (with a DSN), **one** round trip to the service (wait, ReadStates and
    in-memory rows together: :class:`BatchedStateSource`) and what changed; while nothing changed in
    the service (its read board, :mod:`..service.board`), not even that round trip, and no
    registration either (the client returns the same ReadState objects, whose views stand). :meth:`close` ends the
    connections. One thread at a time.
    """

    def __init__(
        self,
        client: ReadStateSource | None,
        dsn: str | None = None,
        con: duckdb.DuckDBPyConnection | None = None,
        wait_timeout: float = 30.0,
        mode: str = "auto",
        cache_bytes: int = DEFAULT_BUDGET,
        hold_rows: bool = True,
        confine: bool | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.client = client
        self.dsn = dsn
        #: confine the connection to the service's data roots before the first statement runs
        #: (:mod:`.sandbox`); None: when the reader has a service and makes its own connection
        self.confine = (client is not None and con is None) if confine is None else confine
        if con is None:
            con = duckdb.connect()
            # data files are immutable (a new name per file): their footers may be kept across queries
            con.execute("SET parquet_metadata_cache = true")
        self.con = con
        self.cache = ReadCache(cache_bytes)
        self._source = SourceLsn(dsn) if dsn else None  # the barrier's pg_current_wal_lsn(), one kept connection
        self._registered: dict[str, object] = {}  # Arrow object name -> the object registered under it
        self._dv_tables: dict[str, tuple[Any, pa.Table]] = {}  # view -> (its files' vectors, the DV temp table's rows)
        self.wait_timeout = wait_timeout
        self.mode = mode
        self.hold_rows = hold_rows
        self.states: dict[str, ReadState] = {}
        self._objects: dict[str, list[str]] = {}  # view -> Arrow objects registered for it
        self._views: dict[str, str] = {}  # view -> the DDL it was created with
        self._infos: dict[str, StatementInfo] = {}
        self._storage: dict[str, Any] | None = None  # the ReadState ``storage`` hints applied to ``con``
        self._mem: dict[str, pa.Table] = {}  # view -> its in-memory rows (as the service sent them)
        self._mem_tables: dict[str, pa.Table] = {}  # view -> the rows its __mc_memt_ temp table holds
        self._masked: dict[str, tuple[Any, pa.Table]] = {}  # view -> (its arrow-mode files and columns, their rows)
        self._dirty_tables: dict[str, Any] = {}  # view -> the files and columns its __mc_dirtyt_ temp table holds
        # view -> (the ReadState object, mode, columns) query() last registered it over: the same object
        # again (ServiceClient.read_states answered from the read board) needs no registration at all
        self._fresh: dict[str, tuple[ReadState, str, list[str] | None]] = {}

    def barrier(self) -> str | None:
        """Wait until the service has applied everything committed in Postgres so far; returns that LSN."""
        lsn = self._barrier_lsn()
        if lsn is not None:
            cast(ReadStateSource, self.client).wait_lsn(lsn, timeout=self.wait_timeout)
        return lsn

    def close(self) -> None:
        """Close the reader's Postgres and DuckDB connections (the reader is not used after)."""
        if self._source is not None:
            self._source.close()
        self.con.close()

    def barrier_lsn(self) -> str | None:
        """The LSN the read-your-writes barrier waits for, without waiting: the source's current LSN
        (``X/Y``; None without a DSN). Pass it as :meth:`register`'s ``wait_lsn``."""
        return self._barrier_lsn()

    def _barrier_lsn(self) -> str | None:
        """The LSN the read-your-writes barrier waits for: the source's current LSN (None without a DSN)."""
        if self._source is None:
            return None
        client = cast(ReadStateSource, self.client)  # a reader with a DSN reads through its client
        lsn: str | None
        try:
            lsn = self._source.current()
        except psycopg.OperationalError:
            # this process may lack the source's password (it is kept in no file; engine/pg/conninfo.py):
            # the service has it, and reports the source's current LSN in its status
            try:
                lsn = client.status().get("source_lsn")
            except Exception:
                lsn = None
            if not lsn:
                raise
        return lsn

    def _fetch(
        self, tables: list[str] | None, match: list[str] | None, lsn: str | None, wait: str | None
    ) -> list[tuple[str, ReadState]]:
        """(name, ReadState with ``mem`` set) of ``tables``, or of the readable mirrors named in ``match``
        (lower-cased; None: all), at ``lsn``, once ``wait`` is applied: one round trip when the client
        has ``read_states``, else ``wait_lsn``, ``status``, then ``read_state`` + ``fetch`` per table."""
        client = cast(ReadStateSource, self.client)  # None only for readers fed by register_state
        batched = getattr(client, "read_states", None)
        if batched is not None:
            states = cast(BatchedStateSource, client).read_states(
                tables=tables, match=match, lsn=lsn, wait_lsn=wait, timeout=self.wait_timeout
            )
            return list(zip(tables, states)) if tables is not None else [(rs.table, rs) for rs in states]
        if wait is not None:
            client.wait_lsn(wait, timeout=self.wait_timeout)
        if tables is None:
            names = [t["name"] for t in client.status()["tables"] if t.get("state") != "copying"]
            tables = [t for t in names if t.lower() in match] if match is not None else names
        out = []
        for t in tables:
            rs = client.read_state(t, lsn)
            out.append((t, rs.with_(mem=client.fetch(cast(str, rs.ticket)))))  # a service's ReadState carries a ticket
        return out

    # ------------------------------------------------------------------ registration
    def register(
        self,
        table: str,
        lsn: str | None = None,
        view: str | None = None,
        columns: list[str] | None = None,
        mode: str | None = None,
        wait_lsn: str | None = None,
    ) -> ReadState:
        """Create view ``view`` (default: the table's name) over the table's ReadState at ``lsn``.

        ``columns``: project to these columns only. ``mode``: ``lazy`` (default unless the reader was
        made with another fixed mode), ``arrow`` or ``anti``. ``wait_lsn``: first wait until the
        service has applied this LSN (in the same round trip; :meth:`barrier_lsn` gives the barrier's).
        Returns the :class:`ReadState`."""
        return self._register(table, lsn, wait_lsn, view, columns, mode)

    def _register(
        self,
        table: str,
        lsn: str | None,
        wait: str | None,
        view: str | None = None,
        columns: list[str] | None = None,
        mode: str | None = None,
    ) -> ReadState:
        ((_, got),) = self._fetch([table], None, lsn, wait)
        rs, mem = got.with_(mem=None), cast(pa.Table, got.mem)
        if mode is None:
            mode = "lazy" if self.mode == "auto" else self.mode
        self.register_state(rs, mem, view or table, columns=columns, mode=mode)
        return rs

    def register_state(
        self, rs: ReadState, mem: pa.Table, view: str, columns: list[str] | None = None, mode: str = "lazy"
    ) -> None:
        """Create view ``view`` over a ReadState ``rs`` (its ``files`` and ``schema``) and its in-memory
        rows ``mem``, applying deletes the ``mode`` way (module docstring)."""
        if mode not in ("lazy", "arrow", "anti"):
            raise ValueError(f"mode must be lazy, arrow or anti, not {mode!r}")
        self._fresh.pop(view, None)
        storage = rs.storage
        if storage and storage != self._storage:  # object store: the service's endpoint, our credentials
            ensure_duckdb_store(self.con, storage)
            self._storage = storage  # applied to this connection: the next read of the same store skips it
        objs: dict[str, object] = {}
        cols = list(columns or rs.schema)
        sel = ", ".join(_ident(c) for c in cols)
        parts = []
        clean = [f.path for f in rs.files if not f.deleted]
        dirty = [f for f in rs.files if f.deleted]
        # after a schema change files have several layouts: DuckDB maps their columns by field id
        opts = _schema_option(rs.fields) if rs.fields else ""
        if opts and mode == "arrow":
            mode = "lazy"
        if mode == "arrow" and rs.files and sum(f.live_rows for f in rs.files) <= MEM_TABLE_ROWS:
            clean, dirty = [], list(rs.files)  # a small table: every file's live rows held as one DuckDB table
        if clean:
            parts.append(f"SELECT {sel} FROM read_parquet([{', '.join(sql_str(p) for p in clean)}]{opts})")
        if mode != "arrow":  # what an arrow-mode query of the view held goes
            self._drop_dirty_table(view)
            self._masked.pop(view, None)
        # Arrow objects keep one name per view and role, so an unchanged plan reuses the view as it is
        if mode == "anti":
            for i, f in enumerate(dirty):
                name = f"__mc_del_{view}_{i}"
                pos = self.cache.positions(f.path, cast(FrozenBitMap64, f.deleted))
                objs[name] = pa.table({"pos": pa.array(pos.astype(np.int64))})
                parts.append(
                    f"SELECT {sel} FROM read_parquet({sql_str(f.path)}, file_row_number = true{opts}) d "
                    f"ANTI JOIN {_ident(name)} x ON d.file_row_number = x.pos"
                )
        elif mode == "lazy":
            plans = [self.cache.plan(f.path, f.rows, cast(FrozenBitMap64, f.deleted)) for f in dirty]
            dv_name = f"__mc_dv_{view}"
            parts.extend(_lazy_parts(plans, cols, dv_name, objs, opts))
            self._keep_dv_table(view, dv_name, objs.pop(dv_name, None), tuple((f.path, f.deleted) for f in dirty))
        else:  # arrow
            parts.extend(self._masked_part(view, dirty, cols, sel, objs))
        mem_name = f"__mc_mem_{view}"
        mem = _same_empty(self._registered.get(mem_name), mem)
        self._mem[view] = mem
        if self._keep_mem_table(view, mem):  # small and non-empty: a DuckDB temp table, no Arrow scan
            parts.append(f"SELECT {sel} FROM {_ident(f'__mc_memt_{view}')}")
        else:
            objs[mem_name] = mem
            # no in-memory rows: ``WHERE false`` keeps the branch's types in the union (so a view's column
            # types never depend on whether rows are buffered) while DuckDB's optimizer drops its Arrow
            # scan, which costs about a millisecond of CPU per query even when empty (bench/delete_paths.py)
            parts.append(f"SELECT {sel} FROM {_ident(mem_name)}" + (" WHERE false" if mem.num_rows == 0 else ""))
        for name in set(self._objects.get(view, [])) - set(objs):
            self._unregister(name)
        for name, obj in objs.items():
            if self._registered.get(name) is not obj:  # an unchanged object (a view's DV table) stays
                self.con.register(name, obj)
                self._registered[name] = obj
        body = "\nUNION ALL BY NAME\n".join(parts)
        ddl = f"CREATE OR REPLACE TEMP VIEW {_ident(view)} AS SELECT {sel} FROM ({body})"
        if self._views.get(view) != ddl:
            self.con.execute(ddl)
            self._views[view] = ddl
        self._objects[view] = list(objs)
        self.states[view] = rs
        # the cache keeps only what files still read need (compacted or fully deleted files go)
        self.cache.retain(f.path for st in self.states.values() for f in st.files)

    def _masked_part(
        self, view: str, dirty: list[FileState], cols: list[str], sel: str, objs: dict[str, object]
    ) -> list[str]:
        """The arrow-mode branch of a view over its files with deletes (:func:`_read_masked`; none: []),
        or over all its files when they hold at most :data:`MEM_TABLE_ROWS` live rows together.

        A file never changes and a deletion vector is a value, so while a view's files, their vectors
        and the columns are unchanged its live rows are exactly those of the last query. Up to
        :data:`MEM_TABLE_ROWS` of them are held as the DuckDB temp table ``__mc_dirtyt_<view>``, written
        once per change (a DuckDB table costs a fraction of a millisecond per query, a registered Arrow
        table several). More are registered as Arrow (``objs``), the same object again while unchanged
        when they fit in a quarter of the reader's cache budget (DuckDB keeps the registration and
        PyArrow reads nothing); larger ones are read again."""
        held_name = f"__mc_dirtyt_{view}"
        if not dirty:
            self._drop_dirty_table(view)
            return []
        key = (tuple(cols), tuple((f.path, f.rows, f.deleted) for f in dirty))
        if self.hold_rows and self._dirty_tables.get(view) == key:
            return [f"SELECT {sel} FROM {_ident(held_name)}"]
        prev = self._masked.get(view) if self.hold_rows else None
        rows = prev[1] if prev is not None and prev[0] == key else _read_masked(dirty, cols, self.cache)
        if int(pc.sum(rows["__mc_keep"]).as_py() or 0) <= MEM_TABLE_ROWS:
            _temp_table(self.con, held_name, rows, sel, " WHERE __mc_keep")
            self._dirty_tables[view] = key
            self._masked.pop(view, None)
            return [f"SELECT {sel} FROM {_ident(held_name)}"]
        self._drop_dirty_table(view)
        if self.hold_rows and rows.nbytes <= self.cache.budget_bytes // 4:
            self._masked[view] = (key, rows)
        else:
            self._masked.pop(view, None)
        name = f"__mc_dirty_{view}"
        objs[name] = rows
        return [f"SELECT {sel} FROM {_ident(name)} WHERE __mc_keep"]

    def _drop_dirty_table(self, view: str) -> None:
        if self._dirty_tables.pop(view, None) is not None:
            self.con.execute(f"DROP TABLE IF EXISTS {_ident(f'__mc_dirtyt_{view}')}")

    def _keep_dv_table(self, view: str, name: str, dv: pa.Table | None, key: tuple[Any, ...]) -> None:
        """Hold a lazy view's bitmaps (``dv``: the Arrow table :func:`_lazy_parts` built; None when no file
        needs them) as the DuckDB temp table ``name``, written again only when ``key`` (its files and
        their vectors) changed. A DuckDB table costs nothing per query, where a registered Arrow table
        costs an Arrow scan (about a millisecond of CPU, bench/delete_paths.py) on every query."""
        prev = self._dv_tables.get(view)
        if dv is None:
            if prev is not None:
                self._drop_dv_table(view, name)
            return
        if prev is not None and prev[0] == key:
            return
        src = f"__mc_dvsrc_{view}"
        self.con.register(src, dv)
        try:
            # stored as BIT: the view's ``b::BIT`` is then no cast at all (a BLOB -> BIT cast of every
            # file's bit string would cost a pass over the vectors per query)
            self.con.execute(
                f"CREATE OR REPLACE TEMP TABLE {_ident(name)} AS SELECT i, c, b::BIT AS b FROM {_ident(src)}"
            )
        finally:
            self.con.unregister(src)
        self._dv_tables[view] = (key, dv)

    def _keep_mem_table(self, view: str, mem: pa.Table) -> bool:
        """Hold a view's in-memory rows ``mem`` as the DuckDB temp table ``__mc_memt_<view>`` when they are
        non-empty and at most :data:`MEM_TABLE_ROWS` rows; True when they are held so. The table is
        written again only when the rows differ from the ones it holds (``pa.Table.equals``: same schema,
        same values): a long-lived reader querying an unchanged buffer then scans a DuckDB table (a
        fraction of a millisecond) instead of the registered Arrow table (several milliseconds of CPU
        per query, even for a few rows). Larger buffers stay registered Arrow (copying them would cost
        more than the scan it saves); the table is dropped then."""
        name = f"__mc_memt_{view}"
        held = self._mem_tables.get(view)
        if mem.num_rows == 0 or mem.num_rows > MEM_TABLE_ROWS:
            if held is not None:
                self._drop_mem_table(view)
            return False
        if held is mem or (
            held is not None and held.schema.equals(mem.schema, check_metadata=True) and held.equals(mem)
        ):
            return True
        _temp_table(self.con, name, mem)
        self._mem_tables[view] = mem
        return True

    def _drop_mem_table(self, view: str) -> None:
        if self._mem_tables.pop(view, None) is not None:
            self.con.execute(f"DROP TABLE IF EXISTS {_ident(f'__mc_memt_{view}')}")

    def _drop_dv_table(self, view: str, name: str) -> None:
        self._dv_tables.pop(view, None)
        self.con.execute(f"DROP TABLE IF EXISTS {_ident(name)}")

    def _unregister(self, name: str) -> None:
        self._registered.pop(name, None)
        try:
            self.con.unregister(name)
        except duckdb.Error:
            pass

    # ------------------------------------------------------------------ reads
    def _reach(self, lsn: str | None) -> None:
        """Before a read: the barrier (``lsn`` None), or wait until the service has applied ``lsn`` (a read
        at an LSN the mirror has not reached would silently return older data); ``TimeoutError`` naming
        both LSNs after ``wait_timeout`` seconds."""
        if lsn is None:
            self.barrier()
        else:
            cast(ReadStateSource, self.client).wait_lsn(lsn, timeout=self.wait_timeout)

    def query(
        self, sql: str, tables: list[str] | None = None, lsn: str | None = None, params: list[Any] | None = None
    ) -> pa.Table:
        """Run ``sql`` over the named mirrored tables (default: the mirrored tables it references).

        ``sql``: SELECT/EXPLAIN statements only (else :class:`ReadOnlyError`, before anything is read).
        ``lsn``: read at this LSN (``X/Y``), once the service has applied it (``TimeoutError`` after
        ``wait_timeout`` s); None: the barrier first (when the reader has a DSN), then each table at
        what is applied. ``params``: values of the statement's ``$1``/``?`` placeholders (DuckDB
        prepared-statement parameters, never spliced into the text)."""
        info = self._infos.get(sql)
        if info is None:  # parsed once per statement text: its read-only verdict and what it reads
            info = self._infos[sql] = StatementInfo(sql, self.con)
            if len(self._infos) > 256:
                self._infos.pop(next(iter(self._infos)))
        _raise_refused(info.refused)
        match = sorted(info.tables) if tables is None and info.parsed else None
        for t, got in self._fetch(tables, match, lsn, self._barrier_lsn() if lsn is None else lsn):
            mode, cols = self.mode, None
            if mode == "auto":
                mode = "arrow" if info.whole or _few_live_rows(got) else "lazy"
            if mode == "arrow" and info.columns is not None:
                cols = [c for c in got.schema if c.lower() in info.columns] or list(got.schema[:1])
            last = self._fresh.get(t) if self.hold_rows else None
            if last is not None and last[0] is got and last[1] == mode and last[2] == cols:
                continue  # the very state the view was registered over (the client's board fast path)
            self.register_state(got.with_(mem=None), cast(pa.Table, got.mem), t, columns=cols, mode=mode)
            self._fresh[t] = (got, mode, cols)
        if self.confine:  # once, after the first registration set up what the reads need
            confine_to_service(self.con, self.client)
            self.confine = False
        try:
            return execute_arrow(self.con, sql, params)
        except duckdb.CatalogException as e:
            self._raise_not_readable(e)
            raise

    def _raise_not_readable(self, e: duckdb.CatalogException) -> None:
        """:class:`~.missing.MirrorNotReadable` saying why, when ``e`` is DuckDB's "Table with name X does
        not exist" and the reader has a service to ask (copying, stopped, interrupted or no such mirror);
        returns otherwise (the caller re-raises ``e``)."""
        name = missing_table(str(e))
        if name is None or self.client is None:
            return
        try:
            status = self.client.status()
        except Exception:  # the service's answer is only the explanation: keep DuckDB's error
            return
        raise MirrorNotReadable(explain_missing(name, status)) from None

    def source_types(self, view: str) -> dict[str, str]:
        """Column name -> the source column's Postgres type (``format_type`` text, the ``pg_type`` field
        metadata of the mirror's schema) of a registered view, as its in-memory rows carry it; {} for a
        view not registered (or rows without the metadata)."""
        mem = self._mem.get(view)
        schema = getattr(mem, "schema", None)
        if schema is None:
            return {}
        out = {}
        for f in schema:
            t = (f.metadata or {}).get(b"pg_type")
            if t:
                out[f.name] = t.decode()
        return out

    def read_table(self, table: str, lsn: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """All visible rows of one mirrored table as Arrow (optionally projected)."""
        view = f"__mc_read_{table}"
        wait = self._barrier_lsn() if lsn is None else lsn
        self._register(table, lsn, wait, view=view, columns=columns, mode="arrow" if self.mode == "auto" else self.mode)
        try:
            return self.con.execute(f"SELECT * FROM {_ident(view)}").to_arrow_table()
        finally:
            self.con.execute(f"DROP VIEW IF EXISTS {_ident(view)}")
            self._views.pop(view, None)
            self._fresh.pop(view, None)
            self._drop_dv_table(view, f"__mc_dv_{view}")
            self._drop_mem_table(view)
            self._mem.pop(view, None)
            self._masked.pop(view, None)
            self._drop_dirty_table(view)
            for name in self._objects.pop(view, []):
                self._unregister(name)


def _same_empty(prev: object, mem: pa.Table) -> pa.Table:
    """``mem``, or ``prev`` (the object registered for a view's in-memory rows) when both are empty
    with the same schema (so an unchanged empty buffer costs no new DuckDB registration)."""
    if (
        mem.num_rows == 0
        and isinstance(prev, pa.Table)
        and prev.num_rows == 0
        and prev.schema.equals(mem.schema, check_metadata=True)
    ):
        return prev
    return mem


def _temp_table(con: duckdb.DuckDBPyConnection, name: str, rows: pa.Table, select: str = "*", where: str = "") -> None:
    """Write ``rows`` (``select`` of them, ``where`` kept) as the DuckDB temp table ``name``, replacing it."""
    src = f"__mc_src_{name}"
    con.register(src, rows)
    try:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {_ident(name)} AS SELECT {select} FROM {_ident(src)}{where}")
    finally:
        con.unregister(src)


def _few_live_rows(rs: ReadState) -> bool:
    """Whether the files with deletes of ``rs`` hold at most :data:`MEM_TABLE_ROWS` live rows in all
    (rows less the deletion vector's cardinality), in a table without a schema change (whose reads go
    the ``lazy`` way anyway)."""
    if rs.fields:
        return False
    live = sum(f.live_rows for f in rs.files if f.deleted)
    return 0 < live <= MEM_TABLE_ROWS


def _schema_option(fields: tuple[ReadField, ...]) -> str:
    """``read_parquet``'s ``schema`` argument for a ReadState's ``fields`` (id, name, type, default per
    current column): columns resolved by Parquet field id, renamed, cast to today's
    type, and a column a file lacks read as its default (text DuckDB casts) or NULL."""
    entries = []
    for f in fields:
        default = "CAST(NULL AS VARCHAR)" if f.default is None else sql_str(f.default)
        entries.append(f"{int(f.id)}: {{name: {sql_str(f.name)}, type: {sql_str(f.type)}, default_value: {default}}}")
    return ", schema = MAP {" + ", ".join(entries) + "}"


def _lazy_parts(
    plans: list[FilePlan], cols: list[str], dv_name: str, objs: dict[str, Any], opts: str = ""
) -> list[str]:
    """SQL branches reading files with deletes the lazy way (see :func:`.plan.plan_file`).

    Files read whole (one segment, some deletes) share **one** ``read_parquet`` whose
    ``file_index`` joins to their bitmaps; files with row groups to skip or to read plainly get one
    branch per segment. The bitmaps are one Arrow table ``dv_name`` (``i``: plan index, ``c``: index
    in the shared scan or -1, ``b``: the bit string), added to ``objs`` (the reader keeps it as a DuckDB
    temp table of that name: :meth:`UnionReader._keep_dv_table`)."""
    sel = ", ".join("d." + _ident(c) for c in cols)
    shared = [i for i, p in enumerate(plans) if len(p.segments) == 1 and p.segments[0].whole and p.needs_bits]
    pos_in_shared = {i: k for k, i in enumerate(shared)}
    rows = [(i, pos_in_shared.get(i, -1), p.dv_bits) for i, p in enumerate(plans) if p.needs_bits]
    if rows:
        objs[dv_name] = pa.table(
            {
                "i": pa.array([r[0] for r in rows], pa.int32()),
                "c": pa.array([r[1] for r in rows], pa.int32()),
                "b": pa.array([r[2] for r in rows], pa.binary()),
            }
        )
    dv = _ident(dv_name)
    out = []
    if shared:
        files = ", ".join(sql_str(plans[i].path) for i in shared)
        out.append(
            f"SELECT {sel} FROM read_parquet([{files}], file_row_number = true{opts}) d "
            f"JOIN (SELECT c, b::BIT AS b FROM {dv} WHERE c >= 0) m ON d.file_index = m.c "
            f"WHERE get_bit(m.b, d.file_row_number::INTEGER) = 0"
        )
    for i, p in enumerate(plans):
        if i in pos_in_shared:
            continue
        src = f"read_parquet({sql_str(p.path)}, file_row_number = true{opts}) d"
        for seg in p.segments:
            rng = "" if seg.whole else f"d.file_row_number BETWEEN {seg.start} AND {seg.stop - 1}"
            if seg.has_deletes:
                cond = "get_bit(m.b, d.file_row_number::INTEGER) = 0" + (f" AND {rng}" if rng else "")
                out.append(f"SELECT {sel} FROM {src}, (SELECT b::BIT AS b FROM {dv} WHERE i = {i}) m WHERE {cond}")
            else:
                out.append(f"SELECT {sel} FROM {src}" + (f" WHERE {rng}" if rng else ""))
    return out


def _read_masked(files: list[FileState], cols: list[str], cache: ReadCache) -> pa.Table:
    """Files with deletes read with PyArrow (columns ``cols``, row groups with live rows only), plus a
    ``__mc_keep`` boolean column that is False on deleted rows. Footers and masks come from ``cache``
    (looked up here, before any parallel read: the cache is single-threaded).

    Local files are read one after the other, each decoded by Arrow's own thread pool (one thread per
    core): a pool of ours reading files side by side on top of it ran more threads than cores — 5M
    rows in 7 files with 1 % deleted, two int columns, 2 cores: 34.4 ms CPU, 19.7 ms wall, against
    28.5 ms CPU, 21.1 ms wall one file at a time (the table scripts/probe_union_scan.py builds). Object-store
    files (``s3://``, ``gs://``, …) are still read side by side, where waiting on the network
    dominates."""
    known = {
        f.path: (cache.keep(f.path, f.rows, cast(FrozenBitMap64, f.deleted)), cache.metadata(f.path)) for f in files
    }

    def one(f: FileState) -> pa.Table:
        (live, keep), md = known[f.path]
        pf = pq.ParquetFile(arrow_source(f.path), metadata=md)  # s3:// through PyArrow's S3 filesystem
        if live is None:
            t = pf.read(columns=cols)
        else:
            t = pf.read_row_groups(list(live), columns=cols) if live else pf.schema_arrow.empty_table().select(cols)
        return t.append_column("__mc_keep", keep)

    tables = list(_pool().map(one, files)) if _side_by_side(files) else [one(f) for f in files]
    return pa.concat_tables(tables)


def _side_by_side(files: list[FileState]) -> bool:
    """Whether :func:`_read_masked` reads ``files`` side by side: several, holding at least
    :data:`PARALLEL_ROWS` rows together, one of them in an object store (a scheme
    :func:`~..storage.stores.kind_of_scheme` knows, as :func:`~..storage.arrow_fs.arrow_source` opens)."""
    remote = any(kind_of_scheme(scheme(f.path)) is not None for f in files)
    return remote and len(files) > 1 and sum(f.rows for f in files) >= PARALLEL_ROWS
