"""Timestamps as mooncake writes them in status, the registry and its marker files."""

from __future__ import annotations

import time

__all__ = ["iso_utc", "utc_now"]


def utc_now() -> str:
    """Now as ISO 8601 UTC to the second, e.g. ``2026-12-01T10:35:36Z`` (RFC 3339 §5.6)."""
    return iso_utc(time.time())


def iso_utc(epoch_s: float) -> str:
    """``epoch_s`` (seconds since the epoch) as ISO 8601 UTC to the second, like :func:`utc_now`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))
