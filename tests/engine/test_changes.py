"""The change feed in-process (engine/table/changes.py), without Postgres: a MirrorTable without an
Iceberg table serves the buffer window; random interleavings of inserts, updates (key changes
too), deletes, TRUNCATE and flushes; for every pair of LSNs the feed can serve, the read at the
first with the feed applied is the read at the second. Persisted history is covered against the real
service in tests/integration/test_changes.py."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.cdc.txn import Change
from mooncake_assets.engine.table.change_keys import run_plan
from mooncake_assets.engine.table.changes import HistoryError, cancel_pairs, plan_changes, read_positions

from .test_apply import COLS, OID, commit, delete, insert, make_table, read, update

META = ("_change", "_commit_lsn")


def _apply(before: list[tuple], feed: pa.Table) -> list[tuple]:
    out = Counter(before)
    for r in feed.to_pylist():
        row = tuple(r[c] for c in COLS)
        if r["_change"] == "delete":
            assert out[row] > 0, row
            out[row] -= 1
        else:
            out[row] += 1
    return sorted((+out).elements(), key=repr)


def _feed(t, a, b) -> pa.Table:
    return plan_changes(t, a, b).execute()


def test_buffer_feed_is_exact_and_pairs_updates_by_key(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2), insert(3, "c", 3))
    t.flush()  # rows 1..3 now in a staged file; the buffer window starts past them
    lo = t.flushed_lsn
    commit(t, 20, update((2, "B", 2), (2,), "K"), insert(4, "d", 4))
    commit(t, 30, delete((3,)), insert(5, "e", 5))
    commit(t, 40, delete((5,)))  # inserted and deleted inside [lo, 41): in no read, not in the feed
    feed = _feed(t, lo, 41)
    rows = [(r["id"], r["v"], r["_change"], r["_commit_lsn"]) for r in feed.to_pylist()]
    assert rows == [
        (2, "b", "delete", "0/14"),
        (2, "B", "insert", "0/14"),
        (3, "c", "delete", "0/1E"),
        (4, "d", "insert", "0/14"),
    ]
    assert _apply(read(t, lo), feed) == read(t, 41)
    assert _feed(t, 21, 21).num_rows == 0
    assert [(r["id"], r["_change"]) for r in _feed(t, 21, 31).to_pylist()] == [(3, "delete"), (5, "insert")]


def test_bad_ranges(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1))
    t.flush()
    commit(t, 20, insert(2, "b", 2))
    with pytest.raises(ValueError, match="is after"):
        plan_changes(t, 21, 12)
    with pytest.raises(ValueError, match="not applied yet"):
        plan_changes(t, 12, 10_000)
    with pytest.raises(HistoryError, match=f"oldest available LSN is 0/{t.flushed_lsn:X}") as e:
        plan_changes(t, 1, 21)
    assert e.value.oldest == t.flushed_lsn and "\n" not in str(e.value)


def test_cancel_pairs_is_a_multiset_difference():
    s = pa.schema([("a", pa.string()), ("f", pa.float64())])
    ins = pa.table({"a": ["x", "x", None, "y"], "f": [float("nan"), float("nan"), 1.0, 2.0]}, schema=s)
    dels = pa.table({"a": ["x", None, None, "z"], "f": [float("nan"), 1.0, 1.0, 2.0]}, schema=s)
    ki, kd = cancel_pairs(ins, dels)
    assert ki.tolist() == [False, True, False, True]  # one NaN 'x' and the NULL row cancel once each
    assert kd.tolist() == [False, False, True, True]


def test_cancel_pairs_by_key_is_the_same_multiset_difference(monkeypatch):
    """With the key given, unique non-null keys pair rows by key (no row hashing); NaN = NaN, NULL = NULL,
    -0.0 != 0.0, a nested column compared by repr, as the whole-row path does."""
    from mooncake_assets.engine.table import change_rows

    s = pa.schema([("k", pa.int64()), ("a", pa.string()), ("f", pa.float64()), ("l", pa.list_(pa.int32()))])
    ins = pa.table(
        {
            "k": [1, 2, 3, 4, 5, 6],
            "a": ["x", "x", None, "y", "z", "w"],
            "f": [float("nan"), 0.0, 1.0, 2.0, None, 1.0],
            "l": [[1], [2], None, [4], [5], [6, 7]],
        },
        schema=s,
    )
    dels = pa.table(
        {
            "k": [6, 5, 4, 3, 2, 1, 9],
            "a": ["w", "z", "y", None, "x", "x", "q"],
            "f": [1.0, None, 2.5, 1.0, -0.0, float("nan"), 1.0],
            "l": [[6, 8], [5], [4], None, [2], [1], None],
        },
        schema=s,
    )
    by_hash = cancel_pairs(ins, dels)
    monkeypatch.setattr(change_rows, "_row_hashes", lambda t: pytest.fail("hashed rows with a unique key"))
    ki, kd = cancel_pairs(ins, dels, ["k"])
    assert ki.tolist() == [False, True, False, True, False, True]  # 1 (NaN), 3 (NULLs), 5 cancel; 2: -0.0
    assert kd.tolist() == [True, False, True, False, True, False, True]  # 6: [6, 8] != [6, 7]
    assert (ki.tolist(), kd.tolist()) == (by_hash[0].tolist(), by_hash[1].tolist())


ROWS = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", None]), st.sampled_from([0.0, -0.0, float("nan"), None])),
    max_size=12,
)


@pytest.mark.parametrize("key", [["k"], ["k", "a"]])
@settings(max_examples=150, deadline=None)
@given(ins=ROWS, dels=ROWS)
def test_cancel_pairs_by_key_equals_whole_row_matching(key, ins, dels):
    """Any rows (repeated or null keys too: those fall back to whole-row hashes), a key of one column
    (index_in) or two (join): by key = by hash."""
    s = pa.schema([("k", pa.int64()), ("a", pa.string()), ("f", pa.float64())])

    def tab(rows):
        return pa.table({n: [r[i] for r in rows] for i, n in enumerate(s.names)}, schema=s)

    def kept(ki, kd, a, b):
        return Counter(repr(r) for r, k in zip(a.to_pylist(), ki) if k), Counter(
            repr(r) for r, k in zip(b.to_pylist(), kd) if k
        )

    i, d = tab(ins), tab(dels)
    assert kept(*cancel_pairs(i, d, key), i, d) == kept(*cancel_pairs(i, d), i, d)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 12)),
        st.tuples(st.just("update"), st.integers(0, 12)),
        st.tuples(st.just("rekey"), st.integers(0, 12)),
        st.tuples(st.just("delete"), st.integers(0, 12)),
        st.tuples(st.sampled_from(["flush", "begin_flush", "finish_flush"]), st.just(0)),
        st.tuples(st.just("truncate"), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


def split_flush(t, op: str, frozen):
    """``begin_flush``: the first step of a flush outside the lock (returns what it took);
    ``finish_flush``: the write and the swap of the one begun (a plain flush when the buffer changed
    meanwhile); anything else: ``frozen`` unchanged. The ops in between are what the replication thread
    applies while the persist's Parquet file is written."""
    if op == "begin_flush" and frozen is None:
        return t.begin_flush()
    if op == "finish_flush" and frozen is not None:
        if t.finish_flush(frozen, t.write_frozen(frozen)) is None:
            t.flush()
        return None
    return frozen


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_random_interleavings_apply_to_the_next_read(tmp_path_factory, ops):
    t = make_table(tmp_path_factory.mktemp("chg"))
    live: dict[int, tuple] = {}
    lsn = 100
    marks = []  # LSNs with the read the table must give there
    frozen = None
    for i, (op, k) in enumerate(ops + [("finish_flush", 0)]):
        lsn += 10
        if op in ("begin_flush", "finish_flush"):
            frozen = split_flush(t, op, frozen)
            continue
        if op == "flush":
            t.flush()
            continue
        if op == "insert" and k not in live:
            live[k] = (k, f"v{i}", i)
            commit(t, lsn, insert(*live[k]))
        elif op == "update" and k in live:
            live[k] = (k, f"u{i}", i)
            commit(t, lsn, update(live[k], (k,), "K"))
        elif op == "rekey" and k in live and k + 100 not in live:
            live[k + 100] = (k + 100, live[k][1], i)
            del live[k]
            commit(t, lsn, update(live[k + 100], (k,), "K"))
        elif op == "delete" and k in live:
            del live[k]
            commit(t, lsn, delete((k,)))
        elif op == "truncate" and live:
            live.clear()
            commit(t, lsn, Change("truncate", OID))
        else:
            continue
        marks.append((lsn + 1, sorted(live.values(), key=repr)))
    served = [(m, rows) for m, rows in marks if m >= t.flushed_lsn]
    for ia, (a, ra) in enumerate(served):
        assert read(t, a) == ra
        for b, rb in served[ia:]:
            feed = _feed(t, a, b)
            assert _apply(ra, feed) == rb, (a, b)
            assert feed.column("_commit_lsn").null_count == 0  # the buffer window is exact


