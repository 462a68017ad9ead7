"""``mooncake query`` prints values as psql does and refuses bad input in one line.

The oracle is psql itself: ``psql --csv`` over the source prints the same CSV as ``mooncake query
--format csv`` over the mirror (±infinity, NULL, booleans, arrays, numeric scale, floats).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import psycopg

from ..helpers import make_settings, mooncake

COLS = "id, ts, tsz, d, b, arr, tags, note, n, f, bin"
SETUP = [
    "CREATE TABLE q (id int PRIMARY KEY, ts timestamp, tsz timestamptz, d date, b boolean, arr int[], tags text[], "
    "note text, n numeric(10,2), f float8, bin bytea)",
    "INSERT INTO q VALUES "
    "(1, 'infinity', 'infinity', 'infinity', true, '{1,2,NULL}', '{\"a b\",NULL,x,\"\"}', repeat('x', 120), 1.50, 0.1, '\\x00ff'),"
    "(2, '-infinity', '-infinity', '-infinity', false, NULL, NULL, NULL, NULL, 'NaN', NULL),"
    "(3, '2024-01-31 12:00:00.5', '2024-01-31 12:00:00.25+00', '2024-01-31', NULL, '{}', '{}', '', 0, '-Infinity', ''),"
    "(4, '0044-03-15 10:00:00 BC', '12000-01-01 00:00:00+00', '0044-03-15 BC', true, '{-7}', '{\"q\\\"uote\",\"c,d\"}',"
    " 'a,b \"c\"', -12.3, 1e300, '\\x')",
]


def _psql_csv(dsn: str, sql: str) -> str:
    psql = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    env = dict(os.environ, PGTZ="UTC", PGDATESTYLE="ISO")
    return subprocess.run(
        [str(psql), "--no-psqlrc", "--csv", "-d", dsn, "-c", sql], capture_output=True, text=True, env=env, check=True
    ).stdout


def _psql(dsn: str, sql: str) -> str:
    psql = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    env = dict(os.environ, PGTZ="UTC", PGDATESTYLE="ISO", PGCLIENTENCODING="UTF8")
    return subprocess.run(
        [str(psql), "--no-psqlrc", "-d", dsn, "-c", sql], capture_output=True, text=True, env=env, check=True
    ).stdout


def _setup(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for s in SETUP:
            c.execute(s)
    settings = make_settings(state_dir, pg_dsn)
    mooncake(settings, "create-table", "q", "public.q", check=True)
    return settings


def test_query_renders_like_psql_and_refuses_bad_input(pg_dsn, state_dir):
    s = _setup(pg_dsn, state_dir)
    try:
        sql = f"SELECT {COLS} FROM q ORDER BY id"
        csv = mooncake(s, "query", sql, "--format", "csv", check=True)
        assert csv.stdout == _psql_csv(pg_dsn, sql), csv.stdout

        table = mooncake(s, "query", sql, check=True)  # piped: nothing cut to 80 columns
        out = table.stdout
        assert "x" * 120 in out and "None" not in out and "False" not in out and "True" not in out, out
        assert "-infinity" in out and "{1,2,NULL}" in out and "(4 rows)" in out, out
        assert not any(line.endswith("…") for line in out.splitlines()), out

        rows = json.loads(mooncake(s, "query", sql, "--format", "json", check=True).stdout)
        assert rows[0]["ts"] == "infinity" and rows[1]["tsz"] == "-infinity" and rows[0]["d"] == "infinity"
        assert rows[0]["b"] is True and rows[1]["b"] is False and rows[2]["b"] is None
        assert rows[0]["arr"] == [1, 2, None] and rows[0]["tags"] == ["a b", None, "x", ""] and rows[2]["arr"] == []
        assert rows[1]["note"] is None and rows[0]["n"] == 1.5 and rows[1]["f"] == "NaN"
        assert rows[2]["ts"] == "2024-01-31T12:00:00.5" and rows[2]["tsz"] == "2024-01-31T12:00:00.25+00:00"

        bad = mooncake(s, "query", sql, "--format", "xml")
        assert bad.returncode == 2 and "xml" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        bad = mooncake(s, "query", sql, "--lsn", "garbage")
        assert bad.returncode == 2 and "'garbage' is not an LSN" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        for stmt in (
            "DELETE FROM q",
            "INSERT INTO q VALUES (9)",
            "COPY q TO '/tmp/mooncake-q.csv'",
            "SELECT 1; DROP TABLE q",
        ):
            bad = mooncake(s, "query", stmt)
            assert bad.returncode == 2 and "queries are read-only" in bad.stderr, (stmt, bad.stderr)
            assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert mooncake(s, "query", "SELECT count(*) AS n FROM q", "--format", "csv", check=True).stdout == "n\n4\n"

        # --no-wait reads what is applied and says at which LSN; --max-wait bounds the barrier
        nw = mooncake(s, "query", "SELECT count(*) AS n FROM q", "--no-wait", "--format", "csv", check=True)
        assert nw.stdout == "n\n4\n" and "read at LSN " in nw.stderr, nw.stderr
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO q (id) VALUES (5)")
        mw = mooncake(s, "query", "SELECT count(*) AS n FROM q", "--max-wait", "60", "--format", "csv", check=True)
        assert mw.stdout == "n\n5\n", mw.stdout
        # --lsn past the source's current WAL position is refused at once, naming both LSNs (no older rows
        # passed off as that LSN, and no wait for an LSN no commit reaches; tests/cli/test_stop_and_lsn_ahead.py)
        far = mooncake(s, "query", "SELECT count(*) AS n FROM q", "--lsn", "FF/0", "--max-wait", "1")
        assert far.returncode == 2 and "LSN FF/0 is ahead of the source's current WAL position" in far.stderr, (
            far.stdout,
            far.stderr,
        )
        assert len(far.stderr.strip().splitlines()) == 1 and far.stdout == "", far.stderr

        # several statements: every result, each on its own, as psql prints them (it printed the last only)
        two = "SELECT 1 AS a; SELECT id, note FROM q WHERE id < 3 ORDER BY id"
        assert mooncake(s, "query", two, check=True).stdout + "\n" == _psql(pg_dsn, two), two
        assert mooncake(s, "query", two, "--format", "csv", check=True).stdout == _psql_csv(pg_dsn, two)
        bad = mooncake(s, "query", "SELECT 1 AS a; DELETE FROM q")  # nothing runs when one is not a read
        assert bad.returncode == 2 and bad.stdout == "" and "queries are read-only" in bad.stderr, bad

        # a stopped service is not started behind the user's back
        assert "stopped" in mooncake(s, "stop", check=True).stdout
        q = mooncake(s, "query", "SELECT count(*) FROM q")
        assert q.returncode == 1 and "service is stopped" in q.stderr and "mooncake start" in q.stderr, q.stderr
        assert "not running" in mooncake(s, "status").stdout
        mooncake(s, "start", check=True)
        assert mooncake(s, "query", "SELECT count(*) AS n FROM q", "--format", "csv", check=True).stdout == "n\n5\n"
    finally:
        mooncake(s, "stop")


STRUCT_SETUP = [
    "CREATE EXTENSION IF NOT EXISTS hstore",
    "CREATE TYPE qc_inner AS (x int, y text)",
    "CREATE TYPE qc_rec AS (at timestamp, d date, label text, inner_v qc_inner, tags text[], n numeric(6,2))",
    "CREATE TABLE qc (id int PRIMARY KEY, r qc_rec, h hstore, ra qc_inner[])",
    r"""INSERT INTO qc VALUES
      (1, ROW('infinity', '-infinity', 'a b', ROW(1, 'x,y'), '{p,"q r",NULL}', 1.5),
          '"k"=>"v", "n"=>NULL, "q\""=>"\\", "sp ace"=>""', ARRAY[ROW(1, 'a'), NULL, ROW(NULL, 'b c')]::qc_inner[]),
      (2, ROW(NULL, '0044-03-15 BC', '', NULL, '{}', NULL), '', '{}'),
      (3, NULL, NULL, NULL),
      (4, ROW('2024-01-31 12:00:00.5', 'infinity', 'say "hi" (\)', ROW(NULL, NULL), NULL, -2), '"a"=>"1"', NULL)""",
]


def test_query_renders_composite_and_hstore_like_psql(pg_dsn, state_dir):
    """A composite (struct) holding ``infinity`` timestamps, quotes, nested composites and arrays, and an
    hstore (map) with a NULL value print as psql prints them (record and hstore text), and as JSON
    objects."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for st in STRUCT_SETUP:
            c.execute(st)
    s = make_settings(state_dir, pg_dsn)
    mooncake(s, "create-table", "qc", "public.qc", check=True)
    try:
        sql = "SELECT id, r, h, ra FROM qc ORDER BY id"
        csv = mooncake(s, "query", sql, "--format", "csv", check=True)
        assert csv.stdout == _psql_csv(pg_dsn, sql), csv.stdout
        table = mooncake(s, "query", sql, check=True).stdout
        assert '(infinity,-infinity,"a b","(1,""x,y"")","{p,""q r"",NULL}",1.50)' in table, table
        assert '"k"=>"v", "n"=>NULL' in table and "(4 rows)" in table, table
        rows = json.loads(mooncake(s, "query", sql, "--format", "json", check=True).stdout)
        assert rows[0]["r"]["at"] == "infinity" and rows[0]["r"]["inner_v"] == {"x": 1, "y": "x,y"}, rows[0]
        assert rows[0]["h"]["n"] is None and rows[0]["h"]["k"] == "v" and rows[2]["r"] is None, rows
        assert rows[0]["ra"][1] is None and rows[0]["ra"][2] == {"x": None, "y": "b c"}, rows[0]
    finally:
        mooncake(s, "stop")


