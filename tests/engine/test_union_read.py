"""The union read (engine/read): every way of applying deletes returns exactly the live rows of files
with and without deletes plus the in-memory rows, for scans, projections, filters and LIMITs."""

from __future__ import annotations

import base64

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

from mooncake_assets.engine.read import UnionReader
from mooncake_assets.engine.read.plan import deleted_positions, plan_file
from mooncake_assets.engine.table.read_state import ReadState

ROW_GROUP = 1000


class FakeClient:
    """Serves ReadStates built in the test, the way the service's ``read_state`` action does."""

    def __init__(self):
        self.tables: dict[str, tuple[dict, pa.Table]] = {}

    def read_state(self, table, lsn=None):
        rs, _ = self.tables[table]
        return ReadState.from_wire(dict(rs, ticket=table))  # as ServiceClient decodes the wire form

    def fetch(self, ticket):
        return self.tables[ticket][1]

    def status(self):
        return {"tables": [{"name": n, "state": "ready"} for n in self.tables]}

    def wait_lsn(self, lsn, timeout=30.0):  # everything built in the test is applied
        return {"applied_lsn": lsn}


def _rows(ids: np.ndarray, tag: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "grp": pa.array(ids % 7, pa.int32()),
            "val": pa.array(ids * 10 + tag, pa.int64()),
            "txt": pa.array([f"r{i}-{tag}" for i in ids.tolist()], pa.string()),
        }
    )


def _dv(positions) -> str | None:
    positions = list(positions)
    return base64.b64encode(BitMap64(positions).serialize()).decode() if positions else None


@pytest.fixture()
def table(tmp_path):
    """A table of 4 files (one clean, one with random deletes, one with whole row groups deleted and
    the rest clean, one with everything but a few rows deleted) and in-memory rows; returns
    (client, expected live rows)."""
    rng = np.random.default_rng(5)
    files, expected = [], []
    layout = [
        ("clean", np.arange(0, 3000), []),
        ("random", np.arange(3000, 8000), sorted(rng.choice(5000, 900, replace=False).tolist())),
        ("groups", np.arange(8000, 12000), list(range(1000, 2000)) + list(range(3000, 3500))),
        ("almost_all", np.arange(12000, 15000), [p for p in range(3000) if p not in (5, 2500, 2999)]),
    ]
    for k, (name, ids, dels) in enumerate(layout):
        t = _rows(ids, k)
        path = tmp_path / f"{name}.parquet"
        pq.write_table(t, path, row_group_size=ROW_GROUP)
        files.append({"name": path.name, "path": str(path), "rows": t.num_rows, "deleted": _dv(dels)})
        keep = np.ones(t.num_rows, bool)
        keep[dels] = False
        expected.append(t.filter(pa.array(keep)))
    mem = _rows(np.arange(20000, 20500), 9)
    expected.append(mem)
    rs = {"table": "t", "lsn": "0/10", "files": files, "schema": ["id", "grp", "val", "txt"]}
    client = FakeClient()
    client.tables["t"] = (rs, mem)
    return client, pa.concat_tables(expected)


def _sorted(t: pa.Table) -> list:
    return sorted(t.to_pylist(), key=lambda r: tuple((k, str(v)) for k, v in r.items()))


def test_plan_skips_deleted_row_groups_and_reads_clean_ones_plainly(table):
    client, _ = table
    files = {f["name"]: f for f in client.tables["t"][0]["files"]}
    f = files["groups.parquet"]
    p = plan_file(f["path"], f["rows"], deleted_positions(f["deleted"]))
    # row group 1 fully deleted (skipped), row group 3 half deleted, 0 and 2 clean
    assert [(s.start, s.stop, s.has_deletes) for s in p.segments] == [
        (0, 1000, False),
        (2000, 3000, False),
        (3000, 4000, True),
    ]
    f = files["almost_all.parquet"]
    p = plan_file(f["path"], f["rows"], deleted_positions(f["deleted"]))
    assert [(s.start, s.stop) for s in p.segments] == [(0, 1000), (2000, 3000)]


