"""Postgres → Arrow type mapping, describe_table and the column-wise text decoder.

Oracle: the values Postgres itself returns through psycopg (typed) for the same rows, decoded here
from the text Postgres prints (COPY csv and pgoutput both produce that text)."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.cdc import (
    ColumnSpec,
    UnsupportedTypeError,
    arrow_type_for,
    decode_text_column,
    decode_text_columns,
    describe_table,
    initial_copy,
)
from mooncake_assets.engine.cdc.decode import _parse_rare
from mooncake_assets.engine.pg.conninfo import OUTPUT_SETTINGS
from mooncake_assets.engine.pg.schema import DATE_INFINITY, TIMESTAMP_INFINITY

ALL_TYPES_DDL = """
CREATE TABLE public.all_types (
    id        int PRIMARY KEY,
    b         boolean,
    i2        smallint,
    i4        integer,
    i8        bigint,
    f4        real,
    f8        double precision,
    n12_2     numeric(12,2),
    n38       numeric(38,10),
    n_free    numeric,
    n_big     numeric(50,5),
    t         text,
    vc        varchar(20),
    c5        char(5),
    nm        name,
    d         date,
    ts        timestamp,
    tstz      timestamptz,
    tm        time,
    u         uuid,
    j         json,
    jb        jsonb,
    by        bytea,
    gen       bigint GENERATED ALWAYS AS (i4::bigint * 2) STORED
)
"""

ALL_TYPES_ROWS = """
INSERT INTO all_types (id, b, i2, i4, i8, f4, f8, n12_2, n38, n_free, n_big, t, vc, c5, nm, d, ts, tstz, tm, u, j, jb, by)
VALUES
 (1, true, 32767, 2147483647, 9223372036854775807, 1.1, 0.1, 1234567890.12, 1234567890123456789012345678.0123456789,
  123456789012345678901234567890123456789012345678901234567890.000000000000000000001, 1.5,
  'héllo wörld ✓ 😀', 'abc', 'ab', 'pg_name', '2024-02-29', '2024-02-29 13:14:15.123456',
  '2024-07-01 12:00:00.5+00', '23:59:59.999999', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
  '{"a": [1, 2, {"b": null}]}', '{"z": 1, "a": "ü"}', '\\x00ff10deadbeef'),
 (2, false, -32768, -2147483648, -9223372036854775808, 'NaN', 'Infinity', -0.01, -1, 'NaN', -99999.99999,
  '', '', '', '', '1970-01-01', '1970-01-01 00:00:00', '1999-12-31 23:59:59+05:30', '00:00:00',
  '00000000-0000-0000-0000-000000000000', '[]', 'null', '\\x'),
 (3, NULL, NULL, NULL, NULL, '-Infinity', '-Infinity', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, true, 0, 0, 0, 3.4028235e38, 1.7976931348623157e308, 0, 0.0000000001, '-0.000000000000000000000000000000000000001',
  0, E'line1\\nline2, "quoted",\\ttab \\\\ backslash', 'x,y', 'a"b', 'n', '0001-01-01',
  '0001-01-01 00:00:00', '2262-04-11 23:47:16.854775+00', '12:00:00.000001',
  'ffffffff-ffff-ffff-ffff-ffffffffffff', '"\\u00e9"', '{"k": "v\\"q"}', '\\x5c78'),
 (5, false, 1, 1, 1, 1e-45, 5e-324, 9999999999.99, 9999999999999999999999999999.9999999999, '1e-30',
  1234567890123456789012345678901234567890123.45678, 'NULL', 'null', '  ', 'x', '9999-12-31',
  '9999-12-31 23:59:59.999999', '1901-12-13 20:45:52-03', '01:02:03', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a12',
  'null', '{}', '\\x0a0d09')
