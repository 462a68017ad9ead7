"""Schemas as applications really make them.

An ORM-style schema (Prisma/Django/Rails conventions: quoted mixed-case tables and columns, an enum
type with a quoted name, reserved words as column names, a schema with a space, a UUID key with a
default, a foreign key, a non-ASCII and a 63-byte column name) is mirrored through the real CLI,
changed, verified with every reader, queried by its mixed-case column names, restarted and evolved
(ADD COLUMN "newCol"). Names given the way Postgres parses them; bad names get one line that says
how they were parsed.
"""

from __future__ import annotations

import json
from contextlib import closing

import psycopg
import pytest

from mooncake_assets.engine.pg.names import (
    InvalidName,
    asset_key_part,
    check_mirror_name,
    resolve_table,
    split_qualified_name,
)
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake

LONG = "A" + "b" * 61 + "Z"  # 63 bytes, mixed case: the longest name Postgres keeps
UMLAUT = "Größe €"  # non-ASCII with a space
assert len(LONG.encode()) == 63

SCHEMA = f"""
CREATE EXTENSION IF NOT EXISTS pgcrypto;
CREATE SCHEMA "Sales Data";
CREATE TYPE "Sales Data"."OrderStatus" AS ENUM ('PENDING', 'SHIPPED', 'Delivered Late');
CREATE TABLE "User" (
  "id" uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  "email" text NOT NULL UNIQUE,
  "createdAt" timestamptz NOT NULL DEFAULT now(),
  "displayName" text,
  "order" int,
  "select" boolean,
  "{UMLAUT}" text,
  "{LONG}" int
);
CREATE TABLE "Sales Data"."Q1 Orders" (
  "id" bigserial PRIMARY KEY,
  "userId" uuid NOT NULL REFERENCES "User"("id") ON DELETE CASCADE,
  "status" "Sales Data"."OrderStatus" NOT NULL DEFAULT 'PENDING',
  "group" text,
  "Total Amount" numeric(12,2),
  "from" date
);
CREATE TABLE dup ("id" int PRIMARY KEY, "a" int, "A" int);
"""


def _sql(dsn, *stmts):
    with psycopg.connect(dsn, autocommit=True) as c:
        for s in stmts:
            c.execute(s)


def _verify_all(s, *readers):
    for reader in readers:
        r = mooncake(s, "verify", "--reader", reader)
        assert r.returncode == 0 and "verified: 2/2" in r.stdout, (reader, r.stdout, r.stderr)


