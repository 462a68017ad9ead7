"""Initial copy of a table at the replication slot's consistent point.

The slot's exported snapshot (``CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT``) is imported with
``SET TRANSACTION SNAPSHOT`` in a ``REPEATABLE READ, READ ONLY`` transaction (PG docs, "Snapshot
Synchronization Functions" / ``SET TRANSACTION``), so the copy sees exactly the rows committed before
the slot's consistent point, and the stream delivers exactly the transactions committed after it
(Postgres's own tablesync works this way).

Rows are read with ``COPY (SELECT cols FROM [ONLY] t) TO STDOUT (FORMAT csv)`` and parsed with
``pyarrow.csv``, every column as a string, then decoded column-wise by
:func:`~.types.decode_text_columns`. CSV keeps NULL (unquoted empty field) apart from ``''`` (quoted
empty field): the reader uses ``null_values=['']`` with ``quoted_strings_can_be_null=False``, and
``ignore_empty_lines=False`` so a single-column row holding NULL (an empty line) is kept.

The COPY data is read in blocks of whole rows (:func:`~.copyread.copy_blocks`: a compiled loop over
``PQgetCopyData``, no Python object per row), each block one batch handed to ``pyarrow.csv``.

Ranged, parallel copy: with ``parallel > 1`` (and a ``connect`` for more connections) a plain table
(``relkind 'r'``, Postgres 14 or later) is cut into CTID ranges (:mod:`.ranges`), read on up to
``parallel`` connections that each import the same snapshot, one ``REPEATABLE READ`` transaction per
connection held for the whole copy (so the slot's replication connection may start streaming as soon
as the first batch is out). A partitioned table (``relkind 'p'``: no heap, no ctid of its own) and
older servers are copied in one range. :func:`copy_range` copies one range in a transaction begun by
:func:`begin_copy_transaction`: the unit a larger deployment can hand to separate workers.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from ..faults import fault
from ..pg.conninfo import OUTPUT_SETTINGS
from ..pg.schema import TableSchema
from .copyread import copy_blocks
from .decode import decode_text_columns
from .ranges import TID_RANGE_SCAN_VERSION, CtidRange, plan_ctid_ranges, table_pages

__all__ = ["initial_copy", "copy_statement", "copy_range", "begin_copy_transaction", "copy_plan"]

# pyarrow's CSV reader drops a UTF-8 BOM at the start of its input: every block starts with one of its
# own, so a first value that starts with U+FEFF keeps it
_BOM = b"\xef\xbb\xbf"

#: ranges per connection of a parallel copy (more, smaller ranges even out tables with holes) and the
#: smallest range worth a COPY of its own, in pages (8 KiB each: 8 MiB)
RANGES_PER_CONNECTION = 4
MIN_RANGE_PAGES = 1024

Item = tuple[pa.RecordBatch, list[pa.Array] | None]  # a batch and its key columns' texts (or None)


def copy_statement(table: TableSchema, rng: CtidRange | None = None) -> sql.Composed:
    """``COPY (SELECT "c1", … FROM [ONLY] "schema"."name" [WHERE <ctid range>]) TO STDOUT (FORMAT
    csv)``; ``ONLY`` for plain tables (pgoutput publishes an inheritance child's rows under the child,
    not the parent); the ``WHERE`` of :meth:`.ranges.CtidRange.predicate` when ``rng`` is given."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    only = sql.SQL("ONLY ") if table.relkind == "r" else sql.SQL("")
    where = sql.SQL(" WHERE {}").format(rng.predicate()) if rng is not None else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM {}{}{}) TO STDOUT (FORMAT csv)").format(
        cols, only, sql.Identifier(table.schema, table.name), where
    )


