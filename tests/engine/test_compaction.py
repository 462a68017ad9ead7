"""engine/compaction without Postgres: policy, planner (universal compaction), rewriter and
its position map, the index rebuild through it, fault parsing."""

from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

from mooncake_assets.engine.compaction import (
    FileStats,
    MaintenancePolicy,
    RewriteInput,
    plan_compaction,
    policy_for,
    rewrite_files,
)
from mooncake_assets.engine.compaction.worker import compact_in_child
from mooncake_assets.engine.faults import faults
from mooncake_assets.engine.iceberg.lineage import FileLineage
from mooncake_assets.engine.index import FileIndex, IndexBlock, PositionMap, dead_file_maps, splitmix64

KiB = 1024
MiB = 1 << 20


# ------------------------------------------------------------------------------------------ policy


def test_policy_defaults_and_validation():
    p = MaintenancePolicy()
    assert p.target_file_bytes == 128 * MiB and p.index_max_blocks == 16 and p.index_max_blocks_per_merge == 32
    assert p.index_merge.max_blocks == 16
    with pytest.raises(ValueError, match="delete_ratio_percent"):
        MaintenancePolicy(delete_ratio_percent=120)
    with pytest.raises(ValueError, match="min_files_per_run"):
        MaintenancePolicy(min_files_per_run=1)
    with pytest.raises(ValueError, match="unknown setting"):
        MaintenancePolicy.from_dict({"target_file_size": 1})
    with pytest.raises(ValueError, match="target_file_bytes must be a int"):
        MaintenancePolicy.from_dict({"target_file_bytes": "big"})
    assert MaintenancePolicy.from_dict({"target_file_bytes": "2048"}).target_file_bytes == 2048
    assert p.worker_nice == 10
    with pytest.raises(ValueError, match="worker_nice must be in 0–19"):
        MaintenancePolicy(worker_nice=20)


def test_policy_per_table_precedence():
    class S:
        extra = {
            "maintenance": {"delete_ratio_percent": 10, "file_count_trigger": 3},
            "maintenance_tables": {"orders": {"delete_ratio_percent": 50}},
        }

    assert policy_for(S(), "orders").delete_ratio_percent == 50
    assert policy_for(S(), "orders").file_count_trigger == 3
    assert policy_for(S(), "other").delete_ratio_percent == 10


# ------------------------------------------------------------------------------------------ planner


def _f(name, kib, rows=1000, deleted=0):
    return FileStats(name, rows, deleted, kib * KiB)


def test_plan_delete_ratio_picks_any_size_highest_first():
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, delete_ratio_percent=30)
    files = [_f("big", 4096, deleted=300), _f("a", 512, deleted=500), _f("b", 512, deleted=100)]
    plan = plan_compaction(files, pol)
    assert plan.files == ["a", "big"]
    assert "delete ratio 50.0%" in plan.reasons["a"][0]


def test_plan_below_trigger_picks_nothing_and_says_why():
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=5)
    plan = plan_compaction([_f(f"f{i}", 10) for i in range(4)], pol)
    assert not plan and any("< trigger 5" in c for c in plan.checks)


def test_plan_size_amplification_rewrites_all_small_files():
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=3, max_size_amplification_percent=200)
    files = [_f("base", 300), _f("x", 250), _f("y", 250), _f("z", 250), _f("large", 2048)]
    plan = plan_compaction(files, pol)
    assert sorted(plan.files) == ["base", "x", "y", "z"]  # 750 KiB over 300 KiB = 250% > 200%
    assert "size amplification 250%" in plan.reasons["base"][0]


def test_plan_size_ratio_run_from_the_smallest():
    # amplification 100+100+150+400 over 900 = 83%: no. Ratio 1%: seed a,b (200); c 150 ≤ 202 → 350;
    # d 400 > 353.5: stop
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=5, size_ratio_percent=1)
    files = [_f("a", 100), _f("b", 100), _f("c", 150), _f("d", 400), _f("e", 900)]
    plan = plan_compaction(files, pol)
    assert plan.files == ["a", "b", "c"] and "size ratio" in plan.reasons["a"][0]
    pol = pol.merged({"size_ratio_percent": 20})  # d 400 ≤ 420 → 750; e 900 ≤ 900 → everything
    assert plan_compaction(files, pol).files == ["a", "b", "c", "d", "e"]


