"""Probe: Arrow work (read + filter + sort + concat of 2M narrow rows) under the service's heap settings.

Each variant runs in a fresh child process: Arrow's pool (``ARROW_DEFAULT_MEMORY_POOL``) and glibc's malloc
settings (``fix_mmap_threshold`` as the service calls it, or glibc's ``MALLOC_*_`` variables, mallopt(3)).
Reports the CPU time of the work, median and minimum of 7 repetitions. Usage::

    .venv/bin/python scripts/probe_arrow_heap.py [ROUNDS]

Measured 2026-12-03 (2 cores, load < 1, 2 rounds; CPU s, median): system pool with glibc's dynamic threshold
0.49–0.51; system, threshold fixed at 128 KiB 0.94–0.97; + ``M_TRIM_THRESHOLD`` 256 MiB 0.96; + ``M_TOP_PAD``
64 MiB 0.63–0.73; fixed at 1 MiB + trim 256 MiB 0.84–0.90; jemalloc, fixed at 128 KiB 0.56 (the service's
choice: ``engine/service/process.py``, ``select_memory_pool``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = 2_000_000
VARIANTS: dict[str, dict[str, str]] = {
    "system, dynamic threshold": {},
    "system, fixed 128 KiB": {"FIX": "1"},
    "system, fixed 128 KiB, trim 256 MiB": {"FIX": "1", "MALLOC_TRIM_THRESHOLD_": str(256 << 20)},
    "system, fixed 128 KiB, trim 256 MiB, top pad 64 MiB": {
        "FIX": "1",
        "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
        "MALLOC_TOP_PAD_": str(64 << 20),
    },
    "system, fixed 1 MiB, trim 256 MiB": {
        "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
        "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
    },
    "jemalloc, fixed 128 KiB": {"FIX": "1", "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"},
}


def make(path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    t = pa.table(
        {
            "aid": pa.array(np.arange(ROWS, dtype=np.int64)),
            "bid": pa.array((np.arange(ROWS) // 100_000).astype(np.int32)),
            "abalance": pa.array(rng.integers(-1000, 1000, ROWS).astype(np.int32)),
            "filler": pa.array(["x" * 84] * ROWS),
        }
    )
    pq.write_table(t, path, row_group_size=128 * 1024)


def work(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if os.environ.get("FIX"):
        from mooncake_assets.engine.heap import fix_mmap_threshold

        fix_mmap_threshold()
    cpu = []
    for _ in range(7):
        c0 = time.process_time()
        t = pq.read_table(path)
        f = t.filter(pc.greater(t["abalance"], 0))
        s = f.sort_by("abalance")
        c = pa.concat_tables([s, t.slice(0, 100_000)]).combine_chunks()
        del t, f, s, c
        cpu.append(time.process_time() - c0)
    pool = pa.default_memory_pool().backend_name
    print(f"{os.environ['LABEL']} (pool {pool}): CPU median {statistics.median(cpu):.3f} s, min {min(cpu):.3f} s")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        work(Path(sys.argv[2]))
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        path = Path(d) / "rows.parquet"
        make(path)
        for _ in range(rounds):
            for label, extra in VARIANTS.items():
                env = dict(os.environ, LABEL=label, ARROW_DEFAULT_MEMORY_POOL="system")
                env.update(extra)
                subprocess.run([sys.executable, __file__, "--child", str(path)], env=env, check=True)


if __name__ == "__main__":
    main()