def _query(s, q):
    r = mooncake(s, "query", q, "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_orm_schema_mirrored_end_to_end(pg_dsn, state_dir):
    _sql(pg_dsn, SCHEMA)
    _sql(
        pg_dsn,
        f"""INSERT INTO "User" ("email", "displayName", "order", "select", "{UMLAUT}", "{LONG}")
                     SELECT 'u' || g || '@x.io', 'User ' || g, g, g % 2 = 0, 'ß' || g, g * 10
                     FROM generate_series(1, 30) g""",
        """INSERT INTO "Sales Data"."Q1 Orders" ("userId", "status", "group", "Total Amount", "from")
            SELECT "id", 'SHIPPED', 'g' || "order" % 3, "order" * 1.5, DATE '2026-01-01' + "order"
            FROM "User" """,
    )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    try:
        # the names as SQL spells them: search_path for the bare quoted name, a schema with a space
        r = mooncake(s, "create-table", "users", '"User"')
        assert r.returncode == 0, r.stdout + r.stderr
        assert 'mirrored public."User" as users: 30 rows' in r.stdout, r.stdout
        r = mooncake(s, "create-table", "q1_orders", ' "Sales Data" . "Q1 Orders" ')
        assert r.returncode == 0, r.stdout + r.stderr
        assert '"Sales Data"."Q1 Orders"' in r.stdout, r.stdout
        r = mooncake(s, "create-table", "dup", "public.dup")  # "a" and "A": DuckDB cannot tell them apart
        assert r.returncode != 0 and 'columns "a" and "A" differ only in case' in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        lt = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)["tables"]
        assert {t["name"]: t["source"] for t in lt} == {
            "users": 'public."User"',
            "q1_orders": '"Sales Data"."Q1 Orders"',
        }

        # inserts, updates (key columns untouched and a reserved-word column), deletes (cascading)
        _sql(
            pg_dsn,
            """INSERT INTO "User" ("email", "displayName", "order") VALUES ('new@x.io', 'New', 99)""",
            f"""UPDATE "User" SET "displayName" = 'Renamed', "{UMLAUT}" = 'ü', "{LONG}" = -1 WHERE "order" <= 5""",
            """UPDATE "Sales Data"."Q1 Orders" SET "status" = 'Delivered Late', "group" = 'late' WHERE "id" % 4 = 0""",
            """DELETE FROM "User" WHERE "order" IN (7, 8)""",
        )
        _verify_all(s, "union")
        rows = _query(
            s,
            'SELECT "displayName", "order", "createdAt" IS NOT NULL AS has_at, "Größe €" AS g, '
            f'"{LONG}" AS long FROM users WHERE "order" <= 5 ORDER BY "order"',
        )
        assert [(r["displayName"], r["order"], r["has_at"], r["g"], r["long"]) for r in rows] == [
            ("Renamed", i, True, "ü", -1) for i in range(1, 6)
        ]
        rows = _query(s, 'SELECT "status", count(*) AS n FROM q1_orders GROUP BY "status"')
        with psycopg.connect(pg_dsn) as c:
            want = dict(
                c.execute('SELECT "status"::text, count(*) FROM "Sales Data"."Q1 Orders" GROUP BY 1').fetchall()
            )
        assert {r["status"]: r["n"] for r in rows} == want and sum(want.values()) == 28  # 2 deleted by the cascade

        with closing(ServiceClient(s.socket_path)) as client:
            for t in ("users", "q1_orders"):
                client.call("persist", table=t)
        _verify_all(s, "union", "pyiceberg", "duckdb-iceberg")

        # a restart, then ADD COLUMN "newCol" (and a change carrying it)
        mooncake(s, "stop", check=True)
        _sql(
            pg_dsn,
            """ALTER TABLE "User" ADD COLUMN "newCol" text DEFAULT 'dflt'""",
            """UPDATE "User" SET "newCol" = 'set' WHERE "order" = 1""",
            """INSERT INTO "Sales Data"."Q1 Orders" ("userId", "status") SELECT "id", 'PENDING' FROM "User" WHERE "order" = 2""",
        )
        mooncake(s, "start", check=True)
        _verify_all(s, "union")
        rows = _query(s, 'SELECT "order", "newCol" FROM users WHERE "order" IN (1, 2) ORDER BY "order"')
        assert [(r["order"], r["newCol"]) for r in rows] == [(1, "set"), (2, "dflt")]
        with closing(ServiceClient(s.socket_path)) as client:  # the same checks in this process, to keep the test short
            for t in ("users", "q1_orders"):
                client.call("persist", table=t)
            for reader in ("union", "pyiceberg", "duckdb-iceberg"):
                results, lsn = verify(s, None, reader, client)
                assert [r.match for r in results] == [True, True], (reader, [r.line() for r in results])

        # the Iceberg field names are the column names, exactly
        from mooncake_assets.engine.iceberg import make_catalog

        tbl = make_catalog(s.catalog, s.warehouse_uri).load_table("mooncake.users")
        names = [f.name for f in tbl.schema().fields]
        assert names == ["id", "email", "createdAt", "displayName", "order", "select", UMLAUT, LONG, "newCol"]
        mapping = json.loads(tbl.metadata.properties.get("schema.name-mapping.default", "[]"))
        if mapping:  # the name mapping, when written, names the same columns
            assert {m["names"][0] for m in mapping} >= set(names)
    finally:
        mooncake(s, "stop")


def test_qualified_names_parse_like_parse_ident(pg_dsn):
    """The local parser (for places without a server) agrees with Postgres's parse_ident."""
    cases = [
        "public.User",
        'public."User"',
        '"User"',
        '"Sales Data"."Q1 Orders"',
        " a . b ",
        "a..b",
        ".a",
        "a.",
        '"a""b"',
        '""',
        '"unclosed',
        "a b",
        "a$b",
        "1a",
        "ÄÖ.x",
        "a.b.c.d",
        "a-b",
        '"a.b"',
        "Straße",
        "",
        '"x"y',
        'x"y"',
        '"ünï ☃"."Tab\tle"',
        'sch.""',
        "_a1.B_2$",
    ]
    with psycopg.connect(pg_dsn) as c:
        for text in cases:
            try:
                with c.transaction():
                    want = c.execute("SELECT parse_ident(%s)", (text,)).fetchone()[0]
            except psycopg.Error:
                want = None
            try:
                got = split_qualified_name(text)
            except InvalidName as e:
                assert len(str(e).splitlines()) == 1
                got = None
            assert got == want, text


def test_bad_names_say_how_they_were_parsed(pg_dsn):
    _sql(
        pg_dsn,
        'CREATE SCHEMA "Sales Data"',
        'CREATE TABLE "Sales Data"."Q1 Orders" (id int PRIMARY KEY)',
        'CREATE TABLE "User" (id int PRIMARY KEY)',
        'CREATE TABLE "Sales Data"."a.b" (id int)',
    )
    with psycopg.connect(pg_dsn) as c:
        oid, t = resolve_table(c, '"Sales Data"."Q1 Orders"')
        assert (t.schema, t.name, str(t)) == ("Sales Data", "Q1 Orders", '"Sales Data"."Q1 Orders"')
        assert str(resolve_table(c, '"Sales Data"."a.b"')[1]) == '"Sales Data"."a.b"'
        assert str(resolve_table(c, '"User"')[1]) == 'public."User"'
        db = c.execute("SELECT current_database()").fetchone()[0]
        assert resolve_table(c, f'{db}.public."User"')[1].name == "User"

        def err(text):
            with pytest.raises(InvalidName) as e:
                resolve_table(c, text)
            msg = str(e.value)
            assert "\n" not in msg
            return msg

        m = err("public.User")
        assert 'parsed as schema "public", table "user"' in m and 'did you mean public."User"?' in m, m
        m = err("User")
        assert 'parsed as table "user"' in m and 'did you mean "User"?' in m, m
        m = err('"Sales Data"."Q1 orders"')
        assert 'schema "Sales Data", table "Q1 orders"' in m and '"Sales Data"."Q1 Orders"' in m, m
        m = err("Sales Data.Q1 Orders")
        assert "does not parse" in m and "Sales Data" in m, m
        m = err('"Sales Data"."Q2 Orders"')
        assert 'parsed as schema "Sales Data", table "Q2 Orders"' in m and "did you mean" not in m, m
        m = err('"unclosed')
        assert "does not parse" in m, m
        assert 'names database "otherdb"' in err("otherdb.public.x")
        c.rollback()


