"""The SQL endpoint's pure parts: SCRAM-SHA-256 (RFC 7677's example exchange), users files,
statement splitting, parameter binding and text output (no Postgres needed)."""

from __future__ import annotations

import base64
import os

import pyarrow as pa
import pytest

from mooncake_assets.engine.read.pgwire import auth
from mooncake_assets.engine.read.pgwire.catalog import SessionSettings, SqlError, local_statement, rewrite_functions
from mooncake_assets.engine.read.pgwire.session import bind_params
from mooncake_assets.engine.read.pgwire.sqltext import max_param, split_statements
from mooncake_assets.engine.read.pgwire.types import fields, text_values


def test_scram_matches_rfc7677_example():
    """RFC 7677 §3: user "user", password "pencil", the nonces, salt and iteration count given there."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    v = auth.make_verifier("pencil", 4096, salt)
    ex = auth.ScramExchange(v, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = ex.first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = ex.final(
        "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    bad = auth.ScramExchange(auth.make_verifier("other", 4096, salt), server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    bad.first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(auth.AuthFailed):
        bad.final(
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        )
    assert auth.Verifier.parse(v.text()) == v and v.text().startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")


def test_users_file_holds_verifiers_and_must_be_private(tmp_path):
    f = tmp_path / "users"
    # passwords with characters base64 never produces, so finding them in the file means plain text
    auth.write_user(f, "ana", "p-w_1")
    auth.write_user(f, "bo", "p-w_2")
    auth.write_user(f, "ana", "p-w_3")  # replaced, not duplicated
    text = f.read_text()
    assert "p-w_" not in text and text.count("ana:") == 1 and oct(os.stat(f).st_mode & 0o777) == "0o600"
    users = auth.load_users(f)
    assert set(users) == {"ana", "bo"}
    assert users["ana"].stored_key == auth.make_verifier("p-w_3", users["ana"].iterations, users["ana"].salt).stored_key
    os.chmod(f, 0o644)
    with pytest.raises(auth.UsersFileError, match="chmod 600"):
        auth.load_users(f)
    os.chmod(f, 0o600)
    f.write_text("ana:plain-password\n")
    with pytest.raises(auth.UsersFileError, match="line 1"):
        auth.load_users(f)


def test_statements_split_outside_literals_and_comments():
    assert split_statements("SELECT 1; SELECT ';' AS x; -- c;\n SELECT $$a;b$$") == [
        "SELECT 1",
        "SELECT ';' AS x",
        "-- c;\n SELECT $$a;b$$",
    ]
    assert split_statements("") == [] and split_statements(" ; ;") == [] and split_statements("/* x; */") == []
    assert max_param("SELECT $1, '$7', $2 -- $9") == 2


def test_parameters_are_bound_not_spliced():
    sql, values = bind_params("SELECT * FROM t WHERE a = $1 AND b = $2 AND c = '$1'", [23, 0], [b"5", b"x' OR 1=1"])
    assert sql == "SELECT * FROM t WHERE a = CAST($1 AS INTEGER) AND b = $2 AND c = '$1'"
    assert values == [5, "x' OR 1=1"]


def test_session_settings_and_transactions():
    s = SessionSettings({"user": "ana", "application_name": "psql", "client_encoding": "UTF8"})
    assert local_statement("SET DateStyle TO 'ISO, DMY'", s).tag == "SET" and s.get("datestyle") == "ISO, DMY"
    assert local_statement("show DateStyle", s).rows == [["ISO, DMY"]]
    assert local_statement("SET TIME ZONE 'UTC'", s).tag == "SET"
    assert local_statement("BEGIN", s).tag == "BEGIN" and s.status == b"T"
    s.status = b"E"  # a failed statement inside the block
    with pytest.raises(SqlError) as e:
        local_statement("SHOW DateStyle", s)
    assert e.value.code == "25P02"
    assert local_statement("COMMIT", s).tag == "ROLLBACK" and s.status == b"I"
    with pytest.raises(SqlError) as e:
        local_statement("SET mooncake.read = 'persisted'", s)
    assert e.value.code == "0A000"
    with pytest.raises(SqlError) as e:
        local_statement("SHOW no_such_setting", s)
    assert e.value.code == "42704"
    assert local_statement("SELECT 1", s) is None
    assert rewrite_functions("SELECT version(), current_setting('DateStyle')", s).endswith("'ISO, DMY'")
    sql = "SELECT 'version()', current_user, current_database(), current_schema() -- version()"
    assert rewrite_functions(sql, s, "ana", "db") == "SELECT 'version()', 'ana', 'db', 'public' -- version()"


def test_result_types_and_text():
    t = pa.table(
        {
            "i": pa.array([1, None], pa.int32()),
            "b": pa.array([True, False]),
            "n": pa.array([pa.scalar(1, pa.decimal128(10, 2)).as_py(), None], pa.decimal128(10, 2)),
            "ts": pa.array([0, 2**63 - 1], pa.timestamp("us", tz="UTC")),
            "a": pa.array([[1, None], []], pa.list_(pa.int64())),
            "h": pa.array([b"\x00\xff", b""], pa.binary()),
            "iv": pa.array(
                [pa.MonthDayNano([14, 3, 4_000_000_000]), pa.MonthDayNano([0, 0, 0])], pa.month_day_nano_interval()
            ),
        }
    )
    assert [f.oid for f in fields(t.schema)] == [23, 16, 1700, 1184, 1016, 17, 1186]
    assert [f.oid for f in fields(pa.schema([("j", pa.string())]), {"j": "jsonb"})] == [3802]
    assert text_values(t) == [
        ["1", "t", "1.00", "1970-01-01 00:00:00+00", "{1,NULL}", "\\x00ff", "1 year 2 mons 3 days 00:00:04"],
        [None, "f", None, "infinity", "{}", "\\x", "00:00:00"],
    ]


def test_binary_parameters_decode_what_psycopg_sends():
    """psycopg's own binary dumpers are the oracle for the layouts."""
    import datetime as dt
    from decimal import Decimal

    import psycopg
    from psycopg.adapt import PyFormat

    from mooncake_assets.engine.read.pgwire.binary import decode

    values = [
        7,
        -(2**40),
        1.5,
        True,
        b"\x00\xff",
        dt.date(2024, 2, 29),
        dt.date(1999, 12, 31),
        dt.datetime(2024, 1, 31, 12, 0, 0, 250000, tzinfo=dt.UTC),
        dt.datetime(1970, 1, 1, 0, 0, 1),
        Decimal("-12.30"),
        Decimal("123456789.000001"),
        Decimal("0"),
    ]
    for v in values:
        dumper = psycopg.adapters.get_dumper(type(v), PyFormat.BINARY)(type(v))
        dumper = dumper.upgrade(v, PyFormat.BINARY)
        assert decode(dumper.oid, bytes(dumper.dump(v))) == v, (v, dumper.oid)