def _parse_csv(
    block: bytes, table: TableSchema, text_idx: list[int] | None = None, threads: bool = True
) -> tuple[pa.RecordBatch, list[list[Any]] | None]:
    """One block of COPY rows (CSV, starting with :data:`_BOM`) -> ``(RecordBatch, texts)``: ``texts``
    the text values of the ``text_idx`` columns, one Arrow string array per column (None when
    ``text_idx`` is None). ``threads``: let ``pyarrow.csv`` parse on its CPU thread pool (off when
    several reading threads parse blocks at once: they are the parallelism, and the pool's handoffs
    cost more than they give, about 20 % wall on 2 cores)."""
    names = [f"c{i}" for i in range(len(table.columns))]  # positional names, safe in CSV options
    data = pa.py_buffer(block)
    tbl = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=4 << 20, use_threads=threads),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False, double_quote=True),
        convert_options=pacsv.ConvertOptions(
            column_types={n: pa.string() for n in names},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    cols = [tbl.column(i) for i in range(len(names))]
    try:
        batch = decode_text_columns(table.columns, cols, column_major=True)
    except ValueError as e:
        err: Any = ValueError(f"table {table.qualified_name}: {e}")  # carries .columns
        err.columns = list(getattr(e, "columns", None) or [])  # which columns (create-table suggests options)
        raise err from None
    return batch, None if text_idx is None else [cols[i].combine_chunks() for i in text_idx]


def initial_copy(
    conn: psycopg.Connection,
    table: TableSchema,
    snapshot_name: str | None,
    batch_rows: int = 100_000,
    progress: Callable[[int, int], None] | None = None,
    *,
    batch_bytes: int = 64 << 20,
    text_columns: Sequence[str] | None = None,
    parallel: int = 1,
    connect: Callable[[], psycopg.Connection] | None = None,
    min_range_pages: int = MIN_RANGE_PAGES,
    text_as_arrow: bool = False,
    prepare: Callable[[Any], Any] | None = None,
) -> Iterator[Any]:
    """Stream a table's rows as RecordBatches (schema: ``table.arrow_schema()`` without metadata).

    ``conn``: an ordinary (not replication) connection with no transaction in progress; it is used
    for one ``REPEATABLE READ READ ONLY`` transaction that imports ``snapshot_name`` (None: a fresh
    snapshot of its own) and pins the text output settings; its autocommit setting is restored after.
    ``batch_rows``: rows per batch (the last may be smaller); ``batch_bytes``: a batch is also cut when
    its CSV text reaches this many bytes (bounds memory for wide rows).
    ``progress(rows_done, bytes_done)``: called after each batch with the running totals (bytes of
    CSV text received).

    ``parallel``: connections to read on (1: one COPY of the whole table, the batches in table
    order). With more, and ``connect`` (returns a new ordinary connection, closed here after the
    copy), the table's CTID ranges (:func:`copy_plan`) are read on up to ``parallel`` connections at
    the same snapshot (``snapshot_name``, or one this transaction exports with
    ``pg_export_snapshot()``), in threads; the batches come in no fixed order, their union is the
    table at the snapshot. ``min_range_pages``: the smallest range (pages) worth a COPY of its own.

    The transaction (and the snapshot import, on every connection) starts at the first ``next()``:
    after that the slot's replication connection may :meth:`~.stream.ReplicationConnection.start`
    while the copy goes on.

    Raises ``ValueError`` if ``conn`` is inside a transaction or the table has no columns,
    ``psycopg.errors.InvalidParameterValue``/``ObjectNotInPrerequisiteState`` when the snapshot is
    gone (the replication connection ran another command or closed: create the slot again),
    ``ValueError`` naming the column for a value that cannot be decoded; an error of any reading
    connection stops the others and is raised here.
    Closing the iterator early cancels the COPYs and rolls the transactions back.

    ``text_columns``: when given, each item is ``(batch, texts)`` where ``texts`` holds, per named
    column, the rows' Postgres text values (``list[str | None]``, e.g. to hash keys exactly as the
    stream's text values are hashed); ``text_as_arrow``: each column's texts as one ``pa.StringArray``
    instead (no Python object per value). Raises ``ValueError`` for a name that is not a column.

    ``prepare``: applied to each item (the batch, or ``(batch, texts)``) in the thread that read it,
    the iterator yields its result instead: per-batch work (key hashing, sorting) then runs on the
    reading connections' threads, beside the COPYs, not on the consumer's. Its exception is raised
    here as a reader's error is.
    """
    text_idx = _text_indexes(table, text_columns)
    if not table.columns:
        raise ValueError(f"table {table.qualified_name} has no columns to mirror")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("initial_copy needs a connection with no transaction in progress")
    saved_autocommit = conn.autocommit
    conn.autocommit = True
    ok = False
    extra: list[psycopg.Connection] = []
    items: Generator[tuple[Any, int, int], None, None] | None = None
    try:
        begin_copy_transaction(conn, snapshot_name)
        ranges = copy_plan(conn, table, parallel if connect is not None else 1, min_range_pages)
        finish = _finisher(text_as_arrow, prepare)
        if len(ranges) == 1:
            items = _finished(_range_items(conn, table, None, text_idx, batch_rows, batch_bytes), finish)
        else:
            assert connect is not None  # copy_plan plans one range without it
            _open_readers(conn, snapshot_name, min(parallel, len(ranges)) - 1, connect, extra)
            items = _parallel_items([conn, *extra], table, ranges, text_idx, batch_rows, batch_bytes, finish)
        rows = nbytes = 0
        for out, nrows, n in items:
            rows += nrows
            nbytes += n
            if progress:
                progress(rows, nbytes)
            yield out
        for c in extra:
            c.execute("COMMIT")
        conn.execute("COMMIT")
        ok = True
    finally:
        if items is not None:
            items.close()  # stops and joins the reader threads before their connections close
        for c in extra:
            c.close()
        _end_copy_transaction(conn, ok, saved_autocommit)


def _open_readers(
    conn: psycopg.Connection,
    snapshot_name: str | None,
    n: int,
    connect: Callable[[], psycopg.Connection],
    into: list[psycopg.Connection],
) -> None:
    """Append to ``into`` ``n`` new connections, each in a copy transaction at ``snapshot_name`` (None:
    the one ``conn``'s transaction exports with ``pg_export_snapshot()``); the caller closes them."""
    if snapshot_name is None:
        row = conn.execute("SELECT pg_export_snapshot()").fetchone()
        assert row is not None  # a function call returns one row
        snapshot_name = str(row[0])
    for _ in range(n):
        into.append(_connected(connect))
        begin_copy_transaction(into[-1], snapshot_name)


def _connected(connect: Callable[[], psycopg.Connection]) -> psycopg.Connection:
    """A new connection from ``connect``, idle, in autocommit mode."""
    c = connect()
    if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        c.rollback()
    c.autocommit = True
    return c


def copy_plan(
    conn: psycopg.Connection, table: TableSchema, parallel: int, min_range_pages: int = MIN_RANGE_PAGES
) -> list[CtidRange]:
    """The CTID ranges :func:`initial_copy` reads ``table`` in with ``parallel`` connections: one
    range ``[0, ∞)`` for ``parallel <= 1``, a table that is not plain (``relkind`` other than
    ``'r'``: a partitioned table has no heap of its own), a server before Postgres 14 (no TID Range
    Scan) or a heap under two ranges of ``min_range_pages``; otherwise up to
    ``parallel * RANGES_PER_CONNECTION`` ranges of :func:`.ranges.plan_ctid_ranges`. ``conn``: in the
    copy's transaction (the heap size is read there)."""
    if parallel <= 1 or table.relkind != "r" or conn.info.server_version < TID_RANGE_SCAN_VERSION:
        return [CtidRange(0, None)]
    return plan_ctid_ranges(table_pages(conn, table), parallel * RANGES_PER_CONNECTION, min_range_pages)


def copy_range(
    conn: psycopg.Connection,
    table: TableSchema,
    rng: CtidRange | None = None,
    *,
    batch_rows: int = 100_000,
    batch_bytes: int = 64 << 20,
    text_columns: Sequence[str] | None = None,
    text_as_arrow: bool = False,
    stop: threading.Event | None = None,
) -> Iterator[pa.RecordBatch] | Iterator[tuple[pa.RecordBatch, list[list[Any]]]]:
    """Copy the rows of one CTID range of ``table`` as RecordBatches (schema: ``table.arrow_schema()``
    without metadata; items as :func:`initial_copy`'s, ``(batch, texts)`` with ``text_columns``, the
    texts as Arrow arrays with ``text_as_arrow``).

    ``conn``: inside the transaction :func:`begin_copy_transaction` began (the snapshot imported and
    the output settings pinned); it is left in it, for more ranges. ``rng``: the heap pages to read
    (:func:`.ranges.plan_ctid_ranges`; None: the whole table, no ctid predicate). A range is read
    with one ``COPY (SELECT … WHERE ctid …) TO STDOUT (FORMAT csv)``, in blocks of whole rows
    (``batch_rows`` rows or ``batch_bytes`` bytes of CSV), each block parsed by ``pyarrow.csv`` and
    decoded column-wise into one batch.

    Raises the server's error (``psycopg.Error``; the transaction is then aborted), ``ValueError``
    naming the column for a value that cannot be decoded or for an unknown ``text_columns`` name,
    :class:`~.copyread.CopyStopped` when ``stop`` is set. Closing it early cancels the COPY."""
    text_idx = _text_indexes(table, text_columns)
    for item, _ in _range_items(conn, table, rng, text_idx, batch_rows, batch_bytes, stop):
        yield _public(item, text_as_arrow)


def _public(item: Item, text_as_arrow: bool) -> Any:
    """An item as the public iterators yield it: the batch alone, or ``(batch, texts)`` with the texts
    as lists (or, ``text_as_arrow``, the Arrow arrays)."""
    batch, texts = item
    if texts is None:
        return batch
    return batch, texts if text_as_arrow else [a.to_pylist() for a in texts]


def _finisher(text_as_arrow: bool, prepare: Callable[[Any], Any] | None) -> Callable[[Item], Any]:
    """What a reader does to each item before handing it over: :func:`_public`, then ``prepare``."""
    if prepare is None:
        return lambda item: _public(item, text_as_arrow)
    return lambda item: prepare(_public(item, text_as_arrow))


def _finished(
    items: Iterator[tuple[Item, int]], finish: Callable[[Item], Any]
) -> Generator[tuple[Any, int, int], None, None]:
    """``(finish(item), rows, CSV bytes)`` of each ``(item, CSV bytes)``; closing it closes ``items``
    (which cancels their COPY)."""
    try:
        for item, n in items:
            yield finish(item), item[0].num_rows, n
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _range_items(
    conn: psycopg.Connection,
    table: TableSchema,
    rng: CtidRange | None,
    text_idx: list[int] | None,
    batch_rows: int,
    batch_bytes: int,
    stop: threading.Event | None = None,
    threads: bool = True,
) -> Generator[tuple[Item, int], None, None]:
    """``((batch, texts), CSV bytes)`` of each block of the range's COPY (``threads``: as
    :func:`_parse_csv`'s)."""
    for block, _n in copy_blocks(
        conn, copy_statement(table, rng), max_bytes=batch_bytes, max_rows=batch_rows, prefix=_BOM, stop=stop
    ):
        fault("copy:block")  # (a crash test holds or kills the copy here, mid-table)
        yield _parse_csv(block, table, text_idx, threads), len(block) - len(_BOM)


_DONE = object()  # a reader thread's last item


def _parallel_items(
    conns: list[psycopg.Connection],
    table: TableSchema,
    ranges: list[CtidRange],
    text_idx: list[int] | None,
    batch_rows: int,
    batch_bytes: int,
    finish: Callable[[Item], Any],
) -> Generator[tuple[Any, int, int], None, None]:
    """``(finish(item), rows, CSV bytes)`` of every range's items, read by one thread per connection
    (each in its copy transaction, ``finish`` applied there), which take the next range from a shared
    queue; at most two items per thread wait to be consumed.
    The first error of a thread stops the others and is raised; closing early stops them too."""
    todo: queue.SimpleQueue[CtidRange] = queue.SimpleQueue()
    for r in ranges:
        todo.put(r)
    out: queue.Queue[Any] = queue.Queue(maxsize=2 * len(conns))
    stop = threading.Event()

    def put(x: Any) -> None:
        while not stop.is_set():
            try:
                out.put(x, timeout=0.2)
                return
            except queue.Full:
                continue

    def work(c: psycopg.Connection) -> None:
        try:
            while not stop.is_set():
                try:
                    rng = todo.get_nowait()
                except queue.Empty:
                    break
                gen = _finished(
                    _range_items(c, table, rng, text_idx, batch_rows, batch_bytes, stop, threads=False), finish
                )
                try:
                    for item in gen:
                        put(item)
                        if stop.is_set():
                            break
                finally:
                    gen.close()
        except BaseException as e:  # handed to the consumer, raised there
            put(e)
        finally:
            put(_DONE)

    threads = [threading.Thread(target=work, args=(c,), name=f"copy-{i}", daemon=True) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    try:
        done = 0
        while done < len(threads):
            x = out.get()
            if x is _DONE:
                done += 1
            elif isinstance(x, BaseException):
                raise x
            else:
                yield x
    finally:
        stop.set()
        for t in threads:
            t.join()


def _text_indexes(table: TableSchema, text_columns: Sequence[str] | None) -> list[int] | None:
    """The column indexes of ``text_columns`` (None: none asked for); ``ValueError`` for a name that is
    not a column."""
    if text_columns is None:
        return None
    unknown = [n for n in text_columns if n not in table.column_index]
    if unknown:
        raise ValueError(f"text_columns {unknown} are not columns of {table.qualified_name}")
    return [table.column_index[n] for n in text_columns]


def begin_copy_transaction(conn: psycopg.Connection, snapshot_name: str | None) -> None:
    """On ``conn`` (idle, autocommit): ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``, the
    snapshot ``snapshot_name`` imported (``SET TRANSACTION SNAPSHOT``, when given; PG docs,
    "Snapshot Synchronization Functions") and the text output settings the decoder relies on pinned
    (``SET LOCAL``). Raises ``psycopg.errors.InvalidParameterValue``/``ObjectNotInPrerequisiteState``
    when the snapshot is gone. End it with ``COMMIT`` (or ``ROLLBACK``)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    if snapshot_name:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
    for k, v in {**OUTPUT_SETTINGS, "client_encoding": "UTF8"}.items():
        conn.execute(sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(k), sql.Literal(v)))


def _end_copy_transaction(conn: psycopg.Connection, ok: bool, saved_autocommit: bool) -> None:
    """After the copy: unless it committed (``ok``), roll back what is left of its transaction; then
    restore the connection's autocommit setting (a closed connection is left alone)."""
    if not ok and not conn.closed:
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except psycopg.Error:
            pass
    if not conn.closed:
        conn.autocommit = saved_autocommit
