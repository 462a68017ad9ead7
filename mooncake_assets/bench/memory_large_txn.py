"""Large-transaction benchmark: one ``UPDATE`` of every row of a table, applied by a real service under
a memory budget (so the open transaction spills to disk), side by side with ``pg_recvlogical`` reading
the same WAL.

Each round, in a scratch database (``logical_decoding_work_mem = 4MB`` for the database, so both
walsenders stream the transaction in chunks, pgoutput protocol 2 with ``streaming on``):

1. a table of ``large_txn_rows`` narrow rows (``id bigint PRIMARY KEY, n int, v text`` of 40
   characters) is mirrored by a service process of its own (fresh state directory, ``memory_limit`` =
   ``large_txn_memory_limit``, ``maintenance: auto``), persisted, and the service is stopped; a second
   logical slot (pgoutput) and a publication of the table are created for ``pg_recvlogical``;
2. ``UPDATE t SET n = n + 1`` runs as one transaction while nothing consumes either slot; ``end`` =
   ``pg_current_wal_lsn()`` after its commit;
3. ``recvlogical``: ``pg_recvlogical --start -o proto_version=2 -o streaming=on --endpos=end`` on its
   slot, timed from launch until it exits; CPU = its user + system time (``getrusage`` of children);
4. ``ours``: the service is started again and timed from launch (process start and loading the mirror
   included: ``startup_seconds`` is the part until it answers its socket, about 5 s on a loaded 2-CPU
   machine, which dominates at the tiny size) until ``wait_lsn(end)`` answers, i.e. every row of the
   transaction is applied and visible to a union read; CPU = the service's ``utime + stime`` (``/proc/<pid>/stat``, proc(5)); peak RSS = its
   ``VmHWM`` (``/proc/<pid>/status``) at that moment, before anything else reads; ``spilled`` = the
   transactions it spilled (``status`` ``memory.spilled``);
5. the mirror is compared with Postgres (``verify``, union read) and the service is stopped.

The two consumers go first in alternate rounds (the second reads WAL the first brought into the page
cache). Figures are medians over ``large_txn_rounds`` rounds: ``seconds_per_million_rows`` = ours' median
seconds ÷ millions of rows, ``ratio`` = pg_recvlogical's median seconds ÷ ours (above 1: faster than
pg_recvlogical), ``peak_rss_bytes`` = the median VmHWM; ``per_round`` keeps the raw rounds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import psycopg

from .common import BenchDatabase, Sizes, med
from .ingest import _drop_slots, _recvlogical

DDL = "CREATE TABLE {t} (id bigint PRIMARY KEY, n int NOT NULL, v text NOT NULL)"
FILL = "INSERT INTO {t} SELECT g, g % 1000, md5(g::text) || lpad(g::text, 8, '0') FROM generate_series(1, {rows}) g"


def _vm_hwm(pid: int) -> int:
    """``VmHWM`` (peak resident set) of ``pid`` in bytes (``/proc/<pid>/status``, proc(5))."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (fields 14 and 15 of ``/proc/<pid>/stat``, proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _one_round(db: BenchDatabase, sizes: Sizes, scratch: Path, r: int, rl_first: bool) -> dict:
    """One measurement: a fresh mirrored table, one UPDATE of every row, both consumers on its WAL."""
    from ..config import Settings
    from ..engine.service import ServiceClient
    from ..engine.service.process import service_pid, start_service, stop_service
    from ..verify import verify

    rows, table, pub, slot = sizes.large_txn_rows, f"big_{r}", f"p_big_{r}", f"s_big_{r}_rl"
    db.execute(DDL.format(t=table))
    db.execute(FILL.format(t=table, rows=rows))
    settings = Settings(state_dir=scratch, dsn=db.dsn, maintenance="auto", memory_limit=sizes.large_txn_memory_limit)
    settings.save()
    start_service(settings)
    client = ServiceClient(settings.socket_path)
    try:
        client.call("create_table", dst=table, src=f"public.{table}")
        client.call("persist", table=table)  # the copied rows durable: what the UPDATE's deletes find
    finally:
        client.close()
        stop_service(settings)
    db.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    with psycopg.connect(db.dsn, autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        t0 = time.perf_counter()
        c.execute(f"UPDATE {table} SET n = n + 1")
        work_s = time.perf_counter() - t0
        end = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
    fig: dict = {"rows": rows, "end_lsn": end, "workload_seconds": work_s}
    for side in ("rl", "ours") if rl_first else ("ours", "rl"):
        if side == "rl":
            fig["recvlogical_seconds"], fig["recvlogical_cpu_seconds"] = _recvlogical(db.dsn, slot, pub, end, 900)
            continue
        t = time.perf_counter()
        start_service(settings, timeout=300)
        fig["startup_seconds"] = time.perf_counter() - t  # launch until it answers (applying may have begun)
        client = ServiceClient(settings.socket_path)
        try:
            pid = service_pid(settings)
            client.wait_lsn(end, timeout=900)
            fig["seconds"] = time.perf_counter() - t
            fig["peak_rss_bytes"], fig["cpu_seconds"] = _vm_hwm(pid), _cpu_seconds(pid)
            fig["spilled"] = client.status()["memory"].get("spilled")
            results, _ = verify(settings, [table], "union", client)
            fig["verify_match"] = all(x.match for x in results)
            fig["verify"] = [x.line() for x in results]
        finally:
            client.close()
            stop_service(settings)
    fig["first"] = "recvlogical" if rl_first else "ours"
    with psycopg.connect(db.dsn, autocommit=True) as c:
        _drop_slots(c, [slot])
        c.execute(f"DROP PUBLICATION {pub}")
    shutil.rmtree(scratch, ignore_errors=True)
    return fig


def run_large_txn_bench(admin_dsn: str, sizes: Sizes, log=print) -> dict:
    """Run the large-transaction figures (module docstring); returns the ``memory.large_txn`` section:
    ``peak_rss_bytes`` (bytes), ``seconds_per_million_rows`` (s), ``ratio`` (pg_recvlogical seconds ÷
    ours), CPU seconds per million rows of each side, ``verify_match`` (every round), ``per_round``."""
    rounds: list[dict] = []
    scratch_root = Path(tempfile.mkdtemp(prefix="mc-bench-large-txn-", dir="/var/tmp"))
    try:
        with BenchDatabase(admin_dsn) as db:
            db.execute(f"ALTER DATABASE {db.name} SET logical_decoding_work_mem = '4MB'")
            for r in range(sizes.large_txn_rounds):
                rounds.append(_one_round(db, sizes, scratch_root / f"r{r}", r, rl_first=r % 2 == 0))
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    rows = sizes.large_txn_rows
    ours, rl = med([x["seconds"] for x in rounds]), med([x["recvlogical_seconds"] for x in rounds])
    out = {
        "rows": rows,
        "rounds": len(rounds),
        "memory_limit_bytes": sizes.large_txn_memory_limit,
        "peak_rss_bytes": int(med([x["peak_rss_bytes"] for x in rounds])),
        "seconds": ours,
        "recvlogical_seconds": rl,
        "startup_seconds": med([x["startup_seconds"] for x in rounds]),
        "seconds_per_million_rows": ours / (rows / 1e6),
        "recvlogical_seconds_per_million_rows": rl / (rows / 1e6),
        "ratio": rl / ours,
        "cpu_seconds_per_million_rows": med([x["cpu_seconds"] for x in rounds]) / (rows / 1e6),
        "recvlogical_cpu_seconds_per_million_rows": med([x["recvlogical_cpu_seconds"] for x in rounds]) / (rows / 1e6),
        "spilled": min(x["spilled"] or 0 for x in rounds),
        "verify_match": all(x["verify_match"] for x in rounds),
        "per_round": rounds,
        "method": "one UPDATE of every row; a service process under memory_limit started after the commit "
        "(timed from launch to wait_lsn) vs pg_recvlogical on its own slot; alternate first; medians; "
        "see mooncake_assets/bench/memory_large_txn.py",
    }
    log(
        f"  memory large_txn: {rows:,} rows updated in one transaction under {sizes.large_txn_memory_limit >> 20} MiB, "
        f"peak RSS {out['peak_rss_bytes'] / 2**20:.0f} MiB, {out['seconds_per_million_rows']:.1f} s per million rows "
        f"(pg_recvlogical {out['recvlogical_seconds_per_million_rows']:.1f}), ratio {out['ratio']:.2f}, "
        f"spilled {out['spilled']}, mirror matches: {out['verify_match']}"
    )
    return out
