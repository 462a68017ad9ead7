"""Hand memory freed after a peak back to the operating system.

A large transaction's apply, a flush or a persist frees much more than the process keeps using
afterwards, but freed memory stays in the allocators' free lists: Arrow's memory pool (jemalloc or
mimalloc keep pages cached) and glibc's ``malloc`` heap (where the system pool, numpy arrays, the
MemIndex and Python's larger objects live; it returns only the top of its main arena by itself).
:func:`release_unused` asks both to give their free pages back, so the service's RSS falls back
after a peak instead of staying at it (measured below; ``tests/engine/test_heap.py``).

- ``pyarrow.default_memory_pool().release_unused()`` (Arrow ``MemoryPool::ReleaseUnused``: jemalloc
  purges its dirty pages, mimalloc collects, the system pool calls ``malloc_trim`` itself);
- glibc's ``malloc_trim(0)`` (malloc_trim(3)) through ``ctypes``, only when the C library is glibc
  (``os.confstr("CS_GNU_LIBC_VERSION")``); elsewhere (musl, macOS) it is skipped.

Measured (2026-12-02; the service under ``memory_limit`` 512 MiB, system pool, a 3M-row table of
``id bigint, n int, v text`` mirrored, then ``UPDATE big SET n = n + 1`` in one transaction, spilled;
service RSS from ``/proc/<pid>/status``, MiB; before: only the pool's ``release_unused`` after a flush):

=================================  ======  =====
service RSS                        before  after
=================================  ======  =====
initial copy persisted             397     258
the UPDATE applied, 5 s later      411     322
after the next persist             411     322
peak (VmHWM)                       675     615
=================================  ======  =====

It costs a few milliseconds per GiB of heap (``malloc_trim`` walks every arena), so callers use it
after a large piece of work (a flush, a persist, a spilled transaction's apply), not per row.

:func:`fix_mmap_threshold` keeps the peak from building up in the first place: glibc serves a
request of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB) with its own ``mmap`` and unmaps it on
``free`` — but by default it *raises* that threshold to the size of each such block freed (up to
32 MiB), so after the first large transaction every later transaction's buffers (the decoder's
columns, a run's text arrays, the hashes, a batch before it is copied out) come from the heap and
stay there when freed, under the blocks that outlive them (mallopt(3), "M_MMAP_THRESHOLD"). Setting
the threshold (mallopt) switches that adjustment off. Measured with the service's own bench steps
(500,000 narrow rows in transactions of 50,000, no flush; 2026-12-03, shared machine): RSS after
+109 → +74 MiB, peak +109 → +89 MiB (``MALLOC_MMAP_THRESHOLD_=131072``, the same setting).

**Its cost, and why the service's Arrow pool is jemalloc**: every buffer of 128 KiB or more that comes
from ``malloc`` is then a fresh mapping, page-faulted in and unmapped on free. With Arrow on the
``system`` pool (which allocates through ``malloc``) Arrow work in the service cost ~1.9x the CPU: a
read + filter + sort + concat of 2M narrow rows (``scripts/probe_arrow_heap.py``, CPU median of 7)
0.49–0.51 s with glibc's dynamic threshold, 0.94–0.97 s fixed at 128 KiB (0.84–0.90 fixed at 1 MiB
with a 256 MiB trim threshold); the
change feed in the service's settings 42 → 93 ms CPU. Arrow on ``jemalloc`` (its own mappings, reused)
with the threshold fixed: 0.56 s, the same peak RSS in the MemSlice pattern
(:func:`~.service.process.select_memory_pool` has the table). The apply path showed no cost either way
(``mooncake bench --quick --suite ingest`` with and without ``MALLOC_MMAP_THRESHOLD_=131072``, CPU µs/row
equal within the noise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

import pyarrow as pa

__all__ = ["release_unused", "malloc_trim_available", "fix_mmap_threshold"]

log = logging.getLogger(__name__)

_TRIM: Callable[[int], int] | None = None
_LOOKED = False


def _glibc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (``int malloc_trim(size_t pad)``), or None when the C library is not glibc."""
    global _TRIM, _LOOKED
    if _LOOKED:
        return _TRIM
    _LOOKED = True
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.malloc_trim
    except (AttributeError, OSError, ValueError):  # (no confstr name, no glibc, no symbol)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    _TRIM = fn
    return fn


#: mallopt(3)'s parameter number of M_MMAP_THRESHOLD (glibc's malloc.h)
M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(nbytes: int = 128 * 1024) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``nbytes`` (module docstring): every ``malloc`` of at least
    that many bytes gets its own mapping, returned to the system by ``free``. Returns True when set,
    False when the C library is not glibc or refuses the value (``mallopt`` returns 0). Never raises."""
    if _glibc_trim() is None:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.mallopt
        fn.argtypes = [ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        return bool(fn(M_MMAP_THRESHOLD, int(nbytes)))
    except (AttributeError, OSError, ValueError) as e:
        log.debug("mallopt(M_MMAP_THRESHOLD) failed: %s", e)
        return False


def malloc_trim_available() -> bool:
    """True when this process runs on glibc, so :func:`release_unused` also trims the ``malloc`` heap."""
    return _glibc_trim() is not None


def release_unused() -> bool:
    """Release the free memory of Arrow's default pool and, on glibc, of the ``malloc`` heap
    (module docstring). Returns True when ``malloc_trim`` gave memory back (its return value), False
    when it had nothing to give or is not available. Never raises: a failure is logged at debug level."""
    try:
        pa.default_memory_pool().release_unused()
    except Exception as e:  # (a pool without the call: nothing to release)
        log.debug("Arrow memory pool release_unused failed: %s", e)
    trim = _glibc_trim()
    if trim is None:
        return False
    try:
        return bool(trim(0))
    except Exception as e:
        log.debug("malloc_trim failed: %s", e)
        return False
