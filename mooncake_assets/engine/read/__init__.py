"""Union reads: persisted + flushed Parquet files with deletes applied, plus the in-memory rows."""

from .missing import MirrorNotReadable
from .union import UnionReader, current_wal_lsn

__all__ = ["MirrorNotReadable", "UnionReader", "current_wal_lsn"]