"""


def _oracle(conn: psycopg.Connection) -> list[tuple]:
    """Rows as Postgres returns them (typed by psycopg), normalised to what Arrow should hold."""
    conn.execute("SET TimeZone = 'America/New_York'")
    rows = conn.execute(
        "SELECT id, b, i2, i4, i8, f4, f8, n12_2, n38, n_free::text, n_big::text, t, vc, c5, nm, d, ts, tstz, tm, "
        "u::text, j::text, jb::text, by FROM all_types ORDER BY id"
    ).fetchall()
    out = []
    for r in rows:
        r = list(r)
        if r[17] is not None:
            r[17] = r[17].astimezone(dt.UTC)
        out.append(tuple(r))
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


def _assert_matches(batch: pa.RecordBatch, expected: list[tuple], names: list[str]) -> None:
    got = batch.to_pylist()
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        for name, ev in zip(names, e):
            gv = g[name]
            if name == "f4" and gv is not None:  # compare as float32
                assert _same(float(np.float32(gv)), float(np.float32(ev))), (name, gv, ev)
                continue
            assert _same(gv, ev), (g["id"], name, gv, ev)


ORACLE_NAMES = [
    "id",
    "b",
    "i2",
    "i4",
    "i8",
    "f4",
    "f8",
    "n12_2",
    "n38",
    "n_free",
    "n_big",
    "t",
    "vc",
    "c5",
    "nm",
    "d",
    "ts",
    "tstz",
    "tm",
    "u",
    "j",
    "jb",
    "by",
]


@pytest.fixture()
def all_types(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(ALL_TYPES_DDL)
        c.execute("SET TimeZone = 'Asia/Kolkata'")  # timestamptz literals without offset are read in this zone
        c.execute(ALL_TYPES_ROWS)
    return pg_dsn


def test_arrow_type_for_mapping():
    assert arrow_type_for(16, -1, "boolean") == pa.bool_()
    assert arrow_type_for(21, -1, "smallint") == pa.int16()
    assert arrow_type_for(23, -1, "integer") == pa.int32()
    assert arrow_type_for(20, -1, "bigint") == pa.int64()
    assert arrow_type_for(700, -1, "real") == pa.float32()
    assert arrow_type_for(701, -1, "double precision") == pa.float64()
    assert arrow_type_for(1700, ((12 << 16) | 2) + 4, "numeric(12,2)") == pa.decimal128(12, 2)
    assert arrow_type_for(1700, ((38 << 16) | 0) + 4, "numeric(38,0)") == pa.decimal128(38, 0)
    assert arrow_type_for(1700, -1, "numeric") == pa.string()
    assert arrow_type_for(1700, ((39 << 16) | 2) + 4, "numeric(39,2)") == pa.string()
    assert arrow_type_for(1700, ((5 << 16) | (-2 & 0x7FF)) + 4, "numeric(5,-2)") == pa.string()
    for oid, name in [
        (25, "text"),
        (1043, "character varying(20)"),
        (1042, "character(5)"),
        (19, "name"),
        (18, '"char"'),
        (2950, "uuid"),
        (114, "json"),
        (3802, "jsonb"),
    ]:
        assert arrow_type_for(oid, -1, name) == pa.string()
    assert arrow_type_for(17, -1, "bytea") == pa.binary()
    assert arrow_type_for(1082, -1, "date") == pa.date32()
    assert arrow_type_for(1114, 3, "timestamp(3) without time zone") == pa.timestamp("us")
    assert arrow_type_for(1184, -1, "timestamp with time zone") == pa.timestamp("us", tz="UTC")
    assert arrow_type_for(1083, -1, "time without time zone") == pa.time64("us")
    with pytest.raises(UnsupportedTypeError, match="tsvector"):
        arrow_type_for(3614, -1, "tsvector")


def test_describe_table(all_types):
    with psycopg.connect(all_types) as c:
        c.execute("ALTER TABLE all_types DROP COLUMN nm")
        c.commit()
        ts = describe_table(c, "public.all_types")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert (ts.schema, ts.name, ts.replica_identity, ts.has_primary_key, ts.key_columns) == (
        "public",
        "all_types",
        "d",
        True,
        ["id"],
    )
    names = [col.name for col in ts.columns]
    assert "nm" not in names  # dropped
    gen = next(col for col in ts.columns if col.name == "gen")  # STORED generated: mirrored, with its expression
    assert gen.generated and "i4" in gen.generated and not any(col.generated for col in ts.columns if col.name != "gen")
    assert names[0] == "id" and ts.columns[0].is_key and ts.columns[0].not_null
    by = {col.name: col for col in ts.columns}
    assert by["n12_2"].type_name == "numeric(12,2)" and by["n12_2"].arrow_type == pa.decimal128(12, 2)
    assert by["n_big"].arrow_type == pa.string() and by["n_free"].arrow_type == pa.string()
    assert by["c5"].type_name == "character(5)"
    sch = ts.arrow_schema()
    assert sch.field("id").nullable is False and sch.field("t").nullable is True
    assert sch.field("tstz").type == pa.timestamp("us", tz="UTC")
    assert sch.field("n12_2").metadata[b"pg_type"] == b"numeric(12,2)"


def test_describe_table_keys_domains_enums(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
        c.execute("CREATE DOMAIN money2 AS numeric(10,2) CHECK (VALUE >= 0)")
        c.execute("CREATE DOMAIN money3 AS money2")
        c.execute('CREATE SCHEMA "My Schema"')
        c.execute(
            'CREATE TABLE "My Schema"."T" (a int NOT NULL, b text NOT NULL, m mood, p money3, '
            "CONSTRAINT u UNIQUE (b, a))"
        )
        c.execute('ALTER TABLE "My Schema"."T" REPLICA IDENTITY USING INDEX u')
        c.execute("CREATE TABLE nokey (a int, b text)")
        c.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
        c.execute("CREATE TABLE pk2 (x int, y text, z int, PRIMARY KEY (y, x))")
        ts = describe_table(c, '"My Schema"."T"')
        assert (ts.schema, ts.name, ts.key_columns, ts.has_primary_key, ts.replica_identity) == (
            "My Schema",
            "T",
            ["b", "a"],
            False,
            "i",
        )
        by = {col.name: col for col in ts.columns}
        assert by["m"].arrow_type == pa.string()
        assert by["p"].arrow_type == pa.decimal128(10, 2) and by["p"].type_name == "money3"
        nk = describe_table(c, "nokey")
        assert nk.key_columns == [] and nk.replica_identity == "f" and not nk.has_primary_key
        assert describe_table(c, "public.pk2").key_columns == ["y", "x"]


def test_describe_table_missing_and_unsupported(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        with pytest.raises(LookupError, match="table public.nope does not exist"):
            describe_table(c, "public.nope")
        with pytest.raises(LookupError, match="does not exist"):
            describe_table(c, "nosuchschema.t")
        c.execute("CREATE VIEW v AS SELECT 1 AS x")
        with pytest.raises(LookupError, match="view"):
            describe_table(c, "v")
        # Only a type whose text cannot be read back is refused, every such column named
        c.execute("CREATE TABLE docs (id int PRIMARY KEY, body regproc, t tsvector, op regoper, xs regproc[])")
        with pytest.raises(UnsupportedTypeError) as e:
            describe_table(c, "docs")
        msg = str(e.value)
        assert msg.startswith("table public.docs: 3 column(s) cannot be mirrored exactly: body (regproc: "), msg
        assert "op (regoper: " in msg and "xs (regproc[]: " in msg and " t (" not in msg, msg
        assert "--column-type body=text --column-type op=text --column-type xs=text" in msg, msg
        assert "--exclude-column body --exclude-column op --exclude-column xs" in msg, msg
        ts = describe_table(c, "docs", column_types={"body": "text", "xs": "text"}, exclude=["op"])
        assert [(x.name, str(x.arrow_type), x.as_text) for x in ts.columns] == [
            ("id", "int32", False),
            ("body", "string", True),
            ("t", "string", True),
            ("xs", "string", True),
        ]
        with pytest.raises(LookupError, match="has no column nope"):
            describe_table(c, "docs", exclude=["nope"])
        with pytest.raises(LookupError, match="part of the key"):
            describe_table(c, "docs", exclude=["id", "body", "op", "xs"])
        c.execute("CREATE TABLE pts (id int PRIMARY KEY, loc point, xs point[], bx box[])")  # text elements
        ts = describe_table(c, "pts")
        assert [str(x.arrow_type) for x in ts.columns] == [
            "int32",
            "string",
            "list<item: string>",
            "list<item: string>",
        ]
        assert ts.columns[3].delim == ";"


def test_initial_copy_decodes_every_type(all_types):
    with psycopg.connect(all_types) as c:
        ts = describe_table(c, "all_types")
        batches = list(initial_copy(c, ts, None, batch_rows=2))
        assert [b.num_rows for b in batches] == [2, 2, 1]
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and c.autocommit is False
        expected = _oracle(c)
    batch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    assert batch.schema.equals(ts.arrow_schema(), check_metadata=False)
    _assert_matches(batch, expected, ORACLE_NAMES)
    row0 = batch.to_pylist()[0]
    assert row0["n_free"] == "123456789012345678901234567890123456789012345678901234567890.000000000000000000001"
    assert row0["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert row0["by"] == b"\x00\xff\x10\xde\xad\xbe\xef"
    row1 = batch.to_pylist()[1]
    assert row1["t"] == "" and row1["by"] == b"" and row1["n_free"] == "NaN"
    assert math.isnan(row1["f4"]) and row1["f8"] == math.inf
    assert batch.to_pylist()[2]["t"] is None


def test_initial_copy_single_column_nulls_and_empty(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE one (t text)")
        c.execute("INSERT INTO one VALUES (NULL), (''), ('x'), (NULL), (E'\\n'), ('\"')")
        ts = describe_table(c, "one")
        got = [v for b in initial_copy(c, ts, None) for v in b.column(0).to_pylist()]
        assert c.autocommit is True
    assert got == [None, "", "x", None, "\n", '"']


def test_initial_copy_progress_and_early_close(pg_dsn):
    with psycopg.connect(pg_dsn) as c:
        c.execute("CREATE TABLE big (id bigint PRIMARY KEY, v text)")
        c.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 25000) g")
        c.commit()
        ts = describe_table(c, "big")
        seen = []
        it = initial_copy(c, ts, None, batch_rows=10_000, progress=lambda r, b: seen.append((r, b)))
        first = next(it)
        assert first.num_rows == 10_000
        it.close()  # cancels the COPY and rolls back
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert c.execute("SELECT count(*) FROM big").fetchone()[0] == 25000  # connection still usable
        c.rollback()
        total = sum(
            b.num_rows for b in initial_copy(c, ts, None, batch_rows=10_000, progress=lambda r, b: seen.append((r, b)))
        )
    assert total == 25000
    assert seen[0][0] == 10_000 and seen[-1][0] == 25000 and seen[-1][1] > 25000 * 32


def test_initial_copy_text_columns(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE k (a text, b numeric(6,2), c int, PRIMARY KEY (c, a))")
        c.execute("INSERT INTO k VALUES ('x', 1.5, 1), ('', NULL, 2)")
        ts = describe_table(c, "k")
        (item,) = list(initial_copy(c, ts, None, text_columns=["c", "b"]))
        batch, texts = item
        assert batch.num_rows == 2 and texts == [["1", "2"], ["1.50", None]]
        with pytest.raises(ValueError, match=r"\['zz'\] are not columns of public.k"):
            next(initial_copy(c, ts, None, text_columns=["zz"]))


def test_initial_copy_refuses_open_transaction(pg_dsn):
    with psycopg.connect(pg_dsn) as c:
        c.execute("CREATE TABLE x (a int)")
        ts = describe_table(c, "x")
        c.execute("SELECT 1")
        with pytest.raises(ValueError, match="no transaction in progress"):
            next(initial_copy(c, ts, None))


def test_rare_dates_and_timestamps_match_postgres(pg_dsn):
    """BC, year > 9999 and infinity values take the Python fallback; check it against Postgres's own
    arithmetic (days / microseconds since 1970)."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE rare (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz)")
        c.execute("""INSERT INTO rare VALUES
            (1, '0044-03-15 BC', '0044-03-15 12:30:00.25 BC', '4713-01-01 00:00:00+00 BC'),
            (2, '10000-01-01', '10000-01-01 00:00:01', '294246-12-31 23:59:59.999999+00'),
            (3, '0001-01-01 BC', '0001-12-31 23:59:59.999999 BC', '1000-01-01 00:00:00+00'),
            (4, 'infinity', 'infinity', '-infinity'),
            (5, '2024-01-01', '2024-01-01 00:00:00', '1850-06-01 00:00:00 Europe/Amsterdam')""")
        ts = describe_table(c, "rare")
        batch = next(initial_copy(c, ts, None))
        exp = c.execute("""SELECT id,
                CASE WHEN isfinite(d) THEN d - date '1970-01-01' END,
                CASE WHEN isfinite(ts) THEN (extract(epoch FROM ts) * 1000000)::numeric(30,0)::bigint END,
                CASE WHEN isfinite(tz) THEN (extract(epoch FROM tz) * 1000000)::numeric(30,0)::bigint END
            FROM rare ORDER BY id""").fetchall()
    d = batch.column("d").cast(pa.int32()).to_pylist()
    t = batch.column("ts").cast(pa.int64()).to_pylist()
    z = batch.column("tz").cast(pa.int64()).to_pylist()
    for i, (_id, ed, et, ez) in enumerate(exp):
        assert d[i] == (ed if ed is not None else DATE_INFINITY), _id
        assert t[i] == (et if et is not None else TIMESTAMP_INFINITY), _id
        assert z[i] == (ez if ez is not None else -TIMESTAMP_INFINITY), _id


