"""CPU of the live service per applied one-row transaction, under sysbench ``oltp_update_non_index``.

A measurement, not a test. A throwaway embedded PostgreSQL (``EmbeddedPostgres`` under /var/tmp), a
scratch database with one sysbench table (``sysbench oltp_common prepare``, ``--rows`` rows), and a real
service process (``mooncake serve``, started by ``start_service``; ``maintenance: auto``) mirroring it.
Once the initial copy is applied and the stream is idle, ``sysbench oltp_update_non_index`` runs for
``--seconds`` seconds with ``--threads`` threads: one ``UPDATE sbtest1 SET c=? WHERE id=?`` per
transaction. The script then waits until the service has applied the source's WAL position (its
``write_lsn`` in ``pg_stat_replication`` reaches ``pg_current_wal_lsn()``) and prints:

- the service's CPU seconds over the run and catch-up (``/proc/<pid>/stat`` utime + stime, proc(5)),
  per sysbench transaction (``cpu_us_per_txn``), and the busiest threads' share
  (``/proc/<pid>/task/*/stat``; the replication thread is normally the first);
- the stream loop's counters over the same span (``status()["stream_counts"]``: loop iterations,
  batches that read data, transactions applied): batches per second and transactions per batch;
- the lag of the slot (``pg_wal_lsn_diff(pg_current_wal_lsn(), write_lsn)``) once a second during the
  run and as sysbench exits, and the catch-up seconds after it.

``--py-spy``: also samples the service with ``py-spy record --pid`` for the run (wall-clock samples: waits in the C receive loop count too) (``pip install py-spy``
into the venv first; it is not a project dependency) and prints the top functions by own and total
samples of the busiest thread. ``--cprofile``: starts the service with ``MOONCAKE_STREAM_PROFILE`` set,
so its replication thread runs under cProfile (timed by the thread's CPU time) and writes a ``.prof`` when the stream stops (the
service's shutdown); the top functions are printed (cProfile slows the thread down ~2x, so the CPU
figures of that run are not comparable).

``--workload W``: another sysbench workload instead (``oltp_insert``, ``oltp_update_index``, …; the
figures per transaction are then per transaction of that workload).

``--rate N``: sysbench's ``--rate`` (a fixed arrival rate, transactions/s) instead of as fast as it can: a
service that keeps up reads small batches, where the loop's per-batch work shows. ``--rand-type``:
sysbench's key distribution (its default, ``special``, sends 75 % of the updates to 1 % of the rows,
so a batch updates the same rows again and again).

Usage: ``nice .venv/bin/python scripts/profile_service_loop.py --rows 10000 --seconds 20 [--rate 1000] [--py-spy] [--cprofile]``
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

from mooncake_assets.bench.common import BenchDatabase
from mooncake_assets.bench.sysbench import _LAG_SQL, parse_tps, sysbench_args
from mooncake_assets.config import Settings
from mooncake_assets.engine.pg import EmbeddedPostgres
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import start_service, stop_service

TABLE = "sbtest1"
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu(stat: Path) -> float:
    """utime + stime of a /proc stat file, in seconds (fields 14 and 15, after the ``(comm)``)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _threads(pid: int) -> dict[str, float]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[f"{task.name}:{(task / 'comm').read_text().strip()}"] = _cpu(task / "stat")
        except OSError:
            pass
    return out


