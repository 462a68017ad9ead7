"""Cut tags on the Iceberg side (engine/iceberg/cuts.py, IcebergMirrorTable.tag, expiry keeping cuts).

Tables in tmp_path (warehouse + SQLite catalog), v3 (deletion vectors) and v2; read back by PyIceberg
at the tag's snapshot and by DuckDB's iceberg extension at that snapshot's metadata.
"""

from __future__ import annotations

import time

import pytest
from pyiceberg.table.refs import SnapshotRefType

from mooncake_assets.engine.iceberg.cuts import cut_tag, cuts_of, cuts_to_drop, parse_cut_tag
from mooncake_assets.engine.lsn import Lsn

from .test_iceberg import FORMATS, Files, catalog, make_table, pyiceberg_ids  # noqa: F401  (catalog: a fixture)


def test_tag_names_round_trip():
    assert cut_tag(Lsn("0/5B688D0")) == "lsn-0-5B688D0"
    assert cut_tag(Lsn("1A/FF")) == "lsn-1A-FF"
    assert parse_cut_tag("lsn-0-5B688D0") == Lsn("0/5B688D0")
    assert parse_cut_tag("0/5B688D0") == Lsn("0/5B688D0")
    assert parse_cut_tag("lsn-0") is None and parse_cut_tag("main") is None and parse_cut_tag("v1") is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_tag_points_at_snapshot_and_is_read_there(catalog, tmp_path, fmt):  # noqa: F811
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", [1, 2, 3])
    s1 = t.commit(add_files=[a], summary={"mooncake.flush-lsn": "0/100"})
    t.tag(cut_tag(0x100), s1)
    t.tag(cut_tag(0x100), s1)  # again: a no-op, no new metadata
    s2 = t.commit(deletes={a: [0]}, summary={"mooncake.flush-lsn": "0/200"})
    t.tag(cut_tag(0x200), s2, max_ref_age_ms=3_600_000)
    loaded = catalog.load_table("ns.t")
    refs = loaded.metadata.refs
    assert refs["lsn-0-100"].snapshot_id == s1 and refs["lsn-0-100"].snapshot_ref_type == SnapshotRefType.TAG
    assert refs["lsn-0-200"].max_ref_age_ms == 3_600_000
    assert refs["main"].snapshot_id == s2  # a tag does not move the branch
    assert [c.tag for c in cuts_of(loaded.metadata)] == ["lsn-0-100", "lsn-0-200"]
    assert pyiceberg_ids(catalog, snapshot_id=s1) == [1, 2, 3]
    assert pyiceberg_ids(catalog, snapshot_id=s2) == [2, 3]
    with pytest.raises(ValueError):
        t.tag("lsn-0-300", 12345)


@pytest.mark.parametrize("fmt", FORMATS)
def test_expiry_keeps_tagged_cuts_up_to_keep_cuts(catalog, tmp_path, fmt):  # noqa: F811
    t = make_table(catalog, fmt)
    files = Files(t, tmp_path)
    a = files.add("a", list(range(10)))
    snaps = [t.commit(add_files=[a], summary={"mooncake.flush-lsn": "0/10"})]
    for i in range(1, 6):
        snaps.append(t.commit(deletes={a: [i]}, summary={"mooncake.flush-lsn": f"0/{10 + i}"}))
    for i in (1, 2, 3):  # cuts on snapshots 1, 2, 3 (not the newest)
        t.tag(cut_tag(0x10 + i), snaps[i])
    future = int(time.time() * 1000) + 60_000
    t.expire_snapshots(older_than_ms=future, retain_last=1, delete_files=True, keep_cuts=2)
    md = catalog.load_table("ns.t").metadata
    assert [c.tag for c in cuts_of(md)] == ["lsn-0-12", "lsn-0-13"]  # the oldest cut went
    assert {s.snapshot_id for s in md.snapshots} == {snaps[2], snaps[3], snaps[5]}
    assert pyiceberg_ids(catalog, snapshot_id=snaps[2]) == [0, 3, 4, 5, 6, 7, 8, 9]
    assert pyiceberg_ids(catalog, snapshot_id=snaps[3]) == [0, 4, 5, 6, 7, 8, 9]
    # keep_cuts None keeps every tag; 0 drops them all
    t.expire_snapshots(older_than_ms=future, retain_last=1, keep_cuts=None)
    assert len(cuts_of(catalog.load_table("ns.t").metadata)) == 2
    t.expire_snapshots(older_than_ms=future, retain_last=1, keep_cuts=0)
    md = catalog.load_table("ns.t").metadata
    assert cuts_of(md) == [] and [s.snapshot_id for s in md.snapshots] == [snaps[5]]