def _spec(t: pa.DataType, name: str = "c", type_name: str = "x") -> ColumnSpec:
    return ColumnSpec(name=name, type_oid=0, typmod=-1, type_name=type_name, arrow_type=t)


def test_decode_row_major_bytes_and_column_major():
    cols = [_spec(pa.int64(), "a"), _spec(pa.string(), "b"), _spec(pa.bool_(), "c")]
    rb = decode_text_columns(cols, [[b"1", b"x", b"t"], [None, None, b"f"]])
    assert rb.to_pylist() == [{"a": 1, "b": "x", "c": True}, {"a": None, "b": None, "c": False}]
    rb2 = decode_text_columns(cols, [["1", None], ["x", None], ["t", "f"]], column_major=True)
    assert rb2.equals(rb)
    assert decode_text_columns(cols, []).num_rows == 0


def test_decode_errors_name_the_column():
    with pytest.raises(ValueError, match=r"column price .*'NaN'"):
        decode_text_column(_spec(pa.decimal128(12, 2), "price", "numeric(12,2)"), ["1.00", "NaN"])
    with pytest.raises(ValueError, match=r"column at .*24:00:00"):
        decode_text_column(_spec(pa.time64("us"), "at", "time"), ["12:00:00", "24:00:00"])
    with pytest.raises(ValueError, match=r"column flag"):
        decode_text_column(_spec(pa.bool_(), "flag"), ["t", "yes"])
    with pytest.raises(ValueError, match=r"column n "):
        decode_text_column(_spec(pa.int16(), "n"), ["40000"])
    with pytest.raises(ValueError, match=r"column blob .*hex"):
        decode_text_column(_spec(pa.binary(), "blob"), ["\\x0g"])
    with pytest.raises(ValueError, match=r"column blob .*hex format"):
        decode_text_column(_spec(pa.binary(), "blob"), ["abc"])
    with pytest.raises(ValueError, match=r"column ts .*outside"):
        decode_text_column(_spec(pa.timestamp("us"), "ts"), ["294276-12-31 23:59:59"])
    with pytest.raises(ValueError, match=r"column s\b.*UTF-8"):
        decode_text_column(_spec(pa.string(), "s"), [b"\xff"])