def test_plan_file_count_forces_the_smallest():
    # sizes double, so no ratio run and amplification 1+2+4+8+16+32 over 64 < 200%
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=4, size_ratio_percent=1)
    files = [_f(f"f{k}", 2**k) for k in range(7)]
    plan = plan_compaction(files, pol)
    # 7 small files > trigger 4: seeded with the 4 smallest (7 − 4 + 1); f4 not by the ratio (16 > 1.01 × 15)
    assert plan.files == ["f0", "f1", "f2", "f3"]
    assert "file count" in plan.reasons["f0"][0]


def test_plan_caps_full_and_single_clean_file():
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=2, max_files_per_run=3)
    files = [_f(f"f{i}", 10) for i in range(6)]
    assert len(plan_compaction(files, pol).files) == 3
    full = plan_compaction(files, pol, full=True)
    assert len(full.files) == 6 and full.reasons["f0"] == ["full compaction"]
    assert not plan_compaction([_f("only", 10)], pol, full=True)
    assert plan_compaction([_f("only", 10, deleted=1)], pol, full=True).files == ["only"]


def test_plan_fixpoint_bounds_small_files():
    """Repeated planning + 'rewriting' (merging the picked files into one of their total live size)
    ends with fewer than file_count_trigger small files and no file at the delete-ratio threshold."""
    rng = np.random.default_rng(3)
    pol = MaintenancePolicy(target_file_bytes=1 * MiB, file_count_trigger=5, delete_ratio_percent=25)
    files = [FileStats(f"f{i}", 1000, int(rng.integers(0, 600)), int(rng.integers(1, 400)) * KiB) for i in range(60)]
    n = 0
    while True:
        plan = plan_compaction(files, pol)
        if not plan:
            break
        picked = [f for f in files if f.name in set(plan.files)]
        live = sum(f.live_bytes for f in picked)
        rows = sum(f.live_rows for f in picked)
        files = [f for f in files if f.name not in set(plan.files)]
        while live > 0:  # outputs cut at the target
            part = min(live, pol.target_file_bytes)
            files.append(FileStats(f"n{n}", max(1, rows * part // max(live, 1)), 0, part))
            n += 1
            live -= part
        assert n < 500
    small = [f for f in files if f.live_bytes < pol.target_file_bytes]
    assert len(small) < pol.file_count_trigger
    assert all(f.delete_ratio_percent < 25 for f in files)


# ------------------------------------------------------------------------------------------ rewriter

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string())])


def _write(path, ids):
    pq.write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "v": [f"value-{i:08d}" * 3 for i in ids]}, schema=SCHEMA),
        path,
        compression="zstd",
    )
    return path.stat().st_size


def _children() -> set[int]:
    """Pids of this process's multiprocessing workers (Linux ``/proc/<pid>/task/<tid>/children``,
    proc(5); spawned workers run ``spawn_main``, multiprocessing's resource tracker does not)."""
    out: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            for p in f.read().split():
                with contextlib.suppress(OSError), open(f"/proc/{p}/cmdline", "rb") as c:
                    if b"spawn_main" in c.read():
                        out.add(int(p))
    return out