def test_framing_reads_what_it_writes_and_refuses_short_messages():
    import io
    import struct

    from mooncake_assets.engine.read.pgwire import protocol as p

    startup = struct.pack("!i", p.PROTOCOL_3_0) + b"user\x00ana\x00database\x00db\x00\x00"
    st = p.read_startup(io.BytesIO(struct.pack("!i", len(startup) + 4) + startup))
    assert st.kind == "startup" and st.params == {"user": "ana", "database": "db"}
    cancel = p.read_startup(io.BytesIO(struct.pack("!iiii", 16, p.CANCEL_REQUEST, 7, 9)))
    assert (cancel.kind, cancel.pid, cancel.key) == ("cancel", 7, 9)
    assert p.read_startup(io.BytesIO(struct.pack("!ii", 8, p.SSL_REQUEST))).kind == "ssl"
    with pytest.raises(p.ProtocolError, match="2.0"):
        p.read_startup(io.BytesIO(struct.pack("!ii", 8, 2 << 16)))
    kind, body = p.read_message(io.BytesIO(p.msg(b"Q", b"SELECT 1\x00")))
    assert kind == b"Q" and p.Body(body).cstr() == "SELECT 1"
    row = p.data_row(["a", None, ""])
    assert row == b"D" + struct.pack("!ih", 4 + 2 + 5 + 4 + 4, 3) + b"\x00\x00\x00\x01a\xff\xff\xff\xff\x00\x00\x00\x00"
    with pytest.raises(p.ProtocolError):
        p.Body(b"\x00").int16()


