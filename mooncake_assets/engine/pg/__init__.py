"""Postgres helpers: the embedded local cluster used by the demo and the tests."""

from .embedded import EmbeddedPostgres, PostgresNotFound, find_pg_bin

__all__ = ["EmbeddedPostgres", "PostgresNotFound", "find_pg_bin"]