def test_deleted_positions_decodes_portable_bitmaps():
    for pos in ([], [0], [1, 5, 70000, 2**31 + 3], list(range(0, 200000, 3))):
        assert deleted_positions(_dv(pos)).tolist() == pos
    big = [5, 2**33 + 1]
    assert deleted_positions(_dv(big)).tolist() == big
    with pytest.raises(ValueError):
        deleted_positions(b"\x01")


@pytest.mark.parametrize("mode", ["lazy", "arrow", "anti"])
def test_every_mode_reads_exactly_the_live_rows(table, mode):
    client, expected = table
    r = UnionReader(client, mode=mode)
    got = r.read_table("t", lsn="0/10")
    assert got.num_rows == expected.num_rows
    assert _sorted(got) == _sorted(expected)
    # projections and filters
    r.register("t", lsn="0/10", mode=mode if mode != "arrow" else "lazy")
    n, s = r.con.execute("SELECT count(*), sum(val) FROM t WHERE grp = 3 AND id BETWEEN 2500 AND 13000").fetchone()
    ids, grp, val = (expected[c].to_numpy() for c in ("id", "grp", "val"))
    sel = (grp == 3) & (ids >= 2500) & (ids <= 13000)
    assert (n, s) == (int(sel.sum()), int(val[sel].sum()))


@pytest.mark.parametrize("mode", ["auto", "lazy", "arrow", "anti"])
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT count(*) AS n, sum(val) AS s, sum(hash(txt) % 1000003) AS h FROM t",
        "SELECT grp, count(*) AS n, sum(val) AS s FROM t GROUP BY grp ORDER BY grp",
        "SELECT count(*) AS n, sum(val) AS s FROM t WHERE id BETWEEN 3100 AND 12100",
        "SELECT * FROM t ORDER BY id",
        "SELECT id FROM t ORDER BY id LIMIT 7 OFFSET 4000",
        "SELECT count(*) AS n FROM t",
    ],
)
def test_query_equals_duckdb_over_the_expected_rows(table, mode, sql):
    client, expected = table
    import duckdb

    con = duckdb.connect()
    con.register("t", expected)
    want = con.execute(sql).to_arrow_table()
    got = UnionReader(client, mode=mode).query(sql, lsn="0/10")
    assert got.to_pylist() == want.to_pylist()


def test_query_registers_only_referenced_tables_and_reregisters_cleanly(table):
    client, expected = table
    client.tables["other"] = (dict(client.tables["t"][0], files=[]), expected.slice(0, 3))
    r = UnionReader(client)
    assert r.query("SELECT count(*) AS n FROM t", lsn="0/10")["n"][0].as_py() == expected.num_rows
    assert set(r.states) == {"t"}
    for _ in range(3):  # old Arrow objects are unregistered when a view is registered again
        r.query("SELECT count(*) AS n FROM t WHERE id > 0", lsn="0/10")
    assert sum(len(v) for v in r._objects.values()) <= 3
    got = r.query("SELECT count(*) AS n FROM t JOIN other USING (id)", lsn="0/10")
    assert got["n"][0].as_py() == 3


@pytest.mark.parametrize("mode", ["lazy", "arrow"])
def test_new_deletes_on_the_same_file_are_seen_despite_the_plan_cache(table, mode):
    """Plans and decoded vectors are memoized by the vector's bytes: a file whose DV grows between two
    reads is read with the new one."""
    client, expected = table
    r = UnionReader(client, mode=mode)
    before = r.read_table("t", lsn="0/10").num_rows
    rs, mem = client.tables["t"]
    f = next(f for f in rs["files"] if f["name"] == "random.parquet")
    old = set(deleted_positions(f["deleted"]).tolist())
    more = sorted(old | {p for p in range(0, 5000, 7) if p not in old})
    f["deleted"] = _dv(more)
    after = r.read_table("t", lsn="0/10").num_rows
    assert before - after == len(more) - len(old) > 0