def test_bytea_decode_sliced_and_nulls():
    arr = pa.array(["\\x01", None, "\\xABcd", "\\x", "\\x00"])
    out = decode_text_column(_spec(pa.binary()), arr.slice(1))
    assert out.to_pylist() == [None, b"\xab\xcd", b"", b"\x00"]
    out.validate(full=True)


@settings(max_examples=200, deadline=None)
@given(st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)))
def test_fallback_timestamp_agrees_with_arrow(v):
    day = f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
    text = f"{day} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if v.microsecond:
        text += f".{v.microsecond:06d}".rstrip("0")
    spec = _spec(pa.timestamp("us"))
    assert _parse_rare(text, spec, "us") == decode_text_column(spec, [text]).cast(pa.int64())[0].as_py()
    tz = _spec(pa.timestamp("us", tz="UTC"))
    assert (
        _parse_rare(text + "-03:30", tz, "us") == decode_text_column(tz, [text + "-03:30"]).cast(pa.int64())[0].as_py()
    )
    dspec = _spec(pa.date32())
    assert _parse_rare(day, dspec, "D") == decode_text_column(dspec, [day]).cast(pa.int32())[0].as_py()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30))
def test_bytea_roundtrip(values):
    text = [None if v is None else "\\x" + v.hex() for v in values]
    assert decode_text_column(_spec(pa.binary()), text).to_pylist() == values


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.decimals(
                min_value=Decimal("-9999999999.99"),
                max_value=Decimal("9999999999.99"),
                places=2,
                allow_nan=False,
                allow_infinity=False,
            ),
        )
    )
)
def test_decimal_roundtrip(values):
    text = [None if v is None else f"{v:.2f}" for v in values]
    assert decode_text_column(_spec(pa.decimal128(12, 2)), text).to_pylist() == values