# ------------------------------------------------------------------ persisted history, in-process
def iceberg_mirror(tmp, schema, columns: list[str], oid: int = OID):
    """A MirrorTable ``t`` of ``schema`` over a SQL catalog and file warehouse under ``tmp`` (loaded when
    it exists there: a restart), its relation ``oid`` mapped with ``columns``."""
    from mooncake_assets.engine.iceberg import IcebergMirrorTable, make_catalog
    from mooncake_assets.engine.table.mirror import MirrorTable

    catalog = make_catalog(f"sqlite:///{tmp}/catalog.db", f"file://{tmp}/warehouse")
    catalog.create_namespace_if_not_exists("mooncake")
    try:
        ice = IcebergMirrorTable.load(catalog, "mooncake.t")
    except Exception:
        ice = IcebergMirrorTable.create(catalog, "mooncake.t", schema.arrow_schema())
    t = MirrorTable("t", "public.t", schema, ice, tmp / "state")
    t.column_map(oid, columns)
    return t


def _iceberg_table(tmp, keyed: bool = True):
    from .test_apply import _schema

    return iceberg_mirror(tmp, _schema(keyed, "d" if keyed else "f"), COLS)


PERSISTED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(0, 10)),
        st.tuples(st.just("update"), st.integers(0, 10)),
        st.tuples(st.just("delete"), st.integers(0, 10)),
        st.tuples(
            st.sampled_from(["flush", "begin_flush", "finish_flush", "persist", "compact", "merge", "restart"]),
            st.just(0),
        ),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=PERSISTED_OPS, keyed=st.booleans(), full=st.booleans())
