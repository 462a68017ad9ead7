"""The service as a background process (``mooncake start|stop|status``).

``start_service`` spawns ``python -m mooncake_assets.cli serve`` detached (own session, default signal
handlers, output to ``<state>/service.log``, mode ``0600``; a password the caller was given is passed in
the child's environment, see :meth:`Settings.service_environment`) and waits until it answers a ping; ``stop_service`` asks it
to shut down over Flight, then kills it by its own pid (``<state>/service.pid``) if it has not gone.
"""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

from ...config import Settings
from .client import ServiceClient, ServiceUnavailable
from ..pg.conninfo import scrub
from ..pg.embedded import reset_signals as _reset_signals
from ..private import ensure_private_dir, open_private


def service_pid(settings: Settings) -> int | None:
    f = settings.state_dir / "service.pid"
    try:
        pid = int(f.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def start_service(settings: Settings, timeout: float = 60.0, report: bool = False):
    """Start the service unless it already answers; returns its pid (with ``report=True``:
    ``(pid, started)``). Callers that race (CLI, Dagster sensors and runs) are serialized by an
    exclusive lock on ``<state>/service.start.lock``: one starts it, the others find it answering.
    RuntimeError with the log tail on failure."""
    ensure_private_dir(settings.state_dir)
    with open_private(settings.state_dir / "service.start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = ServiceClient(settings.socket_path)
            if client.ping():
                client.close()
                pid = service_pid(settings) or -1
                return (pid, False) if report else pid
            pid = _spawn(settings, client, timeout)
            return (pid, True) if report else pid
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _spawn(settings: Settings, client: ServiceClient, timeout: float) -> int:
    settings.save()
    log = open_private(settings.state_dir / "service.log", "ab")
    env = dict(os.environ)
    env["MOONCAKE_STATE_DIR"] = str(settings.state_dir)
    # a password given to this process (--dsn, the resource's dsn) reaches the service through its
    # environment only (readable by its owner alone), never through a file or its command line
    env.update(settings.service_environment())
    proc = subprocess.Popen([sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(settings.state_dir), "serve"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True, preexec_fn=_reset_signals, cwd=str(settings.state_dir))
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        if client.ping(timeout=1.0):
            client.close()
            return proc.pid
        time.sleep(0.1)
    tail = (settings.state_dir / "service.log").read_text(errors="replace").splitlines()[-15:]
    raise RuntimeError(scrub("the mooncake service did not start:\n" + "\n".join(tail)))


def stop_service(settings: Settings, timeout: float = 15.0) -> bool:
    """Stop the background service; returns True if one was running."""
    pid = service_pid(settings)
    client = ServiceClient(settings.socket_path)
    was = False
    try:
        client.call("shutdown", timeout=5)
        was = True
    except Exception:
        pass
    client.close()
    if pid:
        was = True
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # reap it if it is our child (a zombie still answers kill 0)
            except ChildProcessError:
                pass
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return was


def kill_service(settings: Settings) -> None:
    """SIGKILL the service (crash tests)."""
    pid = service_pid(settings)
    if pid:
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.waitpid(pid, os.WNOHANG)  # reap it if it is our child (else it stays a zombie)
            except ChildProcessError:
                pass
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
