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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from ..pg.conninfo import OUTPUT_SETTINGS
from ..pg.schema import TableSchema
from .decode import decode_text_columns

__all__ = ["initial_copy", "copy_statement"]

_CopyRow = bytes | bytearray | memoryview  # one COPY row as psycopg's Copy yields it


def copy_statement(table: TableSchema) -> sql.Composed:
    """``COPY (SELECT "c1", … FROM [ONLY] "schema"."name") TO STDOUT (FORMAT csv)``; ``ONLY`` for plain
    tables (pgoutput publishes an inheritance child's rows under the child, not the parent)."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    only = sql.SQL("ONLY ") if table.relkind == "r" else sql.SQL("")
    return sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT csv)").format(
        cols, only, sql.Identifier(table.schema, table.name)
    )


def _parse_csv(
    chunks: list[_CopyRow], table: TableSchema, text_idx: list[int] | None = None
) -> tuple[pa.RecordBatch, list[list[Any]] | None]:
    """COPY rows (CSV) -> ``(RecordBatch, texts)``: ``texts`` the text values of the ``text_idx``
    columns, one list per column (None when ``text_idx`` is None)."""
    names = [f"c{i}" for i in range(len(table.columns))]  # positional names, safe in CSV options
    # pyarrow's CSV reader drops a UTF-8 BOM at the start of its input: give it one of its own, so a
    # first value that starts with U+FEFF keeps it
    data = pa.py_buffer(b"\xef\xbb\xbf" + b"".join(chunks))
    tbl = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=4 << 20, use_threads=True),
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
    return batch, None if text_idx is None else [cols[i].to_pylist() for i in text_idx]


def initial_copy(
    conn: psycopg.Connection,
    table: TableSchema,
    snapshot_name: str | None,
    batch_rows: int = 100_000,
    progress: Callable[[int, int], None] | None = None,
    *,
    batch_bytes: int = 64 << 20,
    text_columns: Sequence[str] | None = None,
) -> Iterator[pa.RecordBatch] | Iterator[tuple[pa.RecordBatch, list[list[Any]]]]:
    """Stream a table's rows as RecordBatches (schema: ``table.arrow_schema()`` without metadata).

    ``conn``: an ordinary (not replication) connection with no transaction in progress; it is used
    for one ``REPEATABLE READ READ ONLY`` transaction that imports ``snapshot_name`` (None: a fresh
    snapshot of its own) and pins the text output settings; its autocommit setting is restored after.
    ``batch_rows``: rows per batch (the last may be smaller); ``batch_bytes``: a batch is also cut when
    its CSV text reaches this many bytes (bounds memory for wide rows).
    ``progress(rows_done, bytes_done)``: called after each batch with the running totals (bytes of
    CSV text received).

    The transaction (and the snapshot import) starts at the first ``next()``: after that the slot's
    replication connection may :meth:`~.stream.ReplicationConnection.start` while the copy goes on.

    Raises ``ValueError`` if ``conn`` is inside a transaction or the table has no columns,
    ``psycopg.errors.InvalidParameterValue``/``ObjectNotInPrerequisiteState`` when the snapshot is
    gone (the replication connection ran another command or closed: create the slot again),
    ``ValueError`` naming the column for a value that cannot be decoded.
    Closing the iterator early cancels the COPY and rolls the transaction back.

    ``text_columns``: when given, each item is ``(batch, texts)`` where ``texts`` holds, per named
    column, the rows' Postgres text values (``list[str | None]``, e.g. to hash keys exactly as the
    stream's text values are hashed). Raises ``ValueError`` for a name that is not a column.
    """
    text_idx = _text_indexes(table, text_columns)
    if not table.columns:
        raise ValueError(f"table {table.qualified_name} has no columns to mirror")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise ValueError("initial_copy needs a connection with no transaction in progress")
    saved_autocommit = conn.autocommit
    conn.autocommit = True
    ok = False
    try:
        _begin_copy_transaction(conn, snapshot_name)
        yield from _copy_batches(conn, table, text_idx, batch_rows, batch_bytes, progress)
        conn.execute("COMMIT")
        ok = True
    finally:
        _end_copy_transaction(conn, ok, saved_autocommit)


def _text_indexes(table: TableSchema, text_columns: Sequence[str] | None) -> list[int] | None:
    """The column indexes of ``text_columns`` (None: none asked for); ``ValueError`` for a name that is
    not a column."""
    if text_columns is None:
        return None
    unknown = [n for n in text_columns if n not in table.column_index]
    if unknown:
        raise ValueError(f"text_columns {unknown} are not columns of {table.qualified_name}")
    return [table.column_index[n] for n in text_columns]


def _begin_copy_transaction(conn: psycopg.Connection, snapshot_name: str | None) -> None:
    """``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``, the slot's snapshot imported (``SET
    TRANSACTION SNAPSHOT``, when there is one) and the text output settings pinned (``SET LOCAL``)."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
    if snapshot_name:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
    for k, v in {**OUTPUT_SETTINGS, "client_encoding": "UTF8"}.items():
        conn.execute(sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(k), sql.Literal(v)))


def _copy_batches(
    conn: psycopg.Connection,
    table: TableSchema,
    text_idx: list[int] | None,
    batch_rows: int,
    batch_bytes: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[pa.RecordBatch | tuple[pa.RecordBatch, list[list[Any]]]]:
    """The table's COPY, its rows cut into batches of ``batch_rows`` rows or ``batch_bytes`` bytes of
    CSV text, each parsed (:func:`_parse_csv`) and ``progress`` called with the running totals before
    it is yielded (with its text values when ``text_idx`` is given). Closing it early cancels the COPY."""
    rows = nbytes = 0
    chunks: list[_CopyRow] = []
    chunk_bytes = 0
    with conn.cursor() as cur, cur.copy(copy_statement(table)) as cp:
        for row in cp:
            chunks.append(row)
            chunk_bytes += len(row)
            if len(chunks) >= batch_rows or chunk_bytes >= batch_bytes:
                batch, texts = _parse_csv(chunks, table, text_idx)
                rows += batch.num_rows
                nbytes += chunk_bytes
                chunks, chunk_bytes = [], 0
                if progress:
                    progress(rows, nbytes)
                yield batch if texts is None else (batch, texts)
        if chunks:
            batch, texts = _parse_csv(chunks, table, text_idx)
            rows += batch.num_rows
            nbytes += chunk_bytes
            if progress:
                progress(rows, nbytes)
            yield batch if texts is None else (batch, texts)


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