def test_no_in_memory_rows_keeps_the_view_types_and_skips_the_arrow_scan(table):
    """With no rows buffered, the in-memory branch stays in the view (same column types) but DuckDB
    does not scan it; with rows it is read again."""
    client, expected = table
    rs, mem = client.tables["t"]
    clean = [f for f in rs["files"] if f["deleted"] is None]
    client.tables["c"] = (dict(rs, table="c", files=clean), mem)
    r = UnionReader(client, mode="lazy")
    r.register("c", lsn="0/10")
    types = r.con.execute("DESCRIBE c").fetchall()
    assert r.con.execute("SELECT count(*) FROM c").fetchone()[0] == 3000 + mem.num_rows
    client.tables["c"] = (dict(rs, table="c", files=clean), mem.slice(0, 0))
    r.register("c", lsn="0/10")
    assert r.con.execute("DESCRIBE c").fetchall() == types
    assert r.con.execute("SELECT count(*) FROM c").fetchone()[0] == 3000
    plan = r.con.execute("EXPLAIN SELECT count(*), sum(val) FROM c").fetchall()[0][1]
    assert "ARROW_SCAN" not in plan and "READ_PARQUET" in plan
    client.tables["c"] = (dict(rs, table="c", files=clean), mem)
    r.register("c", lsn="0/10")
    assert r.con.execute("SELECT count(*) FROM c").fetchone()[0] == 3000 + mem.num_rows


def test_lazy_bitmaps_live_in_a_duckdb_table_rewritten_only_when_the_vectors_change(table):
    """A lazy view's deletion vectors are a DuckDB temp table (no Arrow scan per query), kept while the
    files' vectors are unchanged and rewritten when one changes (the same view DDL sees the new deletes)."""
    client, expected = table
    rs, mem = client.tables["t"]
    client.tables["t"] = (rs, mem.slice(0, 0))
    r = UnionReader(client, mode="lazy")
    sql = "SELECT count(*) AS n FROM t WHERE id >= 0"
    n0 = r.query(sql, lsn="0/10")["n"][0].as_py()
    assert n0 == expected.num_rows - mem.num_rows
    plan = r.con.execute("EXPLAIN " + sql).fetchall()[0][1]
    assert "ARROW_SCAN" not in plan
    kept = r._dv_tables["t"][1]
    r.query(sql, lsn="0/10")
    assert r._dv_tables["t"][1] is kept  # unchanged vectors: the table was not written again
    f = next(f for f in rs["files"] if f["name"] == "random.parquet")
    old = set(deleted_positions(f["deleted"]).tolist())
    more = sorted(old | {p for p in range(0, 5000, 7) if p not in old})
    f["deleted"] = _dv(more)
    assert r.query(sql, lsn="0/10")["n"][0].as_py() == n0 - (len(more) - len(old))
    assert r._dv_tables["t"][1] is not kept
    for g in rs["files"]:  # no file with deletes left: the table goes
        g["deleted"] = None
    assert r.query(sql, lsn="0/10")["n"][0].as_py() == 3000 + 5000 + 4000 + 3000
    assert "t" not in r._dv_tables
    assert not r.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '__mc_dv_t'").fetchone()[0]


@pytest.mark.parametrize("mode", ["lazy", "arrow"])
def test_small_in_memory_rows_are_a_duckdb_table_rewritten_only_when_they_change(table, mode, monkeypatch):
    """A long-lived reader holds a small buffer as a DuckDB temp table (no Arrow scan per query), kept
    while the rows are equal, written again when they change (same row count, other values) and
    replaced by the registered Arrow table when the buffer grows past MEM_TABLE_ROWS; every query
    returns the rows of its own buffer and the view's column types never change."""
    import mooncake_assets.engine.read.union as union

    client, expected = table
    rs, mem = client.tables["t"]
    files_rows = expected.slice(0, expected.num_rows - mem.num_rows)
    r = UnionReader(client, mode=mode)
    sql = "SELECT * FROM t"

    def check(buf: pa.Table) -> None:
        client.tables["t"] = (rs, buf)
        got = r.query(sql, lsn="0/10")
        assert _sorted(got) == _sorted(pa.concat_tables([files_rows, buf]))

    check(mem)
    types = r.con.execute("DESCRIBE t").fetchall()
    assert "ARROW_SCAN" not in r.con.execute("EXPLAIN SELECT sum(val) FROM __mc_memt_t").fetchall()[0][1]
    held = r._mem_tables["t"]
    check(_rows(np.arange(20000, 20500), 9))  # equal rows, another Arrow object: the table stays
    assert r._mem_tables["t"] is held
    check(_rows(np.arange(20000, 20500), 8))  # same count, other values: written again
    assert r._mem_tables["t"] is not held
    assert r.source_types("t") == {}
    monkeypatch.setattr(union, "MEM_TABLE_ROWS", 100)
    check(mem)  # past the limit: the Arrow table, and the temp table goes
    assert "t" not in r._mem_tables
    assert not r.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '__mc_memt_t'").fetchone()[0]
    assert r.con.execute("DESCRIBE t").fetchall() == types
    check(mem.slice(0, 0))
    check(mem.slice(0, 50))
    assert r.con.execute("DESCRIBE t").fetchall() == types


