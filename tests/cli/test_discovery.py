"""Table discovery: with ``discover_interval_s`` the running service mirrors a table created later in a
mirrored schema by itself — no ``sync``, no restart — through the same create-table path (pre-flight,
publication, initial copy at an exported snapshot), against the real test cluster:

- a sources file, the real CLI (``start``, ``list-tables``, ``verify``, ``sync``) and the real service:
  a new table in the schema appears ``ready`` in ``list-tables``, its changes verify, a table no
  pattern picks is left alone, a pattern that matches nothing is still reported, and the Dagster
  definitions built afterwards (a definitions reload) hold the new table's assets while the same
  service process keeps running;
- a role that reads through an administrator's publication: a new table it may read is mirrored, one
  it may not read is listed as ``error`` with the privilege named, never ``ready``, and is mirrored
  at the next try once it is granted; the publication is never altered.
"""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake, replication_role, run_sql, running_service, service_tables, wait_until
from .test_sources import asset_keys, cli

pytestmark = pytest.mark.slow

PASSWORD = "d1sc0ver-Pw!"


def _status(cfg, source: str) -> dict:
    """The running service's status of ``source`` straight from its socket (no CLI start-up per poll)."""
    from mooncake_assets.engine.service import ServiceClient
    from mooncake_assets.sources import load_config

    s = load_config(cfg).source(source).settings(need_dsn=False)
    c = ServiceClient(s.socket_path)
    try:
        return c.status()
    finally:
        c.close()


def _ready(cfg, source: str, name: str):
    st = _status(cfg, source)
    return next((t for t in st["tables"] if t["name"] == name and t["state"] == "ready"), None)


