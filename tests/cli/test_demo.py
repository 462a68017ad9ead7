"""`mooncake demo` end to end on its own embedded Postgres, then the persisted tables checked by PyIceberg."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mooncake_assets.config import load_settings
from mooncake_assets.engine.pg import EmbeddedPostgres
from mooncake_assets.engine.service.process import stop_service


def _run(state, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_demo_verifies_and_leaves_persisted_state(state_dir):
    state = state_dir / "demo"
    try:
        r = _run(state, "demo", "--seconds", "8", "--clients", "2")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("verified: 4/4 tables match at LSN "), r.stdout[-2000:]
        assert r.stdout.count("persist of 4 tables") + r.stdout.count("flush of 4 tables") >= 2
        # Postgres's and the mirror's balances are read at one LSN, so they are equal
        ticks = [line for line in r.stdout.splitlines() if "| at LSN " in line]
        assert ticks and all(line.endswith("(same)") for line in ticks), r.stdout[-3000:]
        stop_service(load_settings(state))
        assert _run(state, "pg", "start").returncode == 0  # a no-op: it is running
        v = _run(state, "verify", "--reader", "pyiceberg")
        assert v.returncode == 0, v.stdout + v.stderr
        assert v.stdout.strip().splitlines()[-1].startswith("verified: 4/4 tables match at LSN ")
        # DuckDB's iceberg extension reads the same v3 tables (DVs in Puffin) and agrees
        d = _run(state, "verify", "--reader", "duckdb-iceberg")
        assert d.returncode == 0, d.stdout + d.stderr
        assert d.stdout.strip().splitlines()[-1].startswith("verified: 4/4 tables match at LSN ")
    finally:
        stop_service(load_settings(state))
        EmbeddedPostgres(state).destroy()
