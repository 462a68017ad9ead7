"""Two sources in one ``mooncake.yaml``, against two real databases of the test cluster: ``mooncake
sync`` mirrors what the patterns pick, every mirror verifies, ``list-tables``/``status`` show both,
a table created later in a mirrored schema is mirrored by the next ``sync``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_sql

pytestmark = pytest.mark.slow


def cli(cfg: Path, *args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")} | env
    return subprocess.run(
        [sys.executable, "-m", "mooncake_assets.cli", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        env=e,
        cwd=cfg.parent,
        timeout=timeout,
    )


@pytest.fixture()
def two_sources(pg_dsn, pg_dsn2, state_dir):
    """``(config path, env)``: source ``orders`` (schema sales whole minus sales.tmp_*, plus
    public.customers) on one database, ``metrics`` (public.*) on another; services stopped after."""
    run_sql(
        pg_dsn,
        "CREATE SCHEMA sales",
        "CREATE TABLE sales.orders (id int PRIMARY KEY, amount numeric(10,2))",
        "CREATE TABLE sales.items (id int PRIMARY KEY, name text)",
        "CREATE TABLE sales.tmp_scratch (id int PRIMARY KEY)",
        "CREATE TABLE public.customers (id int PRIMARY KEY, name text)",
        "CREATE TABLE public.not_picked (id int PRIMARY KEY)",
        "INSERT INTO sales.orders SELECT g, g * 1.5 FROM generate_series(1, 200) g",
        "INSERT INTO sales.items SELECT g, 'item ' || g FROM generate_series(1, 50) g",
        "INSERT INTO public.customers VALUES (1, 'ann'), (2, 'bob')",
    )
    run_sql(
        pg_dsn2,
        "CREATE TABLE public.samples (id bigint PRIMARY KEY, v double precision)",
        "INSERT INTO public.samples SELECT g, g / 3.0 FROM generate_series(1, 300) g",
    )
    cfg = state_dir / "mooncake.yaml"
    cfg.write_text(
        textwrap.dedent(
            """
            state_root: state
            sources:
              orders:
                dsn_env: ORDERS_PG_DSN
                schemas: [sales]
                tables: [public.customers, "public.nothing_*"]
                exclude: ["sales.tmp_*"]
              metrics:
                dsn_env: METRICS_PG_DSN
                tables: ["public.*"]
            """
        )
    )
    env = {"ORDERS_PG_DSN": pg_dsn, "METRICS_PG_DSN": pg_dsn2}
    yield cfg, env
    for name in ("orders", "metrics"):
        cli(cfg, "--source", name, "stop", env=env)


def asset_keys(cfg: Path) -> set[str]:
    """The asset keys of the Dagster definitions built from the sources file, in this process."""
    from mooncake_assets.dagster.definitions import build_definitions, load_config

    defs = build_definitions(load_config({"MOONCAKE_CONFIG": str(cfg)}))
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def sensor_observations(cfg: Path, source: str) -> set[str]:
    """One tick of the source's sensor in this process (Dagster's build_sensor_context, an ephemeral
    instance): the asset keys it observed."""
    import dagster as dg

    from mooncake_assets.dagster.definitions import build_definitions, load_config

    defs = build_definitions(load_config({"MOONCAKE_CONFIG": str(cfg)}))
    sensor = defs.resolve_sensor_def(f"replication_sensor__{source}")
    key = f"replication__{source}"
    with dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(), definitions=defs, resources={key: defs.resources[key]}
    ) as ctx:
        data = sensor.evaluate_tick(ctx)
    return {e.asset_key.to_user_string() for e in data.asset_events if isinstance(e, dg.AssetObservation)}


def test_two_sources_sync_verify_list_status(two_sources, monkeypatch):
    cfg, env = two_sources
    assert asset_keys(cfg) == set()  # nothing mirrored yet
    r = cli(cfg, "sync", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "source orders: 3 table(s) picked, 0 mirrored already, 3 to mirror" in r.stdout
    assert "source metrics: 1 table(s) picked, 0 mirrored already, 1 to mirror" in r.stdout
    assert "mirrored sales.orders as sales__orders: 200 rows" in r.stdout
    assert "mirrored public.samples as samples: 300 rows" in r.stdout
    assert "warning: source orders: tables: public.nothing_* matches no table" in r.stderr
    assert "tmp_scratch" not in r.stdout and "not_picked" not in r.stdout

    state = cfg.parent / "state"
    assert (state / "orders" / "tables.json").exists() and (state / "metrics" / "tables.json").exists()
    # each source is its own state directory: its own slot
    slots = {json.loads((state / n / "tables.json").read_text())["slot"] for n in ("orders", "metrics")}
    assert len(slots) == 2

    run_sql(
        env["ORDERS_PG_DSN"],
        "UPDATE sales.orders SET amount = 0 WHERE id <= 10",
        "DELETE FROM sales.items WHERE id > 40",
    )
    run_sql(env["METRICS_PG_DSN"], "INSERT INTO samples VALUES (1000, 1)")
    r = cli(cfg, "verify", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "source orders:" in r.stdout and "source metrics:" in r.stdout
    assert "verified: 3/3 tables match" in r.stdout and "verified: 1/1 tables match" in r.stdout

    r = cli(cfg, "list-tables", "--json", env=env)
    assert r.returncode == 0, r.stderr
    listed = {s: sorted(t["name"] for t in v["tables"]) for s, v in json.loads(r.stdout)["sources"].items()}
    assert listed == {"orders": ["customers", "sales__items", "sales__orders"], "metrics": ["samples"]}
    r = cli(cfg, "list-tables", env=env)
    assert r.returncode == 0 and "source orders: mirrored tables" in r.stdout and "source metrics: mirrored" in r.stdout

    r = cli(cfg, "status", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "source orders (state" in r.stdout and "source metrics (state" in r.stdout
    assert r.stdout.count("mooncake service: running") == 2

    # one source's per-table command
    r = cli(cfg, "--source", "metrics", "persist", "samples", env=env)
    assert r.returncode == 0 and "persist samples" in r.stdout, r.stderr

    before = asset_keys(cfg)
    mirrors = {"orders/sales/orders", "orders/sales/items", "orders/public/customers", "metrics/public/samples"}
    assert mirrors <= before
    assert "flush/orders/sales/orders" in before and "postgres/metrics/public/samples" in before
    for k, v in env.items():  # the resources read the DSN variables when the sensor runs
        monkeypatch.setenv(k, v)
    assert sensor_observations(cfg, "orders") == {
        "orders/sales/orders",
        "orders/sales/items",
        "orders/public/customers",
    }
    assert sensor_observations(cfg, "metrics") == {"metrics/public/samples"}

    # a new table in a mirrored schema: the next sync mirrors it, the others stay
    run_sql(
        env["ORDERS_PG_DSN"],
        "CREATE TABLE sales.refunds (id int PRIMARY KEY, order_id int)",
        "INSERT INTO sales.refunds VALUES (1, 3), (2, 7)",
    )
    r = cli(cfg, "sync", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "source orders: 4 table(s) picked, 3 mirrored already, 1 to mirror" in r.stdout
    assert "mirrored sales.refunds as sales__refunds: 2 rows" in r.stdout
    assert "source metrics: 1 table(s) picked, 1 mirrored already, 0 to mirror" in r.stdout
    r = cli(cfg, "--source", "orders", "verify", env=env)
    assert r.returncode == 0 and "verified: 4/4 tables match" in r.stdout, r.stdout + r.stderr
    # the definitions built again (a reload, no restart) have the new table's assets too
    after = asset_keys(cfg)
    assert after - before == {f"{k}orders/sales/refunds" for k in ("", "postgres/")} | {
        f"{kind}/orders/sales/refunds" for kind in ("flush", "deletion_vectors", "index_merge", "compaction")
    }
    r = cli(cfg, "stop", env={})  # every source's service (stop needs no DSN)
    assert r.returncode == 0, r.stderr
    assert (
        "source orders: mooncake service stopped" in r.stdout and "source metrics: mooncake service stopped" in r.stdout
    )


def test_sync_names_the_missing_variable(two_sources):
    cfg, env = two_sources
    r = cli(cfg, "sync", "--dry-run", env={"ORDERS_PG_DSN": env["ORDERS_PG_DSN"]})
    assert r.returncode == 1
    assert "environment variable METRICS_PG_DSN is not set" in r.stderr
    assert "would mirror sales.orders as sales__orders" in r.stdout  # the other source still ran
