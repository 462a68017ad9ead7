"""Bytes per entry and per-row speed of the MemIndex (``python -m mooncake_assets.engine.index.mem_index_bench``).

``--sizes 1000000 10000000`` entries (distinct random uint64 hashes, batches of 16384 rows as the
MemSlice seals them), each size in a fresh child process: ``tracemalloc`` bytes held after the build
(the hashes array is made before tracing starts) and the growth of VmRSS (``/proc/self/status``), both
÷ entries. ``--speed N``: N per-row ``insert_one`` then N ``lookup`` calls from Python (seconds per
call, best of 3). ``--impl FILE``: measure another implementation with the same API (a
``mem_index.py`` from an older commit: ``git show REV:mooncake_assets/engine/index/mem_index.py``),
loaded as a module of this package.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _load(impl: str | None) -> Any:
    if not impl:
        from .mem_index import MemIndex

        return MemIndex
    spec = importlib.util.spec_from_file_location("mooncake_assets.engine.index._bench_impl", impl)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.MemIndex


def _measure(n: int, impl: str | None, speed: int) -> dict[str, Any]:
    cls = _load(impl)
    hs = np.random.default_rng(1).integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    step = 16384
    rss0 = _rss()
    tracemalloc.start()
    m = cls()
    for b, i in enumerate(range(0, n, step)):
        m.insert(hs[i : i + step], b)
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    out: dict[str, Any] = {
        "entries": n,
        "tracemalloc_bytes_per_entry": round(traced / n, 1),
        "rss_bytes_per_entry": round((_rss() - rss0) / n, 1),
    }
    if hasattr(m, "capacity"):
        out["load"] = round(n / m.capacity, 3)
    if speed:
        q = hs[:speed].tolist()
        best_ins = best_look = float("inf")
        for _ in range(3):
            fresh = cls()
            t0 = time.perf_counter()
            for r, h in enumerate(q):
                fresh.insert_one(h, r >> 14, r & 16383)
            best_ins = min(best_ins, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for h in q:
                m.lookup(h)
            best_look = min(best_look, time.perf_counter() - t0)
        out["insert_one_us"] = round(best_ins / speed * 1e6, 3)
        out["lookup_us"] = round(best_look / speed * 1e6, 3)
        qa = hs[:speed]
        t0 = time.perf_counter()
        m.lookup_batch(qa)
        out["lookup_batch_us_per_hash"] = round((time.perf_counter() - t0) / speed * 1e6, 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--speed", type=int, default=200_000)
    ap.add_argument("--impl")
    ap.add_argument("--child", type=int)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_measure(a.child, a.impl, a.speed)))
        return
    for n in a.sizes:
        cmd = [sys.executable, "-m", "mooncake_assets.engine.index.mem_index_bench", "--child", str(n)]
        cmd += ["--speed", str(a.speed)] + (["--impl", a.impl] if a.impl else [])
        print(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
