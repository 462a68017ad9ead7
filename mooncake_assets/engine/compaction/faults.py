"""Fault injection for maintenance crash tests (moonlink style: faults are injected, not mocked).

The service reads ``MOONCAKE_FAULT`` from its environment: a comma-separated list of
``<point>`` (SIGKILL the process at that point) or ``<point>=sleep:<seconds>`` (stall there, to widen a
race window). Points:

=====================================  ========================================================
``compaction:after_files_written``     new data files written and uploaded to the warehouse
``compaction:after_index_rebuilt``     the new IndexBlock written (``build_from_compaction``)
``compaction:before_commit``           every file of the Iceberg commit written, pointer not swapped
``compaction:after_commit``            the Iceberg commit landed, in-memory state not swapped yet
``merge_index:after_index_rebuilt``    the merged IndexBlock written, not swapped in
``persist:after_upload``               a persist's data files uploaded, its commit not started
``commit:before_swap``                 every file of any Iceberg commit written, pointer not swapped
``persist:after_commit``               a persist's commit landed, in-memory state not updated yet
=====================================  ========================================================

Unknown points are ignored (a typo cannot crash a production service: the variable is for tests).
"""
from __future__ import annotations

import logging
import os
import signal
import time

__all__ = ["fault", "faults"]

log = logging.getLogger("mooncake.faults")


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


def fault(point: str) -> None:
    """Act on ``point`` if ``MOONCAKE_FAULT`` names it: SIGKILL this process, or sleep."""
    action = faults().get(point)
    if action is None:
        return
    if action.startswith("sleep:"):
        log.warning("fault injection: sleeping %ss at %s", action[6:], point)
        time.sleep(float(action[6:]))
        return
    log.warning("fault injection: SIGKILL at %s", point)
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
