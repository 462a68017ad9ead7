"""Retries with exponential backoff and jitter, for temporary storage and catalog failures.

Two shapes:

- ``retry_call(fn, policy)``: call now, and again after a backoff while the error is retryable and
  attempts and the deadline allow (for short operations a caller waits on: a warehouse check, a tool);
- ``Backoff``: the state of a long-lived job that failed (the service's persist of one table): when it
  may be tried next, how many times it failed, the last error; the caller keeps doing its other work
  (applying changes, local flushes) in between, and nothing it holds is dropped.

Delays: ``initial_s * multiplier**(n-1)`` for the n-th failure, capped at ``max_delay_s``, times a
random factor in ``[1 - jitter, 1]`` so that many tables do not retry in lockstep.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .errors import StorageError, classify, is_retryable

log = logging.getLogger("mooncake.storage")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``initial_s``: first delay (seconds, > 0). ``multiplier``: growth per failure (>= 1).
    ``max_delay_s``: cap of one delay (seconds). ``max_attempts``: calls in all for ``retry_call``
    (>= 1; None = until the deadline). ``deadline_s``: give up when the next try would start later than
    this many seconds after the first call (None = no deadline). ``jitter``: 0-1, the fraction by which a
    delay may be shortened at random. Permanent errors are never retried."""

    initial_s: float = 0.5
    multiplier: float = 2.0
    max_delay_s: float = 30.0
    max_attempts: int | None = 5
    deadline_s: float | None = 60.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial_s <= 0 or self.multiplier < 1 or self.max_delay_s < self.initial_s:
            raise ValueError(f"RetryPolicy: need initial_s > 0, multiplier >= 1, max_delay_s >= initial_s; got {self}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"RetryPolicy: max_attempts must be >= 1, found {self.max_attempts}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"RetryPolicy: jitter must be within 0-1, found {self.jitter}")

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (1-based)."""
        base = min(self.max_delay_s, self.initial_s * float(self.multiplier) ** min(max(failures - 1, 0), 64))
        return base * (1.0 - self.jitter * rng())


SERVICE_POLICY = RetryPolicy(initial_s=0.5, multiplier=2.0, max_delay_s=30.0, max_attempts=None, deadline_s=None)
"""The service's persist retries: 0.5 s, 1 s, 2 s, … up to 30 s between tries, for as long as it takes."""

RESTORE_POLICY = RetryPolicy(initial_s=0.5, multiplier=2.0, max_delay_s=8.0, max_attempts=6, deadline_s=30.0)
"""Restoring a table at service start: a few tries within 30 s, then the (classified) error stops the start."""


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy = RetryPolicy(),
    *,
    retryable: Callable[[BaseException], bool] = is_retryable,
    sleep: Callable[[float], None] = time.sleep,
    what: str = "operation",
) -> T:
    """Call ``fn()``; on an exception for which ``retryable`` is true, wait ``policy.delay(n)`` and call
    again, within ``policy.max_attempts`` and ``policy.deadline_s``. The last exception propagates
    (classified into a ``StorageError`` when it is a storage failure, with the original as its cause)."""
    start = time.monotonic()
    failures = 0
    while True:
        try:
            return fn()
        except Exception as e:
            failures += 1
            wait = policy.delay(failures)
            out_of_tries = policy.max_attempts is not None and failures >= policy.max_attempts
            past_deadline = policy.deadline_s is not None and time.monotonic() - start + wait > policy.deadline_s
            if not retryable(e) or out_of_tries or past_deadline:
                err = classify(e, what=what)
                if err is not None and err is not e:
                    raise err from e
                raise
            log.warning(
                "%s failed (%s: %s); retry %d in %.2fs",
                what,
                type(e).__name__,
                str(e).splitlines()[0] if str(e) else "",
                failures,
                wait,
            )
            sleep(wait)


@dataclass
class Backoff:
    """Failure state of one recurring job (see module docstring).

    ``failures``: consecutive failures; ``next_at``: ``time.monotonic()`` before which not to try again;
    ``error``: one-line description of the last failure; ``retryable``: whether it was temporary;
    ``since``: wall-clock time of the first failure of this run.
    """

    policy: RetryPolicy = SERVICE_POLICY
    failures: int = 0
    next_at: float = 0.0
    error: str | None = None
    retryable: bool = True
    since: float | None = None
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def due(self) -> bool:
        """True when the job may be tried now."""
        return self.clock() >= self.next_at

    def failed(self, exc: BaseException) -> StorageError | BaseException:
        """Record a failure; returns the classified error (or ``exc`` itself when it is no storage error).
        Permanent errors are retried too, at the longest delay: someone may fix the bucket or the
        credentials without restarting anything."""
        err = classify(exc) or exc
        self.retryable = bool(getattr(err, "retryable", False))
        self.failures += 1
        if self.since is None:
            self.since = time.time()
        n = self.failures if self.retryable else 64  # permanent: straight to the longest delay
        wait = self.policy.delay(n)
        self.next_at = self.clock() + wait
        self.error = (str(err).splitlines() or [type(err).__name__])[0]
        return err

    def describe(self) -> str:
        """``<error> (temporary|permanent; failed N times, next try in S s)``."""
        left = max(0.0, self.next_at - self.clock())
        kind = "temporary" if self.retryable else "permanent until fixed"
        return f"{self.error} ({kind}; failed {self.failures}x, next try in {left:.1f}s)"
