"""Typed key values printed back as Postgres text (the rebuild of an index from data files), checked
against literal texts (against the text a real Postgres prints: tests/pg/test_key_text_postgres.py)."""

from __future__ import annotations

import datetime
import decimal

import pyarrow as pa
import pytest

from mooncake_assets.engine.cdc.text_out import float_text
from mooncake_assets.engine.table.key_text import key_text_columns


def test_float_text_is_float8out():
    assert [
        float_text(x)
        for x in (
            1.0,
            1.5,
            -2.0,
            1e15,
            1e14,
            123456789012345.6,
            1e16,
            1e-5,
            0.0001,
            0.1 + 0.2,
            0.0,
            -0.0,
            float("nan"),
            float("inf"),
            float("-inf"),
        )
    ] == [
        "1",
        "1.5",
        "-2",
        "1e+15",
        "100000000000000",
        "123456789012345.6",
        "1e+16",
        "1e-05",
        "0.0001",
        "0.30000000000000004",
        "0",
        "-0",
        "NaN",
        "Infinity",
        "-Infinity",
    ]
    assert [float_text(x, single=True) for x in (1.0, 0.1, 1e6, 123456.0, 1.5e-5)] == [
        "1",
        "0.1",
        "1e+06",
        "123456",
        "1.5e-05",
    ]


def test_key_text_columns_literal():
    t = pa.table(
        {
            "s": pa.array(["a b", None, ""]),
            "i": pa.array([1, -2, None], pa.int64()),
            "b": pa.array([True, False, None]),
            "d": pa.array([datetime.date(2024, 1, 31), None, datetime.date(1, 1, 1)]),
            "ts": pa.array(
                [datetime.datetime(2024, 1, 31, 12, 0, 0, 500000), None, datetime.datetime(2000, 1, 1)],
                pa.timestamp("us", tz="UTC"),
            ),
            "n": pa.array([decimal.Decimal("1.50"), decimal.Decimal("-0.01"), None], pa.decimal128(10, 2)),
            "m": pa.array([decimal.Decimal("-1234.56"), decimal.Decimal("0.00"), None], pa.decimal128(19, 2)),
            "by": pa.array([b"\x0a\xff", b"", None]),
            "l": pa.array([[1.5, None], [], None], pa.list_(pa.float64())),
        }
    )
    oids = [25, 20, 16, 1082, 1184, 1700, 790, 17, 1022]
    got = [c.to_pylist() for c in key_text_columns(t, t.column_names, oids)]
    assert got == [
        ["a b", None, ""],
        ["1", "-2", None],
        ["t", "f", None],
        ["2024-01-31", None, "0001-01-01"],
        ["2024-01-31 12:00:00.5+00", None, "2000-01-01 00:00:00+00"],
        ["1.50", "-0.01", None],
        ["-$1,234.56", "$0.00", None],
        ["\\x0aff", "\\x", None],
        ["{1.5,NULL}", "{}", None],
    ]
    with pytest.raises(ValueError, match="cannot be printed"):
        key_text_columns(pa.table({"r": pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string()))}), ["r"], [0])
    with pytest.raises(ValueError, match="cannot be printed"):
        key_text_columns(pa.table({"g": pa.array([b"\x01"])}), ["g"], [99999])  # binary that is not bytea