@pytest.mark.parametrize("child", [False, True])
def test_rewrite_applies_dvs_and_maps_every_row(tmp_path, child):
    """In this process and in the child process of lower priority (``maintenance: auto``), the same
    files, position map and row values come out."""
    a_ids, b_ids = list(range(0, 5000)), list(range(10_000, 13_000))
    sa, sb = _write(tmp_path / "a.parquet", a_ids), _write(tmp_path / "b.parquet", b_ids)
    del_a = BitMap64(range(0, 5000, 3))
    del_b = BitMap64(range(3000))  # every row: the file contributes nothing
    inputs = [
        RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 5000, del_a, sa),
        RewriteInput("b.parquet", str(tmp_path / "b.parquet"), 3000, del_b, sb),
    ]
    if child:
        before = _children()
        res = compact_in_child(inputs, tmp_path / "out", SCHEMA, sa // 4, nice=7).rewrite
        kids = _children() - before  # the child stays for the next compaction
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert [os.getpriority(os.PRIO_PROCESS, k) for k in kids] == [min(19, base + 7)], kids
        assert os.getpriority(os.PRIO_PROCESS, 0) == base
        # its own session, whose autogroup has the same nice value (sched(7)): where the kernel groups
        # by session, the child's CPU then does not come out of the service's (and Postgres's) share
        (kid,) = kids
        assert os.getsid(kid) == kid != os.getsid(0)
        if os.path.exists(f"/proc/{kid}/autogroup"):
            with open(f"/proc/{kid}/autogroup") as f:
                assert f.read().split()[-2:] == ["nice", "7"]
    else:
        res = rewrite_files(inputs, tmp_path / "out", SCHEMA, target_bytes=sa // 4)
    assert res.rows_in == 8000 and res.rows_dropped == len(del_a) + 3000 and res.rows_out == 5000 - len(del_a)
    assert len(res.outputs) >= 2  # cut at the target: every output but the last reaches it
    assert all(o.size_bytes >= sa // 4 for o in res.outputs[:-1]), [o.size_bytes for o in res.outputs]
    out = [pq.read_table(o.path) for o in res.outputs]
    assert [t.num_rows for t in out] == [o.rows for o in res.outputs]
    pm = res.position_map
    fi, fr = pm.map_rows("a.parquet", np.arange(5000))
    for old in range(5000):
        if old in del_a:
            assert fi[old] == -1
        else:
            assert out[fi[old]].column("id")[int(fr[old])].as_py() == a_ids[old]
    assert (pm.map_rows("b.parquet", np.arange(3000))[0] == -1).all()
    assert pq.ParquetFile(res.outputs[0].path).metadata.row_group(0).column(0).compression == "ZSTD"


def test_a_rewrite_in_the_child_hands_back_its_error_and_a_killed_child_is_replaced(tmp_path):
    """A missing input fails in the child, the error comes back as itself and no output is left; a
    child killed (as the OOM killer would) fails its compaction with BrokenProcessPool, and the next
    rewrite runs in a new child."""
    from concurrent.futures.process import BrokenProcessPool

    size = _write(tmp_path / "a.parquet", list(range(100)))
    good = [RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 100, BitMap64(), size)]
    gone = [RewriteInput("gone.parquet", str(tmp_path / "gone.parquet"), 100, BitMap64(), size)]
    with pytest.raises(FileNotFoundError, match="gone.parquet"):
        compact_in_child(good + gone, tmp_path / "out", SCHEMA, MiB, nice=3)
    assert not list((tmp_path / "out").glob("*"))  # the partial output deleted by the child
    before = _children()
    assert compact_in_child(good, tmp_path / "out", SCHEMA, MiB, nice=3).rewrite.rows_out == 100
    (kid,) = [k for k in _children() if os.getpriority(os.PRIO_PROCESS, k) == os.getpriority(os.PRIO_PROCESS, 0) + 3]
    assert kid in before  # the same child served both
    hold = tmp_path / "big.parquet"
    big = _write(hold, list(range(300_000)))
    many = [RewriteInput(f"b{i}.parquet", str(hold), 300_000, BitMap64(), big) for i in range(40)]
    killer = threading.Timer(0.5, lambda: os.kill(kid, 9))
    killer.start()
    with pytest.raises(BrokenProcessPool):
        compact_in_child(many, tmp_path / "out2", SCHEMA, 1 << 40, nice=3)
    killer.join()
    assert compact_in_child(good, tmp_path / "out3", SCHEMA, MiB, nice=3).rewrite.rows_out == 100


def test_an_idle_rewrite_child_exits_and_a_new_one_serves_the_next_rewrite(tmp_path, monkeypatch):
    """The child gives its memory back after IDLE_EXIT_S without work; the next rewrite starts another."""
    from mooncake_assets.engine import workers

    monkeypatch.setattr(workers, "IDLE_EXIT_S", 0.2)
    size = _write(tmp_path / "a.parquet", list(range(100)))
    good = [RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 100, BitMap64(), size)]
    before = _children()
    assert compact_in_child(good, tmp_path / "o1", SCHEMA, MiB, nice=4).rewrite.rows_out == 100
    (kid,) = _children() - before
    for _ in range(200):  # a hang guard (20 s), not a speed claim
        if kid not in _children():
            break
        time.sleep(0.1)
    assert kid not in _children()
    assert compact_in_child(good, tmp_path / "o2", SCHEMA, MiB, nice=4).rewrite.rows_out == 100
    assert len(_children() - before) == 1 and kid not in _children()


def test_the_rewrite_child_of_a_killed_service_ends_itself(tmp_path):
    """A service killed outright (SIGKILL) cannot stop its rewrite child; the child notices it was
    reparented and exits instead of waiting for work forever (the chaos run's kills left them)."""
    import signal
    import subprocess
    import sys

    size = _write(tmp_path / "a.parquet", list(range(100)))
    script = f"""
import os, sys, time
import pyarrow as pa
from pyroaring import BitMap64
from mooncake_assets.engine.compaction import RewriteInput
from mooncake_assets.engine.compaction.worker import compact_in_child
schema = pa.schema([pa.field("id", pa.int64(), metadata={{b"PARQUET:field_id": b"1"}}),
                    pa.field("v", pa.string(), metadata={{b"PARQUET:field_id": b"2"}})])
inp = [RewriteInput("a.parquet", {str(tmp_path / "a.parquet")!r}, 100, BitMap64(), {size})]
compact_in_child(inp, {str(tmp_path / "out")!r}, schema, 1 << 20, nice=2)
print("ready", flush=True)
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            kids = [int(p) for p in f.read().split()]
        workers = []
        for k in kids:
            with contextlib.suppress(OSError), open(f"/proc/{k}/cmdline", "rb") as c:
                if b"spawn_main" in c.read():
                    workers.append(k)
        assert len(workers) == 1, kids
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    for _ in range(200):  # a hang guard (20 s), not a speed claim
        if not os.path.exists(f"/proc/{workers[0]}"):
            break
        with contextlib.suppress(OSError), open(f"/proc/{workers[0]}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break  # exited (a zombie until init reaps it)
        time.sleep(0.1)
    else:
        os.kill(workers[0], signal.SIGKILL)
        raise AssertionError("the rewrite child outlived its killed parent")


def test_rewrite_outputs_are_not_small_again(tmp_path):
    """Outputs land at the target (not far above), so the planner does not pick a fresh compaction's
    outputs again: compaction reaches a fixpoint."""
    paths = []
    for i in range(12):
        ids = list(range(i * 20_000, (i + 1) * 20_000))
        size = _write(tmp_path / f"in{i}.parquet", ids)
        paths.append(RewriteInput(f"in{i}.parquet", str(tmp_path / f"in{i}.parquet"), 20_000, BitMap64(), size))
    target = 256 * KiB
    res = rewrite_files(paths, tmp_path / "out", SCHEMA, target_bytes=target)
    sizes = [o.size_bytes for o in res.outputs]
    assert all(target <= b < 1.5 * target for b in sizes[:-1]), sizes
    pol = MaintenancePolicy(target_file_bytes=target, file_count_trigger=2)
    again = plan_compaction([FileStats(o.name, o.rows, 0, o.size_bytes) for o in res.outputs], pol)
    assert not again, again


def _with_ids(schema):
    return pa.schema([f.with_metadata({b"PARQUET:field_id": str(i + 1).encode()}) for i, f in enumerate(schema)])


def _lineage_of(path):
    """(id, _row_id, _last_updated_sequence_number) of every row of a rewritten file, the lineage
    columns found by their reserved Parquet field ids (Iceberg spec "Reserved Field IDs")."""
    pf = pq.ParquetFile(path)
    t = pf.read()
    by_id = {int(f.metadata[b"PARQUET:field_id"]): f.name for f in t.schema}
    assert {2147483540, 2147483539} <= set(by_id), t.schema
    assert pf.schema_arrow.field(by_id[2147483540]).type == pa.int64()
    return list(
        zip(
            t.column("id").to_pylist(),
            t.column(by_id[2147483540]).to_pylist(),
            t.column(by_id[2147483539]).to_pylist(),
        )
    )


def test_rewrite_carries_row_lineage(tmp_path):
    """With lineage, every moved row keeps its row id (inherited: the file's first_row_id + position) and
    its last-updated sequence number (the file's); a second rewrite of those outputs copies the stored
    values, not the outputs' own (new) first_row_id."""
    schema = _with_ids(SCHEMA)
    a_ids, b_ids = list(range(0, 3000)), list(range(10_000, 11_000))
    for name, ids in (("a.parquet", a_ids), ("b.parquet", b_ids)):
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]}, schema=schema), tmp_path / name
        )
    del_a = BitMap64(range(0, 3000, 7))
    inputs = [
        RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 3000, del_a, 1, FileLineage(100, 4)),
        RewriteInput("b.parquet", str(tmp_path / "b.parquet"), 1000, BitMap64([5]), 1, FileLineage(50_000, 9)),
    ]
    res = rewrite_files(inputs, tmp_path / "out", schema, target_bytes=1 << 30, lineage=True)
    got = [row for o in res.outputs for row in _lineage_of(o.path)]
    want = [(i, 100 + p, 4) for p, i in enumerate(a_ids) if p not in del_a]
    want += [(i, 50_000 + p, 9) for p, i in enumerate(b_ids) if p != 5]
    assert got == want
    # the outputs are rewritten again (first_row_id 7 and sequence number 12 of their own): stored values win
    again_in = [
        RewriteInput(o.name, o.path, o.rows, BitMap64([0]), o.size_bytes, FileLineage(7, 12)) for o in res.outputs
    ]
    again = rewrite_files(again_in, tmp_path / "out2", schema, target_bytes=1 << 30, lineage=True)
    assert [row for o in again.outputs for row in _lineage_of(o.path)] == want[1:]
    # without a first_row_id (a file from before an upgrade to v3): row ids stay NULL, sequence inherited
    c = RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 3000, BitMap64(), 1, FileLineage(None, 3))
    (out,) = rewrite_files([c], tmp_path / "out3", schema, target_bytes=1 << 30, lineage=True).outputs
    assert {(r, s) for _, r, s in _lineage_of(out.path)} == {(None, 3)}
    with pytest.raises(ValueError, match="needs the file's lineage"):
        rewrite_files(
            [RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 3000, BitMap64(), 1)],
            tmp_path / "out4",
            schema,
            target_bytes=1 << 30,
            lineage=True,
        )
    # without lineage (format v2) the outputs have the table's columns only
    (plain,) = rewrite_files(inputs[:1], tmp_path / "out5", schema, target_bytes=1 << 30).outputs
    assert pq.read_schema(plain.path).names == ["id", "v"]


