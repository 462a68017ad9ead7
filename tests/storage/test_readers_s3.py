"""The other engines' readers (``verify --reader iceberg-rust|polars``, besides PyIceberg and DuckDB) on an
s3:// warehouse on moto's S3 server: the store's endpoint and credentials reach each reader."""

from __future__ import annotations

import psycopg
import pytest

from mooncake_assets.readers import READERS
from mooncake_assets.verify import verify
from tests.helpers import make_settings, running_service


@pytest.mark.parametrize("fmt", ["deletion-vectors", "position-deletes"])
def test_every_reader_reads_an_s3_warehouse(pg_dsn, state_dir, moto_server, s3_bucket, fmt):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 200) g")
    s = make_settings(state_dir, pg_dsn, warehouse=f"s3://{s3_bucket}/wh", s3_endpoint=moto_server.endpoint)
    with running_service(s) as client:
        client.call("create_table", dst="t", src="public.t", delete_format=fmt)
        client.call("persist", table="t")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM t WHERE id % 3 = 0")
            c.execute("UPDATE t SET v = 'u' WHERE id % 5 = 0")
            lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(lsn, timeout=60)
        client.call("persist", table="t")
    for reader in sorted(READERS):
        results, at = verify(s, ["t"], reader)
        assert [r.match for r in results] == [True], (reader, at, [r.line() for r in results])