def test_mirror_names_and_asset_keys():
    for ok in ("users", "Q1_orders", "_x", "a" * 63):
        assert check_mirror_name(ok) == ok
    for bad in ("", "1abc", "q1 orders", "a.b", "a-b", "a" * 64, "ä", 'x"y'):
        with pytest.raises(InvalidName) as e:
            check_mirror_name(bad)
        assert "\n" not in str(e.value) and "letters, digits and _" in str(e.value)
    assert asset_key_part("User") == "User"
    parts = [asset_key_part(n) for n in ("Sales Data", "Sales_Data", "sales data", "Größe €", "!!!")]
    assert parts[1] == "Sales_Data" and len(set(parts)) == len(parts)
    import re

    assert all(re.fullmatch(r"[A-Za-z0-9_]+", p) for p in parts)
    assert asset_key_part("Sales Data") == asset_key_part("Sales Data")  # deterministic


def test_dagster_specs_and_asset_keys_for_quoted_names():
    """Dagster: quoted sources parse as Postgres parses them, asset keys are valid and deterministic,
    and the real names are shown in the description and metadata."""
    import dagster as dg

    from mooncake_assets.dagster.assets import build_table_assets, source_key
    from mooncake_assets.dagster.resources import ReplicationResource, TableSpec, parse_tables

    specs = parse_tables('q1_orders="Sales Data"."Q1 Orders", "User", Mixed=public.MixedCase, we="We, Ltd"."x=y"')
    assert [(t.name, t.source) for t in specs] == [
        ("q1_orders", '"Sales Data"."Q1 Orders"'),
        ("User", 'public."User"'),
        ("Mixed", "public.mixedcase"),
        ("we", '"We, Ltd"."x=y"'),
    ]
    with pytest.raises(ValueError, match="name the mirror"):
        TableSpec.parse('"Sales Data"."Q1 Orders"')
    key = source_key(specs[0])
    assert key == source_key(TableSpec.parse('q1_orders = "Sales Data" . "Q1 Orders"'))
    assert key.path[0] == "postgres" and key.path[1].startswith("Sales_Data_") and key.path[2].startswith("Q1_Orders_")
    assert source_key(specs[1]).path == ["postgres", "public", "User"]
    assets = build_table_assets(specs)
    defs = dg.Definitions(assets=assets, resources={"replication": ReplicationResource(state_dir="/nonexistent")})
    src = next(a for a in assets if isinstance(a, dg.AssetSpec) and a.key == key)
    assert '"Sales Data"."Q1 Orders"' in src.description
    assert (
        src.metadata["mooncake/source_schema"] == "Sales Data" and src.metadata["mooncake/source_table"] == "Q1 Orders"
    )
    mirror = defs.resolve_assets_def(dg.AssetKey(["mirror", "q1_orders"]))
    assert key in mirror.asset_deps[dg.AssetKey(["mirror", "q1_orders"])]


def test_columns_differing_only_in_case_are_refused_by_schema_evolution():
    """ADD COLUMN "ID" beside "id": DuckDB would read one for the other, so the table stops, saying so."""
    from mooncake_assets.engine.pg.names import case_collision
    from mooncake_assets.engine.table.schema_change import SchemaChangeError

    from ..engine.test_evolution import INT4, cat, plan, schema, spec

    assert case_collision(["id", "ärger", "Ärger", "createdAt"]) is None  # DuckDB folds ASCII letters only
    assert case_collision(["id", "createdAt", "CreatedAt"]) == ("createdAt", "CreatedAt")
    s = schema(spec("id", INT4, 1, 1, True), spec("newCol", INT4, 2, 2))
    ok = plan(
        s,
        [("id", INT4, -1), ("newCol", INT4, -1), ("Other Col", INT4, -1)],
        [cat(1, "id"), cat(2, "newCol"), cat(3, "Other Col")],
    )
    assert ok.added == ["Other Col"]
    with pytest.raises(SchemaChangeError, match='columns "newCol" and "NEWCOL" differ only in case'):
        plan(
            s,
            [("id", INT4, -1), ("newCol", INT4, -1), ("NEWCOL", INT4, -1)],
            [cat(1, "id"), cat(2, "newCol"), cat(3, "NEWCOL")],
        )
