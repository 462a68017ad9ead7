"""``mooncake sql-server`` with the clients people use (psql's meta-commands and ``\\copy``, psycopg's
list parameters and jsonb/uuid decoding, SQLAlchemy/pandas, schema browsers' ``information_schema``
queries, several clients at once), every answer compared with the same statement run on Postgres.

"At the same LSN": each comparison follows a write committed in Postgres just before it, and nothing
writes after it; a ``latest`` read waits until the service has applied the source's LSN at the
statement's start, so the endpoint and Postgres answer over the same committed state (a mirror one
write behind would differ).
"""

from __future__ import annotations

import re
import threading
import uuid

import psycopg
import pytest

from mooncake_assets.engine.read.pgwire import write_user

from ..helpers import make_settings, mooncake, run_sql
from .test_sql_server import PASSWORD, SqlServer, _run_psql

U1, U2 = uuid.UUID(int=1), uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")
SETUP = [
    "CREATE TABLE docs (id int PRIMARY KEY, u uuid, j jsonb, js json, tag varchar(20), n numeric(10,2), "
    "arr int[], note text)",
    f"INSERT INTO docs VALUES (1, '{U1}', '{{\"a\": [1, 2], \"b\": null}}', '[1, \"x\"]', 'red', 1.50, '{{1,2}}', "
    "'tab\there'),"
    f"(2, '{U2}', '\"s\"', '{{}}', 'blue', NULL, NULL, 'line\nbreak \\ back'),"
    "(3, NULL, NULL, NULL, NULL, -2.25, '{}', NULL)",
    'CREATE TABLE "User" (id int PRIMARY KEY, "Name" text)',
    "INSERT INTO \"User\" VALUES (1, 'ann'), (2, 'bob')",
]


