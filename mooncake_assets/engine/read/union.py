"""Union read through DuckDB (DESIGN.md §4).

For each mirrored table the reader asks the service for a ReadState at one LSN — the data files
(persisted in Iceberg or flushed and staged locally), each with its deleted positions as a portable
Roaring bitmap, and a Flight ticket for the committed in-memory rows — and registers a DuckDB view
named after the table:

    SELECT cols FROM read_parquet([files without deletes])
    UNION ALL BY NAME
    SELECT cols FROM read_parquet(file_k, file_row_number = true) ANTI JOIN deletes_k
        ON file_row_number = pos                       -- one branch per file with deletes
    UNION ALL BY NAME
    SELECT cols FROM mem                              -- the Arrow rows from Flight

**Read-your-writes**: with a DSN, the reader first asks Postgres for ``pg_current_wal_lsn()`` and
waits (``wait_timeout`` seconds, then ``TimeoutError`` naming both LSNs) until the service has
applied every commit before it.
"""
from __future__ import annotations

import base64

import duckdb
import numpy as np
import psycopg
import pyarrow as pa
from pyroaring import BitMap64

from ..service.client import ServiceClient


def current_wal_lsn(dsn: str) -> str:
    """``pg_current_wal_lsn()`` of the source, as ``X/Y`` text."""
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


class UnionReader:
    """Registers mirrored tables as DuckDB views over one ReadState each and runs SQL on them.

    ``client``: a :class:`ServiceClient`; ``dsn``: the source DSN for the read-your-writes barrier
    (None = no barrier); ``con``: an existing DuckDB connection to register into (else a new one).
    """

    def __init__(self, client: ServiceClient, dsn: str | None = None, con: duckdb.DuckDBPyConnection | None = None,
                 wait_timeout: float = 30.0):
        self.client = client
        self.dsn = dsn
        self.con = con or duckdb.connect()
        self.wait_timeout = wait_timeout
        self.states: dict[str, dict] = {}

    def barrier(self) -> str | None:
        """Wait until the service has applied everything committed in Postgres so far; returns that LSN."""
        if not self.dsn:
            return None
        lsn = current_wal_lsn(self.dsn)
        self.client.wait_lsn(lsn, timeout=self.wait_timeout)
        return lsn

    def register(self, table: str, lsn: str | None = None, view: str | None = None,
                 columns: list[str] | None = None) -> dict:
        """Create view ``view`` (default: the table's name) over the table's ReadState at ``lsn``.

        ``columns``: project to these columns only. Returns the ReadState (dict)."""
        rs = self.client.read_state(table, lsn)
        mem = self.client.fetch(rs["ticket"])
        if rs.get("storage"):  # s3:// warehouse: httpfs + an S3 secret (the service's endpoint, our credentials)
            from ..storage import ensure_duckdb_s3

            ensure_duckdb_s3(self.con, rs["storage"])
        view = view or table
        cols = columns or rs["schema"]
        sel = ", ".join(_ident(c) for c in cols)
        parts = []
        clean = [f["path"] for f in rs["files"] if not f["deleted"]]
        if clean:
            parts.append(f"SELECT {sel} FROM read_parquet([{', '.join(_sql_str(p) for p in clean)}])")
        for i, f in enumerate(f for f in rs["files"] if f["deleted"]):
            bm = BitMap64.deserialize(base64.b64decode(f["deleted"]))
            name = f"__mc_del_{view}_{i}"
            self.con.register(name, pa.table({"pos": pa.array(np.fromiter(bm, dtype=np.int64, count=len(bm)))}))
            parts.append(f"SELECT {sel} FROM read_parquet({_sql_str(f['path'])}, file_row_number = true) d "
                         f"ANTI JOIN {_ident(name)} x ON d.file_row_number = x.pos")
        mem_name = f"__mc_mem_{view}"
        self.con.register(mem_name, mem)
        parts.append(f"SELECT {sel} FROM {_ident(mem_name)}")
        body = "\nUNION ALL BY NAME\n".join(parts)
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW {_ident(view)} AS SELECT {sel} FROM ({body})")
        self.states[view] = rs
        return rs

    def query(self, sql: str, tables: list[str] | None = None, lsn: str | None = None) -> pa.Table:
        """Run ``sql`` over the named mirrored tables (default: every table the service has)."""
        if lsn is None:
            self.barrier()
        if tables is None:
            tables = [t["name"] for t in self.client.status()["tables"] if t.get("state") != "copying"]
        for t in tables:
            self.register(t, lsn)
        return self.con.execute(sql).to_arrow_table()

    def read_table(self, table: str, lsn: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """All visible rows of one mirrored table as Arrow (optionally projected)."""
        if lsn is None:
            self.barrier()
        self.register(table, lsn, view=f"__mc_read_{table}", columns=columns)
        return self.con.execute(f"SELECT * FROM {_ident('__mc_read_' + table)}").to_arrow_table()
