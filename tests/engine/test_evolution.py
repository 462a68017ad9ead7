"""Schema evolution planning and projection (engine/table/evolution.py), without Postgres: the plan
is a pure function of the mirror's columns, the Relation message and the catalogs' rows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from mooncake_assets.engine.pg.catalog import CatalogColumn
from mooncake_assets.engine.pg.schema import ColumnSpec, TableSchema, UnsupportedTypeError
from mooncake_assets.engine.table.evolution import plan_schema_change, project, promotable
from mooncake_assets.engine.table.schema_change import SchemaChangeError

INT4, INT8, TEXT, TSV = 23, 20, 25, 3614
ARROW = {INT4: pa.int32(), INT8: pa.int64(), TEXT: pa.string()}
NAMES = {INT4: "integer", INT8: "bigint", TEXT: "text"}


def spec(name, oid, attnum, fid, key=False):
    return ColumnSpec(
        name, oid, -1, NAMES[oid], ARROW[oid], is_key=key, decl_oid=oid, decl_typmod=-1, field_id=fid, attnum=attnum
    )


def schema(*cols, keyless=False):
    return TableSchema("public", "t", 1, list(cols), [] if keyless else ["id"], not keyless, "f" if keyless else "d")


def cat(attnum, name, oid=INT4, dropped=False, missing=None):
    return CatalogColumn(
        attnum,
        name if not dropped else f"........pg.dropped.{attnum}........",
        dropped,
        0 if dropped else oid,
        -1,
        0,
        False,
        missing,
    )


def resolve(name, oid, typmod, ndims):
    if oid not in ARROW:
        raise UnsupportedTypeError(f"type oid {oid}")
    return ColumnSpec(name, oid, typmod, NAMES[oid], ARROW[oid], decl_oid=oid, decl_typmod=typmod)


def plan(sch, rel, catalog, **kw):
    return plan_schema_change(sch, rel, catalog, resolve, 0x10, 10, table="t", **kw)


def test_add_with_default_gets_a_fresh_id_and_the_missing_value():
    s = schema(spec("id", INT4, 1, 1, True), spec("a", INT4, 2, 2))
    ch = plan(
        s,
        [("id", INT4, -1), ("a", INT4, -1), ("c", TEXT, -1)],
        [cat(1, "id"), cat(2, "a"), cat(3, "c", TEXT, missing="d")],
    )
    assert ch.added == ["c"] and [c.field_id for c in ch.columns] == [1, 2, 10]
    assert ch.columns[2].initial_default == "d" and ch.columns[2].attnum == 3 and ch.next_field_id == 11


def test_rename_keeps_the_field_id_and_drop_then_add_same_name_is_a_new_field():
    s = schema(spec("id", INT4, 1, 1, True), spec("a", INT4, 2, 2), spec("b", INT4, 3, 3))
    ch = plan(
        s,
        [("id", INT4, -1), ("amount", INT4, -1), ("b", INT4, -1)],
        [cat(1, "id"), cat(2, "amount"), cat(3, "b", dropped=True), cat(4, "b")],
    )
    assert ch.renamed == [("a", "amount")] and ch.dropped == ["b"] and ch.added == ["b"]
    assert [c.field_id for c in ch.columns] == [1, 2, 10]


def test_a_rename_processed_after_more_renames_is_paired_by_position():
    """x3 was renamed to y8 at this LSN and to y11 since: the catalogs know neither x3 nor y8."""
    s = schema(spec("id", INT4, 1, 1, True), spec("x3", TEXT, 8, 5), spec("z", INT4, 9, 6))
    ch = plan(
        s, [("id", INT4, -1), ("y8", TEXT, -1), ("z", INT4, -1)], [cat(1, "id"), cat(8, "y11", TEXT), cat(9, "z")]
    )
    assert ch.renamed == [("x3", "y8")] and not ch.added and not ch.dropped
    assert [c.field_id for c in ch.columns] == [1, 5, 6]
    # the same with the column's attnum unknown (it was added while the mirror lagged)
    s = schema(spec("id", INT4, 1, 1, True), spec("x3", TEXT, 0, 5))
    ch = plan(s, [("id", INT4, -1), ("y8", TEXT, -1)], [cat(1, "id"), cat(8, "y11", TEXT)])
    assert ch.renamed == [("x3", "y8")] and ch.columns[1].field_id == 5


def test_type_promotions_and_refusals():
    s = schema(spec("id", INT4, 1, 1, True), spec("a", INT4, 2, 2))
    ch = plan(s, [("id", INT4, -1), ("a", INT8, -1)], [cat(1, "id"), cat(2, "a", INT8)])
    assert ch.retyped == [("a", "integer", "bigint")] and ch.columns[1].arrow_type == pa.int64()
    with pytest.raises(SchemaChangeError, match=r"table t .*LSN 0/10.*column a changed type from integer to text"):
        plan(s, [("id", INT4, -1), ("a", TEXT, -1)], [cat(1, "id"), cat(2, "a", TEXT)])
    with pytest.raises(SchemaChangeError, match="column doc was added with a type that cannot be mirrored"):
        plan(s, [("id", INT4, -1), ("a", INT4, -1), ("doc", TSV, -1)], [cat(1, "id"), cat(2, "a"), cat(3, "doc", TSV)])
    # the same column, dropped again since (a replay after the fix): left out
    ch = plan(
        s,
        [("id", INT4, -1), ("a", INT4, -1), ("doc", TSV, -1)],
        [cat(1, "id"), cat(2, "a"), cat(3, "doc", dropped=True)],
    )
    assert ch.ignored == ["doc"] and ch.is_noop()
    assert promotable(pa.int16(), pa.int64()) and promotable(pa.float32(), pa.float64())
    assert promotable(pa.decimal128(6, 2), pa.decimal128(12, 2)) and not promotable(
        pa.decimal128(6, 2), pa.decimal128(12, 3)
    )
    assert not promotable(pa.int64(), pa.int32()) and not promotable(pa.int32(), pa.string())


def test_defaults_on_v2_and_drops_on_keyless_tables_stop_the_table():
    s = schema(spec("id", INT4, 1, 1, True))
    with pytest.raises(SchemaChangeError, match="format v2"):
        plan(s, [("id", INT4, -1), ("c", INT4, -1)], [cat(1, "id"), cat(2, "c", missing="7")], format_version=2)
    k = schema(spec("a", INT4, 1, 1), spec("b", TEXT, 2, 2), keyless=True)
    with pytest.raises(SchemaChangeError, match="column b was dropped from a table without a primary key"):
        plan(k, [("a", INT4, -1)], [cat(1, "a"), cat(2, "b", dropped=True)])
    ch = plan(k, [("a", INT4, -1), ("b", TEXT, -1), ("c", INT4, -1)], [cat(1, "a"), cat(2, "b", TEXT), cat(3, "c")])
    assert ch.added == ["c"] and ch.key_columns == []


def _field(name, t, fid):
    return pa.field(name, t, metadata={b"PARQUET:field_id": str(fid).encode()})


def test_project_matches_by_field_id_casts_and_fills_defaults():
    old = pa.schema([_field("id", pa.int32(), 1), _field("a", pa.int32(), 2), _field("gone", pa.string(), 3)])
    data = pa.table([pa.array([1, 2], pa.int32()), pa.array([10, None], pa.int32()), pa.array(["x", "y"])], schema=old)
    new = pa.schema(
        [
            _field("id", pa.int32(), 1),
            _field("amount", pa.int64(), 2),
            _field("c", pa.string(), 4),
            _field("d", pa.int32(), 5),
        ]
    )
    out = project(data, new, {4: pa.scalar("dflt")})
    assert out.schema == new
    assert out.to_pydict() == {"id": [1, 2], "amount": [10, None], "c": ["dflt", "dflt"], "d": [None, None]}
    rb = project(data.to_batches()[0], new, {})
    assert isinstance(rb, pa.RecordBatch) and rb.column(2).null_count == 2
    # without field ids (a file from before ids were written) columns match by name
    plain = pa.table({"id": pa.array([3], pa.int32()), "amount": pa.array([5], pa.int32())})
    assert project(plain, new, {}).to_pydict()["amount"] == [5]


def test_a_column_added_late_then_renamed_is_a_rename():
    """x18 was added and renamed to y19 before the mirror processed the ADD: its attnum stayed unknown;
    at the rename the catalogs know y19 (attnum 5), and position + type pair it with x18."""
    k = schema(spec("a", INT4, 1, 1), spec("x18", TEXT, 0, 7), keyless=True)
    ch = plan(k, [("a", INT4, -1), ("y19", TEXT, -1)], [cat(1, "a"), cat(5, "y19", TEXT)])
    assert ch.renamed == [("x18", "y19")] and not ch.dropped and ch.columns[1].attnum == 5


def test_a_column_added_then_renamed_before_the_add_is_processed_keeps_its_default():
    """Replay after a restart: x9 (DEFAULT 7) was renamed to y13 since, x11 added after it; the catalogs
    know y13 and x11. The ADD at x9's LSN finds its row by attnum order and type: attnum 5, default 7."""
    s = schema(spec("id", INT4, 1, 1, True), spec("x4", TEXT, 4, 4))
    catalog = [cat(1, "id"), cat(4, "x4", TEXT), cat(5, "y13", INT4, missing="7"), cat(6, "x11", TEXT, missing="d")]
    ch = plan(s, [("id", INT4, -1), ("x4", TEXT, -1), ("x9", INT4, -1)], catalog)
    assert ch.added == ["x9"] and ch.columns[2].attnum == 5 and ch.columns[2].initial_default == "7"
    # an unmappable column added and dropped again since is still left out
    catalog = [cat(1, "id"), cat(4, "x4", TEXT), cat(5, "doc", dropped=True)]
    ch = plan(s, [("id", INT4, -1), ("x4", TEXT, -1), ("doc", TSV, -1)], catalog)
    assert ch.ignored == ["doc"]


