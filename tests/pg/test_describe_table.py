"""describe_table, the initial copy and the text decoder against a real Postgres.

Oracle: the values Postgres itself returns through psycopg (typed) for the same rows, decoded here
from the text Postgres prints (COPY csv and pgoutput both produce that text)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from mooncake_assets.engine.cdc import (
    UnsupportedTypeError,
    describe_table,
    initial_copy,
)
from mooncake_assets.engine.pg.schema import DATE_INFINITY, TIMESTAMP_INFINITY

from .all_types import ALL_TYPES_DDL, ALL_TYPES_ROWS


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


def test_source_catalog_retries_a_type_dropped_during_a_lookup(pg_dsn):
    """A schema-change lookup whose first try meets a type that an enum migration committing meanwhile
    dropped (Postgres: ``cache lookup failed for type N``) is tried again and answers from the committed
    catalogs. The race itself (a statement's snapshot older than the drop) cannot be timed from a test,
    so the first try is given the dropped enum's oid, as such a snapshot would."""
    from mooncake_assets.engine.pg.catalog import SourceCatalog

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("""CREATE TYPE "Role" AS ENUM ('USER', 'ADMIN')""")
        c.execute("""CREATE TABLE u (id int PRIMARY KEY, role "Role")""")
        old = c.execute("""SELECT '"Role"'::regtype::oid""").fetchone()[0]
        with c.transaction():
            c.execute("""CREATE TYPE "Role_new" AS ENUM ('USER', 'ADMIN', 'OWNER')""")
            c.execute("""ALTER TABLE u ALTER COLUMN role TYPE "Role_new" USING role::text::"Role_new\"""")
            c.execute("""DROP TYPE "Role\"""")
            c.execute("""ALTER TYPE "Role_new" RENAME TO "Role\"""")
        new = c.execute(
            "SELECT atttypid FROM pg_attribute WHERE attrelid = 'u'::regclass AND attname = 'role'"
        ).fetchone()[0]
    tries = [old, new]

    def owner_label(conn: psycopg.Connection) -> str:
        return conn.execute("SELECT enum_in('OWNER', %s)::text", (tries.pop(0),)).fetchone()[0]

    cat = SourceCatalog(pg_dsn)
    try:
        assert cat._call(owner_label) == "OWNER" and not tries
    finally:
        cat.close()
