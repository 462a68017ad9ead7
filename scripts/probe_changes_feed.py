"""Where one change-feed query's time goes, in process (cProfile), on the bench's ``changes`` tables.

A measurement, not a test. ``setup DIR ROWS``: an embedded PostgreSQL under ``DIR/pg``, a scratch
database and a service state under ``DIR/state`` built exactly as ``mooncake bench --suite changes``
builds them (:func:`mooncake_assets.bench.changes._setup`: ``accounts`` and ``accounts_full``
(REPLICA IDENTITY FULL), a cut, 1 % of the rows changed, a cut); the service is stopped and Postgres
left running; the cuts go to ``DIR/facts.json``. ``profile DIR [N]``: the service started in this
process from that state (``ReplicatorService``, no Flight; Arrow's memory pool and glibc's mmap threshold set as
``serve`` sets them), then ``N`` (default 5) rounds of each feed
(``rows`` of ``accounts_full``, ``rows`` and ``keys`` of ``accounts``): wall and CPU medians, and
one cProfile (CPU time) of the identity-full and the keys feed, top functions by cumulative time.
``client DIR [N]``: the bench's view of the same (the service as its own process, the feeds over
Flight, the full union read ``SELECT * FROM accounts``; rotated rounds, wall and CPU medians, ratios).
``stop DIR``: stops that Postgres.

Usage: ``nice .venv/bin/python scripts/probe_changes_feed.py setup /var/tmp/probe 2000000``, then
``… profile /var/tmp/probe``.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path


def setup(d: Path, rows: int) -> None:
    from dataclasses import replace

    from mooncake_assets.bench.changes import _setup
    from mooncake_assets.bench.common import SIZES, BenchDatabase
    from mooncake_assets.config import Settings
    from mooncake_assets.engine.pg import EmbeddedPostgres
    from mooncake_assets.engine.service.process import stop_service

    d.mkdir(parents=True, exist_ok=True)
    pg_settings = Settings(state_dir=d / "pg")
    pg = EmbeddedPostgres(pg_settings.state_dir)
    if not pg.is_running():
        pg.start()
    db = BenchDatabase(pg_settings.source_dsn(), prefix="mc_probe_ch").__enter__()
    settings, client, f = _setup(db, replace(SIZES["quick"], changes_rows=rows), d / "state", print)
    client.close()
    stop_service(settings)
    w = f.pop("w")
    f["n"] = {"updated": len(w["updated"]), "deleted": len(w["deleted"]), "inserted": w["inserted"]}
    (d / "facts.json").write_text(json.dumps({**f, "rows": rows, "db": db.name}, default=str))
    print(json.dumps(f, default=str))


def profile(d: Path, n: int) -> None:
    from mooncake_assets.config import load_settings
    from mooncake_assets.engine.heap import fix_mmap_threshold
    from mooncake_assets.engine.lsn import Lsn
    from mooncake_assets.engine.service.process import select_memory_pool
    from mooncake_assets.engine.service.service import ReplicatorService

    select_memory_pool()  # the service process's heap: Arrow's system pool, glibc's mmap threshold fixed
    fix_mmap_threshold()
    f = json.loads((d / "facts.json").read_text())
    settings = load_settings(d / "state")
    svc = ReplicatorService(settings.service_config())
    svc.start()
    try:
        since, until = Lsn.parse(f["since"]), Lsn.parse(f["until"])
        cases = {
            "full_rows": lambda: svc.changes("accounts_full", since, until, 600, "rows", sources={}),
            "default_keys": lambda: svc.changes("accounts", since, until, 600, "keys", sources={}),
            "default_rows": lambda: svc.changes("accounts", since, until, 600, "rows", sources={}),
        }
        for c in cases.values():
            c()
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for _ in range(n):
            for k, c in cases.items():
                c0, t0 = time.process_time(), time.perf_counter()
                _, feed = c()
                res[k].append((time.perf_counter() - t0, time.process_time() - c0))
        for k, v in res.items():
            print(
                f"{k}: wall {statistics.median(x[0] for x in v) * 1000:.1f} ms, "
                f"CPU {statistics.median(x[1] for x in v) * 1000:.1f} ms ({n} rounds)"
            )
        for k in ("full_rows", "default_keys"):
            pr = cProfile.Profile(time.process_time)
            pr.enable()
            cases[k]()
            pr.disable()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45)
            print(f"---- {k}\n" + s.getvalue())
    finally:
        svc.stop()


def client_rounds(d: Path, n: int) -> None:
    """The bench's view: the service as its own process, the feeds over Flight, the full union read."""
    from mooncake_assets.bench.changes import _proc_cpu
    from mooncake_assets.config import load_settings
    from mooncake_assets.engine.read import UnionReader
    from mooncake_assets.engine.service import ServiceClient
    from mooncake_assets.engine.service.process import service_pid, start_service, stop_service

    f = json.loads((d / "facts.json").read_text())
    settings = load_settings(d / "state")
    start_service(settings, timeout=120)
    client = ServiceClient(settings.socket_path)
    reader = UnionReader(client)
    pid = service_pid(settings)
    try:
        since, until = f["since"], f["until"]
        cases = {
            "full_rows": lambda: client.changes("accounts_full", since, until, timeout=600),
            "default_keys": lambda: client.changes("accounts", since, until, timeout=600, deletes="keys"),
            "full_read": lambda: reader.query("SELECT * FROM accounts", tables=["accounts"]),
        }
        for c in cases.values():
            c()
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for r in range(n):
            names = list(cases)[r % 3 :] + list(cases)[: r % 3]
            for k in names:
                c0, s0, t0 = time.process_time(), _proc_cpu(pid), time.perf_counter()
                cases[k]()
                res[k].append((time.perf_counter() - t0, time.process_time() - c0 + _proc_cpu(pid) - s0))
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
        for k, (w, c) in med.items():
            print(
                f"{k}: wall {w * 1000:.1f} ms, CPU {c * 1000:.1f} ms; ratio {w / med['full_read'][0]:.3f}, "
                f"CPU ratio {c / med['full_read'][1]:.3f} ({n} rounds)"
            )
    finally:
        reader.con.close()
        client.close()
        stop_service(settings)


if __name__ == "__main__":
    cmd, d = sys.argv[1], Path(sys.argv[2])
    if cmd == "setup":
        setup(d, int(sys.argv[3]))
    elif cmd == "profile":
        profile(d, int(sys.argv[3]) if len(sys.argv) > 3 else 5)
    elif cmd == "client":
        client_rounds(d, int(sys.argv[3]) if len(sys.argv) > 3 else 5)
    elif cmd == "stop":
        from mooncake_assets.config import Settings
        from mooncake_assets.engine.pg import EmbeddedPostgres

        EmbeddedPostgres(Settings(state_dir=d / "pg").state_dir).stop()
