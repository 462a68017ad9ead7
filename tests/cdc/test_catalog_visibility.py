"""``ADD COLUMN … DEFAULT`` on a partitioned table lost its default for older rows under load.

Cause: Postgres writes a commit record — and logical decoding sends the transaction — *before* the
committing backend leaves the proc array. For that moment a new snapshot does not see the
transaction yet. A schema-change lookup in that window saw the table without the added column, found
no catalog row for it, and gave it no default: every older row read NULL. On a loaded machine the
committing backend is sometimes descheduled right there.

The window is held open here on purpose, deterministically: with ``synchronous_standby_names``
naming a standby that never connects, a commit waits for it after its commit record is flushed and
before it becomes visible, while logical decoding sends it at once. The fault point
``catalog:lookup`` (``MOONCAKE_FAULT=catalog:lookup=wait:<flag>``) tells the test that the service has
the transaction in hand and is about to look the catalogs up.
"""

from __future__ import annotations

import contextlib
import threading

import psycopg
import pytest

from mooncake_assets.engine.service.process import stop_service
from mooncake_assets.verify import verify

from ..helpers import make_settings, run_sql, running_service, wait_until

SETUP = [
    "CREATE TABLE c_part (id int, region text, v text, n int, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
    "CREATE TABLE c_part_eu PARTITION OF c_part FOR VALUES IN ('eu')",
    "CREATE TABLE c_part_us PARTITION OF c_part FOR VALUES IN ('us')",
    "INSERT INTO c_part SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v', 0 FROM generate_series(1, 60) g",
]
CHANGE = [
    "ALTER TABLE c_part ADD COLUMN x5 text DEFAULT 'd'",
    "INSERT INTO c_part SELECT g, 'eu', 'v', 0 FROM generate_series(1001, 1005) g",
]


def _commits_are_held(admin_dsn: str) -> bool:
    """Does a probe commit wait for the (absent) synchronous standby? (Its wait is then cancelled: the
    commit itself stands.)"""
    with psycopg.connect(admin_dsn) as probe, psycopg.connect(admin_dsn, autocommit=True) as watch:
        pid = probe.info.backend_pid
        probe.execute("SELECT pg_logical_emit_message(true, 'mooncake-test-probe', '')")  # writes WAL: its commit waits
        th = threading.Thread(target=probe.commit, daemon=True)
        th.start()
        while th.is_alive():
            ev = watch.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if ev and ev[0] == "SyncRep":
                watch.execute("SELECT pg_cancel_backend(%s)", (pid,))
                th.join(30)
                return True
            th.join(0.05)
        return False


@contextlib.contextmanager
def commits_held_invisible(admin_dsn: str):
    """While inside: every commit on the cluster is flushed and decoded but stays invisible to other
    snapshots (it waits for a synchronous standby that never comes). On exit the waits end."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute("ALTER SYSTEM SET synchronous_standby_names = 'mooncake_test_no_such_standby'")
        c.execute("SELECT pg_reload_conf()")
    try:
        wait_until(lambda: _commits_are_held(admin_dsn), timeout=30, what="commits waiting for a synchronous standby")
        yield
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute("ALTER SYSTEM RESET synchronous_standby_names")
            c.execute("SELECT pg_reload_conf()")


def _change_in_background(dsn: str) -> threading.Thread:
    def run():
        with psycopg.connect(dsn) as c:
            for s in CHANGE:
                c.execute(s)
            c.commit()  # returns once the standby wait ends

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def _sees_x5(dsn: str) -> bool:
    return bool(run_sql(dsn, "SELECT 1 FROM pg_attribute WHERE attrelid = 'c_part'::regclass AND attname = 'x5'"))


def _old_rows_read(settings, client, dsn):
    from mooncake_assets.engine.read import UnionReader

    rows = UnionReader(client, dsn).read_table("c_part").to_pylist()
    return sorted({r["x5"] for r in rows if r["id"] <= 60}, key=str), len(rows)


def _check(settings, client, dsn):
    results, lsn = verify(settings, ["c_part"], "union", client)
    assert all(r.match for r in results), [r.line() for r in results]
    client.call("persist", table="c_part")
    results, lsn = verify(settings, ["c_part"], "pyiceberg", client)
    assert all(r.match for r in results), [r.line() for r in results]


def test_add_column_default_looked_up_before_its_commit_is_visible(pg_cluster, pg_dsn, state_dir, monkeypatch):
    run_sql(pg_dsn, *SETUP)
    flag = state_dir / "hold-lookup"
    flag.touch()
    monkeypatch.setenv("MOONCAKE_FAULT", f"catalog:lookup=wait:{flag}")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="c_part", src="public.c_part")
        with commits_held_invisible(pg_cluster.dsn()):
            th = _change_in_background(pg_dsn)
            wait_until(
                lambda: (state_dir / "hold-lookup.reached").exists(),
                timeout=60,
                what="the service to reach the catalog lookup of the schema change",
            )
            assert th.is_alive() and not _sees_x5(pg_dsn)  # decoded and sent, not visible: the window is open
            flag.unlink()  # the lookup goes ahead inside the window
            log = state_dir / "service.log"
            wait_until(
                lambda: "added x5" in log.read_text() or "do not show transaction" in log.read_text(),
                timeout=60,
                what="the service to follow the change or to wait for its commit",
            )
        th.join(60)
        assert not th.is_alive()
        assert _old_rows_read(s, client, pg_dsn) == (["d"], 65)  # not None: the default older rows read
        st = next(t for t in client.status()["tables"] if t["name"] == "c_part")
        assert st["state"] == "ready", st
        _check(s, client, pg_dsn)


@pytest.mark.slow
def test_a_commit_that_stays_invisible_stops_the_table_and_a_restart_resumes(pg_cluster, pg_dsn, state_dir):
    """A lookup that cannot give a trustworthy answer stops the table with an error naming table, column
    and LSN — never "no default"; after a restart the change is replayed and looked up again."""
    run_sql(pg_dsn, *SETUP)
    s = make_settings(state_dir, pg_dsn, maintenance="dagster", catalog_wait_s=0.5)
    with running_service(s) as client:
        client.call("create_table", dst="c_part", src="public.c_part")
        with commits_held_invisible(pg_cluster.dsn()):
            th = _change_in_background(pg_dsn)
            st = wait_until(
                lambda: next((t for t in client.status()["tables"] if t["name"] == "c_part" and t.get("error")), None),
                timeout=60,
                what="the table to stop",
            )
        th.join(60)
        err = st["error"]
        assert "table c_part" in err and "column x5 (text) was added" in err and "schema change at LSN" in err, err
        assert "restart the service" in err and "\n" not in err, err
    stop_service(s)
    with running_service(s) as client:
        wait_until(
            lambda: next(t for t in client.status()["tables"] if t["name"] == "c_part").get("error") is None,
            timeout=60,
            what="the table to resume",
        )
        run_sql(pg_dsn, "INSERT INTO c_part VALUES (2000, 'us', 'w', 1)")
        assert _old_rows_read(s, client, pg_dsn) == (["d"], 66)
        _check(s, client, pg_dsn)
