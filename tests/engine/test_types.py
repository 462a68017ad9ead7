"""Postgres → Arrow type mapping and the column-wise text decoder, in-process (describe_table, the
initial copy and the decoder against Postgres's own values: tests/pg/test_describe_table.py)."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

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
)
from mooncake_assets.engine.cdc.decode import _parse_rare
from mooncake_assets.engine.pg.conninfo import OUTPUT_SETTINGS


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