def test_random_interleavings_across_persist_compaction_restart(tmp_path_factory, ops, keyed, full):
    """Snapshots are cuts (their rows carry no commit LSN), the buffer window is exact; flushes,
    persists, compactions, index merges and restarts in between; every LSN that is neither is refused.
    Keyed: the keys feed equals the full feed's keys, with deleted keys from the delete logs and
    without them (read from the data files). ``full``: updates and deletes carry the whole old row
    (REPLICA IDENTITY FULL; key-less tables always do), and for a keyed table the full-row feed with
    deleted rows from the delete logs equals the one reading them from the data files."""
    from mooncake_assets.engine.compaction import compact, merge_index
    from mooncake_assets.engine.table.changes import NotACutError, snapshot_cuts

    tmp = tmp_path_factory.mktemp("chgp")
    t = _iceberg_table(tmp, keyed)
    t.persist()
    live: dict[int, tuple] = {}
    log: list[tuple[int, Change]] = []  # every commit, replayed after a restart from the flush LSN
    marks = [(t.flush_lsn, [])]
    for k in range(10):  # a persisted file for updates and deletes to hit (delete logs, keyed)
        live[k] = (k, "s", k)
        commit(t, 50 + k, insert(*live[k]))
        log.append((50 + k, insert(*live[k])))
    t.persist()
    marks.append((t.flush_lsn, sorted(live.values(), key=repr)))
    lsn = 100
    frozen = None
    for i, (op, k) in enumerate(ops + [("finish_flush", 0)]):
        lsn += 10
        ch = None
        if op in ("begin_flush", "finish_flush"):
            frozen = split_flush(t, op, frozen)
        elif op == "insert" and k not in live:
            live[k] = (k, f"v{i}", i)
            ch = insert(*live[k])
        elif op == "update" and k in live:
            old = live[k]
            live[k] = (k, f"u{i}", i)
            ch = update(live[k], (k,), "K") if keyed and not full else update(live[k], old, "O")
        elif op == "delete" and k in live:
            ch = delete((k,)) if keyed and not full else delete(live[k], "O")
            del live[k]
        elif op == "flush":
            t.flush()
        elif op == "persist":
            t.persist()
        elif op == "compact":
            compact(t, full=True, expire=False)
        elif op == "merge":
            merge_index(t, full=True)
        elif op == "restart":
            frozen = None  # (the flush begun dies with the process)
            t = _iceberg_table(tmp, keyed)
            t.restore()
            for at, c in log:
                if at >= t.flush_lsn:
                    commit(t, at, c)
        if ch is not None:
            commit(t, lsn, ch)
            log.append((lsn, ch))
            marks.append((lsn + 1, sorted(live.values(), key=repr)))
    cuts = {c.lsn for c in snapshot_cuts(t)}
    valid = [(m, rows) for m, rows in marks if m in cuts or t.flushed_lsn <= m <= t.applied_lsn]
    assert valid
    for ia, (a, ra) in enumerate(valid):
        for b, rb in valid[ia:]:
            feed = _feed(t, a, b)
            assert _apply(ra, feed) == rb, (a, b)
            if a >= t.flushed_lsn:
                assert feed.column("_commit_lsn").null_count == 0
            if keyed:
                _same_as_keys_feed(feed, _keys_both_ways(t, a, b))
            if keyed and full:
                _rows_without_logs_same(t, a, b, feed)
    for m, _ in marks:
        if m not in cuts and m < t.flushed_lsn and m > min(cuts):
            with pytest.raises(NotACutError, match="is not a cut"):
                plan_changes(t, m, t.applied_lsn)


