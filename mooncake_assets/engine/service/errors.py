"""The service's user-facing error."""

from __future__ import annotations

__all__ = ["MooncakeError"]


class MooncakeError(Exception):
    """A user-facing failure with a one-line message (bad table, bad DSN, unknown mirror...)."""
