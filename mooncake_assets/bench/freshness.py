"""Freshness benchmark: commit → visible in a union read, under a background pgbench load.

In a scratch database: ``pgbench -i``, a table ``fresh(id int PRIMARY KEY, at timestamptz)``, and a
real service (``mooncake serve`` as a background process, ``maintenance: auto`` with its default
policy: it flushes and persists while we measure) mirroring ``fresh`` and the four pgbench tables.
While ``pgbench -c 2 -R <rate>`` runs (its changes all flow through the same service), ``commits``
single-row INSERTs into ``fresh`` are made, each in its own transaction (autocommit), a random
20–60 ms apart. For each: ``t0`` just before the INSERT is sent, then the union read is polled —
``UnionReader.register`` (ReadState over Flight, in-memory rows, view) and
``SELECT count(*) FROM fresh WHERE id = i`` — every 2 ms until the row is there; the latency is
``now − t0`` (so it includes the commit itself). No read-your-writes barrier is used: this measures
how soon the row shows up by itself.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from ..engine.pg.embedded import reset_signals
from .common import BenchDatabase, Sizes, pg_bin

TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]


def _pgbench_load(sizes: Sizes, seconds: int, dsn: str) -> list[str]:
    """The background load: pgbench's TPC-B-like script, 2 clients, rate-limited to ``fresh_load_tps``."""
    return [
        pg_bin("pgbench"),
        "-n",
        "-c",
        "2",
        "-j",
        "2",
        "-R",
        str(sizes.fresh_load_tps),
        "-T",
        str(seconds),
        dsn,
    ]


def _wait_visible(reader: Any, i: int, t0: float, timeout_s: float) -> int:
    """Poll the union read every 2 ms until row ``i`` of ``fresh`` is visible; returns the polls taken.
    Raises ``TimeoutError`` after ``timeout_s`` seconds from ``t0`` (``time.perf_counter()``)."""
    n = 0
    while True:
        n += 1
        reader.register("fresh")
        if reader.con.execute("SELECT count(*) FROM fresh WHERE id = ?", [i]).fetchone()[0]:
            return n
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"row {i} of fresh not visible after {timeout_s:.0f}s")
        time.sleep(0.002)


def _summary(lat: list[float], polls: list[int], sizes: Sizes, load_tps: float, st: dict[str, Any]) -> dict[str, Any]:
    """The ``freshness`` section from the latencies (seconds) and poll counts of every commit."""
    ms = np.array(lat) * 1000
    out = {
        "commits": len(lat),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "polls_mean": float(np.mean(polls)),
        "latencies_ms": [round(x, 3) for x in ms.tolist()],
        "background_load": {"pgbench": f"-c 2 -j 2 -R {sizes.fresh_load_tps}", "tps": round(load_tps, 1)},
        "missing_keys": sum(t.get("missing_keys", 0) or 0 for t in st.values()),
        "method": "commit (autocommit INSERT) to visible in UnionReader.register + SELECT, polled every 2 ms, "
        "service in maintenance: auto under pgbench load",
    }
    return out


def run_freshness_bench(admin_dsn: str, sizes: Sizes, log=print, timeout_s: float = 30.0) -> dict:
    """Run the freshness suite; returns the ``freshness`` section of the bench JSON."""
    from ..config import Settings
    from ..engine.read import UnionReader
    from ..engine.service import ServiceClient
    from ..engine.service.process import start_service, stop_service

    scratch = Path(tempfile.mkdtemp(prefix="mc-bench-fresh-", dir="/var/tmp"))
    lat: list[float] = []
    polls: list[int] = []
    bench = None
    try:
        with BenchDatabase(admin_dsn) as db:
            subprocess.run([pg_bin("pgbench"), "-i", "-q", "-s", "1", db.dsn], check=True, capture_output=True)
            db.execute("CREATE TABLE fresh (id int PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")
            settings = Settings(state_dir=scratch, dsn=db.dsn, maintenance="auto")
            settings.save()
            start_service(settings)
            client = ServiceClient(settings.socket_path)
            try:
                for t in ["fresh"] + TABLES:
                    client.call("create_table", dst=t, src=f"public.{t}")
                seconds = max(30, int(sizes.fresh_commits * 0.25) + 30)
                bench = subprocess.Popen(
                    _pgbench_load(sizes, seconds, db.dsn),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                    preexec_fn=reset_signals,  # terminate() stops it (SIGTERM may be inherited ignored)
                )
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    h0 = c.execute("SELECT count(*) FROM pgbench_history").fetchone()[0]
                t_load = time.perf_counter()
                time.sleep(1.0)  # let the load reach the service
                reader = UnionReader(client)
                rng = random.Random(8)
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    for i in range(sizes.fresh_commits):
                        time.sleep(rng.uniform(0.02, 0.06))
                        t0 = time.perf_counter()
                        c.execute("INSERT INTO fresh (id) VALUES (%s)", (i,))
                        polls.append(_wait_visible(reader, i, t0, timeout_s))
                        lat.append(time.perf_counter() - t0)
                        if bench.poll() is not None:
                            break
                st = {t["name"]: t for t in client.status()["tables"]}
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    load_tps = (c.execute("SELECT count(*) FROM pgbench_history").fetchone()[0] - h0) / (
                        time.perf_counter() - t_load
                    )
            finally:
                load = ""
                if bench is not None:
                    if bench.poll() is None:
                        bench.terminate()
                    try:
                        load, _ = bench.communicate(timeout=30)
                    except subprocess.TimeoutExpired:
                        bench.kill()
                client.close()
                stop_service(settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = _summary(lat, polls, sizes, load_tps, st)
    log(
        f"  freshness: {out['commits']} commits, p50 {out['p50_ms']:.1f} ms, p99 {out['p99_ms']:.1f} ms "
        f"(pgbench {out['background_load']['tps']} tps)"
    )
    return out
