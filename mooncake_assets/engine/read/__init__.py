"""Union reads: persisted + flushed Parquet files with deletes applied, plus the in-memory rows."""

from .union import UnionReader, current_wal_lsn

__all__ = ["UnionReader", "current_wal_lsn"]
