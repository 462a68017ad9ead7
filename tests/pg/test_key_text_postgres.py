"""Key values printed from data files equal the text Postgres itself prints (engine/table/key_text.py)."""

from __future__ import annotations

import psycopg
import pyarrow as pa
from psycopg.types.string import TextLoader

from mooncake_assets.engine.cdc import decode_text_columns
from mooncake_assets.engine.pg.catalog import describe_table
from mooncake_assets.engine.pg.conninfo import OUTPUT_SETTINGS
from mooncake_assets.engine.table.key_text import key_text_columns


def test_key_text_round_trips_postgres_text(pg_dsn):
    """Decode what Postgres prints, print it back: the same text, for every type a key may have here."""
    cols = (
        "i2 int2, i4 int4, i8 int8, o oid, b bool, f4 float4, f8 float8, n numeric(12,3), nu numeric, "
        "m money, t text, vc varchar(10), c char(3), u uuid, d date, ti time, ts timestamp, tz timestamptz, "
        "by bytea, iv interval, ia int4[], ta text[], fa float8[], da date[]"
    )
    rows = [
        "(1, 2, 3, 4, true, 1.5, 0.1, 1.5, 1.50, 12.3, 'a', 'b c', 'x', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2024-01-31', '12:00:00.5', '2024-01-31 12:00:00.25', "
        "'2024-01-31 12:00:00+02', '\\x0aff', '1 day 02:00:00', '{1,NULL,3}', '{\"a b\",NULL,\"\",x}', "
        "'{1e15,-0,NaN}', '{2024-01-01,infinity}')",
        "(-32768, -2147483648, -9223372036854775808, 0, false, 1e6, 1e15, -0.001, 'NaN', -1234.56, '', "
        "'', '', '00000000-0000-0000-0000-000000000000', '0044-03-15 BC', '00:00:00', '1999-12-31 23:59:59', "
        "'infinity', '\\x', '-1 mons', '{}', '{}', '{}', '{}')",
        "(NULL, NULL, NULL, NULL, NULL, 'Infinity', '-Infinity', 0, 1e-20, 0, 'ü ✓', NULL, NULL, NULL, "
        "'-infinity', NULL, '-infinity', '1970-01-01 00:00:00.000001+00', NULL, NULL, NULL, NULL, NULL, NULL)",
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for k, v in OUTPUT_SETTINGS.items():
            c.execute(f"SET {k} = '{v}'")
        c.execute(f"CREATE TABLE public.kt ({cols})")
        c.execute("INSERT INTO public.kt VALUES " + ", ".join(rows))
        schema = describe_table(c, "public.kt")
        names = [col.name for col in schema.columns]
        # the output functions' text (what pgoutput and COPY carry; ``bool::text`` would be 'true')
        for d in c.execute("SELECT * FROM public.kt LIMIT 0").description:
            c.adapters.register_loader(d.type_code, TextLoader)
        texts = c.execute("SELECT * FROM public.kt").fetchall()
    columns = [[r[i] for r in texts] for i in range(len(names))]
    batch = decode_text_columns(schema.columns, columns, column_major=True)
    printed = key_text_columns(pa.Table.from_batches([batch]), names, [col.type_oid for col in schema.columns])
    for name, pg, ours in zip(names, columns, printed):
        assert ours.to_pylist() == pg, name


def test_composite_key_text_round_trips_postgres_text(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for k, v in OUTPUT_SETTINGS.items():
            c.execute(f"SET {k} = '{v}'")
        c.execute("CREATE TYPE public.pt AS (x int, s text, f float8, d date)")
        c.execute("CREATE TABLE public.ct (p public.pt, pa public.pt[])")
        c.execute(
            "INSERT INTO public.ct VALUES (ROW(1, 'a b', 1.5, '2024-01-01'), "
            "ARRAY[ROW(2, '', 1e15, NULL)::public.pt]), "
            "(ROW(NULL, 'q\"x\\y', -0, 'infinity'), NULL), (NULL, '{}')"
        )
        schema = describe_table(c, "public.ct")
        for d in c.execute("SELECT * FROM public.ct LIMIT 0").description:
            c.adapters.register_loader(d.type_code, TextLoader)
        texts = c.execute("SELECT * FROM public.ct").fetchall()
    columns = [[r[i] for r in texts] for i in range(2)]
    batch = decode_text_columns(schema.columns, columns, column_major=True)
    printed = key_text_columns(pa.Table.from_batches([batch]), ["p", "pa"], [col.type_oid for col in schema.columns])
    assert [c.to_pylist() for c in printed] == columns