def test_output_settings_are_what_decoder_expects():
    assert OUTPUT_SETTINGS["DateStyle"] == "ISO" and OUTPUT_SETTINGS["bytea_output"] == "hex"


def test_uuid_text_is_canonical():
    u = uuid.uuid4()
    assert decode_text_column(_spec(pa.string()), [str(u)]).to_pylist() == [str(u)]


def test_text_spec_keeps_the_generation_expression_and_drops_the_structure():
    """``--column-type g=text`` of a generated column: the expression (and identity) survive
    ``text_spec`` (describe_mirrored runs it on every restart); nothing of an array's structure does."""
    from mooncake_assets.engine.pg.schema import ColumnSpec, text_spec

    el = ColumnSpec("g[]", 23, -1, "integer", pa.int32())
    c = ColumnSpec(
        "g",
        1007,
        -1,
        "integer[]",
        pa.list_(pa.int32()),
        not_null=True,
        is_key=False,
        element=el,
        ndims=1,
        decl_oid=1007,
        field_id=7,
        element_ids=[8],
        attnum=3,
        initial_default="{1}",
        generated="ARRAY[(a * 2)]",
    )
    t = text_spec(c)
    assert t.generated == "ARRAY[(a * 2)]" and t.as_text and t.arrow_type == pa.string()
    assert (t.name, t.type_oid, t.decl_oid, t.field_id, t.attnum, t.not_null, t.initial_default) == (
        "g",
        1007,
        1007,
        7,
        3,
        True,
        "{1}",
    )
    assert t.element is None and t.ndims == 0 and t.element_ids == [] and t.kind == "" and t.fields is None
    assert c.arrow_type == pa.list_(pa.int32()) and c.element is el  # the original is unchanged
    assert t.arrow_field().type == pa.string()
