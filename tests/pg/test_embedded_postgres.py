import psycopg


def test_embedded_cluster_is_logical(pg_dsn):
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SHOW wal_level").fetchone()[0] == "logical"
        assert c.execute("SELECT 1 + 1").fetchone()[0] == 2