@pytest.fixture()
def served(pg_dsn, state_dir, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for st in SETUP:
            c.execute(st)
    s = make_settings(state_dir, pg_dsn)
    mooncake(s, "create-table", "docs", "public.docs", check=True)
    mooncake(s, "create-table", "User", 'public."User"', check=True)
    users = tmp_path / "users"
    write_user(users, "ana", PASSWORD)
    server = SqlServer(s, users)
    try:
        yield server
    finally:
        server.stop()
        mooncake(s, "stop")


def _same(ours: psycopg.Connection, src: psycopg.Connection, sql: str, params=None):
    a, b = ours.execute(sql, params), src.execute(sql, params)
    got = a.fetchall()
    assert got == b.fetchall(), (sql, got)
    assert [(d.name, d.type_code) for d in a.description] == [(d.name, d.type_code) for d in b.description], sql
    return got


def test_psql_names_meta_commands_and_copy_equal_postgres(served, pg_dsn):
    # schema-qualified and quoted names; Postgres's output column names; COPY … TO STDOUT. The first
    # has no ORDER BY (both answer in insertion order), so it runs before the write, which the others
    # see on both sides (an updated row's place in an unordered answer is not the same on both)
    for sql in (
        r"\copy docs (id, tag) to stdout csv header",
        "UPDATE docs SET tag = 'amber', n = 3.75 WHERE id = 3",
        "SELECT id, tag FROM public.docs ORDER BY id",
        'SELECT "Name" FROM public."User" ORDER BY id',
        "SELECT public.docs.id, d.tag FROM public.docs JOIN docs d USING (id) ORDER BY 1",
        'SELECT count(*), 1, sum(id), min(tag) AS Low, max(tag) AS "High" FROM docs',
        "SELECT id + 1, id::int8, true, lower(tag), CASE WHEN id > 1 THEN 'x' END, coalesce(tag, 'z'), "
        "(SELECT max(id) FROM docs), sum(id) OVER (), ID, NULL, '1'::int FROM docs ORDER BY 1",
        "SELECT 1 UNION ALL SELECT 2",
        r"\copy (SELECT id, tag, note, n FROM public.docs ORDER BY id) to stdout",
        r"\copy (SELECT id, tag, note, arr FROM docs ORDER BY id) to stdout with (format csv, header)",
    ):
        if sql.startswith("UPDATE"):
            run_sql(pg_dsn, sql)
            continue
        ours = _run_psql(served.dsn(), "--csv", "-c", sql)
        assert ours.returncode == 0, (sql, ours.stderr)
        src = _run_psql(pg_dsn, "--csv", "-c", sql)
        assert src.returncode == 0, (sql, src.stderr)
        assert ours.stdout == src.stdout, (sql, ours.stdout)
    d = _run_psql(served.dsn(), "-c", r"\d+ docs")
    assert d.returncode == 0, d.stderr  # psql reads every column it asks for: no crash
    for col, typ in (("u", "uuid"), ("j", "jsonb"), ("tag", "character varying"), ("arr", "integer\\[\\]")):
        assert re.search(rf"\b{col}\s*\|\s*{typ}", d.stdout), d.stdout
    assert "Storage" in d.stdout and "extended" in d.stdout, d.stdout
    quoted = _run_psql(served.dsn(), "-c", r'\d "User"')
    assert quoted.returncode == 0 and re.search(r"Name\s*\|\s*text", quoted.stdout), quoted
    for meta in (r"\di", r"\dv"):
        r = _run_psql(served.dsn(), "-c", meta)
        assert r.returncode == 0 and "Did not find any relations" in r.stdout + r.stderr, (meta, r)
    dn = _run_psql(served.dsn(), "-c", r"\dn")
    assert dn.returncode == 0 and re.search(r"public\s*\|\s*mooncake", dn.stdout), dn
    listed = _run_psql(served.dsn(), "-c", r"\dt public.*")
    assert listed.returncode == 0 and "docs" in listed.stdout and "User" in listed.stdout, listed
    # COPY to a file: 0A000 with what to use instead; COPY FROM: a write
    with psycopg.connect(served.dsn(), autocommit=True) as c:
        with pytest.raises(psycopg.Error) as e:
            c.execute("COPY docs TO '/tmp/docs.txt'")
        assert e.value.sqlstate == "0A000" and "TO STDOUT" in (e.value.diag.message_hint or ""), e.value
        with pytest.raises(psycopg.Error) as e:
            c.execute("COPY docs FROM STDIN")
        assert e.value.sqlstate == "25006", e.value
        with c.cursor().copy("COPY (SELECT id, note FROM docs WHERE id < %s ORDER BY id) TO STDOUT", (3,)) as cp:
            assert list(cp.rows()) == [("1", "tab\there"), ("2", "line\nbreak \\ back")]
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_psycopg_arrays_types_information_schema_sqlalchemy_equal_postgres(served, pg_dsn):
    run_sql(pg_dsn, "UPDATE docs SET tag = 'x y' WHERE id = 3")  # the tag = ANY(…) answer below holds it
    with psycopg.connect(served.dsn(), autocommit=True) as ours, psycopg.connect(pg_dsn, autocommit=True) as src:
        # array parameters (psycopg sends a list as an array: typed for numbers, untyped text for strings)
        _same(ours, src, "SELECT id FROM docs WHERE id = ANY(%s) ORDER BY id", ([1, 3, 99],))
        _same(ours, src, "SELECT id FROM docs WHERE id = ANY(%s) ORDER BY id", ([2**40, 2],))
        _same(ours, src, "SELECT id FROM docs WHERE tag = ANY(%s) ORDER BY id", (["red", "blue", "x y"],))
        _same(ours, src, "SELECT id FROM docs WHERE tag = ANY(%s) ORDER BY id", ([],))
        _same(ours, src, "SELECT id FROM docs WHERE id <> ALL(%s) ORDER BY id", ([1, None],))
        _same(ours, src, "SELECT id FROM docs WHERE u = ANY(%s) ORDER BY id", ([U2],))
        _same(ours, src, "SELECT id FROM docs WHERE id = ANY(%b) ORDER BY id", ([2, 3],))  # binary form
        # jsonb/json/uuid/varchar columns carry their own type OIDs: psycopg decodes dicts and UUIDs
        rows = _same(ours, src, "SELECT id, u, j, js, tag, n, arr FROM docs ORDER BY id")
        assert rows[0][1] == U1 and rows[0][2] == {"a": [1, 2], "b": None} and rows[0][3] == [1, "x"]
        _same(ours, src, "SELECT * FROM public.docs ORDER BY id")
        _same(ours, src, "SELECT d.j AS payload, d.u FROM docs d WHERE d.id = %s", (2,))
        _same(ours, src, 'SELECT "Name", id FROM "User" ORDER BY id')
        # information_schema, as schema browsers read it
        tables = (
            "SELECT table_schema, table_name, table_type FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_name IN ('docs', 'User')"
        )
        assert sorted(ours.execute(tables).fetchall()) == sorted(src.execute(tables).fetchall())
        cols = (
            "SELECT column_name, ordinal_position, data_type, udt_name, character_maximum_length, numeric_precision, "
            "numeric_scale FROM information_schema.columns WHERE table_schema = 'public' AND table_name = %s "
            "ORDER BY ordinal_position"
        )
        for t in ("docs", "User"):
            assert ours.execute(cols, (t,)).fetchall() == src.execute(cols, (t,)).fetchall(), t
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pd = pytest.importorskip("pandas")
    ours_engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(served.dsn()))
    src_engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(pg_dsn))
    run_sql(pg_dsn, "UPDATE docs SET n = 7.25 WHERE id = 2")  # pandas' frames below hold it
    q = sqlalchemy.text("SELECT id, tag, n FROM public.docs WHERE id = ANY(:ids) ORDER BY id")
    frames = []
    for engine in (ours_engine, src_engine):
        with engine.connect() as c:
            frames.append(pd.read_sql(q, c, params={"ids": [1, 2]}))
            assert c.execute(sqlalchemy.text("SELECT count(*) FROM docs")).scalar() == 3
        engine.dispose()
    pd.testing.assert_frame_equal(frames[0], frames[1])
    assert frames[0]["n"].tolist() == [1.5, 7.25], frames[0]  # the write just made, through SQLAlchemy