def _lag(c: psycopg.Connection, slot: str) -> int | None:
    row = c.execute(_LAG_SQL, (slot,)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _wait_caught_up(dsn: str, slot: str, timeout: float) -> float:
    """Seconds until the slot's write_lsn reaches the WAL position asked at the start."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        target = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        while time.perf_counter() - t0 < timeout:
            row = c.execute(
                "SELECT pg_wal_lsn_diff(%s::pg_lsn, r.write_lsn)::bigint FROM pg_replication_slots s "
                "JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
                (target, slot),
            ).fetchone()
            if row is not None and row[0] is not None and row[0] <= 0:
                return time.perf_counter() - t0
            time.sleep(0.05)
    raise TimeoutError(f"the service did not catch up within {timeout:.0f}s")


def _py_spy_top(raw: Path, top: int) -> str:
    """Top functions (own and total samples) of the busiest thread in a py-spy ``--format raw`` file."""
    per_thread: dict[str, list[tuple[list[str], int]]] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        per_thread.setdefault(frames[0], []).append((frames[1:], int(n)))
    if not per_thread:
        return "(no samples)"
    lines = []
    for thread, stacks in sorted(per_thread.items(), key=lambda kv: -sum(n for _, n in kv[1]))[:2]:
        total = sum(n for _, n in stacks)
        own: Counter[str] = Counter()
        incl: Counter[str] = Counter()
        for frames, n in stacks:
            if frames:
                own[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
        lines.append(f"--- {thread}: {total} samples")
        lines.append("own:")
        lines += [f"  {n:6d} {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
        lines.append("total:")
        lines += [f"  {n:6d} {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top)]
    return "\n".join(lines)


def _run(db: BenchDatabase, scratch: Path, a: argparse.Namespace) -> dict:
    args, env = sysbench_args(db.dsn, "oltp_common", a.rows, a.seconds)
    args = [x if not x.startswith("--threads=") else f"--threads={a.threads}" for x in args]
    r = subprocess.run(args + ["prepare"], capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"sysbench prepare failed: {(r.stdout + r.stderr)[-1500:]}")
    settings = Settings(state_dir=scratch, dsn=db.dsn, maintenance="auto")
    settings.save()
    prof = scratch / "stream.prof"
    extra = {"MOONCAKE_STREAM_PROFILE": str(prof)} if a.cprofile else {}
    pid = start_service(settings, extra_env=extra)
    assert isinstance(pid, int)
    client = ServiceClient(settings.socket_path)
    out: dict = {"rows": a.rows, "seconds": a.seconds, "threads": a.threads, "rate": a.rate}
    out.update(rand_type=a.rand_type or "special (sysbench's default)", service_pid=pid)
    try:
        client.call("create_table", dst=TABLE, src=f"public.{TABLE}", timeout=600)
        with psycopg.connect(db.dsn, autocommit=True) as c:
            slot = c.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s AND NOT temporary", (db.name,)
            ).fetchone()[0]
        _wait_caught_up(db.dsn, slot, 120)
        time.sleep(1.0)
        counts0, cpu0, thr0 = client.status().get("stream_counts", {}), _cpu(Path(f"/proc/{pid}/stat")), _threads(pid)
        spy = None
        if a.py_spy:
            spy_bin = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
            spy = subprocess.Popen(
                [spy_bin, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--threads"]
                + ["--duration", str(a.seconds), "-o", str(scratch / "spy.txt")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        run_args, env = sysbench_args(db.dsn, a.workload, a.rows, a.seconds)
        run_args = [x if not x.startswith("--threads=") else f"--threads={a.threads}" for x in run_args]
        if a.rate:
            run_args.append(f"--rate={a.rate}")  # sysbench's fixed arrival rate (transactions/s, all threads)
        if a.rand_type:
            run_args.append(f"--rand-type={a.rand_type}")  # sysbench 1.0's default: special (hot rows)
        samples: list[tuple[float, int | None]] = []
        stop = threading.Event()

        def sample() -> None:
            with psycopg.connect(db.dsn, autocommit=True) as c:
                while not stop.wait(1.0):
                    samples.append((round(time.perf_counter() - t0, 1), _lag(c, slot)))

        t0 = time.perf_counter()
        th = threading.Thread(target=sample, daemon=True)
        th.start()
        r = subprocess.run(run_args + ["run"], capture_output=True, text=True, env=env, timeout=a.seconds + 120)
        stop.set()
        th.join(5)
        with psycopg.connect(db.dsn, autocommit=True) as c:
            out["lag_at_stop_bytes"] = _lag(c, slot)
        if r.returncode != 0:
            raise RuntimeError(f"sysbench run failed: {(r.stdout + r.stderr)[-1500:]}")
        out["catch_up_s"] = round(_wait_caught_up(db.dsn, slot, 600), 2)
        wall = time.perf_counter() - t0
        cpu1, thr1, counts1 = _cpu(Path(f"/proc/{pid}/stat")), _threads(pid), client.status().get("stream_counts", {})
        txns, tps = parse_tps(r.stdout)
        cpu = cpu1 - cpu0
        d = {k: counts1.get(k, 0) - counts0.get(k, 0) for k in counts1}
        out.update(
            sysbench_transactions=txns,
            sysbench_tps=tps,
            wall_s=round(wall, 2),
            service_cpu_s=round(cpu, 2),
            cpu_us_per_txn=round(cpu / max(txns or 1, 1) * 1e6, 1),
            stream_counts=d,
            batches_per_s=round(d.get("batches", 0) / wall, 1),
            txns_per_batch=round(d.get("transactions", 0) / max(d.get("batches", 0), 1), 2),
            max_lag_bytes=max((s[1] or 0 for s in samples), default=None),
            lag_samples=samples,
            busiest_threads={
                k: round(thr1[k] - thr0.get(k, 0.0), 2)
                for k in sorted(thr1, key=lambda k: thr0.get(k, 0.0) - thr1[k])[:4]
            },
        )
        if spy is not None:
            spy.wait(timeout=a.seconds + 60)
            raw = scratch / "spy.txt"
            out["py_spy"] = _py_spy_top(raw, a.top) if raw.exists() else spy.stderr.read().decode()[-2000:]
            if a.keep:
                shutil.copy(raw, a.keep + ".spy.txt")
    finally:
        client.close()
        stop_service(settings)
    if a.cprofile:
        if prof.exists():
            s = io.StringIO()
            st = pstats.Stats(str(prof), stream=s)
            st.sort_stats("tottime").print_stats(a.top)
            st.sort_stats("cumulative").print_stats(a.top)
            out["cprofile"] = s.getvalue()
            if a.keep:
                shutil.copy(prof, a.keep + ".prof")
        else:
            out["cprofile"] = f"(no {prof}: did the service honour MOONCAKE_STREAM_PROFILE?)"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument(
        "--workload", default="oltp_update_non_index", help="the sysbench workload run (default oltp_update_non_index)"
    )
    ap.add_argument("--rate", type=int, default=0, help="sysbench --rate (transactions/s); 0: as fast as it can")
    ap.add_argument("--rand-type", default=None, help="sysbench --rand-type (uniform, gaussian, special, pareto)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--py-spy", action="store_true")
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--keep", default=None, help="copy the profile(s) to this path prefix")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mooncake-svcprof-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    try:
        with BenchDatabase(pg.dsn(), prefix="mooncake_svcprof") as db:
            r = _run(db, root / "state", a)
        for k in ("py_spy", "cprofile"):
            if k in r:
                print(f"\n===== {k} =====\n{r.pop(k)}")
        print(json.dumps(r, indent=1))
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