def test_an_added_column_no_catalog_row_can_be_is_an_error_not_a_column_without_default():
    """Catalogs that show nothing the added column can be (read before its transaction was
    visible, or changed since beyond recognition) give no trustworthy default: the table stops, naming
    table, column and LSN, instead of older rows reading NULL."""
    s = schema(spec("id", INT4, 1, 1, True), spec("a", INT4, 2, 2))
    with pytest.raises(
        SchemaChangeError,
        match=r"table t .*LSN 0/10.*column x5 was added, but the catalogs show no "
        r"column it can be now.*value older rows read in it is unknown",
    ):
        plan(s, [("id", INT4, -1), ("a", INT4, -1), ("x5", TEXT, -1)], [cat(1, "id"), cat(2, "a")])


def test_an_added_column_renamed_and_widened_since_keeps_its_default():
    """x3 int DEFAULT 7 was added at this LSN, then renamed to y4 and widened to bigint (a replay): the
    only free catalog row of a type int can have been widened to is it, and its default is kept."""
    s = schema(spec("id", INT4, 1, 1, True), spec("a", INT4, 2, 2))
    ch = plan(
        s,
        [("id", INT4, -1), ("a", INT4, -1), ("x3", INT4, -1)],
        [cat(1, "id"), cat(2, "a"), cat(3, "y4", INT8, missing="7")],
    )
    assert ch.added == ["x3"] and ch.columns[2].initial_default == "7" and ch.columns[2].attnum == 3
    # two such rows: which one is unknown, so the table stops
    with pytest.raises(SchemaChangeError, match="column x3 was added, but the catalogs show no column it can be"):
        plan(
            s,
            [("id", INT4, -1), ("a", INT4, -1), ("x3", INT4, -1)],
            [cat(1, "id"), cat(2, "a"), cat(3, "y4", INT8, missing="7"), cat(4, "y5", INT8)],
        )
