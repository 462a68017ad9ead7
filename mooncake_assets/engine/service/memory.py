"""The service's memory budget: sizes, accounting, early flush, backpressure.

One number bounds what the service holds for replication, ``ServiceConfig.memory_limit`` (bytes):

- **Accounting** (:meth:`MemoryBudget.usage`): bytes of the open transactions the decoder holds in
  memory (``NativeDecoder.buffered_bytes``; the reference decoder: ``buffered_changes`` ×
  :data:`REFERENCE_CHANGE_BYTES`), plus every table's MemSlice (its Arrow bytes) with its MemIndex
  estimated at :data:`INDEX_ENTRY_BYTES` per row, plus the pending position deletes of its data files
  (``PendingDeletes.nbytes``: about 5 B each; a plain mapping at :data:`PENDING_DELETE_BYTES` each) and their keys in the table's delete log
  (``DeleteLog.nbytes``, at most ``MAX_LOG_BYTES``, ``engine/table/delete_log.py``). These are estimates of the structures that grow with the
  change stream, not the process's RSS (the interpreter, libraries and caches come on top).
- **Early flush** (:meth:`MemoryBudget.relieve`): past :data:`FLUSH_SHARE` of the budget, committed
  buffers are flushed to local staging (``MirrorTable.flush``; no Iceberg commit), largest first, until
  usage is back under it (a MemSlice below 1/:data:`MIN_FLUSH_FRACTION` of the budget is left alone:
  pending deletes, which only a persist frees, must not cause a flush per batch). Called between read batches and between the chunks of a spilled transaction.
- **Spill** (``engine/cdc/spill.py``): each time an open transaction of the compiled decoder holds
  :meth:`MemoryBudget.spill_bytes` in its buffer, its changes so far go to disk (the buffer then starts
  again, its memory reused); at commit it is applied from there, chunk by chunk.
- **Backpressure** (:attr:`MemoryBudget.backpressure`): still over the budget after flushing (a table
  that cannot flush), the stream stops reading from the slot until usage drops (``status`` shows
  ``backpressure: true``). Open transactions are left out of that test (reading on is what completes
  them): the reference decoder, which does not spill, holds a large transaction whole, unbounded by
  the budget (the stream logs a warning when it starts with that decoder).

Sizes on the command line (:func:`parse_size`): an integer with an optional unit, ``B``, ``KiB``,
``MiB``, ``GiB``, ``TiB`` (powers of 1024) or ``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000); ``K``,
``M``, ``G``, ``T`` alone are powers of 1024. The default budget is :data:`DEFAULT_SHARE` of the
machine's ``MemTotal`` (``/proc/meminfo``; proc(5)); a budget below :data:`MIN_MEMORY_LIMIT` is refused.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "DEFAULT_SHARE",
    "FLUSH_SHARE",
    "MIN_MEMORY_LIMIT",
    "MemoryBudget",
    "check_memory_limit",
    "default_memory_limit",
    "format_size",
    "parse_size",
]

log = logging.getLogger("mooncake.service")

#: the smallest budget accepted (bytes): a spill chunk, a MemSlice flush batch and the decoder's buffers
MIN_MEMORY_LIMIT = 128 << 20
#: the default budget: this share of MemTotal
DEFAULT_SHARE = 0.25
#: early flush starts past this share of the budget (a flush briefly needs about its MemSlice's size
#: again: the live rows gathered into one Arrow table, the Parquet writer's buffers; at 0.5 the
#: 3M-row UPDATE under 512 MiB peaked at +464 MiB RSS, at 0.25 at +265 MiB)
FLUSH_SHARE = 0.25
#: an open transaction's buffer spills past this many bytes (its buffer, then a copy as runs while it
#: is written, and the arrays' growth room come on top: about 3x this at the peak). Not a share of the
#: budget: a larger buffer only costs more. Measured 2026-12-03 with ``scripts/probe_streamed_ingest.py
#: STATE ROWS --shape … --mode large`` (one streamed INSERT, the bench's apply loop; quiet 2-core
#: machine, 4 rotated rounds, medians): 400,000 wide rows held whole until the commit (what 377 MiB,
#: the share this replaced at the default budget, did) 6.74 s wall, 5.86 s CPU, max RSS 696 MiB; spilled
#: every 16 MiB 4.96 s, 4.2 s, 525 MiB (the runs kept in memory instead of a file: 5.61 s, 4.65 s,
#: 664 MiB); 1M narrow rows 11.3 → 9.1–10.9 s. The buffer is reused already faulted in (fresh
#: anonymous memory is the costly part: the kernel zeroes it), the runs are built while the walsender
#: still decodes the transaction instead of after its commit, and a spill file deleted within seconds
#: never reaches the disk (page cache writeback comes later)
SPILL_BYTES = 16 << 20
#: an early flush takes a MemSlice of at least 1/this of the budget
MIN_FLUSH_FRACTION = 32
#: estimated bytes per MemIndex entry (key hash → location, Python dict and lists)
INDEX_ENTRY_BYTES = 120
#: estimated bytes per pending position delete held as a plain mapping (a dict entry int → int); a
#: ``PendingDeletes`` (what ``DiskFile.pending`` holds) reports its own ``nbytes``, about 5 B per delete
PENDING_DELETE_BYTES = 100
#: estimated bytes per buffered change of the reference decoder (a ``Change`` with its tuples)
REFERENCE_CHANGE_BYTES = 600

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}


def parse_size(text: str | int) -> int:
    """``512MiB``, ``2GiB``, ``1.5G``, ``1000000`` → bytes (module docstring). ``ValueError`` naming the
    accepted units for anything else."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 512MiB, 2GiB, 1500MB or a number of bytes)")
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    """Bytes as the largest binary unit that keeps one decimal (``536870912`` → ``512.0 MiB``)."""
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024:
            return f"{v:.1f} {unit}" if unit != "B" else f"{int(v)} B"
        v /= 1024
    return f"{v:.1f} TiB"


