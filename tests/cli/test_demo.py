"""`mooncake demo` end to end on its own embedded Postgres, then the persisted tables checked by PyIceberg."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.pg import EmbeddedPostgres
from mooncake_assets.engine.service.process import stop_service


def _run(state, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_demo_verifies_and_leaves_persisted_state(state_dir):
    state = state_dir / "demo"
    try:
        r = _run(state, "demo", "--seconds", "8", "--clients", "2")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("verified: 4/4 tables match at LSN "), r.stdout[-2000:]
        assert r.stdout.count("persist of 4 tables") + r.stdout.count("flush of 4 tables") >= 2
        # Postgres's and the mirror's balances are read at one LSN, so they are equal
        ticks = [line for line in r.stdout.splitlines() if "| at LSN " in line]
        assert ticks and all(line.endswith("(same)") for line in ticks), r.stdout[-3000:]
        stop_service(load_settings(state))
        assert _run(state, "pg", "start").returncode == 0  # a no-op: it is running
        v = _run(state, "verify", "--reader", "pyiceberg")
        assert v.returncode == 0, v.stdout + v.stderr
        assert v.stdout.strip().splitlines()[-1].startswith("verified: 4/4 tables match at LSN ")
        # DuckDB's iceberg extension reads the same v3 tables (DVs in Puffin) and agrees
        d = _run(state, "verify", "--reader", "duckdb-iceberg")
        assert d.returncode == 0, d.stdout + d.stderr
        assert d.stdout.strip().splitlines()[-1].startswith("verified: 4/4 tables match at LSN ")
    finally:
        stop_service(load_settings(state))
        EmbeddedPostgres(state).destroy()


def test_a_flush_between_the_source_read_and_the_mirror_read_is_no_difference(pg_dsn, state_dir):
    """The demo reads Postgres at LSN L, then the mirror at L. When the service flushes the table past L in
    between (its own maintenance, under load), the read at L is refused: the pair is taken again, and a
    tick line whose every try was refused says "not compared this time: …", never "(DIFFERENT)" (which
    made a correct mirror look wrong). The flush is made to land there with the real service."""
    import time

    import psycopg

    from mooncake_assets.demo import QUERY, _tick_line, balances_at_one_lsn
    from mooncake_assets.engine.read import UnionReader
    from mooncake_assets.engine.service import ServiceClient, ServiceError

    from ..helpers import make_settings, mooncake

    class FlushedFirst(UnionReader):
        """A union reader before whose first ``flushes`` reads a commit lands and is flushed."""

        flushes = 1

        def query(self, sql, tables=None, lsn=None, params=None):
            if self.flushes:
                self.flushes -= 1
                with psycopg.connect(pg_dsn, autocommit=True) as c:
                    c.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 1")
                    now = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
                self.client.wait_lsn(now, timeout=30)
                self.client.call("flush", table="pgbench_accounts")
            return super().query(sql, tables=tables, lsn=lsn, params=params)

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int)")
        c.execute("INSERT INTO pgbench_accounts SELECT g, 1 + g % 2, g FROM generate_series(1, 100) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")  # no flush of its own: only the injected ones
    client = ServiceClient(s.socket_path)
    try:
        mooncake(s, "create-table", "pgbench_accounts", "public.pgbench_accounts", check=True)
        reader = FlushedFirst(client, pg_dsn, wait_timeout=30)
        lsn, src, mir = balances_at_one_lsn(pg_dsn, reader)  # the first pair is refused, the second read
        assert reader.flushes == 0 and [tuple(r) for r in src] == [(r["bid"], r["balance"]) for r in mir], (src, mir)
        reader.flushes = 3  # every try refused
        try:
            balances_at_one_lsn(pg_dsn, reader)
            raise AssertionError("read at an LSN the table was flushed past")
        except ServiceError as e:
            assert "cannot read at LSN" in str(e), e
        reader.flushes = 3
        line = _tick_line(client, reader, pg_dsn, time.time())
        assert "not compared this time: table pgbench_accounts: cannot read at LSN" in line, line
        assert "DIFFERENT" not in line, line
        reader.flushes = 0
        assert "(same)" in _tick_line(client, reader, pg_dsn, time.time())
        assert QUERY.startswith("SELECT bid, sum(abalance)")
    finally:
        client.close()
        mooncake(s, "stop")
