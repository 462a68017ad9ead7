"""Least privilege — run with the rights a production database actually grants.

- A role with exactly ``LOGIN REPLICATION`` and ``SELECT`` on the tables, connecting with a SCRAM
  password (the test cluster's ``pg_hba.conf`` asks every role but the superuser for one), mirrors a
  keyed and a key-less table through an administrator's ``FOR TABLES IN SCHEMA`` publication: the
  key-less one is refused with the statement an administrator runs until it is ``REPLICA IDENTITY
  FULL``; changes, a restart, and every reader (union, PyIceberg, DuckDB's iceberg extension) agree.
  The publication is never altered.
- ``check-source`` on a misconfigured server (a second throwaway cluster: ``wal_level=replica``, no
  free slot) with a role without ``REPLICATION`` and a table outside the publication: each problem
  is reported with its fix, and nothing is created (no slot, no publication, no state).
- A table an administrator removes from the publication while it is mirrored stops with an error
  naming the table, the publication and the LSN; the other table goes on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.pg import EmbeddedPostgres
from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake, replication_role, run_sql, running_service, wait_until

PASSWORD = "s3cr3t-Pw!"


def _role_dsn(pg: EmbeddedPostgres, db: str, role: str, password: str | None = PASSWORD) -> str:
    return f"postgresql://{role}{':' + password if password else ''}@127.0.0.1:{pg.port}/{db}"


@pytest.fixture()
def lp_role(pg_cluster, pg_dsn):
    """A role with exactly LOGIN REPLICATION and a SCRAM password; yields its name. Dropped after."""
    with replication_role(pg_cluster.dsn(), pg_dsn, "lp_", PASSWORD) as role:
        yield role


def _verify_all(settings, client, names):
    for reader in ("union", "pyiceberg", "duckdb-iceberg"):
        results, lsn = verify(settings, names, reader, client if reader == "union" else None)
        bad = [r.line() for r in results if not r.match]
        assert len(results) == len(names) and not bad, f"{reader} at LSN {lsn}: {bad}"


def test_scram_password_is_required(pg_cluster, pg_dsn, lp_role):
    """The test cluster authenticates roles other than the superuser by scram-sha-256: no password and
    a wrong one are refused, the right one connects (over TCP, as every DSN here does)."""
    db = pg_dsn.rsplit("/", 1)[1]
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        psycopg.connect(_role_dsn(pg_cluster, db, lp_role, None))
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_role_dsn(pg_cluster, db, lp_role, "wrong"))
    with psycopg.connect(_role_dsn(pg_cluster, db, lp_role)) as c:
        assert c.execute("SELECT current_user").fetchone()[0] == lp_role
    rules = run_sql(pg_cluster.dsn(), "SELECT type, user_name, auth_method FROM pg_hba_file_rules WHERE error IS NULL")
    assert ("host", ["all"], "scram-sha-256") in rules, rules
    assert run_sql(pg_dsn, f"SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = '{lp_role}'") == [
        (True,)
    ]


@pytest.mark.slow
def test_replication_role_with_select_only_mirrors_through_admin_publication(pg_cluster, pg_dsn, lp_role, state_dir):
    admin = pg_dsn  # the superuser: the administrator
    db = pg_dsn.rsplit("/", 1)[1]
    run_sql(
        admin,
        "CREATE SCHEMA app",
        "CREATE TABLE app.orders (id int PRIMARY KEY, status text, amount numeric(10,2))",
        "CREATE TABLE app.events (kind text, payload text)",  # no key at all
        "INSERT INTO app.orders SELECT g, 'new', g * 1.5 FROM generate_series(1, 200) g",
        "INSERT INTO app.events SELECT 'k' || (g % 7), 'p' || g FROM generate_series(1, 150) g",
        f"GRANT USAGE ON SCHEMA app TO {lp_role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA app TO {lp_role}",
        "CREATE PUBLICATION app_pub FOR TABLES IN SCHEMA app",
    )
    # exactly LOGIN REPLICATION (+ SELECT on the tables): no superuser, no ownership, no CREATE
    assert run_sql(
        admin,
        f"SELECT rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolreplication, rolbypassrls, "
        f"rolcanlogin FROM pg_roles WHERE rolname = '{lp_role}'",
    ) == [(False, False, False, True, True, False, True)]
    assert run_sql(
        admin,
        f"SELECT has_database_privilege('{lp_role}', '{db}', 'CREATE'), "
        f"has_schema_privilege('{lp_role}', 'app', 'CREATE'), "
        f"pg_has_role('{lp_role}', (SELECT relowner FROM pg_class WHERE oid = 'app.orders'::regclass), 'USAGE')",
    ) == [(False, False, False)]
    pub_before = run_sql(
        admin,
        "SELECT p.*, (SELECT array_agg(pnnspid) FROM pg_publication_namespace WHERE pnpubid = p.oid), "
        "(SELECT count(*) FROM pg_publication_rel WHERE prpubid = p.oid) FROM pg_publication p",
    )
    settings = make_settings(
        state_dir, _role_dsn(pg_cluster, db, lp_role), publication="app_pub", maintenance="dagster"
    )

    r = mooncake(settings, "check-source", "app.orders", "app.events")
    assert r.returncode == 1, r.stdout + r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("ok") and "wal_level" in ln for ln in lines), r.stdout
    assert any(ln.startswith("ok") and f"role {lp_role}" in ln and "replication connection" in ln for ln in lines), (
        r.stdout
    )
    assert any(ln.startswith("ok") and "app.orders" in ln and "publication app_pub" in ln for ln in lines), r.stdout
    bad = [ln for ln in lines if ln.startswith("error")]
    assert len(bad) == 1 and "app.events" in bad[0] and "ALTER TABLE app.events REPLICA IDENTITY FULL;" in bad[0], (
        r.stdout
    )

    with running_service(settings) as client:
        r = mooncake(settings, "create-table", "events", "app.events")
        assert r.returncode == 1
        msg = r.stderr.strip()
        assert "\n" not in msg and "app.events" in msg and "ALTER TABLE app.events REPLICA IDENTITY FULL;" in msg, msg
        assert PASSWORD not in msg
        assert client.status()["tables"] == []
        assert run_sql(admin, "SELECT count(*) FROM pg_replication_slots") == [(0,)]

        r = mooncake(settings, "create-table", "orders", "app.orders", check=True)
        assert "200 rows" in r.stdout
        run_sql(admin, "ALTER TABLE app.events REPLICA IDENTITY FULL")  # the administrator's part
        r = mooncake(settings, "create-table", "events", "app.events", check=True)
        assert "150 rows" in r.stdout and "whole row" in r.stdout
        run_sql(
            admin,
            "UPDATE app.orders SET status = 'paid' WHERE id % 3 = 0",
            "DELETE FROM app.orders WHERE id > 180",
            "INSERT INTO app.orders VALUES (500, 'new', 1)",
            "UPDATE app.events SET payload = 'x' WHERE kind = 'k1'",
            "DELETE FROM app.events WHERE kind = 'k2'",
            "INSERT INTO app.events VALUES ('k1', 'x'), ('k9', NULL)",
        )
        results, lsn = verify(settings, ["orders", "events"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        for n in ("orders", "events"):
            client.call("persist", table=n)
    # restart: resume from the slot as the same role
    with running_service(settings) as client:
        run_sql(
            admin,
            "UPDATE app.orders SET amount = amount + 1 WHERE id < 50",
            "DELETE FROM app.events WHERE kind = 'k3'",
            "INSERT INTO app.events VALUES ('k3', 'again')",
        )
        results, lsn = verify(settings, ["orders", "events"], "union", client)  # waits until they are applied
        assert all(r.match for r in results), [r.line() for r in results]
        for n in ("orders", "events"):
            client.call("persist", table=n)
        _verify_all(settings, client, ["orders", "events"])
        assert client.status()["publication"] == "app_pub"
        assert {t["name"]: t["error"] for t in client.status()["tables"]} == {"orders": None, "events": None}
    r = mooncake(settings, "verify", "--reader", "duckdb-iceberg")
    assert r.returncode == 0 and "verified: 2/2" in r.stdout, r.stdout + r.stderr
    with running_service(settings) as client:  # drop-table as the same role: the slot goes with the last table
        client.call("drop_table", table="events")
        assert client.call("drop_table", table="orders")["slot_dropped"]
    assert run_sql(admin, "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    # the administrator's publication is exactly as it was; mooncake created no publication of its own
    assert (
        run_sql(
            admin,
            "SELECT p.*, (SELECT array_agg(pnnspid) FROM pg_publication_namespace WHERE pnpubid = p.oid), "
            "(SELECT count(*) FROM pg_publication_rel WHERE prpubid = p.oid) FROM pg_publication p",
        )
        == pub_before
    )


@pytest.fixture()
def bad_cluster():
    """A throwaway second cluster set up wrong: wal_level=replica, one replication slot, two WAL senders."""
    root = Path(tempfile.mkdtemp(prefix="mooncake-test-badpg-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(
        root / "state", settings={"wal_level": "replica", "max_replication_slots": 1, "max_wal_senders": 2}
    )
    pg.start()
    yield pg
    pg.destroy()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_check_source_reports_each_problem_with_its_fix_and_creates_nothing(bad_cluster, state_dir):
    su = bad_cluster.dsn()
    run_sql(
        su,
        "CREATE ROLE norepl LOGIN PASSWORD 'pw-norepl'",
        "CREATE TABLE t_in (id int PRIMARY KEY)",
        "CREATE TABLE t_out (id int PRIMARY KEY)",
        "GRANT SELECT ON t_in, t_out TO norepl",
        "CREATE PUBLICATION adm FOR TABLE t_in",
        "SELECT pg_create_physical_replication_slot('someone_else')",
    )  # the only slot is taken
    before = run_sql(
        su, "SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT array_agg(pubname) FROM pg_publication)"
    )
    settings = make_settings(state_dir, _role_dsn(bad_cluster, "postgres", "norepl", "pw-norepl"), publication="adm")
    files_before = sorted(p.name for p in state_dir.iterdir())
    r = mooncake(settings, "check-source", "public.t_in", "public.t_out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pw-norepl" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()

    def line(level: str, *words: str) -> str:
        hit = [ln for ln in lines if ln.startswith(level) and all(w in ln for w in words)]
        assert hit, f"no {level} line with {words} in:\n{r.stdout}"
        return hit[0]

    assert "ALTER SYSTEM SET wal_level = logical" in line("error", "wal_level", "replica")
    assert "max_replication_slots = 3" in line("error", "replication slots", "0 of 1 free")
    assert "pg_drop_replication_slot('someone_else')" in line("error", "replication slots")
    assert "ALTER ROLE norepl WITH REPLICATION;" in line("error", "role norepl", "REPLICATION")
    assert "ALTER PUBLICATION adm ADD TABLE public.t_out;" in line("error", "public.t_out", "not in publication adm")
    assert "max_slot_wal_keep_size = " in line("warning", "max_slot_wal_keep_size", "unlimited")
    line("ok", "public.t_in", "publication adm")
    assert lines[-1].startswith("check-source: 4 error(s), 1 warning(s)"), lines[-1]
    # nothing created: no slot, no publication, no state
    assert (
        run_sql(
            su, "SELECT (SELECT count(*) FROM pg_replication_slots), (SELECT array_agg(pubname) FROM pg_publication)"
        )
        == before
    )
    assert sorted(p.name for p in state_dir.iterdir()) == files_before


@pytest.mark.slow
def test_create_table_outside_admin_publication_fails_with_the_sql_and_creates_nothing(
    pg_cluster, pg_dsn, lp_role, state_dir
):
    """create-table runs the table's checks before it changes anything: a table outside the
    administrator's publication is one line with the ALTER PUBLICATION to run, nothing is created;
    without --publication, a role that does not own the table is told it needs ownership or a publication."""
    db = pg_dsn.rsplit("/", 1)[1]
    run_sql(
        pg_dsn,
        "CREATE TABLE lp_t (id int PRIMARY KEY, v text)",
        "CREATE TABLE other (id int PRIMARY KEY)",
        f"GRANT SELECT ON lp_t TO {lp_role}",
        "CREATE PUBLICATION adm FOR TABLE other",
    )
    settings = make_settings(state_dir, _role_dsn(pg_cluster, db, lp_role), publication="adm")
    with running_service(settings) as client:
        r = mooncake(settings, "create-table", "lp_t", "public.lp_t")
        msg = r.stderr.strip()
        assert r.returncode == 1 and "\n" not in msg, msg
        assert "not in publication adm" in msg and "ALTER PUBLICATION adm ADD TABLE public.lp_t;" in msg, msg
        assert client.status()["tables"] == []
    assert run_sql(pg_dsn, "SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert run_sql(pg_dsn, "SELECT pubname FROM pg_publication") == [("adm",)]
    assert run_sql(
        pg_dsn, "SELECT count(*) FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid"
    ) == [(1,)]
    from mooncake_assets.engine.iceberg import make_catalog

    cat = make_catalog(settings.catalog, settings.warehouse_uri)
    assert not cat.namespace_exists("mooncake") or cat.list_tables("mooncake") == []
    assert not (state_dir / "tables.json").exists() or '"lp_t"' not in (state_dir / "tables.json").read_text()
    # the service's own publication: adding a table needs ownership of it (Postgres's rule)
    own = make_settings(
        Path(tempfile.mkdtemp(prefix="mooncake-test-state-", dir="/var/tmp")),
        _role_dsn(pg_cluster, db, lp_role),
        publication=None,
    )
    try:
        with running_service(own):
            r = mooncake(own, "create-table", "lp_t", "public.lp_t")
            msg = r.stderr.strip()
            assert r.returncode == 1 and "\n" not in msg, msg
            assert (
                "needs ownership" in msg
                and "CREATE PUBLICATION mooncake FOR TABLE public.lp_t;" in msg
                and "--publication" in msg
            ), msg
        assert run_sql(pg_dsn, "SELECT pubname FROM pg_publication") == [("adm",)]
    finally:
        shutil.rmtree(own.state_dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["admin", "own"])
def test_table_removed_from_publication_stops_with_table_publication_and_lsn(pg_dsn, state_dir, mode):
    """An administrator's publication, and the service's own one: a table taken out of it while it is
    mirrored stops (pgoutput just stops sending its changes, so it would go stale looking healthy)
    with an error naming table, publication and LSN; the other table goes on; a restart keeps it stopped."""
    run_sql(
        pg_dsn,
        "CREATE TABLE keep_t (id int PRIMARY KEY, v text)",
        "CREATE TABLE gone_t (id int PRIMARY KEY, v text)",
        "INSERT INTO keep_t VALUES (1, 'a')",
        "INSERT INTO gone_t VALUES (1, 'a')",
    )
    if mode == "admin":
        run_sql(pg_dsn, "CREATE PUBLICATION adm2 FOR TABLE keep_t, gone_t")
    settings = make_settings(state_dir, pg_dsn, publication="adm2" if mode == "admin" else None, maintenance="dagster")
    with running_service(settings) as client:
        client.call("create_table", dst="keep_t", src="public.keep_t")
        client.call("create_table", dst="gone_t", src="public.gone_t")
        pub = client.status()["publication"]
        assert (pub == "adm2") == (mode == "admin")
        run_sql(pg_dsn, "INSERT INTO gone_t VALUES (2, 'b')")
        results, _ = verify(settings, ["keep_t", "gone_t"], "union", client)
        assert all(r.match for r in results)
        run_sql(pg_dsn, f"ALTER PUBLICATION {pub} DROP TABLE gone_t")
        run_sql(pg_dsn, "INSERT INTO gone_t VALUES (3, 'c')", "INSERT INTO keep_t VALUES (3, 'c')")
        st = wait_until(
            lambda: next(
                (t for t in client.status()["tables"] if t["name"] == "gone_t" and t["state"] == "error"), None
            ),
            what="gone_t stopped",
        )
        err = st["error"]
        assert "gone_t" in err and "public.gone_t" in err and f"removed from publication {pub}" in err, err
        assert "stopped at LSN " in err and "noticed at LSN " in err and "\n" not in err, err
        if mode == "admin":
            assert "ALTER PUBLICATION adm2 ADD TABLE public.gone_t;" in err, err
        stop_lsn = err.split("stopped at LSN ")[1].split(";")[0]
        assert st["applied_lsn"] == stop_lsn
        results, _ = verify(settings, ["keep_t"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        r = mooncake(settings, "list-tables")
        assert f"removed from publication {pub}" in " ".join(r.stdout.split())
    # still stopped after a restart (nothing can bring its changes back)
    with running_service(settings) as client:
        st = next(t for t in client.status()["tables"] if t["name"] == "gone_t")
        assert st["state"] == "error" and f"publication {pub}" in st["error"]
    assert run_sql(pg_dsn, f"SELECT tablename FROM pg_publication_tables WHERE pubname = '{pub}'") == [("keep_t",)]


def test_publication_problems_each_with_its_fix(pg_dsn):
    """The administrator's publication must publish every change of every row and column, and a
    partitioned table under its root: each way it does not is an error with the statement to run."""
    from mooncake_assets.engine.pg import preflight

    run_sql(
        pg_dsn,
        "CREATE TABLE pt (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE pt_1 PARTITION OF pt FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE rf (id int PRIMARY KEY, v text)",
        "CREATE TABLE cl (id int PRIMARY KEY, v text, w text)",
        "CREATE TABLE ins (id int PRIMARY KEY)",
        "CREATE TABLE gen (id int PRIMARY KEY, g int GENERATED ALWAYS AS (id * 2) STORED)",
        "CREATE UNLOGGED TABLE unl (id int PRIMARY KEY)",
        'CREATE TABLE "User" (id int PRIMARY KEY)',
        "CREATE PUBLICATION p_leaf FOR TABLE pt, rf WHERE (id > 3), cl (id, v), gen",
        "CREATE PUBLICATION p_ins FOR TABLE ins WITH (publish = 'insert')",
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:

        def errors(src, pub):
            checks = preflight.check_table(c, src, publication=pub, own_publication="unused")
            return [ch for ch in checks if ch.level == "error"], checks

        e, _ = errors("public.pt", "p_leaf")
        assert (
            len(e) == 1
            and "partitioned" in e[0].message
            and e[0].fix == "ALTER PUBLICATION p_leaf SET (publish_via_partition_root = true);"
        ), e
        e, _ = errors("public.rf", "p_leaf")
        assert len(e) == 1 and "WHERE" in e[0].message and "DROP TABLE public.rf" in e[0].fix, e
        e, _ = errors("public.cl", "p_leaf")
        assert len(e) == 1 and "column(s) w" in e[0].message and "ADD TABLE public.cl;" in e[0].fix, e
        e, _ = errors("public.ins", "p_ins")
        assert (
            len(e) == 1
            and "update, delete, truncate" in e[0].message
            and "SET (publish = 'insert, update, delete, truncate')" in e[0].fix
        ), e
        e, _ = errors("public.unl", "p_leaf")
        assert [ch.fix for ch in e] == [
            "ALTER TABLE public.unl SET LOGGED;",
            "ALTER PUBLICATION p_leaf ADD TABLE public.unl;",
        ], e
        e, checks = errors("public.gen", "p_leaf")
        assert not e and any(
            ch.level == "ok" and "generated column(s) g are mirrored" in ch.message for ch in checks
        ), checks
        e, _ = errors("public.rf", "no_such_pub")
        assert (
            len(e) == 1 and "does not exist" in e[0].message and e[0].fix.startswith("CREATE PUBLICATION no_such_pub")
        ), e
        e, _ = errors("public.nope", "p_leaf")
        assert len(e) == 1 and "does not exist" in e[0].message, e
        # a name that does not resolve is explained as create-table explains it
        e, _ = errors("public.User", "p_leaf")
        assert (
            len(e) == 1
            and 'parsed as schema "public", table "user"' in e[0].message
            and 'public."User"' in e[0].message
        ), e
        e, _ = errors('"Sales Data"."Q1 Orders"', "p_leaf")
        assert len(e) == 1 and 'schema "Sales Data", table "Q1 Orders"' in e[0].message, e


def test_schema_without_usage_names_the_grant(pg_dsn):
    """A table in a schema the role may not use is found all the same (the catalogs are readable), and
    the check says which GRANT is missing, instead of a permission error from looking it up."""
    from mooncake_assets.engine.pg import preflight
    from mooncake_assets.engine.pg.names import resolve_table

    run_sql(pg_dsn, "CREATE SCHEMA hidden", "CREATE TABLE hidden.t (id int PRIMARY KEY)", "CREATE ROLE nousage NOLOGIN")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("SET ROLE nousage")
        oid, name = resolve_table(c, "hidden.t")
        assert str(name) == "hidden.t" and oid == run_sql(pg_dsn, "SELECT 'hidden.t'::regclass::oid")[0][0]
        checks = preflight.check_table(c, "hidden.t", publication=None, own_publication="unused")
        assert [ch.fix for ch in checks if ch.level == "error"] == ["GRANT USAGE ON SCHEMA hidden TO nousage;"], checks
