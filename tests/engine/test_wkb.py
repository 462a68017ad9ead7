"""PostGIS hex EWKB -> ISO WKB decoding and the MemSlice's SRID test, in process: no Postgres."""

import pyarrow as pa
import pytest

from mooncake_assets.engine.cdc.decode import _decode_wkb, _unhex, ewkb_srid_suspect
from mooncake_assets.engine.pg.schema import ColumnSpec

# POINT(1 2) with SRID 4326 (EWKB: SRID flag 0x20000000 in the type) and without one
P_4326 = "0101000020E6100000000000000000F03F0000000000000040"
P_NONE = "0101000000000000000000F03F0000000000000040"
WKB = bytes.fromhex(P_NONE)


def _spec(srid: int) -> ColumnSpec:
    return ColumnSpec("g", 0, -1, "geometry", pa.binary(), kind="wkb", srid=srid)


def test_unhex_decodes_a_sliced_array_with_nulls_and_reports_the_bad_value():
    out, bad = _unhex(pa.array(["zz", "0aFF", None, ""]).slice(1), 0)
    assert bad is None and out.to_pylist() == [b"\x0a\xff", None, b""]
    out, bad = _unhex(pa.array(["\\x0a", None, "\\x1"]), 2)
    assert out is None and bad == 2
    out, bad = _unhex(pa.array(["00", "0g"]), 0)
    assert out is None and bad == 1


def test_decode_wkb_drops_the_srid_and_refuses_another():
    assert _decode_wkb(pa.array([P_4326, None, P_4326.lower()]), _spec(4326)).to_pylist() == [WKB, None, WKB]
    assert _decode_wkb(pa.array([P_NONE]), _spec(0)).to_pylist() == [WKB]
    with pytest.raises(ValueError, match="SRID 4326"):
        _decode_wkb(pa.array([P_4326]), _spec(0))
    with pytest.raises(ValueError, match="not hex EWKB"):
        _decode_wkb(pa.array([P_NONE, "01x"]), _spec(0))
    # POINT Z (1 2 3): EWKB's Z flag becomes ISO's type 1001; a truncated one is refused
    z = "0101000080" + "000000000000F03F00000000000000400000000000000840"
    assert _decode_wkb(pa.array([z]), _spec(0)).to_pylist() == [bytes.fromhex("01E9030000" + z[10:])]
    with pytest.raises(ValueError, match="not valid EWKB"):
        _decode_wkb(pa.array([z[:-2]]), _spec(0))


def test_srid_suspect_flags_only_values_that_need_a_decode():
    s4326, s0 = ewkb_srid_suspect(4326), ewkb_srid_suspect(0)
    assert not s4326(P_4326) and not s4326(P_4326.lower()) and s4326(P_NONE)
    assert not s0(P_NONE) and s0(P_4326)
    assert s0("00") and s0("01xxxxxxzz") and s4326("")
