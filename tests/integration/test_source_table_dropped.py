"""A table dropped at the source: its mirror is stopped read-only (last state kept and readable, status says why and names drop-table), the
service keeps streaming the other tables, and nothing says ``ready`` for it. Real Postgres, service, CLI."""

from __future__ import annotations

import json

import psycopg
import pytest

from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import stop_service
from tests.helpers import make_settings, mooncake


def _status(settings) -> dict:
    c = ServiceClient(settings.socket_path)
    try:
        return {t["name"]: t for t in c.status()["tables"]}
    finally:
        c.close()


@pytest.mark.slow
def test_dropped_source_table_leaves_a_read_only_mirror(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE gone_src (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE kept_src (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO gone_src SELECT g, 'v' || g FROM generate_series(1, 20) g")
        c.execute("INSERT INTO kept_src VALUES (1, 'a')")
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "create-table", "gone", "public.gone_src", check=True)
        mooncake(s, "create-table", "kept", "public.kept_src", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM gone_src WHERE id > 15")
        assert mooncake(s, "verify").returncode == 0
        before = _status(s)
        assert before["gone"]["state"] == "ready" and before["gone"]["source_dropped"] is False
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DROP TABLE gone_src")
            c.execute("INSERT INTO kept_src VALUES (2, 'b')")
        st = _status(s)  # the first status after the drop already says so (never `ready`)
        gone = st["gone"]
        assert gone["state"] == "error" and gone["source_dropped"] is True, gone
        assert "source table public.gone_src was dropped" in gone["error"] and "drop-table" in gone["error"], gone
        assert st["kept"]["state"] == "ready" and st["kept"]["source_dropped"] is False
        # the last state is kept and readable; the other table still streams and verifies
        r = mooncake(s, "query", "SELECT count(*) AS n, max(id) AS m FROM gone", "--format", "json", check=True)
        assert json.loads(r.stdout) == [{"n": 15, "m": 15}], r.stdout
        r = mooncake(s, "verify")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kept (public.kept_src): match — source 2 rows, mirror 2 rows" in r.stdout, r.stdout
        assert "gone (public.gone_src): skipped — its source table was dropped" in r.stdout, r.stdout
        assert "verified: 1/1 tables match" in r.stdout and "(1 read-only, skipped)" in r.stdout, r.stdout
        r = mooncake(s, "list-tables", "--json", check=True)
        listed = {t["name"]: t for t in json.loads(r.stdout)["tables"]}
        assert listed["gone"]["state"] == "error" and listed["gone"]["source_dropped"] is True
        # drop-table removes the read-only mirror; the service keeps running
        mooncake(s, "drop-table", "gone", check=True)
        assert set(_status(s)) == {"kept"}
    finally:
        stop_service(s)
