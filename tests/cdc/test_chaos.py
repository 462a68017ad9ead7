"""The chaos suite (``mooncake chaos``) under pytest.

- a short seeded run through the real command line (quick suite);
- every replayable case in ``tests/cases/`` (written there by a failing run) is replayed;
- a longer multi-seed run (slow).
A failing run writes ``tests/cases/chaos-<seed>-<steps>.json``, so the failure is replayed from then on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mooncake_assets.chaos import run_chaos

from ..helpers import REPO, make_settings, mooncake

CASES = REPO / "tests" / "cases"


def _cases():
    return sorted(CASES.glob("chaos-*.json")) if CASES.is_dir() else []


def _assert_clean(res):
    assert not res.divergences, f"{res.line()}\n" + "\n".join(json.dumps(d)[:1500] for d in res.divergences[:5])


def test_chaos_command_short_run(pg_cluster, state_dir):
    s = make_settings(state_dir, pg_cluster.dsn())
    r = mooncake(
        s,
        "chaos",
        "--seed",
        "101",
        "--steps",
        "40",
        "--phase",
        "20",
        "--schema-rate",
        "0.2",
        "--jitter",
        "--cases",
        str(CASES),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "seed 101: 40 steps (dagster maintenance, jitter)" in r.stdout and "0 divergences" in r.stdout, r.stdout
    changes = int(r.stdout.split(" schema changes")[0].rsplit(" ", 1)[1])
    assert changes >= 3, r.stdout  # ADD/DROP/RENAME/widening mixed in
    assert r.stdout.strip().splitlines()[-1] == "chaos: 1 seed(s) x 40 steps: 0 with divergences"


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.stem)
def test_replay_chaos_case(pg_cluster, case: Path):
    c = json.loads(case.read_text())
    _assert_clean(
        run_chaos(
            c["seed"],
            c["steps"],
            pg_cluster.dsn(),
            cases_dir=None,
            phase=c.get("phase", 25),
            schema_rate=c.get("schema_rate", 0.0),
            jitter=c.get("jitter", False),
        )
    )


@pytest.mark.slow
def test_chaos_seed_with_auto_maintenance(pg_cluster):
    """Seed 3 runs with ``maintenance: auto`` (the service persists, merges and compacts by itself while
    the run adds its own maintenance calls and kills); the short run above drives maintenance itself."""
    _assert_clean(run_chaos(3, 150, pg_cluster.dsn(), cases_dir=CASES, schema_rate=0.1))


def test_a_failing_seed_is_written_as_a_replayable_case(pg_cluster, tmp_path, monkeypatch):
    """The case file a divergent run leaves: seed, steps, phase, the divergences, the operation log;
    the database and state directory are kept for a post-mortem."""
    import shutil

    import psycopg

    from mooncake_assets import chaos

    def diverge(self):
        self.sql("SELECT 1")
        self.res.divergences.append({"step": 1, "reader": "union", "table": "c_items", "detail": "injected"})

    monkeypatch.setattr(chaos._Run, "run", diverge)
    res = run_chaos(5, 10, pg_cluster.dsn(), cases_dir=tmp_path, phase=5, log=lambda m: None)
    case = json.loads((tmp_path / "chaos-5-10.json").read_text())
    assert res.case_file == str(tmp_path / "chaos-5-10.json")
    assert (case["seed"], case["steps"], case["phase"]) == (5, 10, 5)
    assert case["result"]["divergences"][0]["detail"] == "injected" and case["ops"] == ["SELECT 1"]
    assert Path(case["state_dir"]).is_dir()
    shutil.rmtree(case["state_dir"], ignore_errors=True)
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute(f"DROP DATABASE {case['database']} WITH (FORCE)")
