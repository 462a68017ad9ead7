"""The chunked initial copy job (mooncake_assets/dagster/jobs/chunked.py): its chunks run as separate
steps on Dagster's multiprocess executor, and the mirror it makes equals create-table's (rows, and the
LSN its first Iceberg commit is at); then CDC goes on and both mirrors verify against Postgres."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from mooncake_assets.engine.iceberg.catalog import make_catalog
from mooncake_assets.engine.iceberg.names import SUMMARY_FLUSH_LSN
from mooncake_assets.engine.lsn import Lsn

from ..helpers import make_settings, running_service
from ..integration.test_mirror_converges import _all_match


def _first_commit(settings, name: str) -> tuple[int, list]:
    """The flush LSN of mirror ``name``'s first Iceberg snapshot and its rows then (sorted)."""
    t = make_catalog(settings.catalog, settings.warehouse_uri).load_table(f"mooncake.{name}")
    first = min(t.snapshots(), key=lambda s: s.sequence_number)
    lsn = first.summary[SUMMARY_FLUSH_LSN] if first.summary else None
    rows = t.scan(snapshot_id=first.snapshot_id).to_arrow().sort_by("id").to_pylist()
    return Lsn.parse(str(lsn)), rows


def _write(dsn: str, stop: threading.Event) -> None:
    rng = random.Random(3)
    with psycopg.connect(dsn, autocommit=True) as c:
        while not stop.is_set():
            i, j, k = rng.randint(1, 40_000), rng.randint(1, 40_000), rng.randint(40_001, 90_000)
            with c.transaction():
                for t in ("t", "t2"):
                    c.execute(f"UPDATE {t} SET v = v || 'u' WHERE id = %s", (i,))
                    c.execute(f"DELETE FROM {t} WHERE id = %s", (j,))
                    c.execute(f"INSERT INTO {t} VALUES (%s, 'new', 1.5) ON CONFLICT (id) DO NOTHING", (k,))


@pytest.mark.slow
def test_chunked_copy_job_equals_create_table(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("t", "t2"):  # one mirror per source table: create-table mirrors t, the job its twin t2
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n numeric(10,2))")
            c.execute(f"INSERT INTO {t} SELECT g, md5(g::text), g / 7.0 FROM generate_series(1, 40000) g")
            c.execute(f"DELETE FROM {t} WHERE id % 97 = 0")  # holes in the heap
    s = make_settings(state_dir, pg_dsn, maintenance="auto", persist_interval_s=0.5)
    with running_service(s) as client, dg.instance_for_test() as instance:
        ref = client.call("create_table", dst="ref", src="public.t")
        run_config = {"ops": {"plan": {"config": {"table": "chk=public.t2", "parts": 2, "min_range_pages": 16}}}}
        job = dg.build_reconstructable_job(
            "mooncake_assets.dagster.jobs.chunked", "job_for_state_dir", reconstructable_args=(str(state_dir),)
        )
        with dg.execute_job(job, instance=instance, run_config=run_config) as result:
            assert result.success
            events = result.all_events
            out = result.output_for_node("publish")
        steps = {e.step_key for e in events if e.event_type == dg.DagsterEventType.STEP_SUCCESS}
        chunks = sorted(k for k in steps if k and k.startswith("copy_chunk["))
        assert len(chunks) == 2, steps  # two CTID ranges of the ~400-page heap
        pids = {e.pid for e in events if e.step_key in chunks and e.event_type == dg.DagsterEventType.STEP_START}
        assert len(pids) == 2 and os.getpid() not in pids  # each chunk a process of its own
        assert out["rows"] == ref["rows"] == 40000 - 40000 // 97

        # one Iceberg commit at the snapshot's LSN, holding what create-table's holds
        lsn_ref, rows_ref = _first_commit(s, "ref")
        lsn_chk, rows_chk = _first_commit(s, "chk")
        # (each commit is at the stream's position when that moved past the snapshot meanwhile — the other
        # mirror's slot and publication change write WAL — while no change of t or t2 came in between, so
        # its rows are the snapshot's)
        assert lsn_ref >= Lsn.parse(ref["copy_lsn"]) and lsn_chk >= Lsn.parse(out["copy_lsn"])
        assert len(rows_ref) == ref["rows"] and rows_chk == rows_ref
        staging = Path(s.warehouse_uri.removeprefix("file://")) / "mooncake-staging"
        assert out["files"] >= 1 and not (staging.exists() and any(staging.iterdir()))  # staged files taken

        # then CDC: both mirrors follow the source
        stop = threading.Event()
        th = threading.Thread(target=_write, args=(pg_dsn, stop))
        th.start()
        try:
            time.sleep(1.5)
        finally:
            stop.set()
            th.join()
        _all_match(s, client, names=["ref", "chk"])


def test_chunked_copy_job_is_in_the_definitions(tmp_path):
    from mooncake_assets.dagster.definitions import DagsterConfig, build_definitions

    defs = build_definitions(DagsterConfig(state_dir=tmp_path))
    job = defs.get_job_def("chunked_copy")
    assert {n.name for n in job.graph.node_defs} == {"plan", "copy_chunk", "publish"}


def test_chunked_copy_abort_leaves_nothing_and_bad_calls_say_so(pg_dsn, state_dir):
    """A chunked copy begun then aborted (what a failed chunk step does) leaves no mirror, no slot and no
    staged files; a chunk whose snapshot is gone, and finishing an unknown copy, fail in one line."""
    from mooncake_assets.engine.service.chunked import copy_chunk, staging_filesystem
    from mooncake_assets.engine.service.client import ServiceError

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    s = make_settings(state_dir, pg_dsn, maintenance="auto")
    fs, root = staging_filesystem(s.warehouse_uri, None)
    with running_service(s) as client:
        plan = client.call("chunked_copy_begin", dst="t", src="t", parts=2, min_range_pages=8)
        assert len(plan["ranges"]) == 2 and plan["src"] == "public.t"
        assert [t["state"] for t in client.status()["tables"] if t["name"] == "t"] == ["copying"]
        done = copy_chunk(pg_dsn, plan, 0, fs, root)  # one chunk staged, then the copy is given up
        assert done["rows"] > 0 and fs.exists(done["files"][0])
        assert client.call("chunked_copy_abort", slot=plan["slot"]) == {"aborted": plan["slot"], "table": "t"}
        assert not fs.exists(plan["staging"])
        with psycopg.connect(pg_dsn) as c:
            slots = [r[0] for r in c.execute("SELECT slot_name FROM pg_replication_slots").fetchall()]
        assert plan["slot"] not in slots
        with pytest.raises(Exception, match=rf"snapshot {plan['snapshot']} of slot {plan['slot']} is gone"):
            copy_chunk(pg_dsn, plan, 1, fs, root)
        with pytest.raises(ServiceError, match=rf"no chunked copy in progress with slot '{plan['slot']}'"):
            client.call("chunked_copy_finish", slot=plan["slot"])
        # the table can be mirrored afresh: nothing of the aborted copy is in the way
        assert [t["name"] for t in client.status()["tables"]] == []
        again = client.call("create_table", dst="t", src="public.t")
        assert again["rows"] == 20000
