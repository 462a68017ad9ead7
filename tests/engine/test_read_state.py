"""The ReadState: a frozen value in-process (deletion vectors as bitmaps), one JSON wire form."""

import base64
import dataclasses
import json

import pytest
from pyroaring import BitMap64, FrozenBitMap64

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.read.plan import deleted_positions
from mooncake_assets.engine.table.read_state import FileState, ReadField, ReadState


def _state():
    return ReadState(
        table="t",
        lsn=Lsn.parse("1/AB"),
        files=(
            FileState("a.parquet", "/w/a.parquet", 10, FrozenBitMap64([0, 3, 9])),
            FileState("b.parquet", "s3://b/b.parquet", 5, None),
        ),
        schema=("id", "v"),
        fields=(ReadField(1, "id", "BIGINT"), ReadField(2, "v", "VARCHAR", "x")),
        storage={"endpoint": "http://s3"},
        ticket="tk",
        mem_rows=7,
    )


def test_frozen_and_attributes():
    rs = _state()
    with pytest.raises(dataclasses.FrozenInstanceError):
        rs.table = "u"  # type: ignore[misc]
    assert rs.files[0].deleted_count == 3 and rs.files[0].live_rows == 7
    assert rs.files[1].deleted_count == 0 and rs.files[1].live_rows == 5
    assert hash(rs.files[0].deleted) == hash(FrozenBitMap64([0, 3, 9]))  # readers memoize by it
    assert rs.with_(ticket=None).ticket is None and rs.ticket == "tk"


def test_wire_form_is_json_with_base64_portable_bitmaps():
    wire = json.loads(json.dumps(_state().to_wire()))
    assert wire["lsn"] == "1/AB"
    assert wire["files"][0] == {
        "name": "a.parquet",
        "path": "/w/a.parquet",
        "rows": 10,
        "deleted": base64.b64encode(BitMap64([0, 3, 9]).serialize()).decode(),
    }
    assert wire["files"][1]["deleted"] is None
    assert wire["schema"] == ["id", "v"] and wire["ticket"] == "tk" and wire["mem_rows"] == 7
    assert wire["fields"][1] == {"id": 2, "name": "v", "type": "VARCHAR", "default": "x"}
    back = ReadState.from_wire(wire)
    assert back == _state()
    assert isinstance(back.lsn, Lsn) and isinstance(back.files[0].deleted, FrozenBitMap64)


def test_wire_form_leaves_out_what_is_unset():
    rs = ReadState(table="t", lsn=Lsn(0))
    assert rs.to_wire() == {"table": "t", "lsn": "0/0", "files": [], "schema": []}
    assert ReadState.from_wire(rs.to_wire()) == rs


def test_bad_bitmap_on_the_wire():
    with pytest.raises(ValueError, match="Roaring"):
        ReadState.from_wire(
            {
                "table": "t",
                "lsn": "0/1",
                "files": [{"name": "a", "path": "a", "rows": 1, "deleted": base64.b64encode(b"xx").decode()}],
            }
        )


def test_positions_of_the_bitmap_equal_those_of_its_wire_text():
    bm = FrozenBitMap64([1, 5, 7, 4000, 70000])
    text = base64.b64encode(bm.serialize()).decode()
    assert deleted_positions(bm).tolist() == deleted_positions(text).tolist() == [1, 5, 7, 4000, 70000]
    assert deleted_positions(None).tolist() == []