def test_new_table_in_a_mirrored_schema_is_mirrored_without_sync_or_restart(pg_dsn, state_dir):
    run_sql(
        pg_dsn,
        "CREATE SCHEMA shop",
        "CREATE TABLE shop.orders (id int PRIMARY KEY, amount numeric(10,2))",
        "INSERT INTO shop.orders SELECT g, g * 1.5 FROM generate_series(1, 100) g",
    )
    cfg = state_dir / "mooncake.yaml"
    cfg.write_text(
        textwrap.dedent(
            """
            state_root: state
            sources:
              orders:
                dsn_env: ORDERS_PG_DSN
                schemas: [shop]
                tables: ["public.nothing_*"]
                discover_interval_s: 0.5
            """
        )
    )
    env = {"ORDERS_PG_DSN": pg_dsn}
    try:
        r = cli(cfg, "start", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        pid = (state_dir / "state" / "orders" / "service.pid").read_text().strip()
        # the first look, right after the start, mirrors what the patterns pick
        wait_until(lambda: _ready(cfg, "orders", "shop__orders"), 120, "shop.orders mirrored by discovery")
        before = asset_keys(cfg)
        assert "orders/shop/orders" in before and "orders/shop/refunds" not in before

        # created while the service runs, with rows, and changed right after: nobody runs sync
        run_sql(
            pg_dsn,
            "CREATE TABLE shop.refunds (id int PRIMARY KEY, order_id int, note text)",
            "INSERT INTO shop.refunds SELECT g, g % 7, 'r' || g FROM generate_series(1, 40) g",
            "CREATE TABLE public.not_picked (id int PRIMARY KEY)",
            "INSERT INTO public.not_picked VALUES (1)",
        )
        wait_until(lambda: _ready(cfg, "orders", "shop__refunds"), 120, "shop.refunds mirrored by discovery")
        run_sql(
            pg_dsn,
            "INSERT INTO shop.refunds SELECT g, g % 5, 'late ' || g FROM generate_series(41, 90) g",
            "UPDATE shop.refunds SET note = 'changed' WHERE id <= 10",
            "DELETE FROM shop.refunds WHERE id BETWEEN 20 AND 25",
            "UPDATE shop.orders SET amount = 0 WHERE id <= 5",
        )
        r = cli(cfg, "verify", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "verified: 2/2 tables match" in r.stdout, r.stdout

        r = cli(cfg, "list-tables", "--json", env=env)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)["sources"]["orders"]
        assert sorted((t["name"], t["state"]) for t in doc["tables"]) == [
            ("shop__orders", "ready"),
            ("shop__refunds", "ready"),
        ]
        assert doc["discovery"]["unmatched"] == ["tables: public.nothing_*"]  # still said
        assert doc["discovery"]["failed"] == []
        r = cli(cfg, "list-tables", env=env)
        assert r.returncode == 0, r.stderr
        assert "warning: source orders: tables: public.nothing_* matches no table" in r.stdout, r.stdout
        assert "not_picked" not in r.stdout

        # sync finds nothing left to do and still names the pattern that matches nothing
        r = cli(cfg, "sync", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "source orders: 2 table(s) picked, 2 mirrored already, 0 to mirror" in r.stdout
        assert "warning: source orders: tables: public.nothing_* matches no table" in r.stderr

        # the definitions built now (what Dagster's "Reload definitions" does) hold the new table
        after = asset_keys(cfg)
        assert after - before == {f"{k}orders/shop/refunds" for k in ("", "postgres/")} | {
            f"{kind}/orders/shop/refunds" for kind in ("flush", "deletion_vectors", "index_merge", "compaction")
        }
        assert (state_dir / "state" / "orders" / "service.pid").read_text().strip() == pid  # no restart
    finally:
        cli(cfg, "stop", env=env)


@pytest.fixture()
def reader_role(pg_cluster, pg_dsn):
    """A role with LOGIN REPLICATION and a SCRAM password; yields its name. Dropped after."""
    with replication_role(pg_cluster.dsn(), pg_dsn, "disc_", PASSWORD) as role:
        yield role


def test_a_new_table_the_role_cannot_read_is_an_error_not_ready(pg_cluster, pg_dsn, reader_role, state_dir):
    admin, db = pg_dsn, pg_dsn.rsplit("/", 1)[1]
    run_sql(
        admin,
        "CREATE SCHEMA app",
        f"GRANT USAGE ON SCHEMA app TO {reader_role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA app GRANT SELECT ON TABLES TO {reader_role}",
        "CREATE TABLE app.orders (id int PRIMARY KEY, v text)",
        "INSERT INTO app.orders SELECT g, 'o' || g FROM generate_series(1, 30) g",
        "CREATE PUBLICATION app_pub FOR TABLES IN SCHEMA app",
    )
    dsn = f"postgresql://{reader_role}:{PASSWORD}@127.0.0.1:{pg_cluster.port}/{db}"
    patterns = {"schemas": ["app"], "tables": [], "exclude": [], "interval_s": 0.5, "retry_s": 1}
    settings = make_settings(state_dir, dsn, publication="app_pub", extra={"discover": patterns})
    with running_service(settings) as client:
        wait_until(
            lambda: (service_tables(settings).get("app__orders") or {}).get("state") == "ready", 120, "app.orders"
        )
        run_sql(
            admin,
            "CREATE TABLE app.items (id int PRIMARY KEY, name text)",  # readable: the default privileges
            "INSERT INTO app.items SELECT g, 'i' || g FROM generate_series(1, 20) g",
            "CREATE TABLE app.secrets (id int PRIMARY KEY, s text)",
            f"REVOKE SELECT ON app.secrets FROM {reader_role}",
            "INSERT INTO app.secrets VALUES (1, 'x')",
        )
        wait_until(lambda: (service_tables(settings).get("app__items") or {}).get("state") == "ready", 120, "app.items")

        def failed():
            d = client.status()["discovery"]
            return next((f for f in d["failed"] if f["name"] == "app__secrets"), None)

        f = wait_until(failed, 60, "app.secrets listed as failed")
        assert f["state"] == "error" and f["source"] == "app.secrets"
        assert "app.secrets" in f["error"] and "SELECT" in f["error"] and "\n" not in f["error"], f
        assert PASSWORD not in json.dumps(client.status())
        assert "app__secrets" not in service_tables(settings)  # never a mirror, never ready
        r = mooncake(settings, "list-tables")
        assert r.returncode == 0, r.stderr
        assert "app__secrets" in r.stdout and "not mirrored" in r.stdout, r.stdout

        # the administrator grants it: the next try (retry_s) mirrors it and the error is gone
        run_sql(admin, f"GRANT SELECT ON app.secrets TO {reader_role}")
        wait_until(
            lambda: (service_tables(settings).get("app__secrets") or {}).get("state") == "ready", 120, "app.secrets"
        )
        assert client.status()["discovery"]["failed"] == []
        run_sql(
            admin,
            "INSERT INTO app.items VALUES (100, 'late')",
            "UPDATE app.orders SET v = 'x' WHERE id < 4",
            "INSERT INTO app.secrets VALUES (2, 'y')",
        )
        results, lsn = verify(settings, ["app__orders", "app__items", "app__secrets"], "union", client)
        assert [r.match for r in results] == [True, True, True], [r.line() for r in results]
    assert run_sql(admin, "SELECT count(*) FROM pg_publication_rel") == [(0,)]  # FOR TABLES IN SCHEMA: never altered


def test_edited_patterns_reach_the_running_service_without_a_restart(pg_dsn, state_dir):
    """mooncake.yaml edited while the service runs: a schema added to ``schemas`` is mirrored by the same
    service process (no command, no restart); a file edited into an invalid one keeps the patterns in use."""
    run_sql(
        pg_dsn,
        "CREATE SCHEMA shop",
        "CREATE SCHEMA billing",
        "CREATE TABLE shop.orders (id int PRIMARY KEY)",
        "INSERT INTO shop.orders SELECT g FROM generate_series(1, 10) g",
        "CREATE TABLE billing.invoices (id int PRIMARY KEY, total int)",
        "INSERT INTO billing.invoices SELECT g, g FROM generate_series(1, 30) g",
    )
    cfg = state_dir / "mooncake.yaml"
    text = "state_root: state\nsources:\n  o:\n    dsn_env: O_DSN\n    schemas: [{}]\n    discover_interval_s: 0.5\n"
    cfg.write_text(text.format("shop"))
    env = {"O_DSN": pg_dsn}
    try:
        r = cli(cfg, "start", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        pid = (state_dir / "state" / "o" / "service.pid").read_text().strip()
        wait_until(lambda: _ready(cfg, "o", "shop__orders"), 120, "shop.orders mirrored")
        from mooncake_assets.engine.service import ServiceClient
        from mooncake_assets.sources import load_config

        client = ServiceClient(load_config(cfg).source("o").settings(need_dsn=False).socket_path)
        try:
            cfg.write_text("sources: [not, a, mapping]\n")  # invalid: logged, the patterns in use stay
            time.sleep(2.0)  # a few looks
            assert client.status()["discovery"]["patterns"]["schemas"] == ["shop"]
        finally:
            client.close()
        cfg.write_text(text.format("shop, billing"))
        wait_until(lambda: _ready(cfg, "o", "billing__invoices"), 120, "billing.invoices mirrored after the edit")
        st = _status(cfg, "o")
        assert st["discovery"]["patterns"]["schemas"] == ["shop", "billing"]
        assert (state_dir / "state" / "o" / "service.pid").read_text().strip() == pid  # no restart
        r = cli(cfg, "verify", env=env)
        assert r.returncode == 0 and "verified: 2/2 tables match" in r.stdout, r.stdout + r.stderr
    finally:
        cli(cfg, "stop", env=env)
