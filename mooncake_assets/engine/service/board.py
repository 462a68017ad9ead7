"""The service's read board: what a warm union reader checks instead of a Flight round trip (issue 15).

Every change to what a union read sees (rows applied, files flushed, persisted or compacted, deletion
vectors, schemas, tables created or dropped, a table stopped, every applied-LSN move) happens under the
service lock. That lock is an :class:`EpochLock`: when a hold that may have changed something ends,
it adds one to its ``epoch`` and, **before** the lock is released, publishes the epoch and the
stream's applied LSN on the **board**, a 64-byte file beside the service socket
(``<socket>.board``, mode 0600) that the service maps into memory and readers map read-only.

A ``read_states`` answer (taken under one *reading* hold of the lock, which changes nothing and bumps
nothing) carries the board's incarnation and the epoch it was taken at. A client that holds that
answer and finds the board at the same incarnation and epoch knows that no change of any table, and
no LSN move, happened since: the service would answer exactly what it holds (same files, vectors,
rows, LSNs). When it also finds the applied LSN at or past the LSN it must wait for (the
read-your-writes barrier), it answers the query from what it holds, without a round trip. Any other
case takes the round trip as before, so the board can only save a call, never change an answer.

Layout (little-endian u64s): ``magic`` ("MCBOARD1"), ``seq`` (a seqlock: odd while the writer
writes; a reader retries until it reads the same even value before and after), ``incarnation``
(random per service start; 0 once the service stopped), ``epoch``, ``applied`` (the stream's applied
LSN), ``pid`` (the service's). A reader also checks that the file is still the one it mapped (its
inode) and that the pid is alive, so a board left by a killed service is never trusted.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

MAGIC = b"MCBOARD1"
_FIELDS = struct.Struct("<8sQQQQQ")  # magic, seq, incarnation, epoch, applied, pid
SIZE = 64
_SEQ = 8  # offset of seq
_BODY = struct.Struct("<QQQQ")  # incarnation, epoch, applied, pid (at offset 16)


def board_path(socket_path: str | os.PathLike[str]) -> Path:
    """The board file of the service listening on ``socket_path``: ``<socket>.board`` beside it."""
    p = Path(socket_path)
    return p.with_name(p.name + ".board")


class Snapshot(NamedTuple):
    """One consistent read of the board: the service ``incarnation``, ``epoch`` and ``applied`` LSN."""

    incarnation: int
    epoch: int
    applied: int


class Board:
    """The writer's side (the service process): creates ``path`` (0600, replacing any file there) and
    publishes ``(epoch, applied)`` under a seqlock. One writer: publish only while holding the
    service lock (:class:`EpochLock` does)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.incarnation = int.from_bytes(secrets.token_bytes(8), "little") or 1
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._mm: mmap.mmap | None = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._seq = 0
        self._pid = os.getpid()
        _FIELDS.pack_into(self._mm, 0, MAGIC, 0, 0, 0, 0, 0)
        self.publish(0, 0)

    def publish(self, epoch: int, applied: int) -> None:
        """Write ``epoch`` and ``applied`` (an LSN) for readers (seq odd while writing)."""
        mm = self._mm
        if mm is None:
            return
        self._seq += 1
        struct.pack_into("<Q", mm, _SEQ, self._seq)
        _BODY.pack_into(mm, 16, self.incarnation, epoch, applied, self._pid)
        self._seq += 1
        struct.pack_into("<Q", mm, _SEQ, self._seq)

    def close(self) -> None:
        """The service stops: incarnation 0 (no reader trusts the board any more), the file removed."""
        mm = self._mm
        if mm is None:
            return
        self._seq += 1
        struct.pack_into("<Q", mm, _SEQ, self._seq)
        _BODY.pack_into(mm, 16, 0, 0, 0, 0)
        self._seq += 1
        struct.pack_into("<Q", mm, _SEQ, self._seq)
        self._mm = None
        mm.close()
        try:
            if self.path.exists():
                self.path.unlink()
        except OSError:
            pass


class BoardReader:
    """The reader's side: maps ``path`` read-only on first use and returns :class:`Snapshot`\\ s; None
    when there is no board, it is not a board, the service stopped or its process is gone."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mm: mmap.mmap | None = None
        self._ino: int | None = None

    def _open(self, ino: int) -> mmap.mmap | None:
        self.close()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < SIZE:
                return None
            mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        if mm[:8] != MAGIC:
            mm.close()
            return None
        self._mm, self._ino = mm, ino
        return mm

    def snapshot(self) -> Snapshot | None:
        """The board now (a few microseconds: one ``stat``, one ``kill(pid, 0)``, the seqlock read)."""
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            self.close()
            return None
        mm = self._mm if self._ino == ino else self._open(ino)
        if mm is None or mm[:8] != MAGIC:
            return None
        for _ in range(100):
            (s1,) = struct.unpack_from("<Q", mm, _SEQ)
            inc, epoch, applied, pid = _BODY.unpack_from(mm, 16)
            (s2,) = struct.unpack_from("<Q", mm, _SEQ)
            if s1 == s2 and not s1 & 1:
                break
        else:
            return None
        if not inc or not _alive(pid):
            return None
        return Snapshot(inc, epoch, applied)

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
        self._mm, self._ino = None, None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


class EpochLock:
    """The service lock (a reentrant lock) that counts the holds that may have changed what readers see.

    ``with lock:`` / ``acquire()`` is a *writing* hold: when the outermost hold of the thread ends, the
    ``epoch`` goes up by one and, when a board is attached (:meth:`attach`), the epoch and the applied
    LSN are published before the lock is released. ``with lock.reading():`` is a hold that changes
    nothing (it bumps nothing unless it ends with an exception, or a writing hold nests in it).
    ``epoch`` read while holding the lock names the state of everything under it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._dirty = False
        self.epoch = 0
        self._board: Board | None = None
        self._applied: Callable[[], int] = lambda: 0

    def attach(self, board: Board, applied: Callable[[], int]) -> None:
        """Publish on ``board`` from now on, with ``applied()`` (the stream's applied LSN) as the LSN."""
        with self._lock:
            self._board, self._applied = board, applied
            self.epoch += 1
            board.publish(self.epoch, int(applied()))

    def detach(self) -> Board | None:
        """Stop publishing; returns the board that was attached (to close it)."""
        with self._lock:
            board, self._board = self._board, None
            return board

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._depth += 1
            self._dirty = True
        return got

    def release(self) -> None:
        self._end()

    def _end(self) -> None:
        try:
            if self._depth == 1 and self._dirty:
                self._dirty = False
                self.epoch += 1
                if self._board is not None:
                    self._board.publish(self.epoch, int(self._applied()))
        finally:
            self._depth -= 1
            self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._end()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A hold that changes nothing readers see (``read_states``); an exception inside it counts as a
        change (the service may have stopped a table on the way)."""
        self._lock.acquire()
        self._depth += 1
        try:
            yield
        except BaseException:
            self._dirty = True
            raise
        finally:
            self._end()
