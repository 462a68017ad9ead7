"""Fault injection for crash and fault tests (moonlink style: faults are injected, not mocked).

One mechanism, two ways to arm it, both read by the service process at each point:

- ``MOONCAKE_FAULT`` (fixed for the process's life): a comma-separated list of ``<point>`` (SIGKILL
  the process at that point), ``<point>=sleep:<seconds>`` (stall there, to widen a race window),
  ``<point>=errno:<name>`` (raise ``OSError`` with that ``errno`` name there, e.g. ``ENOSPC`` for a
  full disk, every time the point is passed) or
  ``<point>=wait:<path>`` (stall there while ``<path>`` exists, after creating ``<path>.reached``: a
  test holds the process at the point for exactly as long as it needs);
- ``MOONCAKE_FAULTS`` (changed while the process runs): the path of a JSON file written with
  :func:`set_faults`; ``{"commit_conflicts": N}`` makes the next N Iceberg commits (at
  ``commit:before_swap``) lose the pointer race as if another writer had moved the table, counting
  down in the file (``conflicts_injected`` counts up). The error raised is the one the layer owning
  the point registered with :func:`register_conflict` (the Iceberg catalog registers its own
  pointer-conflict error), so this module depends on no layer above it.
  ``{"corrupt_relation": OID}`` corrupts, while the file says so, every Insert/Update/Delete of that
  relation on its way into the stream's decoder (either decoder: ``fault_corrupt_oid`` of
  ``TransactionAssembler`` / ``NativeDecoder``, set by the stream loop from :func:`corrupt_relation`
  before each read): the payload is cut right after its relation OID
  (``pgoutput.cut_after_relation``; the compiled decoder cuts its view of the libpq buffer the same
  way), a malformed message as a broken decoder or a damaged stream would hand over; with
  ``"corrupt_short": true`` it is cut inside the OID (a message no table can be named for: the stream
  fails). Removing the key (or the file) ends it.

A third, ``MOONCAKE_JITTER`` (``<seed>[:<max seconds>[:<probability>]]``, defaults 0.2 s and 0.3),
adds *seeded* delays at every point: the n-th time the process passes point P it sleeps, with the
given probability, a time drawn from ``random.Random("<seed>/<P>/<n>")`` (uniform in 0..max) — so a
run's delays are a function of the seed alone and a failing seed replays with the same ones (the
OS scheduler adds its own on top). ``mooncake chaos --jitter`` sets it for every service it starts
(``<seed>.<start>``: each restart has its own sequence). Jitter never kills: it only widens race
windows (a catalog lookup late against the user's DDL, the apply loop behind the source, a persist's
unlocked upload against a schema switch, a service coming up late after a kill).

Points:

=====================================  ========================================================
``stream:start``                       a replication stream about to connect (at service start and
                                       after a lost stream; the service answers meanwhile and the
                                       source moves on; jitter here waits up to 10× the maximum)
``stream:apply``                       the replication loop has read messages, before applying
                                       them under the service lock
``catalog:lookup``                     before every try of a source-catalog lookup for a schema
                                       change (``SourceCatalog``)
``persist:unlocked``                   a persist's files uploaded without the service lock, before
                                       it takes the lock to commit (a schema switch may come first)
``compaction:after_files_written``     new data files written and uploaded to the warehouse
``compaction:after_index_rebuilt``     the new IndexBlock written (``build_from_compaction``)
``compaction:before_commit``           every file of the Iceberg commit written, pointer not swapped
``compaction:after_commit``            the Iceberg commit landed, in-memory state not swapped yet
``merge_index:after_index_rebuilt``    the merged IndexBlock written, not swapped in
``persist:write``                      a persist has taken the buffered rows (``MirrorTable.begin_flush``)
                                       and is about to write them to Parquet without the service lock
``persist:upload``                     a persist about to copy a staged file to the warehouse (the
                                       copy runs without the service lock)
``persist:after_upload``               a persist's data files uploaded, its commit not started
``commit:before_swap``                 every file of any Iceberg commit written, pointer not swapped
``persist:after_commit``               a persist's commit landed, in-memory state not updated yet
``copy:block``                         the initial copy has read a block of rows of a table from
                                       its COPY, before parsing it (on the copy's reader thread)
``spill:write``                        an open transaction's run about to be appended to its spill
                                       file (``engine/cdc/spill.py``; ``errno:ENOSPC``: a full disk)
``spill:apply``                        a run of a spilled transaction applied at its commit, after
                                       part of it was flushed early to local staging (the memory
                                       budget; ``engine/service/native_batch.py``), the rest not yet
=====================================  ========================================================

Unknown points are ignored (a typo cannot crash a production service: the variable is for tests).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["fault", "faults", "register_conflict", "set_faults", "corrupt_relation", "jitter", "jitter_delay"]

log = logging.getLogger("mooncake.faults")
_FILE_LOCK = threading.Lock()
_JITTER_LOCK = threading.Lock()
_jitter_hits: dict[str, int] = {}
_CONFLICTS: dict[str, Callable[[str], BaseException]] = {}


def register_conflict(point: str, make_error: Callable[[str], BaseException]) -> None:
    """Make an armed ``commit_conflicts`` fault raise ``make_error(message)`` at ``point``. Called by the
    layer that owns the point (its error is what a real conflict there raises); a point nobody
    registered ignores the fault file."""
    _CONFLICTS[point] = make_error


def _jitter_spec() -> tuple[str, float, float] | None:
    raw = (os.environ.get("MOONCAKE_JITTER") or "").strip()
    if not raw:
        return None
    seed, _, rest = raw.partition(":")
    top, _, prob = rest.partition(":")
    try:
        return seed, float(top) if top else 0.2, float(prob) if prob else 0.3
    except ValueError:  # a test variable: a typo must not crash a service
        return None


def jitter_delay(seed: str, point: str, n: int, max_s: float = 0.2, probability: float = 0.3) -> float:
    """The delay (seconds, 0 for none) of the ``n``-th pass (from 0) of ``point`` under jitter ``seed``:
    a pure function of its arguments (``random.Random`` seeded with a string hashes it with SHA-512, so
    no process's hash seed enters)."""
    r = random.Random(f"{seed}/{point}/{n}")
    return r.uniform(0.0, max_s) if r.random() < probability else 0.0


#: points where a longer stall is what widens the window (a restart the source runs ahead of)
_JITTER_SCALE = {"stream:start": 10.0}


def jitter(point: str) -> float:
    """Sleep this pass's seeded delay at ``point`` when ``MOONCAKE_JITTER`` is set; returns it."""
    spec = _jitter_spec()
    if spec is None:
        return 0.0
    with _JITTER_LOCK:
        n = _jitter_hits.get(point, 0)
        _jitter_hits[point] = n + 1
    d = jitter_delay(spec[0], point, n, spec[1] * _JITTER_SCALE.get(point, 1.0), spec[2])
    if d > 0:
        time.sleep(d)
    return d


def faults() -> dict[str, str]:
    """``MOONCAKE_FAULT`` parsed: point → action (``"kill"`` or ``"sleep:<s>"``)."""
    out = {}
    for part in (os.environ.get("MOONCAKE_FAULT") or "").split(","):
        part = part.strip()
        if not part:
            continue
        point, _, action = part.partition("=")
        out[point.strip()] = action.strip() or "kill"
    return out


def set_faults(path: str | os.PathLike[str], **faults: object) -> None:
    """Write the fault file a service started with ``MOONCAKE_FAULTS=path`` reads (atomically)."""
    p = Path(path)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(p)


def _armed(path: str) -> dict[str, Any] | None:
    """The ``MOONCAKE_FAULTS`` file at ``path`` as a dict; None when it is missing or not a JSON object."""
    try:
        armed = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return armed if isinstance(armed, dict) else None


def corrupt_relation() -> tuple[int | None, bool]:
    """``(relation OID, short)``: the relation whose row messages the ``MOONCAKE_FAULTS`` file says to
    corrupt and whether inside the OID (``corrupt_relation``, ``corrupt_short``: module docstring);
    ``(None, False)`` without a file, such a key or a readable file."""
    path = os.environ.get("MOONCAKE_FAULTS")
    armed = _armed(path) if path else None
    oid = armed.get("corrupt_relation") if armed else None
    return (oid, bool(armed.get("corrupt_short"))) if armed and isinstance(oid, int) else (None, False)


def _file_fault(point: str) -> None:
    path = os.environ.get("MOONCAKE_FAULTS")
    make_error = _CONFLICTS.get(point)
    if not path or make_error is None:
        return
    with _FILE_LOCK:
        armed = _armed(path)
        if armed is None:
            return
        n = int(armed.get("commit_conflicts", 0))
        if n <= 0:
            return
        armed["commit_conflicts"] = n - 1
        armed["conflicts_injected"] = int(armed.get("conflicts_injected", 0)) + 1
        set_faults(path, **armed)
    raise make_error(f"injected: another writer moved the table (fault file {path})")


def fault(point: str) -> None:
    """Act on ``point`` if ``MOONCAKE_FAULT`` names it (SIGKILL this process, sleep, wait, or raise
    ``OSError``) or the
    ``MOONCAKE_FAULTS`` file arms it (raise the error registered for ``point``, see
    :func:`register_conflict`); first, under
    ``MOONCAKE_JITTER``, the point's seeded delay (:func:`jitter`)."""
    jitter(point)
    _file_fault(point)
    action = faults().get(point)
    if action is None:
        return
    if action.startswith("sleep:"):
        log.warning("fault injection: sleeping %ss at %s", action[6:], point)
        time.sleep(float(action[6:]))
        return
    if action.startswith("errno:"):
        code = getattr(errno, action[6:], None)
        if isinstance(code, int):
            raise OSError(code, f"{os.strerror(code)} (injected at {point})")
        return
    if action.startswith("wait:"):
        flag = Path(action[5:])
        if flag.exists():
            log.warning("fault injection: holding at %s while %s exists", point, flag)
            Path(f"{flag}.reached").touch()
            deadline = time.time() + 120
            while flag.exists() and time.time() < deadline:
                time.sleep(0.05)
        return
    log.warning("fault injection: SIGKILL at %s", point)
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