def test_arrow_mode_holds_the_live_rows_of_files_with_deletes_until_a_vector_changes(table, monkeypatch):
    """A whole-table query (the arrow way) of a long-lived reader reads the files with deletes with
    PyArrow once: while their deletion vectors and the columns are unchanged, later queries scan a
    DuckDB temp table of their live rows (no PyArrow read, no Arrow scan); a changed vector reads them
    again; past MEM_TABLE_ROWS live rows they are a registered Arrow table, the same object again
    while unchanged; with no file with deletes left the temp table goes, unless the whole table has at
    most MEM_TABLE_ROWS live rows (then every file is held). An unchanged empty buffer keeps its
    registration. Every query equals the expected rows."""
    import mooncake_assets.engine.read.union as union

    client, expected = table
    rs, mem = client.tables["t"]
    reads: list[int] = []
    real = union._read_masked
    monkeypatch.setattr(union, "_read_masked", lambda files, cols, cache: reads.append(1) or real(files, cols, cache))
    r = UnionReader(client, mode="arrow")
    sql = "SELECT * FROM t"

    def check(want: pa.Table) -> None:
        assert _sorted(r.query(sql, lsn="0/10")) == _sorted(want)

    check(expected)
    assert len(reads) == 1 and "t" in r._dirty_tables
    types = r.con.execute("DESCRIBE t").fetchall()
    for _ in range(3):
        check(expected)
    assert len(reads) == 1  # unchanged: nothing read again
    assert "ARROW_SCAN" not in r.con.execute("EXPLAIN SELECT sum(val) FROM __mc_dirtyt_t").fetchall()[0][1]

    f = next(f for f in rs["files"] if f["name"] == "random.parquet")  # one more delete in one file
    old = set(deleted_positions(f["deleted"]).tolist())
    extra = next(p for p in range(5000) if p not in old)
    f["deleted"] = _dv(sorted(old | {extra}))
    gone = expected.filter(pc.not_equal(expected["id"], 3000 + extra))
    check(gone)
    assert len(reads) == 2 and r.con.execute("DESCRIBE t").fetchall() == types

    monkeypatch.setattr(union, "MEM_TABLE_ROWS", 100)  # too many live rows for a temp table: Arrow
    f["deleted"] = _dv(sorted(old))
    check(expected)
    assert "t" not in r._dirty_tables and len(reads) == 3
    held = r._registered["__mc_dirty_t"]
    check(expected)
    assert r._registered["__mc_dirty_t"] is held and len(reads) == 3  # the same object, not read again
    assert not r.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = '__mc_dirtyt_t'").fetchone()[0]

    empty = mem.slice(0, 0)
    client.tables["t"] = (rs, empty)
    check(expected.slice(0, expected.num_rows - mem.num_rows))
    kept = r._registered["__mc_mem_t"]
    client.tables["t"] = (rs, mem.slice(0, 0))  # another empty object of the same schema
    check(expected.slice(0, expected.num_rows - mem.num_rows))
    assert r._registered["__mc_mem_t"] is kept

    clean = [g for g in rs["files"] if g["deleted"] is None]
    client.tables["t"] = (dict(rs, files=clean), mem)
    check(pa.concat_tables([_rows(np.arange(0, 3000), 0), mem]))  # 3000 rows, no deletes: read_parquet
    assert "t" not in r._dirty_tables and "__mc_dirty_t" not in r._registered
    assert "read_parquet" in r._views["t"]
    monkeypatch.setattr(union, "MEM_TABLE_ROWS", 65_536)  # a small table: all its files held as one table
    check(pa.concat_tables([_rows(np.arange(0, 3000), 0), mem]))
    assert [k[0] for k in r._dirty_tables["t"][1]] == [clean[0]["path"]] and "read_parquet" not in r._views["t"]


