"""CDC from Postgres: pgoutput protocol, replication connection, type mapping, initial copy and the
transaction assembler (docs/architecture.md#replication)."""

from ..pg.catalog import describe_table
from ..pg.conninfo import OUTPUT_SETTINGS
from ..pg.schema import ColumnSpec, TableSchema, UnsupportedTypeError, arrow_type_for
from .copy import begin_copy_transaction, copy_plan, copy_range, copy_statement, initial_copy
from .decode import decode_text_column, decode_text_columns
from .pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    Type,
    Update,
    parse_message,
)
from .ranges import CtidRange, plan_ctid_ranges, table_pages
from .stream import ReplicationConnection, ReplicationError
from .txn import Change, ProtocolError, Transaction, TransactionAssembler

__all__ = [
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleData",
    "Type",
    "Update",
    "parse_message",
    "ReplicationConnection",
    "ReplicationError",
    "Change",
    "ProtocolError",
    "Transaction",
    "TransactionAssembler",
    "OUTPUT_SETTINGS",
    "ColumnSpec",
    "TableSchema",
    "UnsupportedTypeError",
    "arrow_type_for",
    "decode_text_column",
    "decode_text_columns",
    "describe_table",
    "copy_statement",
    "initial_copy",
    "copy_range",
    "copy_plan",
    "begin_copy_transaction",
    "CtidRange",
    "plan_ctid_ranges",
    "table_pages",
]