_KEY_SOURCES: Counter[str] = Counter()  # over the run: deleted keys taken from delete logs / read from files
_ROW_SOURCES: Counter[str] = Counter()  # the same for whole deleted rows (REPLICA IDENTITY FULL)


def _rows_without_logs_same(t, a: int, b: int, feed: pa.Table) -> None:
    """The full-row feed ``feed`` of ``[a, b)`` equals the one reading every deleted row from the data files."""
    plan = plan_changes(t, a, b)
    assert plan.execute().equals(feed)
    bare = plan_changes(t, a, b)
    bare.logs, bare.mem_log = [], None
    assert bare.execute().equals(feed), (a, b, plan.row_sources)
    assert bare.row_sources["logged"] == 0
    _ROW_SOURCES.update(plan.row_sources)


def keys_with_and_without_logs(t, a: int, b: int):
    """``(plan, with_logs, without)``: the keys feed of ``[a, b)`` with deleted keys from the snapshots'
    delete logs, and the one that reads every deleted key from the data files (no logs: the fallback),
    checked to take no key from a log."""
    plan = plan_changes(t, a, b, "keys")
    with_logs = run_plan(plan)
    bare = plan_changes(t, a, b, "keys")
    bare.logs, bare.mem_log = [], None
    without = run_plan(bare)
    assert bare.key_sources["logged"] == 0
    return plan, with_logs, without


