"""Issue 7 part 6: the chaos suite (``mooncake chaos``) under pytest.

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
    r = mooncake(s, "chaos", "--seed", "101", "--steps", "40", "--phase", "20", "--cases", str(CASES), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "seed 101: 40 steps" in r.stdout and "0 divergences" in r.stdout, r.stdout
    assert r.stdout.strip().splitlines()[-1] == "chaos: 1 seed(s) x 40 steps: 0 with divergences"


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(), ids=lambda p: p.stem)
def test_replay_chaos_case(pg_cluster, case: Path):
    c = json.loads(case.read_text())
    _assert_clean(run_chaos(c["seed"], c["steps"], pg_cluster.dsn(), cases_dir=None, phase=c.get("phase", 25)))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4])
def test_chaos_seeds(pg_cluster, seed):
    """seed 3 runs with maintenance: auto (the service persists and compacts by itself), seed 4 with
    maintenance driven by the run."""
    _assert_clean(run_chaos(seed, 150, pg_cluster.dsn(), cases_dir=CASES))
