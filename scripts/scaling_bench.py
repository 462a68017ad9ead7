"""The measurements of docs/scaling.md, on this machine.

    .venv/bin/python scripts/scaling_bench.py copy --rows 1000000          # chunked copy, 1/2/4 chunks
    .venv/bin/python scripts/scaling_bench.py sources --seconds 20         # sysbench: one vs two sources

``copy``: a table ``(id bigint PRIMARY KEY, k int, c text, n numeric(12,2), t timestamptz)`` of
``--rows`` rows; create-table's copy (one connection) once, then the ``chunked_copy`` Dagster job
(multiprocess executor, ``--parts`` 1, 2, 4; each a drop-table before) — wall seconds of the job, of
its slowest chunk step, and of the publish (staged files into the mirror, one Iceberg commit).

``sources``: sysbench ``oltp_update_index`` (4 threads, ``--seconds``) on one database mirrored by one
service, then on two databases at once, each mirrored by its own service (state directory, slot):
sysbench's tps per database and summed, and each slot's largest lag (``pg_stat_replication``,
``pg_current_wal_lsn() - write_lsn``) sampled once a second.

Everything runs in a scratch embedded Postgres under /var/tmp; prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from mooncake_assets.bench.sysbench import _sample_lag, parse_tps, sysbench_args
from mooncake_assets.config import load_settings
from mooncake_assets.engine.pg.embedded import EmbeddedPostgres
from mooncake_assets.engine.service.client import ServiceClient
from mooncake_assets.engine.service.process import start_service, stop_service
from mooncake_assets.engine.service.registry import default_names


def _db(pg: EmbeddedPostgres, name: str) -> str:
    with psycopg.connect(pg.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return pg.dsn(name)


def _settings(root: Path, name: str, dsn: str):
    s = load_settings(root / name, dsn=dsn)
    s.maintenance = "auto"
    s.save()
    return s


def bench_copy(pg: EmbeddedPostgres, root: Path, rows: int, parts_list: list[int]) -> dict:
    import dagster as dg

    dsn = _db(pg, "copybench")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE big (id bigint PRIMARY KEY, k int, c text, n numeric(12,2), t timestamptz)")
        c.execute(
            "INSERT INTO big SELECT g, g %% 1000, md5(g::text), g / 3.0, now() FROM generate_series(1, %s) g", (rows,)
        )
        c.execute("VACUUM ANALYZE big")
        pages = c.execute("SELECT pg_relation_size('big') / 8192").fetchone()[0]
    s = _settings(root, "copy", dsn)
    start_service(s)
    client = ServiceClient(s.socket_path, timeout=3600)
    out: dict = {"rows": rows, "heap_pages": pages, "runs": []}
    try:
        t0 = time.perf_counter()
        r = client.call("create_table", dst="big", src="public.big")
        out["create_table"] = {"seconds": round(time.perf_counter() - t0, 2), "rows": r["rows"]}
        client.call("drop_table", table="big")
        job = dg.build_reconstructable_job(
            "mooncake_assets.dagster.jobs.chunked", "job_for_state_dir", reconstructable_args=(str(s.state_dir),)
        )
        for parts in parts_list:
            cfg = {
                "ops": {"plan": {"config": {"table": "big=public.big", "parts": parts, "min_range_pages": 64}}},
                "execution": {"config": {"max_concurrent": parts}},
            }
            with dg.instance_for_test() as inst:
                t0 = time.perf_counter()
                with dg.execute_job(job, instance=inst, run_config=cfg) as res:
                    assert res.success
                    wall = time.perf_counter() - t0
                    chunks = list(res.output_for_node("copy_chunk").values())  # {mapping key: result}
                    pub = res.output_for_node("publish")
            out["runs"].append(
                {
                    "parts": parts,
                    "job_seconds": round(wall, 2),
                    "slowest_chunk_seconds": max(c["seconds"] for c in chunks),
                    "chunk_seconds": sorted(c["seconds"] for c in chunks),
                    "publish_seconds": pub["seconds"],
                    "rows": pub["rows"],
                }
            )
            print(json.dumps(out["runs"][-1]), file=sys.stderr)
            client.call("drop_table", table="big")
    finally:
        client.close()
        stop_service(s)
    return out


def bench_sources(pg: EmbeddedPostgres, root: Path, seconds: int, rows: int) -> dict:
    out: dict = {"workload": "oltp_update_index", "threads_per_source": 4, "seconds": seconds, "table_rows": rows}
    dsns = [_db(pg, f"sb{i}") for i in range(2)]
    settings = []
    for i, dsn in enumerate(dsns):
        args, env = sysbench_args(dsn, "oltp_update_index", rows, seconds)
        subprocess.run(args + ["prepare"], capture_output=True, check=True, env=env)
        s = _settings(root, f"src{i}", dsn)
        start_service(s)
        client = ServiceClient(s.socket_path, timeout=600)
        client.call("create_table", dst="sbtest1", src="public.sbtest1")
        client.close()
        settings.append(s)
    try:
        for n in (1, 2):
            res = _load([(dsns[i], settings[i]) for i in range(n)], seconds, rows)
            out[f"{n}_source" + ("s" if n > 1 else "")] = res
            print(json.dumps(res), file=sys.stderr)
    finally:
        for s in settings:
            stop_service(s)
    return out


def _load(pairs: list, seconds: int, rows: int) -> dict:
    """sysbench on every database of ``pairs`` at once; tps and each slot's largest lag."""
    stop = threading.Event()
    samples: list[list] = [[] for _ in pairs]
    t0 = time.perf_counter()
    samplers = [
        threading.Thread(
            target=_sample_lag, args=(dsn, default_names(s.state_dir)["slot"], t0, stop, samples[i]), daemon=True
        )
        for i, (dsn, s) in enumerate(pairs)
    ]
    procs = []
    for t in samplers:
        t.start()
    for dsn, _ in pairs:
        args, env = sysbench_args(dsn, "oltp_update_index", rows, seconds)
        procs.append(subprocess.Popen(args + ["run"], stdout=subprocess.PIPE, text=True, env=env))
    tps = [parse_tps(p.communicate()[0])[1] for p in procs]
    stop.set()
    for t in samplers:
        t.join()
    lag = [max((x[1] or 0 for x in sm), default=None) for sm in samples]
    return {"tps": tps, "tps_total": round(sum(t or 0 for t in tps), 1), "max_lag_bytes": lag}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["copy", "sources"])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--parts", default="1,2,4")
    ap.add_argument("--seconds", type=int, default=20)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mooncake-scaling-", dir="/var/tmp"))
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    try:
        if a.what == "copy":
            res = bench_copy(pg, root, a.rows, [int(p) for p in a.parts.split(",")])
        else:
            res = bench_sources(pg, root, a.seconds, min(a.rows, 100_000))
        print(json.dumps(res, indent=1))
    finally:
        pg.destroy()


if __name__ == "__main__":
    main()