def test_query_names_columns_and_prints_floats_as_psql_does(pg_dsn, state_dir):
    """``count(*)`` is headed ``count`` (DuckDB calls it ``count_star()``) and a double -1 prints ``-1``
    (Python's ``-1.0``): the CSV equals psql's for floats across fixed and exponent notation."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE fl (id int PRIMARY KEY, f float8, r real)")
        c.execute(
            "INSERT INTO fl VALUES (1, -1, 1), (2, 2.5, -0.5), (3, 1e15, 1e6), (4, 123456789012345, 0.0001),"
            " (5, 1e-5, 3e-5), (6, '-0', 100000)"
        )
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "create-table", "fl", "public.fl", check=True)
        for sql in (
            "SELECT id, f, r FROM fl ORDER BY id",
            "SELECT count(*), min(f), max(r) AS top, f FROM fl WHERE id < 6 GROUP BY f ORDER BY f",  # -0: DuckDB groups it as 0
        ):
            csv = mooncake(s, "query", sql, "--format", "csv", check=True)
            assert csv.stdout == _psql_csv(pg_dsn, sql), csv.stdout
        table = mooncake(s, "query", "SELECT count(*) FROM fl", check=True).stdout
        assert table.splitlines()[0].strip() == "count" and "count_star" not in table, table
    finally:
        mooncake(s, "stop")
