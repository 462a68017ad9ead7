"""``mooncake ui`` (``make ui``): the Dagster webserver and daemon on the demo's tables, alive.

Starts the source Postgres (the embedded one unless a DSN is configured), creates pgbench's tables when
they are missing (``pgbench -i``), starts the replicator service with ``maintenance: dagster`` (for this run only: settings.json keeps its mode), mirrors
the four pgbench tables, runs a rate-limited pgbench workload in the background, and runs
``dagster dev -w workspace.yaml`` on ``host:port`` (127.0.0.1 by default) with ``DAGSTER_HOME`` at
``<state>/dagster``: the replication sensor and the maintenance schedules run, so a newcomer sees
observations, maintenance runs and checks arrive. Ctrl-C stops the UI, the daemon, the workload and the
service (the embedded Postgres keeps running: ``mooncake pg stop``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from mooncake_assets.engine.pg.embedded import reset_signals as _reset_signals

from .config import Settings
from .engine.pg.conninfo import redact

REPO = Path(__file__).resolve().parent.parent


def dagster_dev_command(host: str, port: int, workspace: Path | None = None) -> tuple[list[str], Path]:
    """(argv, working directory) of ``dagster dev`` on this package's definitions: ``-w workspace.yaml``
    when there is one (the current folder's, else the source checkout's), else ``-m mooncake_assets.definitions``."""
    exe = Path(sys.executable).parent / "dagster"
    base = [str(exe) if exe.exists() else "dagster", "dev", "-h", host, "-p", str(port)]
    for cand in [workspace] if workspace else [Path.cwd() / "workspace.yaml", REPO / "workspace.yaml"]:
        if cand and cand.is_file():
            return base + ["-w", str(cand.resolve())], cand.resolve().parent
    return base + ["-m", "mooncake_assets.definitions"], Path.cwd()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _stop_group(proc: subprocess.Popen, first=signal.SIGINT, timeout: float = 20.0) -> None:
    """Stop ``proc`` (the leader of its own session and process group): ``first`` to the leader, which
    shuts its children down; what is left of the group after ``timeout`` gets SIGTERM, then SIGKILL."""
    pgid = proc.pid
    if proc.poll() is None:
        try:
            proc.send_signal(first)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        if not _group_alive(pgid):
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.time() + wait
        while time.time() < deadline and _group_alive(pgid):
            if proc.poll() is None:
                try:
                    proc.wait(0.1)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.1)


def run_ui(
    settings: Settings, host: str = "127.0.0.1", port: int = 3000, scale: int = 1, rate: int = 20, clients: int = 2
) -> int:
    """See the module docstring. ``rate``: pgbench transactions per second (0: no workload). Returns
    ``dagster dev``'s exit status."""
    import psycopg

    from .commands import create_with_progress
    from .dagster.definitions import dagster_home
    from .demo import TABLES, _pg_bin
    from .engine.service import ServiceClient
    from .engine.service.process import start_service, stop_service

    con = Console()
    dsn = settings.source_dsn()
    con.print(f"[bold]source[/bold] {redact(dsn)}")  # never a password
    stop_service(settings)  # a running service keeps its mode: start it again with maintenance by Dagster
    # the mode applies to the service started here only: settings.json keeps its own, so a later
    # `mooncake start` (or query's auto-start) flushes and persists again
    start_service(settings, maintenance="dagster")
    client = ServiceClient(settings.socket_path)
    with psycopg.connect(dsn, autocommit=True) as c:
        present = {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    mirrored = {t["name"] for t in client.status()["tables"]}
    if not set(TABLES) <= present:
        for t in TABLES:
            if t in mirrored:
                client.call("drop_table", table=t)
        mirrored -= set(TABLES)
        con.print(f"pgbench -i -s {scale} …")
        subprocess.run([_pg_bin("pgbench"), "-i", "-q", "-s", str(scale), dsn], check=True, capture_output=True)
    for t in TABLES:
        if t not in mirrored:
            res = create_with_progress(client, t, f"public.{t}")
            print(f"  mirrored public.{t}: {res['rows']:,} rows at LSN {res['copy_lsn']}", flush=True)
    client.close()

    bench = None
    if rate > 0:
        con.print(f"pgbench workload: {clients} clients, {rate} transactions/s")
        bench = subprocess.Popen(
            [_pg_bin("pgbench"), "-n", "-c", str(clients), "-j", "1", "-R", str(rate), "-T", str(365 * 24 * 3600), dsn],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_reset_signals,
        )
    home = dagster_home(settings.state_dir)
    env = dict(os.environ, DAGSTER_HOME=str(home), MOONCAKE_STATE_DIR=str(settings.state_dir))
    env.setdefault("MOONCAKE_TABLES", ",".join(TABLES))
    cmd, cwd = dagster_dev_command(host, port)
    con.print(f"[bold]Dagster UI[/bold] http://{host}:{port}  (DAGSTER_HOME {home}; Ctrl-C stops it all)")
    dev = subprocess.Popen(
        cmd, env=env, cwd=str(cwd), stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_reset_signals
    )

    def _terminate(signum, frame):  # SIGTERM stops everything as Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        while dev.poll() is None:
            time.sleep(0.5)
            if bench is not None and bench.poll() is not None:
                con.print(f"[yellow]the pgbench workload stopped (exit {bench.returncode})")
                bench = None
    except KeyboardInterrupt:
        con.print("stopping …")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish cleaning up
        _stop_group(dev)
        if bench is not None:
            _stop_group(bench, signal.SIGTERM, 5)
        stop_service(settings)
        signal.signal(signal.SIGTERM, previous)
    return dev.returncode or 0
