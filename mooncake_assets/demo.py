"""``mooncake demo``: an end-to-end run on pgbench's tables (docs/architecture.md#command-line).

Starts the embedded Postgres (unless a DSN is configured), runs ``pgbench -i``, mirrors
``pgbench_accounts``, ``pgbench_branches``, ``pgbench_tellers`` and ``pgbench_history`` (no primary
key: REPLICA IDENTITY FULL), runs ``pgbench`` for ``seconds`` while printing a union-read query next to
the same query on Postgres at the same LSN (:func:`balances_at_one_lsn`) and the replication lag, flushes and persists during the run, then stops
the workload, persists every table and verifies every table. The last line is
``verified: K/N tables match at LSN …``; the exit status is 0 only when all match.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import psycopg
from rich.console import Console

from .config import Settings
from .engine.pg.conninfo import redact
from .engine.private import ensure_private_dir

TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]
QUERY = "SELECT bid, sum(abalance) AS balance FROM pgbench_accounts GROUP BY bid ORDER BY bid LIMIT 3"


def _pg_bin(name: str) -> str:
    from .engine.pg import find_pg_bin

    try:
        return str(find_pg_bin() / name)
    except Exception:
        return shutil.which(name) or name


def _tick_line(client, reader, dsn: str, t0: float) -> str:
    """One progress line: the lag now, and pgbench_branches' balances in Postgres and in the mirror at
    one LSN (``same`` or ``DIFFERENT``)."""
    from .engine.service import ServiceError

    st = client.status()  # the lag as it is now, before the comparison waits for the mirror
    row = next((t for t in st["tables"] if t["name"] == "pgbench_accounts"), {})
    head = (
        f"[{time.time() - t0:5.1f}s] lag {row.get('lag_bytes') or 0:>10,} bytes, {row.get('lag_seconds') or 0:.1f}s | "
    )
    try:
        lsn, src, mir = balances_at_one_lsn(dsn, reader)
    except (ServiceError, TimeoutError, psycopg.Error) as e:  # a failed read is no comparison, not a difference
        return head + f"not compared this time: {str(e).splitlines()[0]}"
    pg_txt = ", ".join(f"branch {r[0]}: {int(r[1])}" for r in src)
    mir_txt = ", ".join(f"branch {r['bid']}: {int(r['balance'])}" for r in mir if "bid" in r) or "no rows"
    same = (
        "same"
        if [(r[0], int(r[1])) for r in src] == [(r.get("bid"), int(r.get("balance") or 0)) for r in mir]
        else "DIFFERENT"
    )
    return head + f"at LSN {lsn}: postgres {pg_txt} | mirror {mir_txt} ({same})"


def run_demo(settings: Settings, seconds: int = 30, scale: int = 1, clients: int = 4, dagster: bool = False) -> int:
    from .commands import create_with_progress, run_verify
    from .engine.read import UnionReader
    from .engine.service import ServiceClient
    from .engine.service.process import start_service

    con = Console()
    ensure_private_dir(settings.state_dir)  # 0700 (engine/private.py)
    dsn = settings.source_dsn()
    con.print(f"[bold]source[/bold] {redact(dsn)}")  # never a password
    if dagster:  # the Dagster assets drive maintenance; the service only caps its memory
        from .engine.service.process import stop_service

        stop_service(settings)  # a service already running keeps its mode: start it again in this one
    settings.save()
    start_service(settings, maintenance="dagster" if dagster else None)  # the mode is not saved in settings.json
    client = ServiceClient(settings.socket_path)
    existing = {t["name"] for t in client.status()["tables"]}
    for t in TABLES:
        if t in existing:
            client.call("drop_table", table=t)
    con.print(f"pgbench -i -s {scale} …")
    subprocess.run([_pg_bin("pgbench"), "-i", "-q", "-s", str(scale), dsn], check=True, capture_output=True)
    for t in TABLES:
        res = create_with_progress(client, t, f"public.{t}")
        print(
            f"  mirrored public.{t}: {res['rows']:,} rows at LSN {res['copy_lsn']} ({res['seconds']:.1f}s)", flush=True
        )

    maint = _DagsterMaintenance(settings) if dagster else (lambda op: [client.call(op, table=t) for t in TABLES])
    con.print(f"pgbench: {clients} clients for {seconds}s")
    bench = subprocess.Popen(
        [_pg_bin("pgbench"), "-n", "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds), dsn],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    reader = UnionReader(client, dsn, wait_timeout=60)  # a read at an LSN waits for the service to apply it
    t0 = time.time()
    tick = 0
    maint_log = []
    try:
        while bench.poll() is None:
            time.sleep(min(5.0, max(1.0, seconds / 6)))
            tick += 1
            print(_tick_line(client, reader, dsn, t0), flush=True)
            op = "flush" if tick % 2 else "persist"
            maint(op)
            maint_log.append(op)
            print(f"         {op} of {len(TABLES)} tables", flush=True)
    finally:
        if bench.poll() is None:
            bench.send_signal(signal.SIGINT)
        bench.wait()
    if bench.returncode not in (0, None):
        con.print(f"[yellow]pgbench exited with {bench.returncode}: {bench.stderr.read().decode()[-300:]}")
    while maint_log.count("persist") < 2 or maint_log.count("flush") < 2:
        op = "flush" if maint_log.count("flush") < 2 else "persist"
        maint(op)
        maint_log.append(op)
    reader.barrier()  # let the service apply everything pgbench committed before the final persist
    if dagster:
        maint.finish()
    else:
        for t in TABLES:
            client.call("persist", table=t)
    print("workload stopped; every table persisted; verifying …", flush=True)
    return run_verify(TABLES, "union", settings)


def balances_at_one_lsn(dsn: str, reader, tries: int = 3) -> tuple[str, list[tuple], list[dict]]:
    """``QUERY`` on Postgres and on the mirror at one LSN. Postgres: in one transaction, ``LOCK TABLE
    pgbench_accounts IN SHARE MODE`` (waits for the writers in flight to commit, then holds new ones
    for the few milliseconds of the read), the query, and ``pg_current_wal_lsn()`` = L: every change of
    the table committed before L is in the result, none after it. The mirror is then read at exactly L
    once the service has applied it (``reader``: a UnionReader, which waits up to its ``wait_timeout``). (``verify``'s exported snapshot of a temporary slot is exact for
    every table at once, but under a steady load a slot waits for a running-transactions record, logged
    every 15 s; the demo prints every few seconds.) Returns (L as text, Postgres's rows, the mirror's rows).

    The service may flush the table past L (its own maintenance) before the mirror is read at L, which
    it then refuses ("cannot read at LSN L"): the pair is taken again, ``tries`` times in all, before
    that ``ServiceError`` is raised."""
    from .engine.service import ServiceError

    for attempt in range(tries):
        with psycopg.connect(dsn) as c:  # one transaction, committed on exit
            c.execute("LOCK TABLE pgbench_accounts IN SHARE MODE")
            src = c.execute(QUERY).fetchall()
            lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        try:
            mir = reader.query(QUERY, tables=["pgbench_accounts"], lsn=lsn).to_pylist()
        except ServiceError as e:
            if "cannot read at LSN" not in str(e) or attempt == tries - 1:
                raise
            continue
        return lsn, src, mir
    raise AssertionError("unreachable")


class _DagsterMaintenance:
    """``demo --dagster``: maintenance by materializing the Dagster assets (in this process, recorded in
    the Dagster instance of ``<state>/dagster`` so the runs show up in ``mooncake ui``)."""

    def __init__(self, settings: Settings):
        from .dagster.definitions import DagsterConfig, build_definitions, dagster_instance
        from .dagster.resources import parse_tables

        self.instance = dagster_instance(settings.state_dir)
        self.defs = build_definitions(
            DagsterConfig(state_dir=settings.state_dir, tables=parse_tables(TABLES), automation=False)
        )

    def run(self, keys: list[str], label: str):
        from .dagster.definitions import materialize_keys

        res = materialize_keys(
            self.defs,
            keys,
            instance=self.instance,
            raise_on_error=False,
            tags={"mooncake/trigger": "demo"},
            log_level="ERROR",
        )
        done = len(res.get_asset_materialization_events())
        print(
            f"         dagster run {res.run_id[:8]}: {label}, {done}/{len(keys)} assets materialized"
            + ("" if res.success else " — FAILED"),
            flush=True,
        )
        for ev in res.all_events:
            if ev.is_step_failure:
                print(
                    f"           {ev.step_key}: {ev.step_failure_data.error.message.strip().splitlines()[0]}",
                    flush=True,
                )
        return res

    def __call__(self, op: str) -> None:
        kind = "flush" if op == "flush" else "deletion_vectors"
        self.run([f"{kind}/{t}" for t in TABLES], f"{kind}/* ({len(TABLES)} tables)")

    def finish(self) -> None:
        """Full optimize, the downstream assets through the I/O manager, then the mirror assets' checks."""
        kinds = ["flush", "deletion_vectors", "index_merge", "compaction"]
        self.run(
            [f"{k}/{t}" for t in TABLES for k in kinds],
            "full optimize (flush → deletion vectors → index merge → compaction)",
        )
        res = self.run(["analytics/branch_balances", "analytics/teller_activity"], "downstream assets (union reads)")
        for ev in res.get_asset_materialization_events():
            m = {k: v.value for k, v in ev.materialization.metadata.items()}
            key = ev.asset_key.to_user_string()
            if "balanced_branches" in m:
                print(
                    f"           {key}: {m['balanced_branches']}/{m['branches']} branches balanced, total balance "
                    f"{m['total_branch_balance']:,} (accounts {m['total_account_balance']:,})",
                    flush=True,
                )
            if "balanced_tellers" in m:
                print(
                    f"           {key}: {m['balanced_tellers']}/{m['tellers']} tellers balanced over "
                    f"{m['transactions']:,} transactions",
                    flush=True,
                )
        res = self.run([f"mirror/{t}" for t in TABLES], "mirror assets and their checks")
        for ev in res.get_asset_check_evaluations():
            status = "passed" if ev.passed else f"FAILED ({ev.severity.value})"
            print(f"           check {ev.asset_key.path[-1]}:{ev.check_name} {status} — {ev.description}", flush=True)