def test_files_with_deletes_are_read_side_by_side_only_from_an_object_store():
    """Local files are decoded one after the other by Arrow's own threads; several object-store files
    holding PARALLEL_ROWS together are read side by side (the network wait dominates)."""
    from mooncake_assets.engine.read.union import PARALLEL_ROWS, _side_by_side
    from mooncake_assets.engine.table.read_state import FileState

    half = PARALLEL_ROWS // 2
    assert not _side_by_side([FileState(f"f{i}", f"/w/f{i}.parquet", half) for i in range(4)])
    assert not _side_by_side([FileState(f"f{i}", f"file:///w/f{i}.parquet", half) for i in range(4)])
    assert _side_by_side([FileState(f"f{i}", f"s3://b/w/f{i}.parquet", half) for i in range(2)])
    assert _side_by_side([FileState("a", "/w/a.parquet", half), FileState("b", "gs://b/w/b.parquet", half)])
    assert not _side_by_side([FileState("f", "s3://b/w/f.parquet", 4 * PARALLEL_ROWS)])  # one file
    assert not _side_by_side([FileState(f"f{i}", f"s3://b/w/f{i}.parquet", 10) for i in range(3)])  # few rows


@pytest.mark.parametrize("side_by_side", [False, True], ids=["one_by_one", "side_by_side"])
def test_arrow_mode_past_the_held_size_reads_files_and_drops_their_deleted_rows(tmp_path, monkeypatch, side_by_side):
    """More live rows than MEM_TABLE_ROWS in files with deletes, over PARALLEL_ROWS in all: the arrow
    way reads the files with PyArrow — one after the other (local files), or side by side (as
    object-store files are) — and applies each one's keep mask
    (random deletes, a fully deleted row group, a file whose every row is deleted, a clean file). A
    reader that holds no rows reads them again in every query; every query equals the expected rows,
    also a statement that scans the view twice."""
    import mooncake_assets.engine.read.union as union

    monkeypatch.setattr(union, "_side_by_side", lambda files: side_by_side)

    rng = np.random.default_rng(11)
    n, files, expected = 90_000, [], []
    layout = {
        "random": sorted(rng.choice(n, n // 50, replace=False).tolist()),
        "groups": list(range(10_000, 30_000)) + [5, 40_000, 89_999],
        "gone": list(range(n)),
        "clean": [],
    }
    for k, (name, dels) in enumerate(layout.items()):
        t = pa.table(
            {"id": pa.array(np.arange(k * n, (k + 1) * n), pa.int64()), "val": pa.array(rng.integers(0, 1000, n))}
        )
        path = tmp_path / f"{name}.parquet"
        pq.write_table(t, path, row_group_size=10_000)
        files.append({"name": path.name, "path": str(path), "rows": n, "deleted": _dv(dels)})
        keep = np.ones(n, bool)
        keep[dels] = False
        expected.append(t.filter(pa.array(keep)))
    mem = pa.table({"id": pa.array([10**9], pa.int64()), "val": pa.array([7])})
    expected.append(mem)
    want = pa.concat_tables(expected)
    client = FakeClient()
    client.tables["t"] = ({"table": "t", "lsn": "0/10", "files": files, "schema": ["id", "val"]}, mem)
    assert sum(len(d) and n - len(d) for d in layout.values()) > union.MEM_TABLE_ROWS
    assert 4 * n >= union.PARALLEL_ROWS
    r = UnionReader(client, mode="arrow", hold_rows=False)
    for _ in range(2):
        got = r.query("SELECT id, val FROM t", lsn="0/10")
        assert got.num_rows == want.num_rows
        assert sorted(got["id"].to_pylist()) == sorted(want["id"].to_pylist())
        assert pc.sum(got["val"]).as_py() == pc.sum(want["val"]).as_py()
    assert "__mc_dirty_t" in r._registered  # the registered Arrow branch, not a held DuckDB table
    twice = r.query(
        "SELECT count(*) AS n, sum(val) AS s FROM (SELECT val FROM t UNION ALL SELECT val FROM t)", lsn="0/10"
    )
    assert twice.to_pylist() == [{"n": 2 * want.num_rows, "s": 2 * pc.sum(want["val"]).as_py()}]
