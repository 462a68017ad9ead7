"""The delete log's keys (engine/table/delete_log.py) for primary keys of every common type, in-process
without Postgres: text (commas, quotes, backslashes, ``NULL``/``\\N`` spelled out, the empty string,
unicode, control characters), uuid, numeric (bounded: decimal128; unbounded: Postgres's text, NaN and
±Infinity), timestamp and timestamptz (µs, ±infinity, BC, years past 9999, second-precision zone
offsets) and a composite key whose column order differs from the table's.

For each, deletes of persisted file rows (DELETE, UPDATE with and without the old key, a key change)
applied change by change and as columnar runs, then persisted; more of them pending in the buffer.
The keys feed (``deletes="keys"``) over persisted history, across the buffer window and after a
restart must take every deleted key from the logs, equal the feed that reads them from the data
files (no logs), and hold exactly the keys the changes deleted (decoded as the writer decodes them).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mooncake_assets.engine.cdc.columnar import columnar_transaction
from mooncake_assets.engine.cdc.decode import decode_text_columns
from mooncake_assets.engine.cdc.pgoutput import Relation, RelationColumn, TupleData
from mooncake_assets.engine.cdc.txn import Change, Transaction
from mooncake_assets.engine.pg.schema import ColumnSpec, TableSchema, arrow_type_for, assign_field_ids
from mooncake_assets.engine.table.changes import plan_changes

from .test_changes import iceberg_mirror, keys_with_and_without_logs

OID = 16384
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NUMERIC_12_2 = ((12 << 16) | 2) + 4

#: kind -> (columns (name, type oid, typmod, type name) in table order, key columns in key order,
#: key values as Postgres prints them: one tuple per row, in key order; the last is only ever a new key)
KINDS: dict[str, tuple[list[tuple[str, int, int, str]], list[str], list[tuple[str, ...]]]] = {
    "text": (
        [("v", 25, -1, "text"), ("k", 25, -1, "text")],
        ["k"],
        [
            ("a,b",),
            ('q"uote',),
            ("it's",),
            ("NULL",),
            ("\\N",),
            ("",),
            ("ünï©ødé ✓ 🦆",),
            ("tab\tnew\nline\r",),
            ("back\\slash",),
            ('{a,"b"}',),
            ("(1,2)",),
            (" padded ",),
        ],
    ),
    "uuid": (
        [("k", 2950, -1, "uuid"), ("v", 25, -1, "text")],
        ["k"],
        [(str(uuid.UUID(int=i * 0x0123456789ABCDEF0123456789ABCDEF % (1 << 128))),) for i in range(11)]
        + [("ffffffff-ffff-ffff-ffff-ffffffffffff",)],
    ),
    "numeric(12,2)": (
        [("k", 1700, NUMERIC_12_2, "numeric(12,2)"), ("v", 25, -1, "text")],
        ["k"],
        [("0.00",), ("-0.01",), ("1.50",), ("9999999999.99",), ("-9999999999.99",), ("123.40",), ("7.00",), ("0.10",)],
    ),
    "numeric": (
        [("k", 1700, -1, "numeric"), ("v", 25, -1, "text")],
        ["k"],
        [
            ("NaN",),
            ("Infinity",),
            ("-Infinity",),
            ("1.500",),
            ("0.00000000000000000001",),
            ("-123456789012345678901234567890.123",),
            ("0",),
            ("42",),
        ],
    ),
    "timestamp": (
        [("k", 1114, -1, "timestamp without time zone"), ("v", 25, -1, "text")],
        ["k"],
        [
            ("2024-01-01 00:00:00",),
            ("2024-01-01 00:00:00.000001",),
            ("1999-12-31 23:59:59.5",),
            ("infinity",),
            ("-infinity",),
            ("0044-03-15 12:00:00 BC",),
            ("12345-06-07 08:09:10",),
            ("1970-01-01 00:00:00",),
        ],
    ),
    "timestamptz": (
        [("k", 1184, -1, "timestamp with time zone"), ("v", 25, -1, "text")],
        ["k"],
        [
            ("2024-01-01 00:00:00+00",),
            ("2024-01-01 02:00:00.25+01",),
            ("1969-12-31 23:59:59.999999+00",),
            ("infinity",),
            ("-infinity",),
            ("2000-02-29 12:00:00+05:30",),
            ("1900-01-01 00:00:00+00:09:21",),
            ("2030-05-05 05:05:05-07",),
        ],
    ),
    "composite": (
        [
            ("a", 25, -1, "text"),
            ("v", 25, -1, "text"),
            ("b", 23, -1, "integer"),
            ("c", 1184, -1, "timestamp with time zone"),
        ],
        ["c", "a", "b"],  # the primary key's order, not the table's
        [
            ("2024-01-01 00:00:00+00", "x,y", "1"),
            ("2024-01-01 00:00:00+00", "x,y", "2"),
            ("2024-01-01 00:00:00+00", '"q"', "1"),
            ("infinity", "NULL", "-5"),
            ("-infinity", "ü", "0"),
            ("2024-01-01 00:00:00+00", "", "7"),
            ("1999-01-01 00:00:00+00", "\\N", "2147483647"),
            ("2024-01-01 00:00:00+00", "x,y", "3"),
        ],
    ),
}


def _schema(kind: str) -> TableSchema:
    cols, key, _ = KINDS[kind]
    specs = [
        ColumnSpec(n, oid, typmod, tname, arrow_type_for(oid, typmod, tname), not_null=n in key, is_key=n in key)
        for n, oid, typmod, tname in cols
    ]
    assign_field_ids(specs)
    return TableSchema(
        schema="public", name="t", oid=OID, columns=specs, key_columns=key, has_primary_key=True, replica_identity="d"
    )


def _table(tmp, kind: str):
    return iceberg_mirror(tmp, _schema(kind), [c[0] for c in KINDS[kind][0]], OID)


class Rows:
    """Row images of one kind: ``key`` (values in key order), ``v``; changes as pgoutput decodes them."""

    def __init__(self, kind: str):
        cols, self.key, _ = KINDS[kind]
        self.names = [c[0] for c in cols]
        self.relation = Relation(
            None, OID, "public", "t", "d", [RelationColumn(1 if n in self.key else 0, n, o, m) for n, o, m, _ in cols]
        )

    def tup(self, key: tuple[str, ...], v: str | None, key_only: bool = False) -> TupleData:
        vals = dict(zip(self.key, key))
        out = [vals[n] if n in vals else (None if key_only else v) for n in self.names]
        return TupleData(
            "".join("n" if x is None else "t" for x in out), [None if x is None else x.encode() for x in out]
        )

    def insert(self, key, v) -> Change:
        return Change("insert", OID, new=self.tup(key, v), relation=self.relation)

    def delete(self, key) -> Change:
        return Change("delete", OID, old=self.tup(key, None, key_only=True), old_kind="K", relation=self.relation)

    def update(self, key, v, old_key=None) -> Change:
        old = None if old_key is None else self.tup(old_key, None, key_only=True)
        return Change(
            "update", OID, new=self.tup(key, v), old=old, old_kind="K" if old else None, relation=self.relation
        )


def _commit(t, lsn: int, changes: list[Change], runs: bool) -> None:
    if runs:
        for run in columnar_transaction(Transaction(lsn, lsn, lsn + 8, T0, changes)).runs:
            t.apply_run(run, lsn)
    else:
        for ch in changes:
            t.apply(ch, lsn)
    t.last_change_lsn = max(t.last_change_lsn, lsn)
    t.applied_lsn = max(t.applied_lsn, lsn + 1)


def _deleted_keys(feed: pa.Table, key: list[str]) -> pa.Table:
    return feed.filter(pc.equal(feed.column("_change"), "delete")).select(key)


def _check(t, a: int, b: int, kind: str, want: list[tuple[str, ...]]) -> dict[str, int]:
    """The keys feed of ``[a, b)`` with logs equals the one without and holds the keys ``want`` (text, key
    order) as deletes, equal to the full-row feed's deleted keys; returns where the keys came from."""
    key = KINDS[kind][1]
    plan, with_logs, without = keys_with_and_without_logs(t, a, b)
    assert with_logs.schema == without.schema
    assert with_logs.equals(without), (kind, plan.key_sources)
    full = plan_changes(t, a, b).execute()
    specs = [c for k in key for c in t.schema.columns if c.name == k]
    expect = pa.Table.from_batches([decode_text_columns(specs, list(want))])
    expect = expect.sort_by([(k, "ascending") for k in key])
    got = _deleted_keys(with_logs, key)
    assert got.cast(expect.schema).equals(expect), (kind, got, expect)
    assert _deleted_keys(full, key).cast(expect.schema).equals(expect)
    ins = with_logs.filter(pc.equal(with_logs.column("_change"), "insert"))
    assert ins.equals(full.filter(pc.equal(full.column("_change"), "insert")).cast(ins.schema))
    return dict(plan.key_sources)


