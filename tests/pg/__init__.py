"""Engine modules against a real PostgreSQL, without the service: the replication connection, the
catalog reads (describe_table), the initial copy, pgoutput messages, key text, the Iceberg SQL catalog
and the embedded cluster (fixtures ``pg_cluster``/``pg_dsn`` from tests/conftest.py)."""
