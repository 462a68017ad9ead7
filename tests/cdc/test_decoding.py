"""Units without Postgres: array and money decoding, values that cannot be
held, carried (unchanged-TOAST) values Python cannot hold, schema-change messages, Iceberg statistics
of files holding infinity sentinels."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mooncake_assets.engine.cdc.decode import decode_text_column, decode_text_columns
from mooncake_assets.engine.pg.schema import MONEY, ColumnSpec
from mooncake_assets.engine.table.memslice import BadRowError, Carried, MemSlice
from mooncake_assets.engine.table.schema_change import SchemaChangeError, describe_change, on_relation

TS_INF = 2**63 - 1


def _arr(name, elem_type, elem_oid, nd, type_name="integer[]"):
    el = ColumnSpec(f"{name}[]", elem_oid, -1, type_name.rstrip("[]"), elem_type)
    t = elem_type
    for _ in range(nd):
        t = pa.list_(t)
    return ColumnSpec(name, 1007, -1, type_name, t, element=el, ndims=nd)


def test_array_text_format():
    sp = _arr("g", pa.string(), 25, 1, "text[]")
    vals = ['{"",NULL,"NULL","a\\\\b","q\\"",x,"{}","a,b"," lead"}', "{}", None, '{"\\u00e9"}']
    assert decode_text_column(sp, vals).to_pylist() == [
        ["", None, "NULL", "a\\b", 'q"', "x", "{}", "a,b", " lead"],
        [],
        None,
        ["u00e9"],
    ]  # \\ escapes
    two = _arr("m", pa.int32(), 23, 2)
    assert decode_text_column(two, ["{{1,2},{3,NULL}}", "{}", None]).to_pylist() == [[[1, 2], [3, None]], [], None]
    ts = _arr("ts", pa.timestamp("us"), 1114, 1, "timestamp[]")
    out = decode_text_column(ts, ['{"2020-01-01 00:00:00",infinity,-infinity,NULL}'])
    assert out[0].values.cast("int64").to_pylist() == [1577836800000000, TS_INF, -TS_INF, None]
    by = _arr("b", pa.binary(), 17, 1, "bytea[]")
    assert decode_text_column(by, ['{"\\\\x00ff","\\\\x"}']).to_pylist() == [[b"\x00\xff", b""]]


@pytest.mark.parametrize(
    "value, match",
    [
        ("[0:1]={1,2}", "explicit lower bounds"),
        ("{{1,2},{3,4}}", "more than the column's 1 dimension"),
        ("{1,2", "cannot parse array value"),
        ("{1,x}", "cannot decode"),
    ],
)
def test_array_errors_name_the_column(value, match):
    with pytest.raises(ValueError, match=match) as e:
        decode_text_column(_arr("xs", pa.int32(), 23, 1), [value])
    assert "xs" in str(e.value)


def test_money_is_exact_cents():
    m = ColumnSpec("m", MONEY, -1, "money", pa.decimal128(19, 2))
    got = decode_text_column(m, ["$1,234,567.89", "-$0.01", "$0.00", None, "-$92,233,720,368,547,758.08"])
    assert got.to_pylist() == [
        Decimal("1234567.89"),
        Decimal("-0.01"),
        Decimal("0.00"),
        None,
        Decimal("-92233720368547758.08"),
    ]


def test_numeric_nan_in_decimal_is_an_error_not_a_zero():
    spec = ColumnSpec("price", 1700, (12 << 16 | 2) + 4, "numeric(12,2)", pa.decimal128(12, 2))
    with pytest.raises(ValueError, match=r"column price \(numeric\(12,2\)\): value 'NaN' cannot be represented"):
        decode_text_column(spec, ["1.00", "NaN"])


def _slice(cols):
    specs = [c if isinstance(c, ColumnSpec) else ColumnSpec(c[0], c[1], -1, c[2], c[3]) for c in cols]
    schema = pa.schema([pa.field(s.name, s.arrow_type) for s in specs])
    return MemSlice(schema, lambda c: decode_text_columns(specs, c, column_major=True), batch_rows=4)


def test_bad_value_raises_at_append_with_its_lsn():
    ms = _slice(
        [
            ("id", 23, "integer", pa.int32()),
            ("p", 1700, "numeric(5,2)", pa.decimal128(5, 2)),
            ("t", 1083, "time", pa.time64("us")),
        ]
    )
    ms.append(["1", "1.5", "10:00:00"], 1, 0x10)
    with pytest.raises(BadRowError) as e:
        ms.append(["2", "NaN", "10:00:00"], 2, 0x1_0000_0020)
    assert e.value.lsn == 0x1_0000_0020 and "LSN 1/20" in str(e.value) and "column p" in str(e.value)
    with pytest.raises(BadRowError, match="column t.*24:00:00.*LSN 0/30"):
        ms.append(["3", "2", "24:00:00"], 3, 0x30)
    assert ms.num_rows == 1 and ms.visible().num_rows == 1  # nothing of the bad rows was kept


def test_bad_row_found_at_seal_names_its_commit():
    ms = _slice([("id", 23, "integer", pa.int32()), _arr("xs", pa.int32(), 23, 1)])
    ms._suspects = []  # as if the cheap test missed it
    ms.append(["1", "{1}"], 1, 0x10)
    ms.append(["2", "{{1}}"], 2, 0x20)
    with pytest.raises(BadRowError, match=r"column xs.*LSN 0/20"):
        ms.visible()


def test_carried_values_python_cannot_hold():
    """Unchanged TOAST carries the old row's values; timestamp/date infinity must survive as Arrow."""
    ms = _slice(
        [
            ("id", 23, "integer", pa.int32()),
            ("ts", 1114, "timestamp", pa.timestamp("us")),
            ("d", 1082, "date", pa.date32()),
            ("big", 25, "text", pa.string()),
        ]
    )
    ms.append(["1", "infinity", "-infinity", "x" * 5000], 1, 0x10)
    ms.seal()
    old = ms.row_values((0, 0))
    assert all(isinstance(v, Carried) for v in old)
    ms.append(["2", old[1], old[2], old[3]], 2, 0x20)  # e.g. UPDATE … SET id = 2
    ms.append(["3", "2020-01-01 00:00:00", old[2], None], 3, 0x20)
    t = ms.visible()
    assert t.column("ts").cast("int64").to_pylist() == [TS_INF, TS_INF, 1577836800000000]
    assert t.column("d").cast("int32").to_pylist() == [-(2**31 - 1)] * 3
    assert t.column("big").to_pylist() == ["x" * 5000, "x" * 5000, None]


