"""Where a warm union read's fixed cost per query goes, and why the same clean Parquet read costs more
inside the union-read bench's process than in a script of its own (issue 15).

Builds the bench's tiny table (:data:`~mooncake_assets.bench.union_read.TINY_ROWS` rows, 1 % updated)
with the bench's own code, serves it over Flight in this process as the bench does, and times (median
of ``--rounds`` calls, wall and this process's CPU, in ms) the clean read and the warm union read under
each setting: a plain DuckDB connection, the bench's connection (iceberg extension), with and without
the in-process Flight server, DuckDB threads 1/2, Python's GC off; then each alone against right after a
cold reader's query (the neighbour the bench's rotation gave it). Run:

    .venv/bin/python scripts/probe_fixed_cost.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import threading
import time
from pathlib import Path

import duckdb


def timed(fn, rounds: int) -> tuple[float, float]:
    fn()
    wall, cpu = [], []
    for _ in range(rounds):
        c, t = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)


def timed_after(fn, before, rounds: int) -> tuple[float, float]:
    """As :func:`timed`, with ``before()`` run (untimed) before each call."""
    wall, cpu = [], []
    for _ in range(rounds):
        before()
        c, t = time.process_time(), time.perf_counter()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    from mooncake_assets.bench import union_read as ur
    from mooncake_assets.engine.iceberg.catalog import make_catalog
    from mooncake_assets.engine.service.client import ServiceClient

    work = Path(tempfile.mkdtemp(prefix="probe-fixed-"))
    catalog = make_catalog(f"sqlite:///{work / 'catalog.db'}", ur._uri(work / "warehouse"))
    tiny = ur._build(work, ur.TINY_ROWS, 0.01, ur._base_files(work, ur.TINY_ROWS, "tiny"), 7, catalog, "tiny")
    scan = ur.SCAN_SQL.format(t=f"read_parquet('{tiny.clean_path}')")
    rows: list[tuple[str, float, float]] = []

    def row(name: str, fn) -> None:
        w, c = timed(fn, args.rounds)
        rows.append((name, w, c))
        print(f"{name:<58} wall {w:6.2f} ms  cpu {c:6.2f} ms", flush=True)

    plain = duckdb.connect()
    row("clean, plain connection, no server", lambda: plain.execute(scan).fetchall())
    bench_con, why = ur._iceberg_connection(print)
    row("clean, bench connection (iceberg ext), no server", lambda: bench_con.execute(scan).fetchall())
    server, _ = ur._serve({"tiny": tiny.table}, str(work / "f.sock"))
    client = ServiceClient(str(work / "f.sock"))
    ur._wait_ready(client)
    row("clean, plain connection, Flight server in process", lambda: plain.execute(scan).fetchall())
    readers = ur.make_readers(client)
    union = readers["union"]
    uq = ur.SCAN_SQL.format(t="tiny")
    q_union = lambda: union.query(uq, tables=["tiny"]).to_pylist()
    row("union warm, Flight server in process", q_union)
    row("clean, plain connection, after union reads", lambda: plain.execute(scan).fetchall())
    row("clean, bench connection, after union reads", lambda: bench_con.execute(scan).fetchall())
    row("state only: client.read_states (one round trip)", lambda: client.read_states(tables=["tiny"]))
    for n in (1, 2):
        plain.execute(f"SET threads = {n}")
        row(f"clean, plain connection, threads={n}", lambda: plain.execute(scan).fetchall())
    print("duckdb threads of the union reader:", union.con.execute("SELECT current_setting('threads')").fetchone())
    gc.disable()
    row("clean, plain connection, gc off", lambda: plain.execute(scan).fetchall())
    row("union warm, gc off", lambda: union.query(uq, tables=["tiny"]).to_pylist())
    gc.enable()
    # the neighbours: each warm read timed right after a cold reader's query (a new ServiceClient,
    # UnionReader and DuckDB instance), as the bench's rotation used to place them
    cold = lambda: ur._cold_query(str(work / "f.sock"), uq, "tiny")
    for name, fn in (("clean", lambda: plain.execute(scan).fetchall()), ("union warm", q_union)):
        w, c = timed(fn, args.rounds)
        wn, cn = timed_after(fn, cold, args.rounds)
        print(
            f"{name:<12} alone wall {w:6.2f} cpu {c:6.2f} ms; right after a cold query wall {wn:6.2f} cpu {cn:6.2f} ms"
        )
    print("threads alive:", [t.name for t in threading.enumerate()])
    ur.close_readers(readers)
    client.close()
    server.shutdown()


if __name__ == "__main__":
    main()
