"""Arrow memory pools on the service's buffer pattern: peak RSS and RSS after a flush, per pool.

``python -m mooncake_assets.bench.arrow_pool [--rows 1000000] [--rounds 3] [--json out.json]``

Each pool runs in a fresh child process (``ARROW_DEFAULT_MEMORY_POOL`` set, plus its variant):
``rounds`` times, ``rows`` narrow rows (``pgbench_accounts``' shape: three ``integer`` and a
``character(84)``, as Postgres sends them, text) are appended to a :class:`MemSlice` one by one (sealed
every 16384 rows into Arrow batches by the table's text decoder, MemIndex included), then drained and
written to Parquet (the flush) and everything dropped. After each round the child reads its
``/proc/self/status`` VmRSS (right after the drop and ``settle`` seconds later) and, at the end, VmHWM
(peak). Variants: ``jemalloc_decay0`` (``pa.jemalloc_set_decay_ms(0)``: freed pages go back at once),
``*_release`` (``MemoryPool.release_unused()`` after each flush). No Postgres; Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VARIANTS = ("jemalloc", "jemalloc_decay0", "system", "system_release", "mimalloc", "mimalloc_release")


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def _child(variant: str, rows: int, rounds: int, settle: float) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..engine.cdc import decode_text_columns
    from ..engine.index import KeyHash
    from ..engine.pg.schema import ColumnSpec
    from ..engine.table.memslice import MemSlice

    pool = pa.default_memory_pool()
    if variant == "jemalloc_decay0":
        pa.jemalloc_set_decay_ms(0)
    release = variant.endswith("_release")
    specs = [
        ColumnSpec("aid", 23, -1, "integer", pa.int32(), not_null=True, is_key=True),
        ColumnSpec("bid", 23, -1, "integer", pa.int32()),
        ColumnSpec("abalance", 23, -1, "integer", pa.int32()),
        ColumnSpec("filler", 1042, 88, "character(84)", pa.string()),
    ]

    def decode(cols: list[list[Any]]) -> pa.RecordBatch:
        return decode_text_columns(specs, cols, column_major=True)

    schema = decode([[] for _ in specs]).schema
    hasher = KeyHash([23])
    filler = " " * 84
    base = _status()["VmRSS"]
    out: dict[str, Any] = {"variant": variant, "backend": pool.backend_name, "rss_start": base, "rounds": []}
    tmp = Path(tempfile.mkdtemp(prefix="mc-pool-", dir="/var/tmp"))
    for k in range(rounds):
        mem = MemSlice(schema, decode, specs=specs)
        t0, c0 = time.perf_counter(), time.process_time()
        for a in range(k * rows + 1, (k + 1) * rows + 1):
            t = str(a)
            mem.append([t, "1", "0", filler], hasher.hash_one([t]), 100 + a)
        held = _status()["VmRSS"]
        arrow_held = pool.bytes_allocated()
        table, _, _ = mem.drain()
        pq.write_table(table, tmp / "flush.parquet")
        del table, mem
        (tmp / "flush.parquet").unlink()
        if release:
            pool.release_unused()
        after = _status()["VmRSS"]
        time.sleep(settle)
        out["rounds"].append(
            {
                "round_s": round(time.perf_counter() - t0, 2),
                "round_cpu_s": round(time.process_time() - c0, 2),
                "rss_full": held,
                "arrow_bytes_full": arrow_held,
                "rss_after_drop": after,
                "rss_after_settle": _status()["VmRSS"],
                "arrow_bytes_after_drop": pool.bytes_allocated(),
            }
        )
    tmp.rmdir()
    out["peak_rss"] = _status()["VmHWM"]
    out["arrow_max_memory"] = pool.max_memory()
    return out


def run_pool_bench(rows: int = 1_000_000, rounds: int = 3, settle: float = 1.0, log: Any = print) -> dict[str, Any]:
    """Every variant in its own child process; returns ``{variant: figures}`` (bytes)."""
    res = {}
    for v in VARIANTS:
        env = dict(os.environ, ARROW_DEFAULT_MEMORY_POOL=v.split("_")[0])
        env.pop("MOONCAKE_ARROW_POOL", None)
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "mooncake_assets.bench.arrow_pool",
                "--child",
                v,
                "--rows",
                str(rows),
                "--rounds",
                str(rounds),
                "--settle",
                str(settle),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(p.stdout.strip().splitlines()[-1])
        res[v] = r
        mb = 1 / 2**20
        log(
            f"  {v:17s} ({r['backend']}): peak RSS {r['peak_rss'] * mb:6.0f} MiB; per round "
            + "; ".join(
                f"full {x['rss_full'] * mb:.0f} -> drop {x['rss_after_drop'] * mb:.0f} -> {x['rss_after_settle'] * mb:.0f}"
                for x in r["rounds"]
            )
            + f" MiB (start {r['rss_start'] * mb:.0f})"
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--child")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.child, a.rows, a.rounds, a.settle)))
        return
    res = run_pool_bench(a.rows, a.rounds, a.settle)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
