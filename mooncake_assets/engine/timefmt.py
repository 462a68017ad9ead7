"""Timestamps as mooncake writes them in status, the registry and its marker files."""

from __future__ import annotations

import time

__all__ = ["utc_now"]


def utc_now() -> str:
    """Now as ISO 8601 UTC to the second, e.g. ``2026-12-01T10:35:36Z`` (RFC 3339 §5.6)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