def test_refs_past_max_ref_age_are_dropped(catalog, tmp_path):  # noqa: F811
    t = make_table(catalog, "deletion-vectors")
    files = Files(t, tmp_path)
    s1 = t.commit(add_files=[files.add("a", [1])])
    s2 = t.commit(add_files=[files.add("b", [2])])
    t.tag("lsn-0-1", s1, max_ref_age_ms=1000)
    t.tag("lsn-0-2", s2)
    md = catalog.load_table("ns.t").metadata
    ts = md.snapshot_by_id(s1).timestamp_ms
    assert cuts_to_drop(md, None, ts + 500) == []
    assert cuts_to_drop(md, None, ts + 1500) == ["lsn-0-1"]
    assert cuts_to_drop(md, 1, ts) == ["lsn-0-1"]


def test_query_of_a_cut_reads_only_the_tables_its_sql_names(catalog, tmp_path):  # noqa: F811
    """``query_cut`` scans the tables the statement names (joins, subqueries, CTEs), not every table of the
    cut: with the other table's data file gone, a query of ``t`` still answers, and one of ``u`` fails."""
    import os
    from urllib.parse import urlparse

    from mooncake_assets.engine.iceberg import IcebergMirrorTable
    from mooncake_assets.engine.read.cuts import query_cut, referenced_tables

    from .test_iceberg import SCHEMA

    data_file = {}
    for name, ids in (("t", [1, 2, 3]), ("u", [7])):
        tbl = IcebergMirrorTable.create(catalog, f"ns.{name}", SCHEMA, delete_format="deletion-vectors")
        (tmp_path / name).mkdir()
        data_file[name] = Files(tbl, tmp_path / name).add(name, ids)
        snap = tbl.commit(add_files=[data_file[name]], summary={"mooncake.flush-lsn": "0/100"})
        tbl.tag(cut_tag(0x100), snap)
    rows, info = query_cut(catalog, "ns", "lsn-0-100", "SELECT count(*) AS n FROM t JOIN u ON t.id < u.id")
    assert rows.to_pylist() == [{"n": 3}] and sorted(info.tables) == ["t", "u"]
    os.remove(urlparse(data_file["u"]).path)  # u can no longer be read
    for sql in (
        "SELECT count(*) AS n FROM t",
        "WITH x AS (SELECT id FROM t) SELECT count(*) AS n FROM x",
        "SELECT count(*) AS n FROM (SELECT * FROM T WHERE id IN (SELECT id FROM t)) s",
    ):
        rows, info = query_cut(catalog, "ns", "0/100", sql)
        assert rows.to_pylist() == [{"n": 3}], sql
        assert sorted(info.tables) == ["t", "u"]  # the cut still holds both
    with pytest.raises(Exception, match="u"):
        query_cut(catalog, "ns", "0/100", "SELECT * FROM t UNION ALL SELECT * FROM u")
    import duckdb

    con = duckdb.connect()
    assert referenced_tables("SELECT 1 FROM a, (SELECT * FROM B) b2 WHERE EXISTS (SELECT 1 FROM c)", con) == {
        "a",
        "b",
        "c",
    }
    assert referenced_tables("EXPLAIN SELECT * FROM a", con) is None  # then every table is read