def test_rewrite_failure_leaves_no_output(tmp_path):
    _write(tmp_path / "a.parquet", list(range(100)))
    bad = RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 99, BitMap64(), 10)  # wrong row count
    good = RewriteInput("g.parquet", str(tmp_path / "a.parquet"), 100, BitMap64(), 10)
    with pytest.raises(ValueError, match="expected 99 rows"):
        rewrite_files([good, bad], tmp_path / "out", SCHEMA, target_bytes=1 << 20)
    assert list((tmp_path / "out").iterdir()) == []


def _worked_example(tmp_path):
    """Files a.parquet (ids 0–399) and b.parquet (1000–1299) and their IndexBlocks, the first also
    covering 5 rows of dead.parquet (a file no longer in the table): (a ids, b ids, a bytes, b bytes,
    block 1, block 2)."""
    a_ids, b_ids = list(range(0, 400)), list(range(1000, 1300))
    sa = _write(tmp_path / "a.parquet", a_ids)
    sb = _write(tmp_path / "b.parquet", b_ids)
    blk1 = IndexBlock.build(
        tmp_path / "1.idx",
        splitmix64(np.array(a_ids + [7777] * 5, dtype=np.uint64)),
        np.array([0] * 400 + [1] * 5),
        np.array(list(range(400)) + list(range(5))),
        ["a.parquet", "dead.parquet"],
    )
    blk2 = IndexBlock.build(
        tmp_path / "2.idx", splitmix64(np.array(b_ids, dtype=np.uint64)), 0, np.arange(300), ["b.parquet"]
    )
    return a_ids, b_ids, sa, sb, blk1, blk2