def default_memory_limit(meminfo: str = "/proc/meminfo") -> int:
    """:data:`DEFAULT_SHARE` of ``MemTotal`` (proc(5), in kB), at least :data:`MIN_MEMORY_LIMIT`;
    1 GiB where ``/proc/meminfo`` cannot be read."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(MIN_MEMORY_LIMIT, int(int(line.split()[1]) * 1024 * DEFAULT_SHARE))
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def check_memory_limit(n: int) -> int:
    """``n`` if it is a usable budget, else ``ValueError`` with the minimum, in one line."""
    if n < MIN_MEMORY_LIMIT:
        raise ValueError(
            f"memory limit {format_size(n)} is below the working minimum of {format_size(MIN_MEMORY_LIMIT)} "
            f"({MIN_MEMORY_LIMIT} bytes)"
        )
    return n


def _pending_bytes(pending: Any) -> int:
    """Estimated bytes of one file's pending deletes: their own ``nbytes`` (``PendingDeletes``), else
    :data:`PENDING_DELETE_BYTES` per entry."""
    n = getattr(pending, "nbytes", None)
    return int(n) if n is not None else len(pending) * PENDING_DELETE_BYTES


class MemoryBudget:
    """The accounting of one service against ``limit`` bytes (module docstring).

    ``tables()``: the mirrors (a callable returning :class:`~..table.mirror.MirrorTable` objects, read
    under the service lock by the callers); ``decoder``: set by the stream thread to its decoder (a
    ``NativeDecoder`` or ``TransactionAssembler``), None between streams. ``backpressure``: the last
    :meth:`relieve` left usage over the budget. ``early_flushes``: flushes this budget forced.
    """

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.decoder: Any = None
        self.backpressure = False
        self.early_flushes = 0
        self.peak_usage = 0

    def spill_bytes(self) -> int:
        """Bytes of one open transaction's in-memory buffer past which it spills to disk
        (:data:`SPILL_BYTES`, whatever the budget: at :data:`MIN_MEMORY_LIMIT` an eighth of it)."""
        return SPILL_BYTES

    @staticmethod
    def buffer_bytes(t: Any) -> int:
        """Estimated bytes of ``t``'s MemSlice with its MemIndex (what a flush frees)."""
        return int(t.mem.nbytes + t.mem.num_rows * INDEX_ENTRY_BYTES)

    @staticmethod
    def table_bytes(t: Any) -> int:
        """Estimated bytes ``t`` holds in memory for changes not yet flushed (module docstring)."""
        pending = sum(_pending_bytes(f.pending) for f in t.files.values())
        log = getattr(getattr(t, "delete_log", None), "nbytes", 0)  # keys of those deletes (table/delete_log.py)
        return int(t.mem.nbytes + t.mem.num_rows * INDEX_ENTRY_BYTES + pending + log)

    def decoder_bytes(self) -> int:
        """Bytes of the open transactions the stream's decoder holds in memory."""
        d = self.decoder
        if d is None:
            return 0
        n = getattr(d, "buffered_bytes", None)
        return int(n) if n is not None else int(d.buffered_changes) * REFERENCE_CHANGE_BYTES

    def usage(self, tables: Iterable[Any]) -> dict[str, int]:
        """``{"decoder", "tables", "total"}`` bytes (the caller holds the service lock)."""
        tb = sum(self.table_bytes(t) for t in tables)
        dec = self.decoder_bytes()
        total = tb + dec
        self.peak_usage = max(self.peak_usage, total)
        return {"decoder": dec, "tables": tb, "total": total}

    def relieve(self, tables: Iterable[Any], on_error: Callable[[Any, Exception], None] | None = None) -> bool:
        """Flush committed buffers, largest first, while usage is past :data:`FLUSH_SHARE` of the budget
        (the caller holds the service lock; a table stopped by an error is not flushed). Sets and
        returns :attr:`backpressure`: usage without the open transactions still over the whole budget. A failing flush goes to
        ``on_error(table, error)`` (the caller stops the table); without one it propagates."""
        tables = [t for t in tables if not t.error]
        goal = int(self.limit * FLUSH_SHARE)
        total = self.usage(tables)["total"]
        if total > goal:
            least = self.limit // MIN_FLUSH_FRACTION  # (no tiny files while pending deletes fill the budget)
            for t in sorted(tables, key=self.buffer_bytes, reverse=True):
                if total <= goal or self.buffer_bytes(t) < least:
                    break
                before = self.table_bytes(t)
                try:
                    t.flush()
                except Exception as e:
                    if on_error is None:
                        raise
                    on_error(t, e)
                    continue
                self.early_flushes += 1
                total -= before - self.table_bytes(t)
                log.info("table %s: flushed early (memory budget %s)", t.name, format_size(self.limit))
        # the open transactions are left out: reading on is what completes them (and the compiled
        # decoder's are bounded by its spill size); stopping helps only while persists catch up
        self.backpressure = total - self.decoder_bytes() > self.limit
        return self.backpressure

    def status(self, tables: Iterable[Any]) -> dict[str, Any]:
        """The ``memory`` block of ``status``: ``limit_bytes``, ``usage_bytes`` (``decoder``, ``tables``,
        ``total``), ``peak_usage_bytes``, ``backpressure``, ``early_flushes``, ``spill_bytes``."""
        u = self.usage(tables)
        return {
            "limit_bytes": self.limit,
            "usage_bytes": u,
            "peak_usage_bytes": self.peak_usage,
            "backpressure": self.backpressure,
            "early_flushes": self.early_flushes,
            "spill_bytes": self.spill_bytes(),
        }
