"""create-table with the initial copy in CTID ranges on parallel connections, then verify."""

from __future__ import annotations

import psycopg
import pytest

from mooncake_assets.engine.cdc import begin_copy_transaction, copy_plan, describe_table

from ..helpers import make_settings, running_service
from .test_mirror_converges import _all_match


def test_create_table_with_parallel_chunks_verifies(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE wide (id bigint PRIMARY KEY, v text, n numeric(12,2), f float8, b bytea)")
        c.execute("ALTER TABLE wide SET (autovacuum_enabled = false)")
        c.execute(
            "INSERT INTO wide SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE repeat(md5(g::text), 2) END, "
            "g / 100.0, CASE WHEN g % 11 = 0 THEN 'NaN'::float8 ELSE g * 0.5 END, "
            "decode(md5(g::text), 'hex') FROM generate_series(1, 200000) g"
        )
        c.execute("DELETE FROM wide WHERE id % 5 = 0")  # holes, no VACUUM
        ts = describe_table(c, "wide")
        begin_copy_transaction(c, None)
        assert len(copy_plan(c, ts, 2)) >= 2  # the service's copy of this table is ranged
        c.execute("COMMIT")
    s = make_settings(state_dir, pg_dsn, maintenance="auto", copy_parallel=2)
    with running_service(s) as client:
        res = client.call("create_table", dst="wide", src="public.wide")
        assert res["rows"] == 160000, res
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO wide (id, v) VALUES (200001, 'streamed')")
            c.execute("UPDATE wide SET v = 'u' WHERE id = 1")
        _all_match(s, client)


@pytest.mark.parametrize("parallel", [1, 2])
def test_copy_of_several_batches_with_a_two_column_key_and_nulls_equals_postgres(pg_dsn, state_dir, parallel):
    """create-table's copy hashes and sorts each batch on the reading threads and builds the file's
    IndexBlock from those runs: over more than one batch (100,000 rows), with a two-column key and
    NULLs, the mirror equals Postgres, and updates and deletes after the copy find rows of every batch
    through that IndexBlock."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE multi (a int, b text, v text, n int, PRIMARY KEY (a, b))")
        c.execute(
            "INSERT INTO multi SELECT g / 3, 'k' || (g % 3), CASE WHEN g % 5 = 0 THEN NULL ELSE md5(g::text) END, "
            "CASE WHEN g % 7 = 0 THEN NULL ELSE g END FROM generate_series(0, 249999) g"
        )
    s = make_settings(state_dir, pg_dsn, maintenance="auto", copy_parallel=parallel)
    with running_service(s) as client:
        res = client.call("create_table", dst="multi", src="public.multi")
        assert res["rows"] == 250000, res
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # rows of the first, middle and last batches
            c.execute("UPDATE multi SET v = 'u' WHERE (a, b) IN ((0, 'k0'), (40000, 'k1'), (83333, 'k0'))")
            c.execute("DELETE FROM multi WHERE (a, b) IN ((1, 'k1'), (50000, 'k2'), (83332, 'k2'))")
            c.execute("UPDATE multi SET n = NULL WHERE a = 70000")
        _all_match(s, client)
