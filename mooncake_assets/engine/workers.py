"""CPU-heavy maintenance work in a child process of lower CPU priority (``maintenance: auto``).

What runs here: a compaction's rewrite and index rebuild, and an index merge
(:mod:`~mooncake_assets.engine.compaction.worker`).

Why a process and not a thread: the service's replication thread needs the GIL for every batch it
applies. Work in a lower-priority *thread* of the service still takes the GIL between its Arrow
calls, and when the kernel deschedules it while it holds it (which a low priority makes likely on a
machine Postgres keeps busy), the apply loop waits for a thread that is not running (priority
inversion); at the service's own priority it takes the CPU the apply loop needs. A child process has
its own GIL and its own nice value (setpriority(2), sched(7) "The nice value"), so only the kernel
decides, and it gives the apply loop the CPU first. Measured with ``mooncake bench --suite sysbench``
(``oltp_insert``, 4 threads, 60 s, 23–29k tps on 2 cores; max applied lag of each run): compaction's
rewrite in a nice-10 thread 18.2, 21.7, 23.4 MiB; in a nice-10 child decoding on Arrow's pool (two
threads) 5.9, 41.6, 42.7 MiB; on one thread 7.2, 7.9, 26.5 MiB. A thread tracer then showed the
index rebuild after the rewrite at the service's priority (up to 2.9 s) under a lag spike, and it
moved here too. (A persist's Parquet write moved here as well made ``oltp_insert`` worse in four of
five runs — 28.3, 35.1, 29.6, 20.8 MiB against 9.0; traces showed the replication thread runnable
yet getting little CPU, and waiting for the service lock at the persist's swap — so it stays in the
service.)

One child per priority: a :class:`concurrent.futures.ProcessPoolExecutor` of one worker started with
``spawn`` (a fresh interpreter: forking a process with running threads and Arrow's pools is unsafe),
reused, and ended after :data:`IDLE_EXIT_S` without work; it works on one thread (Arrow's pool at
one), so it adds at most one busy core. The function and its arguments are pickled across (Arrow
tables and numpy arrays as their buffers). A child that dies (killed, out of memory) fails that call
with ``BrokenProcessPool``; the next call starts a new child. A child whose service died ends itself
within :data:`PARENT_CHECK_S`.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa

__all__ = ["run_niced", "shutdown_workers", "IDLE_EXIT_S", "PARENT_CHECK_S"]

#: seconds a child waits for the next call before it exits (its ~200 MB of imports and buffers go
#: back to the machine; the next call starts a new one, about a second of CPU at its priority)
IDLE_EXIT_S = 120.0
#: seconds between the child's checks that the service that started it is alive
PARENT_CHECK_S = 1.0


@dataclass
class _Child:
    """The child of one priority: its pool, the calls in flight on it and its idle timer."""

    pool: ProcessPoolExecutor
    running: int = 0
    idle: threading.Timer | None = field(default=None, repr=False)


T = TypeVar("T")

_children: dict[int, _Child] = {}
_lock = threading.Lock()


def _start_child(nice: int, parent: int) -> None:
    """Child initializer: its own session (setsid(2)) whose autogroup gets the nice value ``nice``
    (``/proc/self/autogroup``, sched(7) "The autogroup feature"), ``nice`` steps lower CPU priority,
    one Arrow thread, and a watchdog that ends the child once ``parent`` (the service's pid) is gone.

    Why its own autogroup: where the kernel groups processes by session (``sched_autogroup_enabled``,
    the default of many distributions), a nice value only ranks threads of one session; the
    service's session as a whole competes with Postgres's, so a busy child in it, niced or not, takes
    its session's share from the walsender that feeds the stream. Measured here: under ``oltp_insert``
    at 27–30k tps the WAL the walsender had not yet sent reached 20–30 MiB with the child in the
    service's session, ≤ 2 MiB with ``pg_recvlogical`` as the consumer. Where setsid or the
    autogroup file is refused, the child keeps the service's session and only its nice value counts.

    The watchdog: a service killed outright (SIGKILL, the OOM killer) cannot stop its child, and the
    child would wait forever for work: its end of the work queue keeps the pipe open, so it never
    reads EOF."""
    try:
        os.setsid()
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:  # (not Linux, no autogroups, or not allowed: the nice value below still applies)
        pass
    try:
        os.nice(nice)
    except OSError:  # (not allowed: run at the parent's priority)
        pass
    pa.set_cpu_count(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)  # reparented: the service is gone; half-written outputs are orphans it cleans up

    threading.Thread(target=watch, name="mooncake-parent-watch", daemon=True).start()


def _take(nice: int) -> _Child:
    """The child of priority ``nice`` (started when there is none), counted as busy."""
    with _lock:
        child = _children.get(nice)
        if child is None:
            pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(nice, os.getpid()),
            )
            child = _children[nice] = _Child(pool)
        if child.idle is not None:
            child.idle.cancel()
            child.idle = None
        child.running += 1
        return child


def _give_back(nice: int, child: _Child) -> None:
    """A call on ``child`` ended: when nothing else runs there, it exits after :data:`IDLE_EXIT_S`."""
    with _lock:
        child.running -= 1
        if child.running or _children.get(nice) is not child:
            return
        child.idle = threading.Timer(IDLE_EXIT_S, _retire, (nice, child))
        child.idle.daemon = True
        child.idle.start()


def _retire(nice: int, child: _Child) -> None:
    with _lock:
        if child.running or _children.get(nice) is not child:
            return
        del _children[nice]
    child.pool.shutdown(wait=True)


def run_niced(nice: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the child process of priority ``nice`` (steps below this process, 1–19; 0 or
    less: here, in the calling thread, at its priority); calls of one priority run one at a time.
    ``fn`` must be a module-level function and ``args`` picklable. Blocks until it returns; returns
    its result. Raises what ``fn`` raises, or ``BrokenProcessPool`` when the child died (the next
    call starts a new one)."""
    if nice <= 0:
        return fn(*args)
    child = _take(nice)
    try:
        return child.pool.submit(fn, *args).result()
    except BrokenProcessPool:
        with _lock:
            if _children.get(nice) is child:
                del _children[nice]
        child.pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        _give_back(nice, child)


def shutdown_workers() -> None:
    """Stop the child processes (they are started again when needed)."""
    with _lock:
        children = list(_children.values())
        _children.clear()
        for c in children:
            if c.idle is not None:
                c.idle.cancel()
    for c in children:
        c.pool.shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown_workers)
