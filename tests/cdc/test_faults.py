"""Restarts and faults. The service must retry with backoff, never confirm the slot past
what is durable in Iceberg, resume from the slot without duplicates, and report the fault."""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.faults import set_faults
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.pg import EmbeddedPostgres
from mooncake_assets.engine.service.process import kill_service, start_service

from ..helpers import make_settings, mooncake, running_service, wait_until
from .conftest import Mirror, mirror_fixture, new_state_dir


@pytest.fixture()
def fresh_mirror(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def _slot_confirmed(m) -> int:
    slot = m.client.status()["slot"]
    return Lsn.parse(
        m.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", params=(slot,))[0][0]
    )


def test_walsender_terminated_resumes_without_duplicates(fresh_mirror):
    """pg_terminate_backend of the walsender while unpersisted changes sit in memory: the server resends
    from the slot's confirmed position (the last persist), and nothing is applied twice."""
    m = fresh_mirror
    m.sql(
        "CREATE TABLE w (id int PRIMARY KEY, n int)",
        "CREATE TABLE w_nk (k int, v text)",
        "INSERT INTO w SELECT g, 0 FROM generate_series(1, 100) g",
    )
    m.create("w")
    m.create("w_nk")
    with psycopg.connect(m.dsn, autocommit=True) as c:
        before = Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    m.sql(
        "INSERT INTO w SELECT g, 1 FROM generate_series(101, 200) g",
        "UPDATE w SET n = n + 1 WHERE id <= 50",
        "INSERT INTO w_nk SELECT g % 3, 'd' FROM generate_series(1, 30) g",
    )
    m.check("w", "w_nk")  # applied in memory, not persisted: the slot stays behind
    # the slot may have been confirmed past the tables' flush LSN while they were clean (an idle mirror
    # confirms the keepalive's WAL end), but never past the first change that is only in memory
    assert _slot_confirmed(m) <= before
    for round_ in range(2):
        slot = m.client.status()["slot"]
        m.sql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s", params=(slot,))
        m.sql(
            f"UPDATE w SET n = n + 10 WHERE id > {150 + round_}",
            "DELETE FROM w_nk WHERE ctid = (SELECT min(ctid) FROM w_nk)",
        )
        m.check("w", "w_nk")
    st = m.client.status()
    assert len(st["stream_faults"]) >= 2 and "terminating connection" in st["stream_faults"][-1]["error"], st
    out = " ".join(mooncake(m.settings, "status", check=True).stdout.split())
    assert "lost stream(s)" in out and "terminating connection" in out, out
    # the report names the slot and the LSN the stream resumes from (its confirmed LSN: the last persist)
    assert f"slot {st['slot']}," in out, out
    resumed = Lsn.parse(re.search(r"confirmed LSN ([0-9A-F]+/[0-9A-F]+)", out).group(1))
    assert resumed <= before, (out, before)
    assert m.status("w")["missing_keys"] == 0 and m.status("w_nk")["missing_keys"] == 0
    m.check("w", "w_nk", iceberg=True)


def test_iceberg_commit_conflicts_retry_with_backoff(pg_cluster, monkeypatch):
    """Every persist loses the pointer race for a while (injected): the table shows state 'retrying'
    with an error naming it, keeps serving reads, the slot is never confirmed past its flush LSN, and
    once commits land again everything is persisted once; a SIGKILL afterwards loses and doubles nothing."""
    from .conftest import drop_database, new_database

    db = new_database(pg_cluster)
    dsn = pg_cluster.dsn(db)
    state = new_state_dir()
    faults = state / "faults.json"
    set_faults(faults, commit_conflicts=0)
    monkeypatch.setenv("MOONCAKE_FAULTS", str(faults))
    s = make_settings(state, dsn, maintenance="auto", persist_interval_s=0.3)
    try:
        with running_service(s) as client:
            m = Mirror(s, client, dsn)
            m.sql(
                "CREATE TABLE cc (id int PRIMARY KEY, v text)",
                "INSERT INTO cc SELECT g, 'a' FROM generate_series(1, 50) g",
            )
            m.create("cc")
            before = Lsn.parse(m.status("cc")["flush_lsn"])
            set_faults(faults, commit_conflicts=12)  # > 2 persists' worth of internal attempts
            m.sql(
                "INSERT INTO cc SELECT g, 'b' FROM generate_series(51, 150) g", "UPDATE cc SET v = 'c' WHERE id <= 10"
            )
            st = wait_until(lambda: (x := m.status("cc"))["state"] == "retrying" and x, what="state retrying")
            assert "mooncake.cc" in st["error"] and "race" in st["error"] and "temporary" in st["error"], st["error"]
            # read from the status that showed 'retrying': on a loaded machine the third persist may land
            # while the check below runs, so a later status may rightly show a newer flush LSN
            assert Lsn.parse(st["flush_lsn"]) == before
            confirmed = _slot_confirmed(m)
            assert confirmed <= Lsn.parse(m.status("cc")["flush_lsn"])  # nothing confirmed past what is durable
            m.check("cc")  # reads are served meanwhile
            st = wait_until(
                lambda: (x := m.status("cc"))["state"] == "ready" and Lsn.parse(x["flush_lsn"]) > before and x,
                timeout=60,
                what="a persist after the conflicts",
            )
            import json

            assert json.loads(faults.read_text())["conflicts_injected"] == 12
            m.check("cc", iceberg=True)
            wait_until(lambda: _slot_confirmed(m) > before, what="the slot to move on")
            kill_service(s)
            m.sql("UPDATE cc SET v = 'after kill' WHERE id > 140")
            start_service(s)
            client.close()
            m.check("cc", iceberg=True)
            assert m.status("cc")["missing_keys"] == 0
    finally:
        drop_database(pg_cluster, db)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.slow
def test_postgres_restarts_under_the_mirror(tmp_path):
    """The source Postgres crashes (immediate stop) and comes back on the same port: the service
    reconnects with backoff, reports the lost stream, and resumes from the slot without loss or doubles.
    A dedicated cluster, since the session cluster is shared."""
    root = Path(tempfile.mkdtemp(prefix="mooncake-pgrestart-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    state = new_state_dir()
    s = make_settings(state, pg.dsn(), maintenance="auto", persist_interval_s=0.5)
    ctl = [str(Path(pg.bin("pg_ctl"))), "-D", str(pg.data_dir)]
    try:
        with running_service(s) as client:
            m = Mirror(s, client, pg.dsn())
            m.sql(
                "CREATE TABLE r (id int PRIMARY KEY, n int)",
                "CREATE TABLE r_nk (k int)",
                "INSERT INTO r SELECT g, 0 FROM generate_series(1, 500) g",
            )
            m.create("r")
            m.create("r_nk")
            m.sql("UPDATE r SET n = 1 WHERE id <= 100", "INSERT INTO r_nk SELECT g % 4 FROM generate_series(1, 40) g")
            m.check("r", "r_nk")
            for mode in ("immediate", "fast"):
                pg._run(ctl[:1] + ["stop", "-m", mode, "-w"] + ctl[1:], check=False)
                time.sleep(1.0)
                pg._run(ctl[:1] + ["start", "-w", "-l", str(pg.data_dir / "server.log")] + ctl[1:])
                m.sql(
                    "UPDATE r SET n = n + 1 WHERE id % 3 = 0",
                    "DELETE FROM r_nk WHERE ctid = (SELECT min(ctid) FROM r_nk)",
                )
                wait_until(
                    lambda: m.client.status()["stream_error"] is None and m.client.status()["streaming"],
                    timeout=40,
                    what="the stream to come back",
                )
                m.check("r", "r_nk")
            st = m.client.status()
            assert len(st["stream_faults"]) >= 2, st
            # each lost stream is reported with the server's reason; status names the slot and the LSN the
            # stream resumes from (the slot's confirmed LSN)
            assert any(
                "terminating connection" in f["error"] or "closed the connection" in f["error"]
                for f in st["stream_faults"]
            ), st["stream_faults"]
            out = " ".join(mooncake(s, "status", check=True).stdout.split())
            assert f"slot {st['slot']}," in out and "lost stream(s)" in out, out
            assert re.search(r"confirmed LSN [0-9A-F]+/[0-9A-F]+", out), out
            m.check("r", "r_nk", iceberg=True)
            assert m.status("r")["missing_keys"] == 0 and m.status("r_nk")["missing_keys"] == 0
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.slow
def test_sigkill_at_random_points(pg_cluster):
    """SIGKILL the service at seeded random moments while transactions (some streamed, some with
    savepoints) keep committing and the service persists every 0.3 s: no loss, no doubles."""
    from .conftest import drop_database, new_database, with_dsn_options

    db = new_database(pg_cluster)
    dsn = with_dsn_options(pg_cluster.dsn(db), "-c logical_decoding_work_mem=64kB")
    state = new_state_dir()
    s = make_settings(state, dsn, maintenance="auto", persist_interval_s=0.3)
    rng = random.Random(77)
    stop = threading.Event()
    done = {"txns": 0, "error": None}

    def workload():
        try:
            _workload()
        except Exception as e:  # surfaced by the test below
            done["error"] = e

    def _workload():
        wrng = random.Random(78)
        with psycopg.connect(dsn, autocommit=True) as c:
            i = 1000
            while not stop.is_set():
                done["txns"] += 1
                with c.transaction():
                    c.execute("UPDATE k SET n = n + 1 WHERE id = %s", (wrng.randint(1, 300),))
                    c.execute("INSERT INTO k VALUES (%s, 0)", (i,))
                    i += 1
                    if wrng.random() < 0.03:
                        c.execute("SAVEPOINT s")
                        c.execute("INSERT INTO k SELECT g, -1 FROM generate_series(%s::int, %s::int) g", (i, i + 2000))
                        c.execute("ROLLBACK TO SAVEPOINT s")
                    if wrng.random() < 0.02:
                        c.execute("INSERT INTO k SELECT g, 2 FROM generate_series(%s::int, %s::int) g", (i, i + 1500))
                        i += 1501
                    c.execute("DELETE FROM k_nk WHERE ctid = (SELECT min(ctid) FROM k_nk)")
                    c.execute("INSERT INTO k_nk VALUES (%s), (%s)", (i % 5, i % 5))
                time.sleep(0.003)

    try:
        with running_service(s) as client:
            m = Mirror(s, client, dsn)
            m.sql(
                "CREATE TABLE k (id int PRIMARY KEY, n int)",
                "CREATE TABLE k_nk (v int)",
                "INSERT INTO k SELECT g, 0 FROM generate_series(1, 300) g",
                "INSERT INTO k_nk SELECT g % 5 FROM generate_series(1, 50) g",
            )
            m.create("k")
            m.create("k_nk")
            th = threading.Thread(target=workload)
            th.start()
            try:
                for _ in range(4):
                    time.sleep(0.5 + rng.random() * 2.0)
                    kill_service(s)
                    time.sleep(rng.random())
                    start_service(s)
                    client.close()
            finally:
                stop.set()
                th.join()
            assert done["error"] is None and done["txns"] > 100, done
            m.check("k", "k_nk", iceberg=True)
            assert m.status("k")["missing_keys"] == 0 and m.status("k_nk")["missing_keys"] == 0
    finally:
        from .conftest import drop_database

        drop_database(pg_cluster, db)
        shutil.rmtree(state, ignore_errors=True)


def test_sigkill_during_create_table_then_create_again(fresh_mirror):
    """A SIGKILL in the middle of create-table's initial copy leaves a publication entry and a
    half-made Iceberg table; after a restart, create-table of the same table must simply work."""
    m = fresh_mirror
    m.sql(
        "CREATE TABLE ck (id int PRIMARY KEY, v text)",
        "INSERT INTO ck SELECT g, repeat('x', 50) FROM generate_series(1, 400000) g",
        "CREATE TABLE ck_other (id int PRIMARY KEY)",
    )
    # the copy is held at its first block (MOONCAKE_FAULT=copy:block=wait:<flag>) while the flag exists:
    # the kill lands mid-copy however fast the copy is
    flag = Path(m.settings.state_dir) / "hold-copy"
    kill_service(m.settings)
    start_service(m.settings, extra_env={"MOONCAKE_FAULT": f"copy:block=wait:{flag}"})
    m.client.close()
    m.create("ck_other")
    flag.touch()
    errors = []
    th = threading.Thread(target=lambda: errors.append(_try(lambda: m.create("ck"))))
    th.start()
    wait_until(lambda: Path(f"{flag}.reached").exists(), what="the copy to reach its first block")
    assert any(t["name"] == "ck" and t["state"] == "copying" for t in m.client.status()["tables"])
    kill_service(m.settings)
    th.join()
    flag.unlink()
    start_service(m.settings)
    m.client.close()
    assert all(t["name"] != "ck" for t in m.client.status()["tables"])
    m.sql("UPDATE ck SET v = 'changed' WHERE id <= 10", "INSERT INTO ck_other VALUES (1)")
    r = m.create("ck")
    assert r["rows"] == 400000
    m.sql("DELETE FROM ck WHERE id <= 5")
    m.check("ck", "ck_other")


def _try(fn):
    try:
        fn()
    except Exception as e:
        return e
