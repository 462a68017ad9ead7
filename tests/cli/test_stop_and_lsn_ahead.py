"""``mooncake stop`` holds for every command that would start the service, and an LSN past the source's
current WAL position is refused at once (not waited for until --max-wait). Real Postgres, real service."""

from __future__ import annotations

import json
import time

import psycopg

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import service_pid, stopped_mark

from ..helpers import make_settings, mooncake, replication_role, run_sql


def _running(s) -> bool:
    c = ServiceClient(s.socket_path)
    try:
        return c.ping()
    finally:
        c.close()


def _one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return " ".join(lines[0].split())


def _source_lsn(dsn: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as c:
        return Lsn(Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]))


def test_after_stop_no_command_starts_the_service(pg_dsn, state_dir):
    """After ``mooncake stop`` every command that needs the service refuses in one line (exit 1, as
    ``query`` does) instead of starting it again; those that need no service still work; ``start``
    starts it and ends the stop."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE st (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO st SELECT g, 'v' || g FROM generate_series(1, 20) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    try:
        mooncake(s, "create-table", "st", "public.st", check=True)
        mooncake(s, "persist", "st", check=True)
        assert "stopped" in mooncake(s, "stop", check=True).stdout
        mark = stopped_mark(s)
        assert mark is not None
        for args in (
            ("list-tables",),
            ("list-tables", "--json"),
            ("verify",),
            ("verify", "st", "--checksum"),
            ("flush", "st"),
            ("persist", "st"),
            ("persist", "--all"),
            ("cut",),
            ("merge-index", "st"),
            ("compact", "st"),
            ("drop-table", "st"),
            ("create-table", "st2", "public.st"),
            ("query", "SELECT count(*) FROM st"),
            ("changes", "st", "--since", "0/0", "--no-wait"),
        ):
            r = mooncake(s, *args)
            line = _one_line(r)
            assert r.returncode == 1, (args, r.returncode, line)
            assert (
                f"error: the mooncake service is stopped (`mooncake stop` at {mark}); start it with `mooncake start`"
                in (line)
            ), (args, line)
            assert not _running(s) and service_pid(s) is None, f"{args} started the service"
        # what needs no service is not refused
        st = mooncake(s, "status")
        assert st.returncode == 3 and "not running" in st.stdout, (st.stdout, st.stderr)
        assert mooncake(s, "list-cuts", check=True).returncode == 0
        v = mooncake(s, "verify", "--reader", "pyiceberg", check=True).stdout
        assert "verified: 1/1 tables match" in v, v
        assert not _running(s) and stopped_mark(s) == mark
        # `mooncake start` starts it, and the commands use it again
        mooncake(s, "start", check=True)
        assert stopped_mark(s) is None
        tables = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)["tables"]
        assert [t["name"] for t in tables] == ["st"], tables
    finally:
        mooncake(s, "stop")


def test_a_start_that_fails_keeps_the_stop(pg_cluster, pg_dsn, state_dir, tmp_path, monkeypatch):
    """``mooncake start`` that fails (a role whose password is not given; the service cannot take its
    socket) leaves the stop in place: the next list-tables says the service is stopped instead of
    starting it. Once a start succeeds the mark is gone and list-tables starts the service as on a
    fresh state directory."""
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    try:
        mooncake(s, "start", check=True)
        mooncake(s, "stop", check=True)
        mark = stopped_mark(s)
        assert mark is not None
        with replication_role(pg_cluster.dsn(), pg_dsn, "stopmark_", "s3cret-pw") as role:
            nopw = make_settings(state_dir, pg_dsn.replace("postgres@", f"{role}@", 1), maintenance="dagster")
            r = mooncake(nopw, "start")
            assert r.returncode == 1 and "cannot log in" in r.stderr and "s3cret-pw" not in r.stderr, r.stderr
        assert stopped_mark(s) == mark and not _running(s)
        s.socket_path.mkdir()  # the service cannot unlink it to listen there: it exits at start
        try:
            r = mooncake(s, "start")
            assert r.returncode == 1 and "the mooncake service did not start" in r.stderr, (r.stdout, r.stderr)
        finally:
            s.socket_path.rmdir()
        assert stopped_mark(s) == mark
        r = mooncake(s, "list-tables")
        assert r.returncode == 1 and "the mooncake service is stopped" in _one_line(r), r.stderr
        assert not _running(s)
        mooncake(s, "start", check=True)
        assert stopped_mark(s) is None
        mooncake(s, "stop", check=True)
        (s.state_dir / "service.stopped").unlink()  # as if never stopped: a command starts it when needed
        mooncake(s, "list-tables", check=True)
        assert _running(s)
    finally:
        mooncake(s, "stop")


def test_an_lsn_ahead_of_the_source_is_refused_at_once(pg_dsn, state_dir, tmp_path, monkeypatch):
    """``query --lsn``, ``changes --since/--until`` past the source's ``pg_current_wal_lsn()`` fail at
    once (exit 2, one line naming both LSNs), however long --max-wait is. An LSN the source has reached
    but the mirror has not is still waited for; except by ``changes --no-wait``, which never waits (a
    --since not applied yet is an error at once)."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE la (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO la VALUES (1, 'a'), (2, 'b')")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    hold = tmp_path / "hold-apply"
    monkeypatch.setenv("MOONCAKE_FAULT", f"stream:apply=wait:{hold}")  # for the service `start` spawns
    try:
        mooncake(s, "start", check=True)
        mooncake(s, "create-table", "la", "public.la", check=True)
        mooncake(s, "query", "SELECT count(*) FROM la", check=True)  # caught up with the source
        since = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)["tables"][0]["applied_lsn"]
        for args, far in (
            (("query", "SELECT count(*) FROM la", "--lsn", "5/0"), "5/0"),
            (("changes", "la", "--since", "1/0", "--no-wait"), "1/0"),
            (("changes", "la", "--since", "1/0"), "1/0"),
            (("changes", "la", "--since", since, "--until", "FF/0"), "FF/0"),
        ):
            t0 = time.monotonic()
            r = mooncake(s, *args, "--max-wait", "60")
            took = time.monotonic() - t0
            line = _one_line(r)
            assert r.returncode == 2 and r.stdout == "", (args, r.returncode, line)
            assert line.startswith(f"error: LSN {far} is ahead of the source's current WAL position "), line
            assert line.endswith(" (pg_current_wal_lsn()); pick an LSN at or below it"), line
            named = Lsn.parse(line.split(" position ")[1].split(" ")[0])
            assert Lsn.parse(since) <= named <= _source_lsn(pg_dsn), (line, since)
            assert took < 30, (args, took, line)

        # the mirror held behind the source: an LSN the source has reached is waited for, not refused
        hold.write_text("")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO la VALUES (3, 'c')")
        reached = hold.with_name(hold.name + ".reached")
        deadline = time.time() + 60
        while not reached.exists():
            assert time.time() < deadline, "the stream did not reach stream:apply"
            time.sleep(0.1)
        now = str(_source_lsn(pg_dsn))
        r = mooncake(s, "query", "SELECT count(*) FROM la", "--lsn", now, "--max-wait", "1")
        assert r.returncode == 1 and "timed out after 1s waiting for LSN" in _one_line(r), r.stderr
        # changes --no-wait ends at what is applied now and does not wait for a --since past it
        t0 = time.monotonic()
        r = mooncake(s, "changes", "la", "--since", now, "--no-wait", "--max-wait", "60")
        took = time.monotonic() - t0
        line = _one_line(r)
        assert r.returncode == 1 and f"LSN {now} is not applied yet" in line and "--no-wait" in line, line
        assert took < 30, (took, line)
        hold.unlink()  # the stream goes on: the LSN is reached and read at
        q = mooncake(s, "query", "SELECT count(*) AS n FROM la", "--lsn", now, "--format", "csv", check=True)
        assert q.stdout == "n\n3\n", q.stdout
    finally:
        if hold.exists():
            hold.unlink()
        mooncake(s, "stop")


