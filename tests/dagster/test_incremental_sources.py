"""Incremental mirror inputs in the definitions built from a sources file: a downstream asset of the
second source's mirror (loaded through ``io_manager__metrics``, its output stored through the default
``io_manager``) reads only the changes after its first run, its cursor advances, and its result equals
Postgres's (two real databases, two real services, assets materialized in-process)."""

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mooncake_assets.dagster.resources import CURSORS, INCREMENTAL, MirrorChanges
from tests.cli.test_sources import cli, two_sources  # noqa: F401  (the fixture)
from tests.helpers import run_sql

pytestmark = pytest.mark.slow

SAMPLES = dg.AssetKey(["metrics", "public", "samples"])


@dg.asset(
    key=["analytics", "samples_total"],
    ins={"samples": dg.AssetIn(key=SAMPLES, metadata={INCREMENTAL: True, "columns": ["id", "v"]})},
)
def samples_total(context: dg.AssetExecutionContext, samples: MirrorChanges) -> pa.Table:
    """Row count and sum of v of the mirror, folded from the previous output and the changes."""
    n = 0 if samples.previous is None else int(samples.previous["n"][0].as_py())
    total = 0.0 if samples.previous is None else float(samples.previous["total"][0].as_py())
    ins, dels = samples.inserts, samples.deletes
    n += ins.num_rows - dels.num_rows
    total += float(pc.sum(ins["v"]).as_py() or 0) - float(pc.sum(dels["v"]).as_py() or 0)
    context.add_output_metadata(
        {"read_rows": samples.rows.num_rows, "full": samples.full, "since": samples.since or ""}
    )
    return pa.table({"n": [n], "total": [total]})


def _materialize(defs: dg.Definitions) -> dict:
    res = dg.materialize([*defs.assets, samples_total], selection=[samples_total.key], resources=defs.resources)
    assert res.success
    (event,) = res.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


def _stored(database: str) -> tuple[tuple[int, float], str]:
    con = duckdb.connect(database, read_only=True)
    try:
        n, total = con.execute("SELECT n, total FROM analytics.samples_total").fetchone()
        (lsn,) = con.execute(f"SELECT lsn FROM {CURSORS} WHERE op = 'analytics__samples_total'").fetchone()
        return (int(n), round(float(total), 6)), lsn
    finally:
        con.close()


def _pg(dsn: str) -> tuple[int, float]:
    import psycopg

    with psycopg.connect(dsn) as c:
        n, total = c.execute("SELECT count(*), sum(v) FROM samples").fetchone()
    return int(n), round(float(total), 6)


def test_incremental_asset_of_a_sources_file_mirror(two_sources, monkeypatch):  # noqa: F811
    from mooncake_assets.dagster.definitions import build_definitions, load_config

    cfg, env = two_sources
    r = cli(cfg, "sync", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    for k, v in env.items():  # the resources read the DSN variables when a run needs them
        monkeypatch.setenv(k, v)
    config = load_config({"MOONCAKE_CONFIG": str(cfg)})
    defs = build_definitions(config)
    # the mirror loads through its source's I/O manager; the downstream output goes to the default one
    assert defs.resources["io_manager"] is defs.resources["io_manager__orders"]

    meta = _materialize(defs)
    assert meta["full"] is True and meta["read_rows"] == 300
    stored, first = _stored(config.database)
    assert stored == _pg(env["METRICS_PG_DSN"])

    run_sql(
        env["METRICS_PG_DSN"],
        "UPDATE samples SET v = v + 1 WHERE id <= 3",
        "DELETE FROM samples WHERE id > 295",
        "INSERT INTO samples VALUES (1000, 7.25), (1001, 0.5)",
    )
    r = cli(cfg, "--source", "metrics", "persist", "samples", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    meta = _materialize(defs)
    # only the changes: 3 updates (a delete and an insert each), 5 deletes, 2 inserts
    assert meta["full"] is False and meta["since"] == first and meta["read_rows"] == 2 * 3 + 5 + 2
    stored, second = _stored(config.database)
    assert stored == _pg(env["METRICS_PG_DSN"]) and second != first

    meta = _materialize(defs)  # nothing new persisted: an empty feed from the new cursor
    assert meta["full"] is False and meta["since"] == second and meta["read_rows"] == 0
    assert _stored(config.database) == (_pg(env["METRICS_PG_DSN"]), second)