def test_index_rebuild_through_the_rewrite_map(tmp_path):
    """The worked example end to end: blocks of old files → build_from_compaction with the rewriter's
    map (plus a dead file's entries dropped): every live key points at its row in the new files."""
    a_ids, b_ids, _, _, blk1, blk2 = _worked_example(tmp_path)
    del_a, del_b = BitMap64(range(0, 400, 2)), BitMap64([0, 299])
    res = rewrite_files(
        [
            RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 400, del_a, 1),
            RewriteInput("b.parquet", str(tmp_path / "b.parquet"), 300, del_b, 1),
        ],
        tmp_path / "out",
        SCHEMA,
        target_bytes=1 << 20,
    )
    dead = dead_file_maps([blk1, blk2], {"a.parquet", "b.parquet"})
    assert set(dead) == {"dead.parquet"} and len(dead["dead.parquet"][0]) == 5
    pm = PositionMap(res.position_map.files, {**dead, **res.position_map.sources})
    new = FileIndex.build_from_compaction([blk1, blk2], pm, tmp_path / "new.idx")
    assert new.num_entries == res.rows_out and new.files == tuple(o.name for o in res.outputs)
    tables = {o.name: pq.read_table(o.path) for o in res.outputs}
    fidx = FileIndex([new])
    for pos, k in enumerate(a_ids):
        hits = fidx.lookup(int(splitmix64(np.array([k], dtype=np.uint64))[0]))
        if pos in del_a:
            assert hits == []
        else:
            ((name, row),) = hits
            assert tables[name].column("id")[row].as_py() == k
    assert fidx.lookup(int(splitmix64(np.array([7777], dtype=np.uint64))[0])) == []