def test_with_a_sources_file_a_stopped_source_is_reported_and_the_others_served(pg_dsn, pg_dsn2, state_dir):
    """Over every source of a sources file, list-tables, verify and sync say in one line that the source
    whose service was stopped (``--source NAME stop``) is stopped, go on with the others, and exit 1;
    the stopped service is not started."""
    from mooncake_assets.config import load_settings

    from .test_sources import cli

    run_sql(pg_dsn, "CREATE TABLE a1 (id int PRIMARY KEY)", "INSERT INTO a1 VALUES (1)")
    run_sql(pg_dsn2, "CREATE TABLE b1 (id int PRIMARY KEY)", "INSERT INTO b1 VALUES (1)")
    cfg = state_dir / "mooncake.yaml"
    cfg.write_text(
        'state_root: state\nsources:\n  one:\n    dsn_env: ONE_PG_DSN\n    tables: ["public.a*"]\n'
        "  two:\n    dsn_env: TWO_PG_DSN\n    tables: [public.b1, public.b2]\n"
    )
    env = {"ONE_PG_DSN": pg_dsn, "TWO_PG_DSN": pg_dsn2}
    try:
        r = cli(cfg, "sync", env=env)
        assert r.returncode == 0, (r.stdout, r.stderr)
        r = cli(cfg, "--source", "one", "stop", env=env)
        assert r.returncode == 0 and "stopped" in r.stdout, (r.stdout, r.stderr)
        run_sql(pg_dsn, "CREATE TABLE a2 (id int PRIMARY KEY)")  # sync has something to do in both sources
        run_sql(pg_dsn2, "CREATE TABLE b2 (id int PRIMARY KEY)")
        one = load_settings(state_dir / "state" / "one")
        for args, two in (
            (("list-tables",), "b1"),
            (("list-tables", "--json"), '"b1"'),
            (("verify",), "b1"),
            (("sync",), "mirrored public.b2 as b2"),
        ):
            r = cli(cfg, *args, env=env)
            errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
            assert r.returncode == 1 and len(errors) == 1, (args, r.stdout, r.stderr)
            assert errors[0].startswith("error: source one: the mooncake service is stopped (`mooncake stop` at")
            assert two in r.stdout, (args, r.stdout)  # source two is served
            assert not _running(one), f"{args} started source one's service"
        r = cli(cfg, "--source", "two", "list-tables", "--json", env=env)
        assert {t["name"] for t in json.loads(r.stdout)["tables"]} == {"b1", "b2"}, r.stdout
    finally:
        for name in ("one", "two"):
            cli(cfg, "--source", name, "stop", env=env)


