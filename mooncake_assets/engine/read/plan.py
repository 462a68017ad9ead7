"""How one data file with deletes is read (docs/architecture.md#union-read): its deleted positions, its row groups, and
which row ranges need the positions applied at all.

A ReadState carries each file's deleted positions as a 64-bit Roaring bitmap (on the wire: base64 of its
portable serialization). The bitmap's layout (Roaring "portable" 64-bit format, as in Iceberg's ``deletion-vector-v1``): bucket
count (8 bytes, little-endian), then per bucket its high 32 bits (4 bytes, little-endian) and a
portable 32-bit Roaring bitmap of the low 32 bits. Positions in a data file are < 2**32, so the
bitmap has at most one bucket, key 0, and its 32-bit bitmap is decoded straight to a ``uint32`` array
(about 100x faster than iterating a ``BitMap64``).

A file's row groups are classified by their deletes: *full* (every row deleted: never read), *clean*
(no deletes: read plainly) and *dirty*; consecutive row groups of one class form a
:class:`Segment`. Parquet footers are cached by path (data files are immutable and never reuse a
name).
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from pyroaring import BitMap, BitMap64, FrozenBitMap64

from ..storage.arrow_fs import arrow_source

MAX_SEGMENTS = 16  # more than this many row ranges in one file: read it as one range with positions applied


def deleted_positions(dv: FrozenBitMap64 | str | bytes | None) -> np.ndarray:
    """:func:`decode_positions`, memoized by the bitmap (or its text) (read-only result): a reader that reads
    an unchanged file again does not decode its deletion vector again (Trino and Spark keep such
    caches of delete files too). Bounded: :data:`CACHED_VECTORS` vectors."""
    if not dv:
        return np.zeros(0, dtype=np.uint32)
    return _positions_cached(dv)


CACHED_VECTORS = 256


@functools.lru_cache(maxsize=CACHED_VECTORS)
def _positions_cached(dv: FrozenBitMap64 | str | bytes) -> np.ndarray:
    a = decode_positions(dv)
    a.flags.writeable = False
    return a


def decode_positions(dv: FrozenBitMap64 | str | bytes | None) -> np.ndarray:
    """Sorted deleted positions (``uint32``, or ``int64`` beyond 2**32) of a file's deletion vector: a
    ReadState's ``deleted`` bitmap, or the base64 text or raw bytes of a portable 64-bit Roaring bitmap
    (the wire form); None = nothing deleted. Raises ``ValueError`` on bad bytes."""
    if not dv:
        return np.zeros(0, dtype=np.uint32)
    if isinstance(dv, (BitMap64, FrozenBitMap64)):  # in-process ReadStates carry the bitmap itself
        a = np.frombuffer(dv.to_array(), dtype=np.uint64)
        return a.astype(np.uint32) if int(a[-1]) < 1 << 32 else a.astype(np.int64)
    raw = base64.b64decode(dv) if isinstance(dv, str) else bytes(dv)
    if len(raw) < 8:
        raise ValueError(f"a 64-bit Roaring bitmap starts with an 8-byte bucket count; found {len(raw)} bytes")
    buckets = int.from_bytes(raw[:8], "little")
    if buckets == 0:
        return np.zeros(0, dtype=np.uint32)
    if buckets == 1 and len(raw) >= 12 and raw[8:12] == b"\x00\x00\x00\x00":
        try:
            return np.frombuffer(BitMap.deserialize(raw[12:]).to_array(), dtype=np.uint32)
        except Exception as e:
            raise ValueError(f"bad 32-bit Roaring bitmap in bucket 0: {e}") from None
    try:
        return np.array(BitMap64.deserialize(raw).to_array(), dtype=np.int64)
    except Exception as e:
        raise ValueError(f"bad 64-bit Roaring bitmap: {e}") from None


def keep_mask(num_rows: int, positions: np.ndarray) -> np.ndarray:
    """Boolean (num_rows,): False at the deleted ``positions`` (positions ≥ num_rows are ignored)."""
    m = np.ones(num_rows, dtype=bool)
    if len(positions):
        m[positions[positions < num_rows] if positions[-1] >= num_rows else positions] = False
    return m


def arrow_mask(mask: np.ndarray) -> Any:
    """A numpy boolean array as an Arrow ``BooleanArray`` without a per-value conversion (packed bits)."""
    import pyarrow as pa

    return pa.BooleanArray.from_buffers(
        pa.bool_(), len(mask), [None, pa.py_buffer(np.packbits(mask, bitorder="little"))]
    )


@functools.lru_cache(maxsize=8192)
def parquet_row_groups(path: str) -> tuple[int, ...]:
    """Row counts of a Parquet file's row groups, from its footer (cached; ``plan_file``'s default)."""
    md = pq.ParquetFile(arrow_source(path)).metadata  # s3:// through PyArrow's S3 filesystem
    return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))


@dataclass(frozen=True)
class Segment:
    """Rows ``[start, stop)`` of a file, made of whole row groups; ``has_deletes``: some of them are
    deleted (positions must be applied); ``whole``: the segment is the entire file."""

    start: int
    stop: int
    has_deletes: bool
    whole: bool = False


@dataclass
class FilePlan:
    """How to read one file with deletes: its live ``segments`` (fully deleted row groups left out) and,
    when some segment has deletes, ``dv_bits``: the deleted positions as a bit string (bit i of the
    file is bit ``7 - i % 8`` of byte ``i // 8``, the order DuckDB's ``BIT`` type and ``get_bit`` use)."""

    path: str
    num_rows: int
    deleted: int
    segments: list[Segment]
    dv_bits: bytes | None = None

    @property
    def needs_bits(self) -> bool:
        return any(s.has_deletes for s in self.segments)


def row_group_keep(row_groups: tuple[int, ...], keep: np.ndarray) -> tuple[tuple[int, ...] | None, Any]:
    """For reading a file with PyArrow: ``row_groups`` (its row groups' row counts) and ``keep`` (bool
    (num_rows,), :func:`keep_mask`) → (the row groups to read — None for all —, a keep mask over their
    rows as an Arrow ``BooleanArray``). Row groups whose rows are all deleted are left out; when the
    counts do not add up to the mask's length every row group is read."""
    if sum(row_groups) != len(keep):
        return None, arrow_mask(keep)
    starts = np.concatenate([[0], np.cumsum(row_groups, dtype=np.int64)])
    live = [k for k in range(len(row_groups)) if keep[starts[k] : starts[k + 1]].any()]
    if len(live) == len(row_groups):
        return None, arrow_mask(keep)
    m = np.concatenate([keep[starts[k] : starts[k + 1]] for k in live]) if live else np.zeros(0, bool)
    return tuple(live), arrow_mask(m)


def plan_file(path: str, num_rows: int, positions: np.ndarray, row_groups: tuple[int, ...] | None = None) -> FilePlan:
    """The :class:`FilePlan` of a file of ``num_rows`` rows whose sorted deleted ``positions`` are given.

    ``row_groups``: the row counts of its row groups (default: read from the footer, cached)."""
    positions = positions[positions < num_rows]
    if row_groups is None:
        row_groups = parquet_row_groups(path)
    if sum(row_groups) != num_rows:  # footer and ReadState disagree: trust neither's row groups
        row_groups = (num_rows,)
    bounds = np.concatenate([[0], np.cumsum(row_groups, dtype=np.int64)])
    dels = np.searchsorted(positions, bounds[1:]) - np.searchsorted(positions, bounds[:-1])
    segs: list[list[Any]] = []
    for k, n in enumerate(row_groups):
        if n == 0 or dels[k] >= n:
            continue  # empty or fully deleted: not read
        dirty = bool(dels[k])
        if segs and segs[-1][1] == bounds[k] and segs[-1][2] == dirty:
            segs[-1][1] = int(bounds[k + 1])
        else:
            segs.append([int(bounds[k]), int(bounds[k + 1]), dirty])
    if len(segs) > MAX_SEGMENTS:
        segs = [[segs[0][0], segs[-1][1], True]]
    segments = [Segment(a, b, d, whole=(a == 0 and b == num_rows)) for a, b, d in segs]
    bits = None
    if any(s.has_deletes for s in segments):
        m = np.zeros(num_rows, dtype=np.uint8)
        m[positions] = 1
        bits = np.packbits(m).tobytes()
    return FilePlan(path, num_rows, len(positions), segments, bits)