def test_parse_tree_names_columns_as_postgres_and_cuts_public():
    from mooncake_assets.engine.read.pgwire.parsed import Parser

    p = Parser()
    got = p.parse(
        'SELECT count(*), 1, a + b, x::int8, \'1\'::int, true, lower(n) AS Low, "Q" AS "Q", ID, pg_catalog.now(), '
        "CASE WHEN a THEN 1 END, coalesce(a, b), (SELECT max(z) FROM t), EXISTS (SELECT 1), ARRAY[1], $1, "
        'row_number() OVER () FROM public.t, "public"."U" u, db.public.v WHERE public.t.a = 1'
    )
    assert got.names == [
        "count", "?column?", "?column?", "x", "int4", "?column?", "low", "Q", "id", "now",
        "case", "coalesce", "max", "exists", "array", "?column?", "row_number",
    ]  # fmt: skip
    assert got.sql.endswith('FROM t, "U" u, v WHERE t.a = 1') and got.tables == {"t": "t", "u": "u", "v": "v"}
    star = p.parse("SELECT 1 AS a, *, x FROM t")
    assert star.output_names(5) == ["a", "", "", "", "x"] and star.columns[2] == (None, "x")
    assert p.parse("SELECT 1 UNION SELECT 2 AS b").names == ["?column?"]
    info = p.parse("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
    assert info.information_schema == {"tables"} and "FROM __mc_is_tables WHERE" in info.sql
    assert p.parse("SELEC 1").names is None


def test_array_parameters_text_and_binary():
    import psycopg
    from psycopg.adapt import PyFormat

    from mooncake_assets.engine.read.pgwire import arrays
    from mooncake_assets.engine.read.pgwire.binary import decode

    assert arrays.parse_text('{1,NULL,"a b","q\\"x",{2}}') == ["1", None, "a b", 'q"x', ["2"]]
    assert arrays.parse_text("{}") == [] and arrays.parse_text("[0:1]={a,b}") == ["a", "b"]
    with pytest.raises(SqlError):
        arrays.parse_text("1,2")
    for v in ([1, None, 3], [[1, 2], [3, 4]], [2**40], ["a", "b c"], [1.5]):
        dumper = psycopg.adapters.get_dumper(list, PyFormat.BINARY)(list).upgrade(v, PyFormat.BINARY)
        assert arrays.decode_binary(bytes(dumper.dump(v)), decode) == v, v
    assert arrays.uses_as_array("SELECT 1 WHERE x = ANY ( $2 )", 2) and not arrays.uses_as_array("= ANY($21)", 2)
    sql, values = bind_params("SELECT 1 WHERE a = ANY($1) AND b = ANY($2)", [1007, 0], [b"{1,2}", b'{x,"y z"}'])
    assert sql == "SELECT 1 WHERE a = ANY(CAST($1 AS INTEGER[])) AND b = ANY(CAST($2 AS VARCHAR[]))"
    assert values == [[1, 2], ["x", "y z"]]
    assert bind_params("SELECT $1", [1007], [b"{{1},{2}}"])[0] == "SELECT CAST($1 AS INTEGER[][])"


def test_copy_statements_and_lines():
    from mooncake_assets.engine.read.pgwire.copy import copy_out

    plan = copy_out("COPY (SELECT 1) TO STDOUT")
    assert plan is not None and plan.query == "SELECT 1" and not plan.csv
    assert plan.line(["a\tb", None, "", "x\\y\n"]) == b"a\\tb\t\\N\t\tx\\\\y\\n\n"
    csv = copy_out("copy t (a, b) to stdout with (format csv, header true, delimiter ';')")
    assert csv is not None and (csv.query, csv.header, csv.delimiter) == ("SELECT a, b FROM t", True, ";")
    assert csv.line(["a;b", None, "", 'q"', "plain"]) == b'"a;b";;"";"q""";plain\n'
    assert copy_out("COPY t TO STDOUT CSV HEADER").delimiter == ","  # type: ignore[union-attr]
    assert copy_out("COPY t FROM STDIN") is None and copy_out("SELECT 1") is None
    for sql in ("COPY t TO '/tmp/x'", "COPY t TO STDOUT (FORMAT binary)"):
        with pytest.raises(SqlError) as e:
            copy_out(sql)
        assert e.value.code == "0A000" and e.value.hint


def test_psql_catalog_queries_get_the_columns_they_select():
    from mooncake_assets.engine.read.pgwire.psql import select_names

    sql = (
        "SELECT a.attname,\n  pg_catalog.format_type(a.atttypid, a.atttypmod),\n  (SELECT pg_catalog.pg_get_expr(d.adbin,"
        " d.adrelid, true) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid),\n  a.attnotnull,\n"
        "  CASE WHEN a.attstattarget=-1 THEN NULL ELSE a.attstattarget END AS attstattarget,\n"
        '  n.nspname as "Schema", false AS relhasoids\nFROM pg_catalog.pg_attribute a'
    )
    assert select_names(sql) == [
        "attname", "format_type", "pg_get_expr", "attnotnull", "attstattarget", "Schema", "relhasoids",
    ]  # fmt: skip
