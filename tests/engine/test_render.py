"""Query output rendering (engine/read/render.py) of structured values, in process: no Postgres."""

import json

import pyarrow as pa

from mooncake_assets.engine.pg.schema import TIMESTAMP_INFINITY
from mooncake_assets.engine.read.render import text_rows, to_json


def _table() -> pa.Table:
    rec = pa.struct([("at", pa.timestamp("us")), ("label", pa.string()), ("tags", pa.list_(pa.string()))])
    recs = pa.array(
        [{"at": None, "label": "a b", "tags": ["p", None]}, None, {"at": None, "label": "", "tags": None}], rec
    )
    # the decoder's +infinity sentinel in the struct's timestamp field (past datetime's range)
    at = pa.array([TIMESTAMP_INFINITY, None, 0], pa.int64()).cast(pa.timestamp("us"))
    recs = pa.StructArray.from_arrays(
        [at, recs.field(1), recs.field(2)], fields=list(rec), mask=pa.array([False, True, False])
    )
    h = pa.array([[("k", "v"), ("n", None), ('q"', "\\")], None, []], pa.map_(pa.string(), pa.string()))
    return pa.table({"r": recs, "h": h})


def test_struct_and_map_render_as_record_and_hstore_text():
    names, rows = text_rows(_table())
    assert names == ["r", "h"]
    assert rows[0] == ['(infinity,"a b","{p,NULL}")', '"k"=>"v", "n"=>NULL, "q\\""=>"\\\\"']
    assert rows[1] == [None, None]
    assert rows[2] == ['("1970-01-01 00:00:00","",)', ""]


def test_struct_and_map_render_as_json_objects():
    rows = json.loads(to_json(_table()))
    assert rows[0]["r"] == {"at": "infinity", "label": "a b", "tags": ["p", None]}
    assert rows[0]["h"] == {"k": "v", "n": None, 'q"': "\\"}
    assert rows[1] == {"r": None, "h": None}
    assert rows[2]["r"]["tags"] is None and rows[2]["h"] == {}
