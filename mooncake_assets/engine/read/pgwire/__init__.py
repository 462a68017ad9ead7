"""A read-only PostgreSQL-wire endpoint over union reads (``mooncake sql-server``; docs/sql-server.md).

Modules: :mod:`.protocol` (message framing), :mod:`.auth` (SCRAM-SHA-256 verifiers, users files),
:mod:`.session` (one connection's message flow), :mod:`.server` (listener, threads, cancel),
:mod:`.backend` (the pool of UnionReaders statements run on; persisted snapshots and cuts through
:mod:`..snapshots`), :mod:`.catalog` and :mod:`.psql` (statements answered without DuckDB),
:mod:`.pgcatalog` (``pg_catalog`` tables built from the mirrors, for SQLAlchemy's reflection),
:mod:`.types` (OIDs and text output), :mod:`.sqltext`.
"""

from .auth import UsersFileError, Verifier, load_users, make_verifier, write_user
from .backend import Backend
from .server import SqlServer, tls_context

__all__ = [
    "Backend",
    "SqlServer",
    "tls_context",
    "UsersFileError",
    "Verifier",
    "load_users",
    "make_verifier",
    "write_user",
]
