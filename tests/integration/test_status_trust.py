"""No state in which a mirror is wrong while list-tables, status and Dagster say it is fine.

Items 1 (two mirrors of one source), 2 (scheduled verify), 3 (maintenance mode and warnings), 5 (a
different --dsn while a service runs), with the real service, Postgres and CLI.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import service_pid, start_service, stop_service
from tests.helpers import make_settings, mooncake, running_service, service_tables, wait_until


def _tables(settings) -> dict:
    """list-tables --json's tables by name (through the CLI)."""
    r = mooncake(settings, "list-tables", "--json", check=True)
    return {t["name"]: t for t in json.loads(r.stdout)["tables"]}


_status = service_tables


# ------------------------------------------------------------------------------------------ item 1
@pytest.mark.slow
def test_second_mirror_of_one_source_is_refused_and_the_first_keeps_following(pg_dsn, state_dir):
    """The issue's scenario: create-table dup_a and dup_b of public.dup_src, insert 10, update 5, verify;
    drop-table dup_b; more changes, across a restart. On the old code dup_b took dup_a's changes
    (MISMATCH while `ready`) and its drop removed the source from the publication."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE dup_src (id int PRIMARY KEY, v text)")
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "create-table", "dup_a", "public.dup_src", check=True)
        r = mooncake(s, "create-table", "dup_b", "public.dup_src")
        assert r.returncode != 0
        err = r.stderr.strip()
        assert len(err.splitlines()) == 1 and "dup_a" in err and "public.dup_src" in err, err
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO dup_src SELECT g, 'v' || g FROM generate_series(1, 10) g")
            c.execute("UPDATE dup_src SET v = 'u' WHERE id <= 5")
        r = mooncake(s, "verify")
        assert r.returncode == 0, r.stdout + r.stderr
        mooncake(s, "drop-table", "dup_b")  # refused above: nothing to drop, the publication keeps dup_src
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO dup_src VALUES (11, 'x')")
            c.execute("DELETE FROM dup_src WHERE id = 2")
        stop_service(s)  # and across a restart
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO dup_src VALUES (12, 'y')")
        r = mooncake(s, "verify", "dup_a")
        assert r.returncode == 0 and "source 11 rows, mirror 11 rows" in r.stdout, r.stdout + r.stderr
        assert set(_status(s)) == {"dup_a"}
    finally:
        stop_service(s)


@pytest.mark.slow
def test_drop_of_a_legacy_duplicate_keeps_the_source_published(pg_dsn, state_dir):
    """A state dir made by the old code may hold two mirrors of one source: on restart the second is
    shown stopped (not `ready` and starved), and dropping it keeps the source in the publication."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for name in ("dup_src", "dup_other"):
            c.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v text)")
            c.execute(f"INSERT INTO {name} VALUES (1, 'a')")
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "create-table", "dup_a", "public.dup_src", check=True)
        mooncake(s, "create-table", "dup_b", "public.dup_other", check=True)
        mooncake(s, "stop", check=True)
        # what the old code's registry held after `create-table dup_b public.dup_src`
        reg = json.loads((state_dir / "tables.json").read_text())
        reg["tables"]["dup_b"].update(source="public.dup_src", oid=reg["tables"]["dup_a"]["oid"])
        (state_dir / "tables.json").write_text(json.dumps(reg))
        mooncake(s, "start", check=True)  # after `stop` only `start` starts the service
        tables = _tables(s)
        assert tables["dup_a"]["state"] == "ready"
        assert tables["dup_b"]["state"] == "error" and "dup_a" in tables["dup_b"]["error"], tables["dup_b"]
        mooncake(s, "drop-table", "dup_b", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            assert (
                c.execute("SELECT count(*) FROM pg_publication_tables WHERE tablename = 'dup_src'").fetchone()[0] == 1
            )
            c.execute("INSERT INTO dup_src VALUES (2, 'b')")
        r = mooncake(s, "verify", "dup_a")
        assert r.returncode == 0 and "mirror 2 rows" in r.stdout, r.stdout + r.stderr
    finally:
        stop_service(s)


# ------------------------------------------------------------------------------------------ item 2
def test_scheduled_verify_reports_match_then_turns_a_silent_stop_into_an_error(pg_dsn, state_dir):
    """The service checks each mirror by itself (counts + checksums per key range at one LSN); a mirror
    that stops receiving changes (its source left the publication behind the service's back) turns
    to `error` saying what differs, in list-tables and status."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE vt (id int PRIMARY KEY, v text, n numeric(10,2), ts timestamptz, u uuid, j jsonb)")
        c.execute(
            "INSERT INTO vt SELECT g, 'v' || g, g / 3.0, now(), gen_random_uuid(), '{\"a\": 1}' "
            "FROM generate_series(1, 500) g"
        )
    # the publication poll would name the cause first; off here, the scheduled verify must find it
    s = make_settings(state_dir, pg_dsn, verify_interval_s=0.5, publication_check_s=0)
    try:
        mooncake(s, "create-table", "vt", "public.vt", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE vt SET v = 'w' WHERE id % 7 = 0")
            c.execute("DELETE FROM vt WHERE id % 11 = 0")
        # a check after the changes (one before them matches too, at its own LSN)
        v = wait_until(
            lambda: (
                (_status(s)["vt"].get("verify") or {}).get("source_rows") == 500 - 45 and _status(s)["vt"]["verify"]
            ),
            timeout=120,
            what="a scheduled verify after the changes",
        )
        assert v["result"] == "match" and v["lsn"] and v["at"] and v["mirror_rows"] == 455, v
        assert _status(s)["vt"]["state"] == "ready"
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            pub = json.loads((state_dir / "tables.json").read_text())["publication"]
            c.execute(f"ALTER PUBLICATION {pub} DROP TABLE vt")
            c.execute("INSERT INTO vt VALUES (1000, 'new')")
        wait_until(lambda: _status(s)["vt"]["state"] == "error", timeout=120, what="the mismatch to show")
        t = _tables(s)["vt"]
        assert t["verify"]["result"] == "mismatch"
        assert "source 456 rows, mirror 455 rows" in t["error"] and "row counts differ" in t["error"], t["error"]
        r = mooncake(s, "list-tables", check=True)
        assert "found the mirror differs" in " ".join(r.stdout.split()), r.stdout
        r = mooncake(s, "status")
        assert "vt: error; last verify: mismatch" in r.stdout, r.stdout
        r = mooncake(s, "verify", "--checksum")  # the same check, on demand
        assert r.returncode == 1 and "vt: mismatch at LSN" in r.stdout and "checksums: 0/1" in r.stdout, r.stdout
        from mooncake_assets.dagster.sensors.replication import observation  # what Dagster records on mirror/vt

        meta = observation("vt", t, {"source_lsn": None}, None).metadata
        assert meta["state"].value == "error" and meta["verify_result"].value == "mismatch"
        assert meta["verify_lsn"].value == t["verify"]["lsn"] and meta["verify_at"].value
        # ... and the asset check mirror_matches_source shows that result (once per scheduled verify)
        import dagster as dg

        from mooncake_assets.dagster.sensors.replication import MaintenanceThresholds, first_sight

        tcur: dict = {}
        with dg.DagsterInstance.ephemeral() as inst:
            obs = observation("vt", t, {"source_lsn": None}, None)
            evs = [
                e
                for e in first_sight(inst, "vt", t, obs, MaintenanceThresholds(), tcur)
                if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == "mirror_matches_source"
            ]
            assert len(evs) == 1 and not evs[0].passed and t["verify"]["lsn"] in evs[0].description, evs
            again = [
                e
                for e in first_sight(inst, "vt", t, obs, MaintenanceThresholds(), tcur)
                if isinstance(e, dg.AssetCheckEvaluation) and e.check_name == "mirror_matches_source"
            ]
            assert again == []  # the same verify is reported once
    finally:
        stop_service(s)


def test_checksum_verify_matches_every_type_and_no_key(pg_dsn, state_dir):
    """No false alarm: the checksum of the source (decoded COPY) and of the mirror (Parquet + deletion
    vectors + memory) agree for every mapped type, with and without a primary key; one changed value is
    found (same row counts, values differ)."""
    from tests.pg.all_types import ALL_TYPES_DDL, ALL_TYPES_ROWS

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(ALL_TYPES_DDL)
        c.execute(ALL_TYPES_ROWS)
        c.execute("CREATE TABLE nokey (a int, b text, c float8)")
        c.execute("INSERT INTO nokey VALUES (1, 'x', 0.5), (1, 'x', 0.5), (2, NULL, 'NaN')")
    s = make_settings(state_dir, pg_dsn, verify_interval_s=0)
    with running_service(s) as client:
        client.call("create_table", dst="all_types", src="public.all_types")
        client.call("create_table", dst="nokey", src="public.nokey", exclude=["c"])  # create-table options count
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE all_types SET t = 'changed' WHERE id = (SELECT min(id) FROM all_types)")
            c.execute("DELETE FROM nokey WHERE a = 2")
        client.call("persist", table="all_types")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO nokey VALUES (3, 'y', -0.0)")  # in memory at the check
        res = client.call("verify_now")
        assert {n: r["result"] for n, r in res.items()} == {"all_types": "match", "nokey": "match"}, res
        # a value the mirror has wrong: change the source behind the stream's back (not published)
        pub = client.status()["publication"]
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute(f"ALTER PUBLICATION {pub} DROP TABLE nokey")
            c.execute("UPDATE nokey SET b = 'z' WHERE a = 3")
            c.execute(f"ALTER PUBLICATION {pub} DROP TABLE all_types")
            c.execute("UPDATE all_types SET i4 = i4 + 1 WHERE id = (SELECT max(id) FROM all_types)")
        res = client.call("verify_now")
        # without a key a row's range is its whole row's: a changed value moves it to another range
        assert res["nokey"]["result"] == "mismatch" and "source 3 rows, mirror 3 rows" in res["nokey"]["detail"]
        assert res["all_types"]["result"] == "mismatch", res
        assert "values differ in 1 of 16 key ranges (same row counts)" in res["all_types"]["detail"]
        assert {t["name"]: t["state"] for t in client.status()["tables"]} == {"all_types": "error", "nokey": "error"}
        # a name that is not a mirror is refused in one line (it used to be dropped: "checksums: 0/0")
        r = mooncake(s, "verify", "--checksum", "all_types", "typo")
        assert (
            r.returncode == 1 and r.stderr.strip() == "error: no mirrored table named typo; mirrors: all_types, nokey"
        ), r
        r = mooncake(s, "verify", "typo")  # the comparison with a reader: the same line
        assert r.returncode != 0 and "no mirrored table named typo; mirrors: all_types, nokey" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ------------------------------------------------------------------------------------------ item 3
@pytest.mark.slow
def test_maintenance_mode_of_a_started_service_is_not_saved(pg_dsn, state_dir):
    """`mooncake ui` (and the Dagster resource) start the service with maintenance: dagster for their own
    run only; a later plain start runs auto. `start --maintenance` exists; status/list-tables show it."""
    s = make_settings(state_dir, pg_dsn)
    try:
        start_service(s, maintenance="dagster")
        assert json.loads(s.settings_file.read_text())["maintenance"] == "auto"
        c = ServiceClient(s.socket_path)
        assert c.status()["maintenance"] == "dagster"
        c.close()
        r = mooncake(s, "status")
        assert "maintenance: dagster" in r.stdout, r.stdout
        r = mooncake(s, "start", "--maintenance", "auto")
        assert r.returncode == 1 and "maintenance: dagster" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        stop_service(s)
        r = mooncake(s, "start", check=True)
        assert "maintenance: auto" in r.stdout, r.stdout
        assert json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)["maintenance"] == "auto"
        stop_service(s)
        mooncake(s, "start", "--maintenance", "dagster", check=True)
        assert "maintenance: dagster" in mooncake(s, "list-tables", check=True).stdout
        assert load_settings(state_dir).maintenance == "auto"
    finally:
        stop_service(s)


UI_SCRIPT = """
import sys
from pathlib import Path
from mooncake_assets import ui
from mooncake_assets.config import load_settings
# the Dagster webserver itself is not under test here: a process that exits at once stands in for it
ui.dagster_dev_command = lambda host, port, workspace=None: ([sys.executable, "-c", "pass"], Path.cwd())
sys.exit(ui.run_ui(load_settings(sys.argv[1], dsn=sys.argv[2]), rate=0, scale=1))
"""


@pytest.mark.slow
def test_ui_leaves_the_state_dir_in_its_own_maintenance_mode(pg_dsn, state_dir):
    """`mooncake ui` runs its service with maintenance: dagster; after it exits, settings.json still says
    auto and a plain `mooncake start` flushes and persists again (the old ui saved dagster)."""
    import subprocess
    import sys

    s = make_settings(state_dir, pg_dsn)
    r = subprocess.run(
        [sys.executable, "-c", UI_SCRIPT, str(state_dir), pg_dsn], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mirrored public.pgbench_accounts" in r.stdout, r.stdout
    assert json.loads(s.settings_file.read_text())["maintenance"] == "auto"
    try:
        r = mooncake(s, "start", check=True)
        assert "maintenance: auto" in r.stdout, r.stdout
    finally:
        stop_service(s)


@pytest.mark.slow
def test_unpersisted_table_and_held_wal_are_warnings(pg_dsn, state_dir):
    """maintenance: dagster and nobody persisting: list-tables, status and the sensor's observation warn."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE wt (id int PRIMARY KEY, v text)")
    s = make_settings(state_dir, pg_dsn, warn_persist_age_s=1.0, warn_slot_wal_bytes=1000)
    try:
        start_service(s, maintenance="dagster")
        mooncake(s, "create-table", "wt", "public.wt", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO wt SELECT g, repeat('x', 100) FROM generate_series(1, 200) g")
        wait_until(lambda: len(_status(s)["wt"]["warnings"]) == 2, timeout=60, what="both warnings")
        t = _tables(s)["wt"]
        assert "no persist for" in t["warnings"][0] and "maintenance is dagster" in t["warnings"][0]
        assert "bytes of WAL in slot" in t["warnings"][1]
        r = mooncake(s, "list-tables", check=True)
        assert "wt: warning: no persist for" in " ".join(r.stdout.split()), r.stdout
        from mooncake_assets.dagster.sensors.replication import observation

        obs = observation("wt", t, {"source_lsn": None}, None)
        assert "no persist for" in obs.metadata["warnings"].value
        mooncake(s, "persist", "wt", check=True)
        assert _status(s)["wt"]["warnings"] == []
    finally:
        stop_service(s)


# ------------------------------------------------------------------------------------------ item 5
BAD_DSN = "postgresql://mc_user:s3cr3t-pw@127.0.0.1:1/nodb?connect_timeout=2"


@pytest.mark.slow
def test_failed_create_table_leaves_no_service_and_another_dsn_is_refused(pg_dsn, state_dir):
    """A create-table against an unreachable DSN fails in one line and leaves no service behind; the next
    command with the right DSN works. A command whose --dsn differs from a running service's is refused
    naming both, without the password; status says whether the source is reachable."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE dt (id int PRIMARY KEY)")
    bad = load_settings(state_dir, dsn=BAD_DSN)
    r = mooncake(bad, "create-table", "dt", "public.dt")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "s3cr3t" not in r.stderr
    assert service_pid(bad) is None and not ServiceClient(bad.socket_path).ping()
    good = load_settings(state_dir, dsn=pg_dsn)
    try:
        mooncake(good, "create-table", "dt", "public.dt", check=True)
        r = mooncake(bad, "list-tables")
        err = r.stderr.strip()
        assert r.returncode == 1 and len(err.splitlines()) == 1, err
        assert "s3cr3t" not in err and "port=1" in err and "dbname=nodb" in err
        assert "dbname=" + pg_dsn.rsplit("/", 1)[-1].split("?")[0] in err or "dbname" in err
        r = mooncake(bad, "status")
        assert r.returncode == 1 and "s3cr3t" not in r.stderr and "mirrors from" in r.stderr
        r = mooncake(good, "status", check=True)
        assert "(reachable" in r.stdout and "s3cr3t" not in r.stdout
    finally:
        stop_service(good)
    # a service whose source cannot be reached now starts (it retries, as after an outage) with one
    # warning line; status says the source is not reachable. A refused login fails start instead
    # (test_start_with_a_wrong_password_and_no_mirror_fails_in_one_line).
    bad = load_settings(state_dir / "other", dsn=BAD_DSN)
    try:
        r = mooncake(bad, "start", check=True)
        warning = r.stderr.strip()
        assert len(warning.splitlines()) == 1 and "cannot be reached now" in warning, warning
        assert "port=1" in warning and "s3cr3t" not in warning, warning
        r = mooncake(bad, "status")
        assert "NOT reachable" in r.stdout and "s3cr3t" not in r.stdout, r.stdout
    finally:
        stop_service(bad)
