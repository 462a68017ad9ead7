"""The Dagster UI: ``dagster dev -w workspace.yaml`` on loopback serves the asset graph (GraphQL and a
screenshot taken with headless Chromium into ``test-output/<test>/``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from mooncake_assets.engine.pg.embedded import free_port as _free_port
from mooncake_assets.engine.pg.embedded import reset_signals as _reset_signals

from ..helpers import REPO, make_settings
from .browser import HeadlessChromium, find_chromium
from .conftest import PGBENCH

KINDS = ["flush", "deletion_vectors", "index_merge", "compaction"]
ERROR_MARKERS = (
    "Unexpected GraphQL error",
    "PythonError",
    "Something went wrong",
    "An error occurred",
    "Error loading",
    "Could not load",
    "DagsterInvalidDefinitionError",
)


def graphql(port: int, query: str, variables: dict | None = None, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        doc = json.load(r)
    if doc.get("errors"):
        raise AssertionError(f"GraphQL errors: {doc['errors']}")
    return doc["data"]


LOCATIONS = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""

ASSETS = """{ assetNodes { assetKey { path } dependencyKeys { path } groupName kinds
  assetChecksOrError { __typename ... on AssetChecks { checks { name } } } } }"""

REPOS = """{ repositoriesOrError { __typename ... on RepositoryConnection { nodes { name
  sensors { name minIntervalSeconds sensorState { status } }
  schedules { name cronSchedule scheduleState { status } }
  jobs { name } } } } }"""


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop ``dagster dev`` (leader of its own process group) and whatever it started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # dagster dev shuts its webserver, daemon and code servers down
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(2)
    if proc.poll() is None:
        proc.wait(10)


@pytest.mark.ui
def test_dagster_dev_asset_graph(pg_dsn, state_dir, out_dir):
    if find_chromium() is None:
        pytest.skip("chromium is not installed (make system-deps installs it)")
    make_settings(state_dir, pg_dsn, maintenance="dagster")
    home = Path(tempfile.mkdtemp(prefix="mooncake-dagster-home-"))
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    port = _free_port()
    env = dict(
        os.environ,
        DAGSTER_HOME=str(home),
        MOONCAKE_STATE_DIR=str(state_dir),
        MOONCAKE_TABLES=",".join(PGBENCH),
        MOONCAKE_DAGSTER_AUTOMATION="off",
    )  # nothing runs by itself during the test: the graph is what we look at
    exe = Path(sys.executable).parent / "dagster"
    log = open(out_dir / "dagster-dev.log", "wb")
    dev = subprocess.Popen(
        [str(exe), "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=str(REPO),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_reset_signals,
    )
    browser = None
    try:
        # 1. the code location loads
        deadline = time.time() + 180
        entry = None
        while time.time() < deadline:
            assert dev.poll() is None, f"dagster dev exited ({dev.returncode}); see {out_dir / 'dagster-dev.log'}"
            try:
                ws = graphql(port, LOCATIONS, timeout=5)["workspaceOrError"]
                entries = ws.get("locationEntries") or []
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    entry = entries[0]
                    break
            except (OSError, AssertionError):
                pass
            time.sleep(1)
        assert entry is not None, "the code location did not load within 180 s"
        assert entry["locationOrLoadError"]["__typename"] == "RepositoryLocation", entry

        # 2. the asset graph: mirrors, maintenance chain, downstream assets, checks
        nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(port, ASSETS)["assetNodes"]}
        deps = {k: {"/".join(d["path"]) for d in n["dependencyKeys"]} for k, n in nodes.items()}
        for t in PGBENCH:
            assert deps[f"mirror/{t}"] == {f"postgres/public/{t}"}
            assert set(nodes[f"mirror/{t}"]["kinds"]) >= {"postgres", "iceberg", "duckdb"}
            chain = [f"mirror/{t}"] + [f"{k}/{t}" for k in KINDS]
            for up, down in zip(chain, chain[1:]):
                assert deps[down] == {up}, (down, deps[down])
            checks = {c["name"] for c in nodes[f"mirror/{t}"]["assetChecksOrError"]["checks"]}
            assert checks == {"mirror_matches_source", "replication_lag"}
        assert deps["analytics/branch_balances"] == {
            "mirror/pgbench_accounts",
            "mirror/pgbench_branches",
            "mirror/pgbench_history",
        }
        assert deps["analytics/teller_activity"] == {"mirror/pgbench_tellers", "mirror/pgbench_history"}

        # 3. the sensor, the schedules and the jobs
        repos = graphql(port, REPOS)["repositoriesOrError"]["nodes"]
        sensors = {s["name"]: s for r in repos for s in r["sensors"]}
        schedules = {s["name"]: s for r in repos for s in r["schedules"]}
        jobs = {j["name"] for r in repos for j in r["jobs"]}
        assert sensors["replication_sensor"]["minIntervalSeconds"] == 10
        assert schedules["deletion_vectors_schedule"]["cronSchedule"] == "* * * * *"
        assert schedules["index_merge_schedule"]["cronSchedule"] == "*/10 * * * *"
        assert schedules["compaction_schedule"]["cronSchedule"] == "0 * * * *"
        assert {"flush_schedule", "full_optimize_schedule"} <= set(schedules)
        assert {"flush_job", "deletion_vectors_job", "index_merge_job", "compaction_job", "full_optimize_job"} <= jobs

        # 4. the pictures: the global lineage (one node per stage) and one table's chain, in a browser
        browser = HeadlessChromium(out_dir / "chromium.log")
        stages = ["postgres", "mirror", *KINDS, "analytics"]

        def ready(expected: list[str], count: tuple[str, int] | None = None):
            def check(page):
                page.click_button("Skip")  # Dagster's "join the community" dialog covers the graph on a fresh profile
                text = page.text()
                bad = [m for m in ERROR_MARKERS if m in text]
                assert not bad, f"the page shows an error ({bad}): {text[:1000]}"
                ok = all(e in text for e in expected) and (count is None or text.count(count[0]) >= count[1])
                return text if ok else None

            return check

        browser.goto(f"http://127.0.0.1:{port}/asset-groups")
        browser.wait_for(ready(stages + ["Global asset lineage"]), timeout=90)
        time.sleep(2.0)  # let the layout settle
        browser.click_button("Skip")
        shot = browser.screenshot(out_dir / "asset_graph.png")
        assert shot.stat().st_size > 20_000, "the screenshot is suspiciously small"
        (out_dir / "asset_graph.txt").write_text(browser.text())

        browser.goto(
            f"http://127.0.0.1:{port}/assets/compaction/pgbench_accounts?view=lineage"
            "&lineageScope=upstream&lineageDepth=6"
        )
        text = browser.wait_for(
            ready(stages[:-1] + ["pgbench_accounts"], ("Never materialized", 4)), timeout=90
        )  # mirror/<t> may be recorded by the sensor already
        time.sleep(2.0)
        browser.click_button("Skip")
        shot = browser.screenshot(out_dir / "table_lineage.png")
        assert shot.stat().st_size > 20_000, "the screenshot is suspiciously small"
        (out_dir / "table_lineage.txt").write_text(text)
        final = browser.text()
        assert not [m for m in ERROR_MARKERS if m in final], final[:1000]
    finally:
        if browser is not None:
            browser.close()
        _stop_group(dev)
        log.close()
        shutil.rmtree(home, ignore_errors=True)