def _entries(block):
    h, f, r = block.entries()
    order = np.lexsort((r, f, h))
    return [block.files[i] for i in f[order]], h[order].tolist(), r[order].tolist()


def test_the_rewrite_child_rebuilds_the_index_as_this_process_does(tmp_path):
    """``maintenance: auto`` rebuilds the IndexBlocks of a compaction in the rewrite's child
    (compact_in_child with a Reindex; a dead file's entries dropped there too) and merges blocks there
    (merge_in_child): the blocks come out as the in-process build writes them;
    a rebuild that fails in the child deletes the rewrite's outputs and comes back as itself."""
    from mooncake_assets.engine.compaction.worker import Reindex, compact_in_child, merge_in_child

    a_ids, b_ids, sa, sb, blk1, blk2 = _worked_example(tmp_path)
    inputs = [
        RewriteInput("a.parquet", str(tmp_path / "a.parquet"), 400, BitMap64(range(0, 400, 2)), sa),
        RewriteInput("b.parquet", str(tmp_path / "b.parquet"), 300, BitMap64([0, 299]), sb),
    ]
    live = frozenset({"a.parquet", "b.parquet"})
    blocks = (str(blk1.path), str(blk2.path))
    here = compact_in_child(
        inputs, tmp_path / "o1", SCHEMA, 1 << 20, 0, reindex=Reindex(blocks, live, str(tmp_path / "h.idx"))
    )
    there = compact_in_child(
        inputs, tmp_path / "o2", SCHEMA, 1 << 20, 6, reindex=Reindex(blocks, live, str(tmp_path / "c.idx"))
    )
    assert there.block == str(tmp_path / "c.idx") and there.index_seconds > 0
    with IndexBlock.open(here.block) as h, IndexBlock.open(there.block) as c:
        assert c.num_entries == there.rewrite.rows_out == 200 + 298
        names = {o.name: i for i, o in enumerate(there.rewrite.outputs)}
        hnames = {o.name: i for i, o in enumerate(here.rewrite.outputs)}
        hf, hh, hr = _entries(h)
        cf, ch, cr = _entries(c)
        assert (ch, cr) == (hh, hr) and [names[n] for n in cf] == [hnames[n] for n in hf]
    merged = merge_in_child([blk1, blk2], {"a.parquet", "b.parquet"}, tmp_path / "m.idx", 6)
    same = FileIndex.build_from_compaction(
        [blk1, blk2], PositionMap((), dead_file_maps([blk1, blk2], live)), tmp_path / "m0.idx", unmapped="keep"
    )
    assert _entries(merged) == _entries(same) and merged.num_entries == 700
    missing = Reindex((str(tmp_path / "gone.idx"),), live, str(tmp_path / "x.idx"))
    with pytest.raises(FileNotFoundError, match="gone.idx"):
        compact_in_child(inputs, tmp_path / "o3", SCHEMA, 1 << 20, 6, reindex=missing)
    assert not list((tmp_path / "o3").glob("*")) and not (tmp_path / "x.idx").exists()


# ------------------------------------------------------------------------------------------ faults


def test_fault_spec_parsing(monkeypatch):
    monkeypatch.setenv("MOONCAKE_FAULT", "compaction:after_commit, compaction:after_files_written=sleep:0.5")
    assert faults() == {"compaction:after_commit": "kill", "compaction:after_files_written": "sleep:0.5"}
    monkeypatch.delenv("MOONCAKE_FAULT")
    assert faults() == {}