def test_a_command_where_no_state_is_sets_nothing_up(pg_dsn, state_dir):
    """Run where no mooncake state is (a wrong directory, a forgotten MOONCAKE_STATE_DIR), a command that
    reads or changes mirrors fails in one line naming the directory, and leaves no state directory,
    no embedded Postgres and no service behind; create-table begins a state there."""
    import subprocess
    import sys

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE fresh (id int PRIMARY KEY)")
        c.execute("INSERT INTO fresh VALUES (1), (2)")
    where = state_dir / "elsewhere"

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MOONCAKE_")}
        cmd = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(where), "--dsn", pg_dsn, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)

    for args in (("list-tables",), ("query", "SELECT 1"), ("verify",), ("persist", "fresh"), ("cut",)):
        r = cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert _one_line(r) == (
            f"error: no mooncake state in {where.resolve()}: nothing is mirrored there; give the state directory "
            "of your mirrors (--state-dir or MOONCAKE_STATE_DIR), or begin one here with "
            "`mooncake create-table DST SCHEMA.TABLE`"
        ), (args, r.stderr)
        assert not (where / "settings.json").exists() and not (where / "service.pid").exists(), args
    r = cli("create-table", "fresh", "public.fresh")
    try:
        assert r.returncode == 0, r.stderr
        assert (where / "settings.json").exists()  # create-table began the state
        r = cli("query", "SELECT count(*) AS n FROM fresh", "--format", "csv")
        assert r.returncode == 0 and r.stdout == "n\n2\n", r.stderr
    finally:
        cli("stop")