def _keys_both_ways(t, a: int, b: int) -> pa.Table:
    """The keys feed of ``[a, b)`` with deleted keys from the snapshots' delete logs, checked equal to
    the one that reads every deleted key from the data files (no logs: the fallback)."""
    plan, with_logs, without = keys_with_and_without_logs(t, a, b)
    assert with_logs.to_pylist() == without.to_pylist(), (a, b, plan.key_sources)
    _KEY_SOURCES.update(plan.key_sources)
    return with_logs


def _same_as_keys_feed(feed: pa.Table, keys: pa.Table) -> None:
    """The keys feed has the full feed's inserts (rows, LSNs, order) and its deletes' keys and LSNs,
    with every other column of a delete null."""
    full, got = feed.to_pylist(), keys.to_pylist()
    assert [r for r in got if r["_change"] == "insert"] == [r for r in full if r["_change"] == "insert"]
    dels = [r for r in got if r["_change"] == "delete"]
    assert [(r["id"], r["_commit_lsn"]) for r in dels] == [
        (r["id"], r["_commit_lsn"]) for r in full if r["_change"] == "delete"
    ]
    assert all(r["v"] is None and r["n"] is None for r in dels)
    assert [r["id"] for r in got] == [r["id"] for r in full]  # by key, a key's delete before its insert


def test_keys_feed_of_the_buffer_window_and_a_keyless_table(tmp_path):
    t = make_table(tmp_path / "k")
    commit(t, 10, *(insert(i, f"a{i}", i) for i in range(1, 6)))
    t.flush()  # rows 1..5 in a staged file: their deletes are read back as keys from it
    lo = t.flushed_lsn
    commit(t, 20, update((2, "B", 2), (2,), "K"), insert(6, "f", 6), delete((3,)))
    commit(t, 30, delete((6,)), update((4, "D", 4), (4,), "K"))
    full = _feed(t, lo, 31)
    keys = run_plan(plan_changes(t, lo, 31, "keys"))
    _same_as_keys_feed(full, keys)
    assert [(r["id"], r["_change"]) for r in keys.to_pylist()] == [
        (2, "delete"),
        (2, "insert"),
        (3, "delete"),
        (4, "delete"),
        (4, "insert"),
    ]
    assert keys.schema.field("v").nullable and keys.schema.field("n").nullable
    kl = make_table(tmp_path / "kl", keyed=False)
    commit(kl, 10, insert(1, "a", 1))
    with pytest.raises(ValueError, match="table t has no primary key: deletes as keys need one") as e:
        plan_changes(kl, kl.flushed_lsn, 11, "keys")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="deletes must be one of rows, keys, not 'all'"):
        plan_changes(t, lo, 31, "all")


def test_read_positions_reads_the_rows_at_positions_across_row_groups(tmp_path):
    """Rows of several row groups (one holding none of the positions), in position order, equal a take
    over the whole file; every position, and none, too."""
    import pyarrow.parquet as pq
    from pyroaring import BitMap64

    t = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "v": pa.array([f"s{i}" * (i % 5) if i % 7 else None for i in range(1000)]),  # distinct, nulls
            "status": pa.array(["new", "paid", "gone"][i % 3] for i in range(1000)),  # low cardinality
            "b": pa.array([bytes([i % 256]) * (i % 3) for i in range(1000)], pa.binary()),
        }
    )
    path = tmp_path / "f.parquet"
    pq.write_table(t, path, row_group_size=128)
    pf = pq.ParquetFile(path)
    assert pf.num_row_groups == 8
    want = [0, 1, 127, 128, 300, 383, 640, 641, 999]  # row groups 0, 1, 2, 5, 7; none of 3, 4, 6
    for source in (path, str(path), pf, pa.memory_map(str(path))):  # a path, a stream, an open ParquetFile
        got = read_positions(source, BitMap64(want))
        assert got.schema == t.schema  # string columns read as dictionaries come back as strings
        assert got.to_pylist() == t.take(pa.array(want)).to_pylist()
        assert got.column("id").to_pylist() == want
        assert read_positions(source, BitMap64(range(1000))).to_pylist() == t.to_pylist()
        assert read_positions(source, BitMap64()).num_rows == 0
    only = pa.schema([pa.field("status", pa.string())])
    assert (
        read_positions(path, BitMap64(want), only).to_pylist() == t.select(["status"]).take(pa.array(want)).to_pylist()
    )