@pytest.mark.parametrize("runs", [False, True], ids=["changes", "runs"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_keys_feed_with_logs_equals_the_files_for_every_key_type(tmp_path, kind, runs):
    keys = KINDS[kind][2]
    r = Rows(kind)
    t = _table(tmp_path, kind)
    t.persist()
    _commit(t, 100, [r.insert(k, f"v{i}") for i, k in enumerate(keys[:-1])], runs)
    t.persist()
    a = t.flush_lsn
    # deletes of persisted rows: DELETE, UPDATE without and with the old key, a key change
    _commit(t, 200, [r.delete(keys[0]), r.delete(keys[2])], runs)
    _commit(t, 210, [r.update(keys[1], "u1")], runs)
    _commit(t, 220, [r.update(keys[3], "u3", old_key=keys[3])], runs)
    _commit(t, 230, [r.update(keys[-1], "moved", old_key=keys[4])], runs)
    t.persist()
    b = t.flush_lsn
    assert t.iceberg.refresh().table.current_snapshot().summary.additional_properties.get("mooncake.delete-log")
    # pending in the buffer window: deleted rows of the persisted file, logged in memory
    _commit(t, 300, [r.delete(keys[5]), r.update(keys[6], "u6")], runs)
    now = t.applied_lsn
    first = [keys[0], keys[2], keys[1], keys[3], keys[4]]
    assert _check(t, a, b, kind, first) == {"logged": 5, "read": 0}
    assert _check(t, b, now, kind, [keys[5], keys[6]]) == {"logged": 2, "read": 0}
    assert _check(t, a, now, kind, first + [keys[5], keys[6]]) == {"logged": 7, "read": 0}
    t = _table(tmp_path, kind)  # a restart: the logs of the snapshots are read back from Parquet
    t.restore()
    assert _check(t, a, b, kind, first) == {"logged": 5, "read": 0}


# ---------------------------------------------------------------- whole old rows (REPLICA IDENTITY FULL)
def _full_tup(r: Rows, key: tuple[str, ...], v: str | None) -> TupleData:
    return r.tup(key, v)


def _delete_full(r: Rows, key, v) -> Change:
    return Change("delete", OID, old=_full_tup(r, key, v), old_kind="O", relation=r.relation)


def _update_full(r: Rows, key, v, old_key, old_v) -> Change:
    return Change("update", OID, new=r.tup(key, v), old=_full_tup(r, old_key, old_v), old_kind="O", relation=r.relation)


def _rows_both_ways(t, a: int, b: int) -> tuple[pa.Table, dict[str, int], list[str]]:
    """The full-row feed of ``[a, b)`` with the logs' whole old rows, checked equal to the one reading
    every deleted row from the data files (no logs); returns it, where its deleted rows came from and
    the files it read."""
    plan = plan_changes(t, a, b)
    feed = plan.execute()
    bare = plan_changes(t, a, b)
    bare.logs, bare.mem_log = [], None
    without = bare.execute()
    assert bare.row_sources["logged"] == 0
    assert feed.schema == without.schema
    assert feed.equals(without), (plan.row_sources, feed.to_pylist(), without.to_pylist())
    return feed, dict(plan.row_sources), list(plan.files_read)


@pytest.mark.parametrize("runs", [False, True], ids=["changes", "runs"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_full_row_feed_takes_whole_old_rows_from_the_logs_for_every_key_type(tmp_path, kind, runs):
    """Changes that carry the whole old row ('O', REPLICA IDENTITY FULL; NULL values included): the
    persist's log holds those rows (summary ``mooncake.delete-log-rows``), and the full-row feed takes
    the deleted rows from it and the buffer's log instead of the data file (which it does not read),
    equal to the feed that reads them from the file, across a restart. A key-only delete ('K') of the
    same file makes that file's deleted rows come from the file again."""
    keys = KINDS[kind][2]
    r = Rows(kind)
    t = _table(tmp_path, kind)
    t.persist()
    vals = [None if i == 3 else f"v{i}" for i in range(len(keys) - 1)]
    _commit(t, 100, [r.insert(k, vals[i]) for i, k in enumerate(keys[:-1])], runs)
    t.persist()
    a = t.flush_lsn
    old_file = next(iter(t.files.values())).location
    _commit(t, 200, [_delete_full(r, keys[0], vals[0]), _delete_full(r, keys[2], vals[2])], runs)
    _commit(t, 210, [_update_full(r, keys[1], "u1", keys[1], vals[1])], runs)
    _commit(t, 220, [_update_full(r, keys[3], "u3", keys[3], None)], runs)  # a NULL in the old row
    _commit(t, 230, [_update_full(r, keys[-1], "moved", keys[4], vals[4])], runs)  # a key change
    t.persist()
    b = t.flush_lsn
    summary = t.iceberg.refresh().table.current_snapshot().summary.additional_properties
    assert summary.get("mooncake.delete-log-rows") == "5", summary
    _commit(t, 300, [_delete_full(r, keys[5], vals[5]), _update_full(r, keys[6], "u6", keys[6], vals[6])], runs)
    now = t.applied_lsn
    for lo, hi, n in [(a, b, 5), (b, now, 2), (a, now, 7)]:
        feed, sources, read = _rows_both_ways(t, lo, hi)
        assert sources == {"logged": n, "read": 0}, (lo, hi)
        assert old_file not in read, (lo, hi, read)
        dels = feed.filter(pc.equal(feed.column("_change"), "delete"))
        assert dels.num_rows == n
    t2 = _table(tmp_path, kind)  # a restart: the log is read back from Parquet
    t2.restore()
    feed, sources, read = _rows_both_ways(t2, a, b)
    assert sources == {"logged": 5, "read": 0} and old_file not in read
    # a key-only delete ('K'): its file's deleted rows are read from that file, the others' still logged
    _commit(t, 310, [r.delete(keys[7])], runs)
    feed, sources, read = _rows_both_ways(t, b, t.applied_lsn)
    if len(keys) > 8:  # keys[7] is a row of the old file: all three of its deleted rows are read from it
        assert sources == {"logged": 0, "read": 3} and old_file in read
    else:  # keys[7] is the moved row, in the file the persist at b wrote
        assert sources == {"logged": 2, "read": 1} and old_file not in read


def test_default_identity_writes_no_whole_rows_and_the_full_row_feed_reads_the_files(tmp_path):
    """Key-only changes (the default replica identity): the log holds keys only (no
    ``mooncake.delete-log-rows``) and the full-row feed reads the deleted rows from the data file."""
    kind = "text"
    keys = KINDS[kind][2]
    r = Rows(kind)
    t = _table(tmp_path, kind)
    t.persist()
    _commit(t, 100, [r.insert(k, f"v{i}") for i, k in enumerate(keys[:4])], False)
    t.persist()
    a = t.flush_lsn
    _commit(t, 200, [r.delete(keys[0]), r.update(keys[1], "u1")], False)
    t.persist()
    summary = t.iceberg.refresh().table.current_snapshot().summary.additional_properties
    assert summary.get("mooncake.delete-log") and "mooncake.delete-log-rows" not in summary
    plan = plan_changes(t, a, t.flush_lsn)
    plan.execute()
    assert plan.logs == [] and plan.row_sources == {"logged": 0, "read": 2}


@pytest.mark.parametrize("runs", [False, True], ids=["changes", "runs"])
def test_a_schema_change_starts_the_delete_log_again(tmp_path, runs):
    """Whole old rows logged under the old columns, then ADD COLUMN before the persist: the persist once
    failed (``Field "v2" does not exist in schema``: the log's text columns decoded with the new column
    list; found by `mooncake chaos`, seed 4). The log starts again at the schema change; the feed reads
    those deleted rows from the file, equal to the feed without logs."""
    from mooncake_assets.engine.table.evolution import SchemaChange

    keys = KINDS["text"][2]
    r = Rows("text")
    t = _table(tmp_path, "text")
    t.persist()
    _commit(t, 100, [r.insert(k, f"v{i}") for i, k in enumerate(keys[:4])], runs)
    t.persist()
    a = t.flush_lsn
    _commit(t, 200, [_delete_full(r, keys[0], "v0"), _update_full(r, keys[1], "u1", keys[1], "v1")], runs)
    assert t.delete_log.full_rows == 2
    cols = t.schema.columns + [ColumnSpec("x", 23, -1, "integer", pa.int32(), field_id=t.next_field_id)]
    t.evolve(SchemaChange(cols, list(t.schema.key_columns), 250, t.next_field_id + 1, added=["x"]))
    assert len(t.delete_log) == 0 and t.delete_log.value_names == ["v", "x"]
    t.persist()  # (raised KeyError before)
    feed, sources, _ = _rows_both_ways(t, a, t.flush_lsn)
    assert sources == {"logged": 0, "read": 2}, sources
    assert feed.filter(pc.equal(feed.column("_change"), "delete")).num_rows == 2
