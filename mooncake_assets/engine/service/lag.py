"""Replication lag in bytes and seconds, without the service lock (``list-tables``: ``lag_bytes``,
``lag_seconds``).

``lag_bytes`` of a table is the source's current WAL position (``pg_current_wal_lsn()``, asked when
the status is taken) minus the LSN the table has applied, read at that moment (an ``int`` read needs
no lock: the apply thread may be in the middle of a batch, which is exactly when lag is worth seeing).

``lag_seconds`` is the time since the oldest commit the table has not applied. The commits past the
applied LSN have not arrived yet, so their times are not known; what is known is when the source's
WAL passed each position: every XLogData and keepalive of the stream carries the server's WAL end, and
every status asks for the current one. :class:`LagTracker` keeps those (LSN, time) samples and answers
"when did the source's WAL first pass LSN L", interpolating between the two samples around L — the way
Postgres's walsender computes ``write_lag`` in ``pg_stat_replication`` (its LagTracker, walsender.c).
The oldest unapplied commit ends after the applied LSN, so the time since the WAL passed it is its
age, to within the sampling interval (the stream delivers samples several times a second under load).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque


class LagTracker:
    """(LSN, time) samples of the source's WAL end, ``capacity`` of them (oldest dropped first).

    ``record(lsn, at)``: a WAL end seen at ``at`` (seconds since the epoch; default now); samples
    whose LSN does not advance are ignored, so the first time each position was seen is kept.
    ``seconds(applied_lsn, now)``: seconds since the WAL first passed ``applied_lsn`` (0.0 when no
    sample is past it: nothing known is unapplied). Thread-safe; O(log n) per call."""

    def __init__(self, capacity: int = 4096):
        self._lsns: deque[int] = deque(maxlen=capacity)
        self._times: deque[float] = deque(maxlen=capacity)
        self._mu = threading.Lock()

    def record(self, lsn: int, at: float | None = None) -> None:
        """Keep the sample (``lsn``, ``at``: seconds since the epoch, default now) unless ``lsn`` is 0 or
        does not pass the newest sample."""
        if not lsn:
            return
        with self._mu:
            if self._lsns and lsn <= self._lsns[-1]:
                return
            self._lsns.append(lsn)
            self._times.append(time.time() if at is None else at)

    def passed_at(self, lsn: int) -> float | None:
        """When the WAL first went past ``lsn`` (interpolated), or None when no sample is past it."""
        with self._mu:
            lsns, times = list(self._lsns), list(self._times)
        i = bisect.bisect_right(lsns, lsn)
        if i == len(lsns):
            return None
        if i == 0:  # passed before the oldest sample kept: at least that old
            return times[0]
        l0, l1, t0, t1 = lsns[i - 1], lsns[i], times[i - 1], times[i]
        return t0 + (t1 - t0) * (lsn - l0) / (l1 - l0)

    def seconds(self, applied_lsn: int, now: float | None = None) -> float:
        """Seconds (>= 0.0) from when the WAL first passed ``applied_lsn`` (:meth:`passed_at`) to ``now``
        (default: the current time); 0.0 when no sample is past it."""
        at = self.passed_at(applied_lsn)
        if at is None:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - at)