def _twenty_persisted_rows(tmp_path):
    """A keyed table with rows 0..19 persisted (an empty snapshot first); returns it and its flush LSN."""
    t = _iceberg_table(tmp_path)
    t.persist()
    for k in range(20):
        commit(t, 100 + k, insert(k, f"v{k}", k))
    t.persist()
    return t, t.flush_lsn


def test_keys_feed_takes_deleted_keys_from_the_delete_logs(tmp_path):
    """A persist that deletes rows of older files writes a delete log named by its snapshot alone; the
    keys feed over persisted history takes the deleted keys from it, across a restart; a snapshot
    without one (compaction) does not inherit it; a log that is gone falls back to the files."""
    import os

    from mooncake_assets.engine.compaction import compact
    from mooncake_assets.engine.iceberg import SUMMARY_DELETE_LOG

    t, a = _twenty_persisted_rows(tmp_path)
    commit(t, 200, delete((3,)))
    commit(t, 210, update((5, "u5", 50), (5,), "K"))
    commit(t, 220, insert(30, "v30", 30))
    commit(t, 230, delete((30,)))  # a buffered row: nothing to log
    t.persist()
    b = t.flush_lsn
    summary = t.iceberg.refresh().table.current_snapshot().summary.additional_properties
    log_loc = summary[SUMMARY_DELETE_LOG]
    t = _iceberg_table(tmp_path)  # a restart: the feed needs only the snapshots
    t.restore()
    plan = plan_changes(t, a, b, "keys")
    keys = run_plan(plan)
    assert plan.key_sources == {"logged": 2, "read": 0}
    assert [(r["id"], r["_change"]) for r in keys.to_pylist()] == [(3, "delete"), (5, "delete"), (5, "insert")]
    _same_as_keys_feed(_feed(t, a, b), keys)
    os.remove(log_loc.removeprefix("file://"))
    plan = plan_changes(t, a, b, "keys")
    assert run_plan(plan).to_pylist() == keys.to_pylist()
    assert plan.key_sources == {"logged": 0, "read": 2}
    commit(t, 300, insert(40, "v40", 40))
    t.persist()  # deletes nothing
    compact(t, full=True, expire=False)
    logs = [
        s.summary.additional_properties.get(SUMMARY_DELETE_LOG) for s in t.iceberg.refresh().table.metadata.snapshots
    ]
    assert [x for x in logs if x] == [log_loc]  # neither the next persist nor compaction carries it over


def test_delete_log_stops_at_its_budget_and_the_feed_reads_the_rest(tmp_path):
    """Past ``max_bytes`` a table's delete log keeps no more entries; the persist logs what it kept and
    the keys feed reads the other deleted keys from the data file: the same feed."""
    from mooncake_assets.engine.table.delete_log import DeleteLog

    t, a = _twenty_persisted_rows(tmp_path)
    t.delete_log = DeleteLog(t.key_names, max_bytes=250)  # three row-wise entries
    for k in range(6):
        commit(t, 200 + k, delete((k,)))
    assert len(t.delete_log) == 3 and t.delete_log.dropped == 3
    t.persist()
    assert len(t.delete_log) == 0
    keys = _keys_both_ways(t, a, t.flush_lsn)
    assert [r["id"] for r in keys.to_pylist()] == list(range(6))
