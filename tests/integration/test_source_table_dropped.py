"""A table dropped at the source: its mirror is stopped read-only (last state kept and readable, status says why and names drop-table), the
service keeps streaming the other tables, and nothing says ``ready`` for it. Real Postgres, service, CLI."""

from __future__ import annotations

import json

import psycopg
import pytest

from mooncake_assets.engine.service.process import stop_service
from tests.helpers import make_settings, mooncake, service_tables

_status = service_tables


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


@pytest.mark.slow
def test_a_mirror_whose_source_table_is_gone_at_a_restart_stays_readable(pg_dsn, state_dir):
    """A restart after a source table was dropped (while its mirror ran: stopped then; or while the service
    was down) starts the service (it failed with "LookupError: table public.x does not exist", so no mirror
    could be read): such a mirror is opened stopped from its saved columns, its last state readable with the
    warning, status saying why; the other mirror streams on, and drop-table removes the stopped one."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("run_src", "down_src", "kept_src"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(10,2))")
            c.execute(f"INSERT INTO {t} SELECT g, 'v' || g, g / 4.0 FROM generate_series(1, 10) g")
    s = make_settings(state_dir, pg_dsn)
    try:
        for t in ("run", "down", "kept"):
            mooncake(s, "create-table", t, f"public.{t}_src", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DROP TABLE run_src")
        assert _status(s)["run"]["state"] == "error"
        mooncake(s, "stop", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DROP TABLE down_src")
            c.execute("INSERT INTO kept_src VALUES (11, 'new', 1.5)")
        mooncake(s, "start", check=True)
        st = _status(s)
        for t in ("run", "down"):
            assert st[t]["state"] == "error" and f"source table public.{t}_src was dropped" in st[t]["error"], st[t]
            r = mooncake(s, "query", f"SELECT count(*) AS n, sum(n) AS s FROM {t}", "--format", "json", check=True)
            assert json.loads(r.stdout) == [{"n": 10, "s": 13.75}], r.stdout
            assert f"warning: {t} is stopped" in r.stderr, r.stderr
        assert st["kept"]["state"] == "ready", st["kept"]
        r = mooncake(s, "query", "SELECT count(*) AS n FROM kept", "--format", "csv", check=True)
        assert r.stdout == "n\n11\n", r.stdout
        for t in ("run", "down"):
            mooncake(s, "drop-table", t, check=True)
        assert set(_status(s)) == {"kept"}
    finally:
        stop_service(s)
