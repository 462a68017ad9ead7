"""Owner-only files: the state directory ``0700``, the files mooncake writes in it ``0600``.

The state directory holds the mirrors' buffers, indexes, staged Parquet files, the catalog, the
service's log and its Unix socket: nothing in it is for other local users. A state directory that
already exists and is open to others (group or other permission bits set, e.g. made by an older
version as ``0755``) is left as it is — the user may share it on purpose — but gets one warning per
process that says how to close it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import IO, Any

__all__ = ["ensure_private_dir", "warn_if_open", "write_private", "open_private", "DIR_MODE", "FILE_MODE"]

DIR_MODE = 0o700
FILE_MODE = 0o600
log = logging.getLogger("mooncake.state")
_warned: set[str] = set()


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and missing parents) with mode ``0700`` when it does not exist; an existing one
    is checked by :func:`warn_if_open`. Returns the path."""
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            p.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass
        else:
            os.chmod(p, DIR_MODE)  # mkdir's mode is filtered by the umask; make it exactly 0700
    warn_if_open(p)
    return p


def warn_if_open(path: str | os.PathLike[str]) -> str | None:
    """Log (once per process and directory) a warning when ``path`` grants any permission to group or
    others; returns the warning text, or None when the directory is owner-only or absent."""
    p = Path(path)
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o077:
        return None
    msg = (
        f"state directory {p} is open to other users (mode {mode:04o}); it holds the mirrors' data, "
        f"logs and the service socket: run `chmod 700 {p}`"
    )
    key = str(p.resolve())
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", msg)
    return msg


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then rename) with mode
    ``0600`` from the start: the content is never readable by others, not even for a moment."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # an existing temporary file keeps its mode otherwise
        with os.fdopen(fd, "w") as f:
            fd = -1
            f.write(text)
        os.replace(tmp, p)
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp.exists():
            tmp.unlink()


def open_private(path: str | os.PathLike[str], mode: str = "ab") -> IO[Any]:
    """``open(path, mode)`` for writing, creating the file ``0600`` (an existing file is made ``0600``)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, mode)