def test_psql_copy_to_a_file_equals_postgres_at_the_same_lsn(served, pg_dsn, tmp_path):
    """psql's ``\\copy (SELECT …) to '<file>'`` (psql sends ``COPY … TO STDOUT`` and writes the file):
    the file written through the endpoint has the rows of the file written from Postgres, right after
    writes to both mirrors (a join of the two, text and CSV formats)."""
    lsn = run_sql(
        pg_dsn,
        "UPDATE docs SET tag = 'green', note = 'after' WHERE id = 3",
        "DELETE FROM docs WHERE id = 1",
        "INSERT INTO docs (id, tag, arr) VALUES (4, 'new', '{4}')",
        "INSERT INTO \"User\" VALUES (4, 'dee')",
        "SELECT pg_current_wal_lsn()::text",
    )[0][0]
    join = 'SELECT d.id, d.tag, d.note, d.arr, u."Name" FROM docs d LEFT JOIN "User" u USING (id) ORDER BY d.id'
    for name, options, copied in (
        ("join.csv", " with (format csv, header)", (join, 3)),
        ("join.txt", "", (join, 3)),
        ("docs.txt", "", ("SELECT id, u, j, n FROM public.docs WHERE id > 1 ORDER BY id", 3)),
    ):
        sql, count = copied
        files = {}
        for side, dsn in (("ours", served.dsn()), ("postgres", pg_dsn)):
            f = tmp_path / f"{side}-{name}"
            r = _run_psql(dsn, "-c", f"\\copy ({sql}) to '{f}'{options}")
            assert r.returncode == 0 and r.stdout.strip() == f"COPY {count}", (side, sql, r)
            files[side] = f.read_text()
        assert files["ours"] == files["postgres"], (name, lsn, files["ours"])
        if "csv" not in options:  # the text format escapes the newline in row 2's note: one line a row
            assert len(files["ours"].splitlines()) == count, files["ours"]
    assert "4,new,,{4},dee" in (tmp_path / "ours-join.csv").read_text().splitlines()  # the writes are there
    assert "3\tgreen\tafter\t{}\t\\N" in (tmp_path / "ours-join.txt").read_text().splitlines()


def test_eight_clients_at_once_each_get_their_answer(served):
    """Eight psycopg connections in eight threads, each its own parameterized statements, at once."""
    out: dict[int, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def client(k: int) -> None:
        try:
            with psycopg.connect(served.dsn(), autocommit=True) as c:
                start.wait(timeout=120)
                got = []
                for i in range(5):
                    sql = "SELECT id, %s::int AS k FROM docs WHERE id <= %s ORDER BY id"
                    got.append(c.execute(sql, (k, 1 + (k + i) % 3)).fetchall())
                    got.append(c.execute('SELECT count(*) FROM "User" WHERE id = ANY(%s)', ([1, k],)).fetchone())
                out[k] = got
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for k in range(8):
        expected = []
        for i in range(5):
            n = 1 + (k + i) % 3
            expected.append([(j, k) for j in range(1, n + 1)])
            expected.append((2 if k == 2 else 1,))
        assert out[k] == expected, (k, out[k])
