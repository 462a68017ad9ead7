"""Integration tests: a real PostgreSQL, the real replicator service, real Iceberg files (one file per concept)."""
