"""Shared pieces of the benchmarks: sizes, timing side by side, machine facts, bench databases.

Timing rule: a figure and its reference are measured in the same run, **interleaved**:
``rounds`` rounds, each running every contender once (in a rotated order), so that noise from other
processes on the machine hits both sides alike. Each contender's time is the **median** of its
rounds; ratios are ratios of medians (the ratio of best times is recorded too, as ``*_best``, and
where both sides run in this process, the ratio of median CPU times, as ``cpu_*``).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

import psycopg


@dataclass
class Sizes:
    """How big each suite's workload is: ``full`` (``mooncake bench``), ``quick`` (``--quick``, under 10
    minutes for everything) or ``tiny`` (the test that keeps the bench from rotting)."""

    name: str
    union_rows: int  # rows of the union-read table
    union_rounds: int  # interleaved rounds per union-read figure
    ingest_small_rows: int  # rows inserted in small transactions (10 rows each)
    ingest_large_rows: int  # rows inserted by one large (streamed) transaction
    wide_factor: float  # wide-row workloads use this share of the narrow row counts
    copy_rows: int  # rows of the initial-copy table
    fresh_commits: int  # single-row commits timed by the freshness suite
    fresh_load_tps: int  # background pgbench rate (transactions/s) during the freshness suite
    memory_rows: int  # rows buffered by the memory suite
    index_sizes: tuple  # sizes for the index bench
    maintenance_quick: bool  # passed to run_maintenance_bench
    union_fixed_rounds: int = 30  # rounds of the union-read fixed cost (a tiny table queried this many times)
    iceberg_rows: int = 100_000  # rows of the union-read tables also read as a Flink-style v2 table by DuckDB
    iceberg_rounds: int = 5  # rounds on those (DuckDB's equality-delete read costs rows × deletes)
    ingest_rounds: int = 3  # rounds per ingest shape (shapes in a rotated order each round; medians)
    ingest_seed_rows: int = 100_000  # rows the updates/deletes shapes start from (not timed)
    sysbench_rows: int = 100_000  # rows of the sysbench table
    sysbench_seconds: int = 60  # seconds each sysbench workload runs
    large_txn_rows: int = 2_000_000  # rows updated by the memory suite's one large transaction
    large_txn_rounds: int = 3  # rounds of it (the two consumers going first in turn; medians)
    large_txn_memory_limit: int = 512 << 20  # the service's memory budget for it (bytes)
    changes_rows: int = 5_000_000  # rows of the change-feed suite's table (1% of them change: .changes)
    changes_rounds: int = 5  # rotated rounds of the change-feed read vs the full union read


SIZES = {
    "full": Sizes(
        "full", 5_000_000, 9, 500_000, 1_000_000, 0.4, 2_000_000, 300, 400, 2_000_000, (1_000_000, 10_000_000), False
    ),
    "quick": Sizes("quick", 500_000, 9, 100_000, 200_000, 0.5, 500_000, 100, 300, 500_000, (100_000, 1_000_000), True),
    "tiny": Sizes("tiny", 30_000, 2, 2_000, 5_000, 0.5, 5_000, 8, 50, 20_000, (20_000,), True),
}
# the union-read suite's fixed-cost rounds and its DuckDB-iceberg comparison tables (rows, rounds), by size
for _size, (_fixed, _rows, _rounds) in {
    "full": (40, 100_000, 3),
    "quick": (30, 20_000, 5),
    "tiny": (5, 3_000, 2),
}.items():
    SIZES[_size] = replace(SIZES[_size], union_fixed_rounds=_fixed, iceberg_rows=_rows, iceberg_rounds=_rounds)
# the ingest suite's rounds and seed rows, the sysbench suite's table rows and seconds per workload, by size
for _size, (_irounds, _seed, _sb_rows, _sb_s) in {
    "full": (3, 500_000, 100_000, 60),
    "quick": (3, 100_000, 20_000, 10),
    "tiny": (2, 2_000, 2_000, 3),
}.items():
    SIZES[_size] = replace(
        SIZES[_size], ingest_rounds=_irounds, ingest_seed_rows=_seed, sysbench_rows=_sb_rows, sysbench_seconds=_sb_s
    )


# the memory suite's large transaction: rows, rounds, the service's memory budget, by size
for _size, (_lt_rows, _lt_rounds, _lt_limit) in {
    "full": (2_000_000, 3, 512 << 20),
    "quick": (300_000, 3, 128 << 20),
    "tiny": (20_000, 2, 128 << 20),
}.items():
    SIZES[_size] = replace(
        SIZES[_size], large_txn_rows=_lt_rows, large_txn_rounds=_lt_rounds, large_txn_memory_limit=_lt_limit
    )

# the change-feed suite's table rows and rounds, by size
for _size, (_ch_rows, _ch_rounds) in {
    "full": (5_000_000, 5),
    "quick": (500_000, 5),
    "tiny": (20_000, 2),
}.items():
    SIZES[_size] = replace(SIZES[_size], changes_rows=_ch_rows, changes_rounds=_ch_rounds)


def interleaved(
    contenders: dict[str, Callable[[], object]], rounds: int, cpu: dict[str, list[float]] | None = None
) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Run every contender once per round, order rotated each round; returns (wall seconds per round,
    last result) per contender. ``cpu``: filled with this process's CPU seconds per round (all its
    threads: DuckDB's, PyArrow's, an in-process server's), which noise from other processes disturbs less."""
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    results: dict[str, object] = {}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            c = time.process_time()
            t = time.perf_counter()
            results[n] = contenders[n]()
            times[n].append(time.perf_counter() - t)
            if cpu is not None:
                cpu.setdefault(n, []).append(time.process_time() - c)
    return times, results


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def machine() -> dict:
    """What the figures were measured on."""
    import duckdb
    import pyarrow

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "duckdb": duckdb.__version__,
        "pyarrow": pyarrow.__version__,
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_bytes"] = int(f.readline().split()[1]) * 1024
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        info["loadavg_at_start"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


class BenchDatabase:
    """A throwaway database in the source cluster (created on enter, dropped with its slots on exit)."""

    def __init__(self, admin_dsn: str, prefix: str = "mooncake_bench"):
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        self.admin_dsn = admin_dsn
        self.name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        d = conninfo_to_dict(admin_dsn)
        d["dbname"] = self.name
        self.dsn = make_conninfo(**d)

    def __enter__(self) -> BenchDatabase:
        with psycopg.connect(self.admin_dsn, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {self.name}")
        return self

    def __exit__(self, *exc) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as c:
            for (slot,) in c.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (self.name,)
            ).fetchall():
                for _ in range(50):
                    try:
                        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                        break
                    except psycopg.Error:
                        time.sleep(0.1)
            c.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")

    def execute(self, sql: str, params=None) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            c.execute(sql, params)


def pg_bin(name: str) -> str:
    """A Postgres client binary (pgbench, pg_recvlogical, psql) next to the server's."""
    import shutil

    from ..engine.pg import find_pg_bin

    try:
        p = find_pg_bin() / name
        if p.exists():
            return str(p)
    except Exception:
        pass
    return shutil.which(name) or name


def set_path(d: dict, dotted: str, value) -> None:
    """``d["a"]["b"]["c"] = value`` for ``dotted = "a.b.c"`` (creating the dicts)."""
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def get_path(d: dict, dotted: str, default=None):
    for k in dotted.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d