def _rel(cols, ident="d"):
    return SimpleNamespace(
        replica_identity=ident, columns=[SimpleNamespace(name=n, type_oid=o, typmod=m, is_key=k) for n, o, m, k in cols]
    )


def _table(cols, key=("id",)):
    specs = [ColumnSpec(n, o, m, tn, pa.int32(), decl_oid=o, decl_typmod=m) for n, o, m, tn in cols]
    return SimpleNamespace(
        name="orders",
        source="public.orders",
        flush_lsn=0x100,
        _relmap={},
        schema=SimpleNamespace(columns=specs, key_columns=list(key)),
        column_map=lambda oid, names: None,
    )


@pytest.mark.parametrize(
    "new_cols, expect",
    [
        ([("id", 23, -1, True), ("qty", 23, -1, False), ("note", 25, -1, False)], "column note (text) was added"),
        ([("id", 23, -1, True)], "column qty (integer) was dropped"),
        ([("id", 23, -1, True), ("amount", 23, -1, False)], "column qty was renamed to amount"),
        ([("id", 23, -1, True), ("qty", 20, -1, False)], "column qty changed type from integer to bigint"),
        (
            [("id", 23, -1, True), ("qty", 1043, 14, False)],
            "column qty changed type from integer to character varying(10)",
        ),
    ],
)
def test_schema_change_messages_name_table_column_lsn(new_cols, expect):
    t = _table([("id", 23, -1, "integer"), ("qty", 23, -1, "integer")])
    msg = describe_change(t, _rel(new_cols), 0x1_0000_2000)
    assert expect in msg and "table orders" in msg and "LSN 1/2000" in msg and "0/100" in msg
    with pytest.raises(SchemaChangeError, match="LSN 1/2000"):
        on_relation(t, 5, _rel(new_cols), 0x1_0000_2000)


def test_relation_resent_unchanged_is_accepted():
    t = _table([("id", 23, -1, "integer"), ("qty", 23, -1, "integer")])
    on_relation(t, 5, _rel([("id", 23, -1, True), ("qty", 23, -1, False)]), 1)
    with pytest.raises(SchemaChangeError, match="replica identity key"):
        on_relation(t, 5, _rel([("id", 23, -1, False), ("qty", 23, -1, True)], "i"), 2)


def test_iceberg_stats_of_a_file_with_infinity(tmp_path):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, TimestampType

    from mooncake_assets.engine.iceberg.datafile import data_file_from_parquet_metadata

    schema = Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, "ts", TimestampType(), required=False)
    )
    tbl = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "ts": pa.array(np.array([0, TS_INF], dtype=np.int64)).view(pa.timestamp("us")),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(tbl, path)
    df = data_file_from_parquet_metadata(str(path), path.stat().st_size, pq.read_metadata(path), schema, {}, 2)
    assert df.record_count == 2
    assert 1 in df.lower_bounds and 2 not in df.lower_bounds and 2 not in df.upper_bounds
    assert df.value_counts[2] == 2
