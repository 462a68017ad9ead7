"""The decoders of structured types (composite, hstore, PostGIS EWKB, arrays with another
delimiter) and nested Iceberg field ids, without a server. The end-to-end tests against Postgres are
in tests/cdc/test_all_types.py."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import pyarrow_to_schema

from mooncake_assets.engine.cdc.decode import decode_text_columns
from mooncake_assets.engine.pg.schema import ColumnSpec, ColumnValueError, assign_field_ids, nested_field_count
from mooncake_assets.engine.table.schema_state import _nested_ids


def _composite():
    inner = [ColumnSpec("x", 23, -1, "integer", pa.int32()), ColumnSpec("y", 25, -1, "text", pa.string())]
    inner_t = pa.struct([pa.field("x", pa.int32()), pa.field("y", pa.string())])
    tags_el = ColumnSpec("tags[]", 25, -1, "text", pa.string())
    fields = [
        ColumnSpec("a", 0, -1, "inner_t", inner_t, kind="composite", fields=inner),
        ColumnSpec("tags", 1009, -1, "text[]", pa.list_(pa.string()), element=tags_el, ndims=1),
    ]
    t = pa.struct([pa.field("a", inner_t), pa.field("tags", pa.list_(pa.string()))])
    return ColumnSpec("c", 0, -1, "outer_t", t, kind="composite", fields=fields)


def test_composite_text_to_struct():
    spec = _composite()
    vals = ['("(1,""a (b)"")","{x,""y z"",NULL}")', "(,)", '("(,"""")",{})', None, '("(2,""\\\\\\\\"")",)']
    got = decode_text_columns([spec], [[v] for v in vals]).column(0).to_pylist()
    assert got == [
        {"a": {"x": 1, "y": "a (b)"}, "tags": ["x", "y z", None]},
        {"a": None, "tags": None},  # ROW(NULL, NULL): a struct of NULLs, not NULL
        {"a": {"x": None, "y": ""}, "tags": []},  # '' (quoted), not NULL
        None,
        {"a": {"x": 2, "y": "\\"}, "tags": None},
    ]


def test_composite_with_another_field_count_names_the_column():
    with pytest.raises(ColumnValueError, match=r"column c \(outer_t\): composite value '\(1,2,3\)' has 3 fields") as e:
        decode_text_columns([_composite()], [["(1,2,3)"]])
    assert e.value.columns == ["c"]


def test_hstore_text_to_map():
    spec = ColumnSpec("h", 0, -1, "hstore", pa.map_(pa.string(), pa.string()), kind="hstore")
    vals = ['"a"=>"1", "b"=>NULL, "c d"=>"x\\"y", "\\\\"=>"=>"', "", None, '"NULL"=>""']
    got = decode_text_columns([spec], [[v] for v in vals]).column(0).to_pylist()
    assert got == [[("a", "1"), ("b", None), ("c d", 'x"y'), ("\\", "=>")], [], None, [("NULL", "")]]


def _ewkb(t: int, srid: int | None, body: bytes) -> str:
    flag = 0x20000000 if srid is not None else 0
    return (b"\x01" + struct.pack("<I", t | flag) + (struct.pack("<I", srid) if srid is not None else b"") + body).hex()


def test_ewkb_to_iso_wkb():
    spec = ColumnSpec("g", 0, -1, "geometry(Geometry,4326)", pa.binary(), kind="wkb", srid=4326)
    pt = struct.pack("<dd", 1, 2)
    pt_z = struct.pack("<ddd", 1, 2, 3)
    # a 2-D point; a POINT Z (EWKB flag 0x80000000 -> ISO 1001); a MULTIPOINT M of one point (-> 2004 / 2001)
    line_m = struct.pack("<I", 1) + b"\x01" + struct.pack("<I", 1 | 0x40000000) + pt_z
    vals = [_ewkb(1, 4326, pt), _ewkb(1 | 0x80000000, 4326, pt_z), _ewkb(4 | 0x40000000, 4326, line_m), None]
    got = decode_text_columns([spec], [[v] for v in vals]).column(0).to_pylist()
    assert got[0] == b"\x01" + struct.pack("<I", 1) + pt
    assert got[1] == b"\x01" + struct.pack("<I", 1001) + pt_z
    assert got[2] == b"\x01" + struct.pack("<I", 2004) + struct.pack("<I", 1) + b"\x01" + struct.pack("<I", 2001) + pt_z
    assert got[3] is None
    with pytest.raises(ValueError, match=r"column g .*SRID 3857, the column's is 4326.*--column-type g=text"):
        decode_text_columns([spec], [[_ewkb(1, 3857, pt)]])
    assert spec.doc() == "geometry(Geometry,4326): ISO WKB, SRID 4326"


def test_array_with_semicolon_delimiter():
    el = ColumnSpec("b[]", 603, -1, "box", pa.string(), as_text=True)
    spec = ColumnSpec("b", 1020, -1, "box[]", pa.list_(pa.string()), element=el, ndims=1, delim=";")
    got = decode_text_columns([spec], [["{(1,1),(0,0);(3,3),(2,2)}"], ["{}"], ["{NULL}"]]).column(0).to_pylist()
    assert got == [["(1,1),(0,0)", "(3,3),(2,2)"], [], [None]]


def test_every_failing_column_is_named():
    d = ColumnSpec("d", 1700, 655366, "numeric(10,2)", pa.decimal128(10, 2))
    e = ColumnSpec("e", 1700, 655366, "numeric(10,2)", pa.decimal128(10, 2))
    ok = ColumnSpec("ok", 23, -1, "integer", pa.int32())
    with pytest.raises(ColumnValueError) as err:
        decode_text_columns([d, ok, e], [["NaN", "1", "NaN"]])
    assert err.value.columns == ["d", "e"] and "column d" in str(err.value) and "column e" in str(err.value)


def test_nested_field_ids_round_trip_through_iceberg():
    spec = _composite()
    h = ColumnSpec("h", 0, -1, "hstore", pa.map_(pa.string(), pa.string()), kind="hstore")
    arr = ColumnSpec("a", 0, -1, "outer_t[]", pa.list_(spec.arrow_type), element=spec, ndims=1)
    cols = [ColumnSpec("id", 23, -1, "integer", pa.int32()), spec, h, arr]
    assert [nested_field_count(c.arrow_type) for c in cols] == [0, 5, 2, 6]
    nxt = assign_field_ids(cols)
    assert [c.field_id for c in cols] == [1, 2, 3, 4] and nxt == 5 + 5 + 2 + 6
    ice = pyarrow_to_schema(pa.schema([c.arrow_field() for c in cols]), format_version=3)
    for c in cols:
        f = ice.find_field(c.name)
        assert f.field_id == c.field_id and _nested_ids(f.field_type) == c.element_ids, c.name
    assert len({i for c in cols for i in [c.field_id] + c.element_ids}) == nxt - 1  # all distinct
