"""Errors raised by the Iceberg side of a mirrored table.

Each error says whether retrying can help (``retryable``), as moonlink's errors do: a temporary error
may succeed when the same call is made again later; a permanent one will fail again until the caller
changes its request.
"""

from __future__ import annotations


class IcebergMirrorError(Exception):
    """Base class. ``retryable``: True when calling again unchanged may succeed (temporary)."""

    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable


class CommitConflict(IcebergMirrorError):
    """Another writer moved the table and this commit could not be applied on top of it.

    ``retryable`` True: the pointer kept moving for every attempt (temporary contention; the caller may
    call ``commit`` again). ``retryable`` False: the request no longer fits the table (a file to delete
    from or remove is gone, a file to add is already there); the caller must re-plan. Nothing of the
    failed commit is visible in the table either way.
    """

    retryable = True


class CommitStateUnknown(IcebergMirrorError):
    """The pointer swap failed in a way that leaves unknown whether it happened (e.g. a lost connection).

    The files written for the commit are left in place (they may be live). Reload the table
    (``IcebergMirrorTable.load``) and look at ``state()`` before deciding to commit again. Temporary.
    """

    retryable = True


class UnsupportedCatalog(IcebergMirrorError):
    """The catalog cannot hold this kind of table (e.g. format v3 through a catalog other than SQL or
    REST: PyIceberg 0.12 cannot write v3 metadata, so v3 needs a catalog whose swap we can drive).
    Permanent."""
