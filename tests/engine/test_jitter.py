"""Seeded jitter (engine/faults.py, ``MOONCAKE_JITTER``): the delays at each point are a
function of the seed alone, the same in every process, so a failing chaos seed replays with them."""

from __future__ import annotations

import os
import subprocess
import sys

from mooncake_assets.engine import faults

POINTS = ["catalog:lookup", "stream:apply", "persist:unlocked", "stream:start"]


def _sequence(seed: str, n: int = 40) -> list[float]:
    return [faults.jitter_delay(seed, p, i) for p in POINTS for i in range(n)]


def test_delays_are_a_function_of_the_seed():
    a, b = _sequence("1015.1"), _sequence("1015.1")
    assert a == b
    assert _sequence("1015.2") != a and _sequence("1016.1") != a
    assert all(0.0 <= d <= 0.2 for d in a)
    hits = sum(d > 0 for d in a)
    assert 0 < hits < len(a)  # some passes stall, most do not (probability 0.3)


def test_the_same_delays_in_another_process_whatever_its_hash_seed():
    code = (
        "from mooncake_assets.engine import faults; "
        "print([round(faults.jitter_delay('7.0', p, i), 9) for p in ('catalog:lookup', 'stream:apply') "
        "for i in range(20)])"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": h},
        ).stdout
        for h in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(
        [round(faults.jitter_delay("7.0", p, i), 9) for p in ("catalog:lookup", "stream:apply") for i in range(20)]
    )


def test_fault_points_sleep_the_seeded_delay_only_when_armed(monkeypatch):
    monkeypatch.delenv("MOONCAKE_JITTER", raising=False)
    assert faults.jitter("catalog:lookup") == 0.0
    monkeypatch.setenv("MOONCAKE_JITTER", "3.0:0.001:1.0")  # tiny delays, every pass
    monkeypatch.setattr(faults, "_jitter_hits", {})
    got = [faults.jitter("catalog:lookup") for _ in range(3)] + [faults.jitter("stream:start")]
    assert got[:3] == [faults.jitter_delay("3.0", "catalog:lookup", i, 0.001, 1.0) for i in range(3)]
    assert got[3] == faults.jitter_delay("3.0", "stream:start", 0, 0.01, 1.0)  # 10x at a restarted stream
    monkeypatch.setenv("MOONCAKE_JITTER", "not:a:number")
    assert faults.jitter("catalog:lookup") == 0.0  # a typo never crashes a service
