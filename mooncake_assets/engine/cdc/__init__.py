"""CDC from Postgres: pgoutput protocol, replication connection, type mapping, initial copy and the
transaction assembler (see DESIGN §6)."""
from .copy import copy_statement, initial_copy
from .pgoutput import (
    Begin, Commit, Delete, Insert, Message, Origin, PgOutputMessage, Relation, RelationColumn, StreamAbort,
    StreamCommit, StreamStart, StreamStop, Truncate, TupleData, Type, Update, parse_message,
)
from .stream import ReplicationConnection, ReplicationError
from .txn import Change, ProtocolError, Transaction, TransactionAssembler
from ..pg.catalog import describe_table
from ..pg.conninfo import OUTPUT_SETTINGS
from .decode import decode_text_column, decode_text_columns
from ..pg.schema import ColumnSpec, TableSchema, UnsupportedTypeError, arrow_type_for

__all__ = [
    "Begin", "Commit", "Delete", "Insert", "Message", "Origin", "PgOutputMessage", "Relation", "RelationColumn",
    "StreamAbort", "StreamCommit", "StreamStart", "StreamStop", "Truncate", "TupleData", "Type", "Update",
    "parse_message", "ReplicationConnection", "ReplicationError", "Change",
    "ProtocolError", "Transaction", "TransactionAssembler", "OUTPUT_SETTINGS", "ColumnSpec", "TableSchema",
    "UnsupportedTypeError", "arrow_type_for", "decode_text_column", "decode_text_columns", "describe_table",
    "copy_statement", "initial_copy",
]
