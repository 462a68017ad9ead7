"""Fixtures of the Dagster layer's tests: a small pgbench-shaped source in a fresh database, a state dir
bound to it (maintenance driven by Dagster), the Definitions built for it, and an in-memory Dagster
instance. The real service runs as a background process; every test stops it at the end."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from mooncake_assets.config import Settings
from mooncake_assets.dagster.definitions import DagsterConfig, build_definitions, materialize_keys
from mooncake_assets.dagster.resources import ReplicationResource, parse_tables
from mooncake_assets.engine.service.process import stop_service

from ..helpers import REPO, make_settings

PGBENCH = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]

SCHEMA = """
CREATE TABLE pgbench_branches (bid int PRIMARY KEY, bbalance int NOT NULL, filler char(88));
CREATE TABLE pgbench_tellers (tid int PRIMARY KEY, bid int NOT NULL, tbalance int NOT NULL, filler char(84));
CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84));
CREATE TABLE pgbench_history (tid int, bid int, aid int, delta int, mtime timestamp, filler char(22));
INSERT INTO pgbench_branches SELECT b, 0 FROM generate_series(1, 2) b;
INSERT INTO pgbench_tellers SELECT t, (t - 1) / 10 + 1, 0 FROM generate_series(1, 20) t;
INSERT INTO pgbench_accounts SELECT a, (a - 1) / 1000 + 1, 0, '' FROM generate_series(1, 2000) a;
"""


def tpcb(dsn: str, n: int, seed: int = 1) -> None:
    """``n`` pgbench TPC-B-like transactions (the same statements pgbench's default script runs)."""
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(n):
            aid, bid, tid, delta = rng.randint(1, 2000), rng.randint(1, 2), rng.randint(1, 20), rng.randint(-5000, 5000)
            with c.transaction():
                c.execute("UPDATE pgbench_accounts SET abalance = abalance + %s WHERE aid = %s", (delta, aid))
                c.execute("UPDATE pgbench_tellers SET tbalance = tbalance + %s WHERE tid = %s", (delta, tid))
                c.execute("UPDATE pgbench_branches SET bbalance = bbalance + %s WHERE bid = %s", (delta, bid))
                c.execute(
                    "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (%s, %s, %s, %s, now())",
                    (tid, bid, aid, delta),
                )


@dataclass
class MooncakeEnv:
    """One test's world: source DSN, mooncake settings, Dagster definitions and instance."""

    dsn: str
    settings: Settings
    config: DagsterConfig
    defs: dg.Definitions
    instance: dg.DagsterInstance

    @property
    def replication(self) -> ReplicationResource:
        return self.defs.resources["replication"]

    def materialize(
        self, *keys: str, raise_on_error: bool = True, run_config=None, checks: bool = False
    ) -> dg.ExecuteInProcessResult:
        """Materialize ``keys`` (without their asset checks unless ``checks``)."""
        return materialize_keys(
            self.defs, keys, instance=self.instance, raise_on_error=raise_on_error, run_config=run_config, checks=checks
        )

    def mirror_all(self) -> dg.ExecuteInProcessResult:
        return self.materialize(*[f"mirror/{t}" for t in PGBENCH])

    def run_with_mirrors(self, *assets, tables=PGBENCH, **kw) -> dg.ExecuteInProcessResult:
        """Materialize ``assets`` (test-defined, reading mirrors through the I/O manager) with the mirror
        assets' definitions present (not materialized) and the resources of ``defs``."""
        mirrors = [self.defs.get_assets_def(dg.AssetKey(["mirror", t])) for t in tables]
        return dg.materialize(
            [*mirrors, *assets],
            selection=[a.key for a in assets],
            resources=self.defs.resources,
            instance=self.instance,
            **kw,
        )

    def union_barrier(self) -> str:
        """Wait until the service has applied everything committed in the source so far."""
        return self.replication.union_reader().barrier()

    def pg_rows(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.dsn) as c:
            return c.execute(sql).fetchall()

    def rebuild(self, **thresholds) -> MooncakeEnv:
        """The same world with other thresholds."""
        cfg = DagsterConfig(
            state_dir=self.config.state_dir,
            tables=self.config.tables,
            database=self.config.database,
            thresholds={**self.config.thresholds, **thresholds},
        )
        return MooncakeEnv(self.dsn, self.settings, cfg, build_definitions(cfg), self.instance)


def pytest_collection_modifyitems(config, items):
    # Dagster's own code calls its deprecated InitResourceContext.dagster_run when it builds a resource that
    # depends on another (our I/O manager on the replication resource); that is not ours to fix
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(
                pytest.mark.filterwarnings("ignore:InitResourceContext.dagster_run is deprecated:DeprecationWarning")
            )


@pytest.fixture()
def pgbench_dsn(pg_dsn) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(SCHEMA)
    return pg_dsn


@pytest.fixture()
def mc(pgbench_dsn, state_dir):
    settings = make_settings(state_dir, pgbench_dsn, maintenance="dagster")
    config = DagsterConfig(
        state_dir=state_dir, tables=parse_tables(PGBENCH), database=str(state_dir / "dagster.duckdb")
    )
    instance = dg.DagsterInstance.ephemeral()
    try:
        yield MooncakeEnv(pgbench_dsn, settings, config, build_definitions(config), instance)
    finally:
        instance.dispose()
        stop_service(settings)


@pytest.fixture()
def out_dir(request) -> Path:
    """``test-output/<test name>/`` at the repo root (git-ignored)."""
    d = REPO / "test-output" / request.node.name
    d.mkdir(parents=True, exist_ok=True)
    return d
