"""Fault injection for crash and fault tests (moonlink style: faults are injected, not mocked).

One mechanism, two ways to arm it, both read by the service process at each point:

- ``MOONCAKE_FAULT`` (fixed for the process's life): a comma-separated list of ``<point>`` (SIGKILL
  the process at that point), ``<point>=sleep:<seconds>`` (stall there, to widen a race window) or
  ``<point>=wait:<path>`` (stall there while ``<path>`` exists, after creating ``<path>.reached``: a
  test holds the process at the point for exactly as long as it needs);
- ``MOONCAKE_FAULTS`` (changed while the process runs): the path of a JSON file written with
  :func:`set_faults`; ``{"commit_conflicts": N}`` makes the next N Iceberg commits (at
  ``commit:before_swap``) lose the pointer race as if another writer had moved the table, counting
  down in the file (``conflicts_injected`` counts up).

Points:

=====================================  ========================================================
``compaction:after_files_written``     new data files written and uploaded to the warehouse
``compaction:after_index_rebuilt``     the new IndexBlock written (``build_from_compaction``)
``compaction:before_commit``           every file of the Iceberg commit written, pointer not swapped
``compaction:after_commit``            the Iceberg commit landed, in-memory state not swapped yet
``merge_index:after_index_rebuilt``    the merged IndexBlock written, not swapped in
``persist:upload``                     a persist about to copy a staged file to the warehouse (the
                                       copy runs without the service lock)
``persist:after_upload``               a persist's data files uploaded, its commit not started
``commit:before_swap``                 every file of any Iceberg commit written, pointer not swapped
``persist:after_commit``               a persist's commit landed, in-memory state not updated yet
=====================================  ========================================================

Unknown points are ignored (a typo cannot crash a production service: the variable is for tests).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["fault", "faults", "set_faults"]

log = logging.getLogger("mooncake.faults")
_FILE_LOCK = threading.Lock()


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


def set_faults(path: str | os.PathLike, **faults) -> None:
    """Write the fault file a service started with ``MOONCAKE_FAULTS=path`` reads (atomically)."""
    p = Path(path)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(p)


def _file_fault(point: str) -> None:
    path = os.environ.get("MOONCAKE_FAULTS")
    if not path or point != "commit:before_swap":
        return
    with _FILE_LOCK:
        try:
            armed = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return
        n = int(armed.get("commit_conflicts", 0))
        if n <= 0:
            return
        armed["commit_conflicts"] = n - 1
        armed["conflicts_injected"] = int(armed.get("conflicts_injected", 0)) + 1
        set_faults(path, **armed)
    from .iceberg.catalog import SwapConflict

    raise SwapConflict(f"injected: another writer moved the table (fault file {path})")


def fault(point: str) -> None:
    """Act on ``point`` if ``MOONCAKE_FAULT`` names it (SIGKILL this process, or sleep) or the
    ``MOONCAKE_FAULTS`` file arms it (raise ``SwapConflict`` at ``commit:before_swap``)."""
    _file_fault(point)
    action = faults().get(point)
    if action is None:
        return
    if action.startswith("sleep:"):
        log.warning("fault injection: sleeping %ss at %s", action[6:], point)
        time.sleep(float(action[6:]))
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
