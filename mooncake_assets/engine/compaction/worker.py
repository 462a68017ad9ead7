"""A compaction's rewrite in a child process of lower CPU priority (``maintenance: auto``).

Why a process and not a thread: the service's replication thread needs the GIL for every batch it
applies. A rewrite in a lower-priority *thread* of the service still takes the GIL between its Arrow
calls, and when the kernel deschedules it while it holds it (which a low priority makes likely on a
machine Postgres keeps busy), the apply loop waits for a thread that is not running (priority
inversion). A child process has its own GIL and its own nice value (setpriority(2), sched(7) "The
nice value"), so only the kernel decides, and it gives the apply loop the CPU first. Measured with
``mooncake bench --suite sysbench`` (``oltp_insert``, 4 threads, 60 s, 26–29k tps on 2 cores; max
applied lag of each run): rewrite in a nice-10 thread 18.2, 21.7, 23.4 MiB; in a nice-10 child
decoding on Arrow's pool (two threads) 5.9, 41.6, 42.7 MiB; in a nice-10 child decoding on one
thread 7.2, 7.9, 26.5 MiB; with compaction kept off 10.2 MiB. Single runs swing widely at this
load; the larger figures sat on persists and on compactions running together.

The child is a :class:`concurrent.futures.ProcessPoolExecutor` of one worker started with
``spawn`` (a fresh interpreter: forking a process with running threads and Arrow's pools is unsafe),
once per priority, reused, and ended after :data:`IDLE_EXIT_S` without work; it decodes on one
thread, so a compaction adds at most one busy core. What crosses the pipe is small or
columnar: the inputs (names, paths, deletion-vector bitmaps, lineage), the Arrow schema, the FileIO
(PyIceberg FileIOs pickle their properties, so ``s3://``, ``gs://`` and ``abfs://`` inputs open in
the child as in the service), and back the :class:`~.rewriter.RewriteResult` (output paths and the
PositionMap, 12 bytes per input row). A child that dies (killed, out of memory) fails that
compaction with ``BrokenProcessPool``; the next one starts a new child. A child whose service died
ends itself within :data:`PARENT_CHECK_S`.
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
from pathlib import Path
from typing import Any

import pyarrow as pa

from .rewriter import RewriteInput, RewriteResult, rewrite_files

__all__ = ["rewrite_in_child", "shutdown_workers"]

#: seconds a child waits for the next rewrite before it exits (its ~200 MB of imports and buffers
#: go back to the machine; the next compaction starts a new one, about a second of CPU at its priority)
IDLE_EXIT_S = 120.0
#: seconds between the child's checks that the service that started it is alive
PARENT_CHECK_S = 1.0

_pools: dict[int, ProcessPoolExecutor] = {}
_running: dict[int, int] = {}  # rewrites in flight per priority
_idle_timers: dict[int, threading.Timer] = {}
_pools_lock = threading.Lock()


def _start_child(nice: int, parent: int) -> None:
    """Child initializer: ``nice`` steps lower CPU priority, one decoding thread (Arrow's pool holds
    one thread: a compaction adds at most one busy core to the machine the stream runs on), and a
    watchdog that ends the child once ``parent`` (the service's pid) is gone. A service killed
    outright (SIGKILL, the OOM killer) cannot stop its child, and the child would wait forever for
    work: its end of the work queue keeps the pipe open, so it never reads EOF."""
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


def _open_with(io: Any) -> Callable[[str], Any]:
    """path → what ``pyarrow.parquet.ParquetFile`` takes: a FileIO stream for URIs, the path otherwise."""
    return lambda p: io.new_input(p).open() if io is not None and "://" in p else p


def _rewrite(
    inputs: list[RewriteInput],
    out_dir: str,
    schema: pa.Schema,
    target_bytes: int,
    io: Any,
    defaults: dict[int, pa.Scalar] | None,
    lineage: bool,
) -> RewriteResult:
    """In the child: :func:`rewrite_files`."""
    return rewrite_files(
        inputs, out_dir, schema, target_bytes, open_input=_open_with(io), defaults=defaults, lineage=lineage
    )


def _take(nice: int) -> ProcessPoolExecutor:
    """The child of priority ``nice`` (started when there is none), counted as busy."""
    with _pools_lock:
        timer = _idle_timers.pop(nice, None)
        if timer is not None:
            timer.cancel()
        pool = _pools.get(nice)
        if pool is None:
            pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(nice, os.getpid()),
            )
            _pools[nice] = pool
        _running[nice] = _running.get(nice, 0) + 1
        return pool


def _give_back(nice: int, pool: ProcessPoolExecutor) -> None:
    """A rewrite on ``pool`` ended: when nothing else runs there, it exits after :data:`IDLE_EXIT_S`."""
    with _pools_lock:
        _running[nice] -= 1
        if _running[nice] or _pools.get(nice) is not pool:
            return
        timer = threading.Timer(IDLE_EXIT_S, _retire, (nice, pool))
        timer.daemon = True
        _idle_timers[nice] = timer
        timer.start()


def _retire(nice: int, pool: ProcessPoolExecutor) -> None:
    with _pools_lock:
        if _running.get(nice) or _pools.get(nice) is not pool:
            return
        del _pools[nice]
        _idle_timers.pop(nice, None)
    pool.shutdown(wait=True)


def rewrite_in_child(
    inputs: list[RewriteInput],
    out_dir: str | Path,
    schema: pa.Schema,
    target_bytes: int,
    nice: int,
    io: Any = None,
    defaults: dict[int, pa.Scalar] | None = None,
    lineage: bool = False,
) -> RewriteResult:
    """:func:`~.rewriter.rewrite_files` of ``inputs`` (same arguments, ``open_input`` made from
    ``io``: a PyIceberg FileIO for URI inputs, None for local paths) run in the child process of
    priority ``nice`` (steps below this process, 1–19; 0 or less: here, in the calling thread, at its
    priority). Blocks until it is done; returns its
    :class:`RewriteResult` (outputs written under ``out_dir`` by the child, local paths). Raises what
    the rewrite raises (outputs deleted, as :func:`rewrite_files` does), or ``BrokenProcessPool``
    when the child died (its partial outputs are left to the orphan cleanup of ``out_dir``)."""
    if nice <= 0:
        return _rewrite(list(inputs), str(out_dir), schema, target_bytes, io, defaults, lineage)
    pool = _take(nice)
    try:
        return pool.submit(_rewrite, list(inputs), str(out_dir), schema, target_bytes, io, defaults, lineage).result()
    except BrokenProcessPool:
        with _pools_lock:
            if _pools.get(nice) is pool:
                del _pools[nice]
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        _give_back(nice, pool)


def shutdown_workers() -> None:
    """Stop the child processes (they are started again when needed)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
        for timer in _idle_timers.values():
            timer.cancel()
        _idle_timers.clear()
    for p in pools:
        p.shutdown(wait=True, cancel_futures=True)


atexit.register(shutdown_workers)
