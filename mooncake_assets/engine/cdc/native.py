"""The compiled receive-and-decode path: pgoutput straight into columnar transactions.

:class:`NativeDecoder` (compiled, ``_native.pyx``) takes the XLogData payloads of one replication
stream and returns :class:`~.columnar.ColumnarTransaction` objects — the same as
:func:`~.columnar.columnar_transaction` of what :class:`~.txn.TransactionAssembler` returns for the
same stream, with no Python object per row (PG docs, "Logical Replication Message Formats" and
"Logical Streaming Replication Protocol"; protocol versions 1 and 2 with streamed transactions).
Its API mirrors the assembler's: ``feed(payload, wal_lsn) -> list[ColumnarTransaction]``,
``relations``, ``types``, ``in_stream``, ``in_transaction``, ``open_streams``, ``buffered_changes``,
``idle``, ``reset()``. A malformed Insert/Update/Delete/Relation of a readable relation OID inside a
transaction is no error but a :class:`~.pgoutput.BadMessage` on the transaction
(``ColumnarTransaction.bad``, as the assembler's ``Transaction.bad``; such a transaction is never
part of a ``ColumnarBatch``). Errors: :class:`~.txn.ProtocolError` (the assembler's messages) for a
broken message sequence, ``ValueError`` naming the XLogData's LSN for any other malformed message.

:class:`Receiver` (compiled) reads XLogData from libpq with ``PQgetCopyData`` on psycopg's own
``PGconn`` and feeds the decoder without a Python ``bytes`` per message;
:meth:`~.stream.ReplicationConnection.read_transactions` drives it.

This module is also the one place that leans on psycopg's packaging: which shared library is the
libpq that owns psycopg's ``PGconn`` (:func:`libpq_path`). psycopg[binary] loads a libpq of its own
(``psycopg_binary.libs/libpq-<hash>.so.5…``), the pure-Python implementation the system's; the
compiled loop must call the same one (a ``PGconn`` is private to the libpq build that made it), so
it looks the functions up at run time in the library found here instead of linking against one;
and the ``PGconn*`` address, ``PGconn.pgconn_ptr`` (documented, but not in ``psycopg.pq.abc``).
Version gate: :data:`PSYCOPG_RANGE` (where this was verified); outside it :func:`libpq_path` raises
:class:`UnsupportedLibraryVersion` unless ``MOONCAKE_UNCHECKED_LIBRARIES=1`` (then it warns);
tests/pg/test_native_receiver.py (``test_libpq_is_psycopgs_own``) fails, naming the assumption, when a
release changes it.
"""

from __future__ import annotations

import ctypes
import os
import re
import warnings
from functools import cache
from importlib.metadata import version as _installed_version

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGconn

from ._native import READ_END, READ_LOST, READ_OK, READ_POLL_ERROR, NativeDecoder, Receiver

__all__ = [
    "NativeDecoder",
    "Receiver",
    "READ_OK",
    "READ_END",
    "READ_LOST",
    "READ_POLL_ERROR",
    "PSYCOPG_RANGE",
    "UnsupportedLibraryVersion",
    "libpq_path",
    "receiver_for",
]

#: psycopg versions (>= low, < high) whose libpq loading was checked: the binary wheel's libpq in
#: ``psycopg_binary.libs``, mapped in the process once ``psycopg.pq`` is imported
PSYCOPG_RANGE = ((3, 2), (3, 4))

_LIBPQ_RE = re.compile(r"(^|/)libpq[-.][^/]*\.so(\.[0-9.]+)?$|(^|/)libpq\.so(\.[0-9.]+)?$")


class UnsupportedLibraryVersion(RuntimeError):
    """The installed psycopg is outside :data:`PSYCOPG_RANGE`."""


def _check_version() -> None:
    v = tuple(int(x) for x in re.findall(r"\d+", _installed_version("psycopg"))[:2])
    lo, hi = PSYCOPG_RANGE
    if lo <= v < hi:
        return
    msg = f"psycopg {psycopg.__version__} is outside the range checked for the native receive loop {PSYCOPG_RANGE}"
    if os.environ.get("MOONCAKE_UNCHECKED_LIBRARIES") == "1":
        warnings.warn(msg, stacklevel=3)
        return
    raise UnsupportedLibraryVersion(msg)


def _mapped_libpqs() -> list[str]:
    """Paths of the libpq shared objects mapped in this process (``/proc/self/maps``, Linux)."""
    seen: list[str] = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6:
                path = parts[5].strip()
                if _LIBPQ_RE.search(path) and path not in seen:
                    seen.append(path)
    return seen


@cache
def libpq_path() -> str:
    """The file of the libpq that psycopg uses (the one that owns ``PGconn.pgconn_ptr``).

    The candidates are the libpq files mapped in the process; with psycopg's binary implementation
    the one under ``psycopg_binary.libs`` is taken, and the choice must answer ``PQlibVersion()`` as
    ``psycopg.pq.version()`` does. Raises ``OSError`` when none fits (not Linux, an implementation
    that loads no libpq file), :class:`UnsupportedLibraryVersion` (see the module docstring)."""
    _check_version()
    want = pq.version()
    cands = _mapped_libpqs()
    if pq.__impl__ == "binary":
        cands = [p for p in cands if "psycopg_binary" in p] or cands
    for path in cands:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:
            continue
        if lib.PQlibVersion() == want:
            return path
    raise OSError(f"no loaded libpq answers PQlibVersion() == {want} (psycopg impl {pq.__impl__}; mapped: {cands})")


def receiver_for(pgconn: PGconn) -> Receiver:
    """A :class:`Receiver` on psycopg's ``pgconn``: its ``pgconn_ptr`` (the ``PGconn*`` address; every
    psycopg implementation has it, the ``pq.abc.PGconn`` protocol does not declare it) and the libpq
    of :func:`libpq_path`. Raises ``OSError`` for a closed connection."""
    ptr = getattr(pgconn, "pgconn_ptr", None)
    if not isinstance(ptr, int) or ptr == 0:
        raise OSError("psycopg's PGconn has no pgconn_ptr (closed connection, or psycopg changed)")
    return Receiver(ptr, libpq_path())
