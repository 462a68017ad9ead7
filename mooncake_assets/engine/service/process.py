"""The service as a background process (``mooncake start|stop|status``).

``start_service`` spawns ``python -m mooncake_assets.cli serve`` detached (own session, default signal
handlers, output to ``<state>/service.log``, mode ``0600``; a password the caller was given is passed in
the child's environment, see :meth:`Settings.service_environment`) and waits until it answers a ping; ``stop_service`` asks it
to shut down over Flight, then kills it by its own pid (``<state>/service.pid``) if it has not gone.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from ..pg.conninfo import scrub, source_label
from ..pg.embedded import reset_signals as _reset_signals
from ..private import ensure_private_dir, open_private, write_private
from ..timefmt import utc_now
from .client import ServiceClient

log = logging.getLogger(__name__)

#: the Arrow memory pool of the service process (see :func:`select_memory_pool`)
SERVICE_MEMORY_POOL = "jemalloc"
#: Arrow's own variable naming the default pool (jemalloc, mimalloc or system); set, it wins
ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def select_memory_pool(name: str | None = None) -> str:
    """Make ``name`` (default: ``$ARROW_DEFAULT_MEMORY_POOL`` when set, else :data:`SERVICE_MEMORY_POOL`)
    pyarrow's default memory pool in this process; returns the pool's ``backend_name``. A backend
    this pyarrow build lacks (``pa.supported_memory_backends()``) falls back to ``system`` with a
    warning; a name that is no backend raises ``ValueError``.

    Why ``jemalloc``: the service fixes glibc's mmap threshold (``engine/heap.py``, ``fix_mmap_threshold``, so
    that each transaction's transient buffers leave the heap when freed). With the ``system`` pool
    every Arrow buffer of 128 KiB or more then becomes a fresh mapping, page-faulted in and unmapped
    on free, and Arrow work in the service (the change feed, persists, compaction, Flight answers)
    costs ~1.9x the CPU. Measured 2026-12-03 on the quiet 2-core machine (load < 1):
    ``scripts/probe_arrow_heap.py`` (read + filter + sort + concat of 2M narrow rows, CPU median of 7,
    two rounds) and ``python -m mooncake_assets.bench.arrow_pool --child <variant>`` with
    ``MALLOC_MMAP_THRESHOLD_=131072`` (the same setting; 1M narrow rows appended to a MemSlice, drained,
    written to Parquet, dropped, the pool's ``release_unused`` after each round, 3 rounds, MiB):

    ==============================  ================  ========  ==========================
    pool, glibc mmap threshold      Arrow work, CPU s  peak RSS  RSS after each flush, 1 s
    ==============================  ================  ========  ==========================
    system, glibc's dynamic         0.49–0.51          297       132, 132, 133
    system, fixed 128 KiB           0.94–0.97          288       133, 133, 133
    jemalloc, fixed 128 KiB         0.56               288       207, 199, 143
    ==============================  ================  ========  ==========================

    (``M_TRIM_THRESHOLD`` 256 MiB beside the fixed threshold: 0.96; plus ``M_TOP_PAD`` 64 MiB: 0.63–0.73.)
    The peaks are equal; jemalloc keeps up to ~100 MiB of freed pages a little longer after a flush
    (bounded: its decay hands them back; ``release_unused`` asks at once) where the system pool returns
    to its start, and every large Arrow operation of the service needs ~0.6 of the system pool's CPU
    (within ~12 % of glibc's dynamic threshold). An earlier measurement (2026-12-01, before the
    threshold was fixed) had chosen ``system`` for that return after a flush.
    """
    want = (name or os.environ.get(ARROW_POOL_ENV) or SERVICE_MEMORY_POOL).strip().lower()
    makers = {"jemalloc": pa.jemalloc_memory_pool, "mimalloc": pa.mimalloc_memory_pool, "system": pa.system_memory_pool}
    if want not in makers:
        raise ValueError(f"unknown Arrow memory pool {want!r} (jemalloc, mimalloc or system)")
    if want not in pa.supported_memory_backends():
        log.warning("Arrow memory pool %s is not in this pyarrow build; using system", want)
        want = "system"
    pool = makers[want]()
    pa.set_memory_pool(pool)
    return str(pool.backend_name)


class ProcessSettings(Protocol):
    """What starting, stopping and finding the service process needs of the application's settings
    (the application's ``Settings`` has it): the state directory and socket, the DSN the
    caller names (None: the embedded Postgres), ``save()`` (writes ``settings.json``, which the
    spawned ``serve`` reads) and ``service_environment()`` (entries for the child's environment)."""

    state_dir: Path
    dsn: str | None

    @property
    def socket_path(self) -> Path: ...

    def save(self) -> None: ...

    def service_environment(self) -> dict[str, str]: ...


def service_pid(settings: ProcessSettings) -> int | None:
    """The pid in ``<state>/service.pid`` when that process is alive (signal 0 reaches it, or it exists
    under another user); None when there is no file, it is unreadable, or the process is gone."""
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


def clear_stopped_mark(settings: ProcessSettings) -> None:
    """End ``mooncake stop``'s stop (:func:`stopped_mark`): a service answers again."""
    (settings.state_dir / "service.stopped").unlink(missing_ok=True)


def stopped_mark(settings: ProcessSettings) -> str | None:
    """When the user stopped the service with ``mooncake stop`` (and nothing started it since): the
    time of that stop (UTC, ISO 8601), else None. ``<state>/service.stopped`` holds it."""
    try:
        return (settings.state_dir / "service.stopped").read_text().strip() or "an unknown time"
    except OSError:
        return None


class SourceMismatch(RuntimeError):
    """The running service mirrors from another source than the command's ``--dsn`` (one line, no password)."""


def check_source(settings: ProcessSettings, info: dict[str, Any]) -> None:
    """Raise :class:`SourceMismatch` when ``settings`` name a DSN (``--dsn``, MOONCAKE_PG_DSN or
    settings.json) other than the source of the running service whose ``ping`` answer is ``info``.
    DSNs are compared as conninfo without passwords; no DSN (the embedded Postgres) is not checked."""
    if not settings.dsn or not info.get("source"):
        return
    mine = source_label(settings.dsn)
    if mine != info["source"]:
        raise SourceMismatch(
            f"the running mooncake service (pid {info.get('pid')}) mirrors from {info['source']}, "
            f"not {mine}; stop it first (`mooncake stop`) to use another source"
        )


def start_service(
    settings: ProcessSettings,
    timeout: float = 60.0,
    report: bool = False,
    maintenance: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> int | tuple[int, bool]:
    """Start the service unless it already answers; returns its pid (with ``report=True``:
    ``(pid, started)``). Callers that race (CLI, Dagster sensors and runs) are serialized by an
    exclusive lock on ``<state>/service.start.lock``: one starts it, the others find it answering.

    ``maintenance``: ``auto`` or ``dagster`` for a service started here (``serve --maintenance``; not
    written to settings.json, so it applies to this process only); a running one keeps its mode.
    ``extra_env``: environment variables set for a service started here only (on top of this
    process's environment; a running one keeps its own). :class:`SourceMismatch` when the running
    service's source is not the DSN of ``settings``; RuntimeError with the log tail when it does not
    start."""
    if maintenance not in (None, "auto", "dagster"):
        raise ValueError(f"maintenance must be auto or dagster, not {maintenance!r}")
    ensure_private_dir(settings.state_dir)
    with open_private(settings.state_dir / "service.start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client = ServiceClient(settings.socket_path)
            if client.ping():
                try:
                    info = client.call("ping", timeout=5)
                except Exception:
                    info = {}
                client.close()
                check_source(settings, info)
                pid = service_pid(settings) or -1
                return (pid, False) if report else pid
            pid = _spawn(settings, client, timeout, maintenance, extra_env)
            return (pid, True) if report else pid
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _spawn(
    settings: ProcessSettings,
    client: ServiceClient,
    timeout: float,
    maintenance: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> int:
    settings.save()
    log = open_private(settings.state_dir / "service.log", "ab")
    log.seek(0, os.SEEK_END)
    log_start = log.tell()  # what this service writes comes after it (the log is appended to)
    env = dict(os.environ)
    env["MOONCAKE_STATE_DIR"] = str(settings.state_dir)
    env.setdefault(ARROW_POOL_ENV, SERVICE_MEMORY_POOL)  # the child's pool from its first allocation
    # a password given to this process (--dsn, the resource's dsn) reaches the service through its
    # environment only (readable by its owner alone), never through a file or its command line
    env.update(settings.service_environment())
    env.update(extra_env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(settings.state_dir), "serve"]
        + (["--maintenance", maintenance] if maintenance else []),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
        preexec_fn=_reset_signals,
        cwd=str(settings.state_dir),
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        if client.ping(timeout=1.0):
            client.close()
            clear_stopped_mark(settings)  # only a start that answers ends `mooncake stop`'s stop
            return proc.pid
        time.sleep(0.1)
    raise RuntimeError(scrub(_start_failure(settings.state_dir / "service.log", log_start)))


def _start_failure(log_path: Path, start: int) -> str:
    """Why the service whose output began at byte ``start`` of ``log_path`` did not start: one line with
    its ``error: …`` message (``serve``'s, which ends its output) when it printed one, else the log's
    last lines (a crash's traceback)."""
    with open(log_path, "rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("error: ")), None)
    if at is None:
        return "the mooncake service did not start:\n" + "\n".join(lines[-15:])
    why = " ".join(" ".join(ln.split()) for ln in [lines[at][len("error: ") :], *lines[at + 1 :]] if ln.strip())
    return f"the mooncake service did not start: {why}"


def stop_service(settings: ProcessSettings, timeout: float = 15.0, mark: bool = False) -> bool:
    """Stop the background service; returns True if one was running. ``mark``: record that the user
    stopped it (:func:`stopped_mark`), so reads say so instead of starting it again."""
    if mark:
        write_private(ensure_private_dir(settings.state_dir) / "service.stopped", utc_now())
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


def kill_service(settings: ProcessSettings) -> None:
    """SIGKILL the service (crash tests) and wait up to 5 s until it is gone (reaped when it is our
    child); nothing when no service runs."""
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
