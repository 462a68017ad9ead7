"""Iceberg ``deletion-vector-v1`` blobs: the deleted row positions of one data file.

Pure codec: bytes in, bytes out, never a path. Layout of a blob (Puffin spec, ``deletion-vector-v1``)::

    offset  size  field
    0       4     length of (magic + vector), unsigned, big-endian
    4       4     magic D1 D3 39 64
    8       n     vector: portable 64-bit Roaring bitmap (below), n = length - 4
    8+n     4     CRC-32 (zlib's, not CRC-32C) over magic + vector, big-endian

Portable 64-bit Roaring (the ``vector``; all little-endian)::

    8 bytes   number of 32-bit bitmaps
    per bitmap, in ascending unsigned key order:
      4 bytes   key: the high 32 bits of every position in this bitmap
      ...       a portable 32-bit Roaring bitmap holding the low 32 bits

Position limit: the spec allows any position whose most significant bit is 0 (at most 2**63 - 1).
The reference implementation (Iceberg Java ``RoaringPositionBitmap``) keeps its 32-bit bitmaps in an
array indexed by key, so it caps keys at 2**31 - 2 and positions at ``MAX_POSITION`` =
(2**31 - 2) * 2**32 + 2**31 = 0x7FFF_FFFE_8000_0000. We use that cap both ways, so every vector written
here is readable by the reference and nothing read here exceeds what it could have written.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

from pyroaring import BitMap64

MAGIC = b"\xd1\xd3\x39\x64"
MAX_KEY = 2**31 - 2
MAX_POSITION = (MAX_KEY << 32) | 0x8000_0000

_SERIAL_COOKIE_NO_RUN = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4  # run-cookie bitmaps with fewer containers omit the offset table
_ARRAY_MAX_CARDINALITY = 4096
_BITMAP_CONTAINER_BYTES = 8192


def encode_deletion_vector(positions: Iterable[int] | BitMap64) -> bytes:
    """Serialize row positions as a complete ``deletion-vector-v1`` blob (layout in the module doc).

    ``positions``: an iterable of ints or a ``pyroaring.BitMap64`` (not modified; a copy is
    run-optimized, as the reference writer does, so output matches it byte for byte).
    Raises ``ValueError`` on a negative position or one above ``MAX_POSITION``.
    """
    return _frame(_to_bitmap(positions))


def decode_deletion_vector(blob: bytes) -> BitMap64:
    """Parse a ``deletion-vector-v1`` blob (layout in the module doc) into its positions.

    Raises ``ValueError``, saying what was expected and what was found, when the blob is shorter than
    12 bytes, the length field disagrees with the blob size, the magic is wrong, the CRC does not
    match, or the vector is malformed or holds a position above ``MAX_POSITION``.
    """
    blob = bytes(blob)
    if len(blob) < 12:
        raise ValueError(f"deletion vector: expected at least 12 bytes (length, magic, CRC), found {len(blob)}")
    (length,) = struct.unpack_from(">I", blob, 0)
    if length + 8 != len(blob):
        raise ValueError(
            f"deletion vector: length field says magic + vector is {length} bytes, so the blob should be "
            f"{length + 8} bytes; found {len(blob)}"
        )
    if blob[4:8] != MAGIC:
        raise ValueError(f"deletion vector: expected magic {MAGIC.hex(' ')}, found {blob[4:8].hex(' ')}")
    (stored_crc,) = struct.unpack_from(">I", blob, len(blob) - 4)
    actual_crc = zlib.crc32(blob[4:-4])
    if stored_crc != actual_crc:
        raise ValueError(
            f"deletion vector: CRC-32 mismatch, stored {stored_crc:#010x}, computed {actual_crc:#010x} "
            "over magic + vector"
        )
    return decode_portable_roaring64(blob[8:-4])


def decode_portable_roaring64(data: bytes) -> BitMap64:
    """Parse a bare portable 64-bit Roaring bitmap (no length, magic or CRC) for use as a DV.

    Walks the bitmap directory first, so keys are checked before any container is decoded.
    Raises ``ValueError`` when the data is truncated or has trailing bytes, a key exceeds
    ``MAX_KEY`` (2**31 - 2) or is out of ascending order, a 32-bit bitmap is malformed, or a position
    exceeds ``MAX_POSITION``.
    """
    data = bytes(data)
    if len(data) < 8:
        raise ValueError(f"portable roaring64: expected an 8-byte bitmap count, found {len(data)} bytes")
    (count,) = struct.unpack_from("<Q", data, 0)
    offset, previous_key = 8, -1
    for i in range(count):
        if offset + 4 > len(data):
            raise ValueError(
                f"portable roaring64: truncated, header promises {count} bitmaps but data ends in bitmap {i}"
            )
        (key,) = struct.unpack_from("<I", data, offset)
        if key > MAX_KEY:
            raise ValueError(
                f"portable roaring64: bitmap {i} has key {key} (positions from {key << 32}); a deletion "
                f"vector allows keys up to {MAX_KEY} (positions up to MAX_POSITION = {MAX_POSITION})"
            )
        if key <= previous_key:
            raise ValueError(f"portable roaring64: keys must be strictly ascending, found {key} after {previous_key}")
        previous_key = key
        offset += 4 + _portable32_size(data, offset + 4)
    if offset != len(data):
        raise ValueError(f"portable roaring64: {count} bitmaps end at byte {offset}, but found {len(data)} bytes")
    try:
        bitmap = BitMap64.deserialize(data)
    except ValueError as e:
        raise ValueError(f"portable roaring64: malformed 32-bit bitmap container ({e})") from None
    if len(bitmap) and bitmap.max() > MAX_POSITION:
        raise ValueError(f"portable roaring64: position {bitmap.max()} exceeds MAX_POSITION = {MAX_POSITION}")
    return bitmap


def _to_bitmap(positions: Iterable[int] | BitMap64) -> BitMap64:
    """A run-optimized BitMap64 copy of ``positions``; ValueError on a position out of range."""
    if isinstance(positions, BitMap64):
        bitmap = positions.copy()
    else:
        positions = positions if isinstance(positions, (list, tuple, range)) else list(positions)
        try:
            bitmap = BitMap64(positions)
        except OverflowError:
            bad = next(p for p in positions if not 0 <= p < 2**64)
            raise ValueError(f"deletion vector: positions must be 0..{MAX_POSITION}, found {bad}") from None
    if len(bitmap) and bitmap.max() > MAX_POSITION:
        raise ValueError(f"deletion vector: positions must be 0..{MAX_POSITION}, found {bitmap.max()}")
    bitmap.run_optimize()
    return bitmap


def _frame(bitmap: BitMap64) -> bytes:
    body = MAGIC + bitmap.serialize()
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


def _portable32_size(data: bytes, start: int) -> int:
    """Byte size of the portable 32-bit Roaring bitmap at ``data[start:]`` (RoaringFormatSpec).

    Header: cookie 12346 + 4-byte container count, or cookie 12347 with (count - 1) in the high 16
    bits followed by a run flag bitset of ceil(count / 8) bytes. Then per container 2-byte key and
    2-byte (cardinality - 1); then 4-byte offsets (always for 12346, for 12347 only when
    count >= 4); then the containers: run = 2-byte run count + 4 bytes per run, array = 2 bytes per
    value (cardinality <= 4096), bitmap = 8192 bytes.
    """

    def need(end: int) -> None:
        if end > len(data):
            raise ValueError(
                f"portable roaring64: truncated 32-bit bitmap at byte {start}, "
                f"needs at least {end} bytes, found {len(data)}"
            )

    need(start + 4)
    n: int
    (cookie,) = struct.unpack_from("<I", data, start)
    pos = start + 4
    if cookie == _SERIAL_COOKIE_NO_RUN:
        need(pos + 4)
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        runs = b""
        has_offsets = True
    elif cookie & 0xFFFF == _SERIAL_COOKIE:
        n = (cookie >> 16) + 1
        need(pos + (n + 7) // 8)
        runs = data[pos : pos + (n + 7) // 8]
        pos += len(runs)
        has_offsets = n >= _NO_OFFSET_THRESHOLD
    else:
        raise ValueError(
            f"portable roaring64: expected a 32-bit Roaring cookie ({_SERIAL_COOKIE_NO_RUN} or "
            f"{_SERIAL_COOKIE}) at byte {start}, found {cookie & 0xFFFF}"
        )
    if n > 65536:
        raise ValueError(f"portable roaring64: a 32-bit bitmap holds at most 65536 containers, found {n}")
    need(pos + 4 * n)
    cardinalities = [struct.unpack_from("<H", data, pos + 4 * i + 2)[0] + 1 for i in range(n)]
    pos += 4 * n + (4 * n if has_offsets else 0)
    for i, cardinality in enumerate(cardinalities):
        if runs and runs[i // 8] >> (i % 8) & 1:
            need(pos + 2)
            pos += 2 + 4 * struct.unpack_from("<H", data, pos)[0]
        elif cardinality <= _ARRAY_MAX_CARDINALITY:
            pos += 2 * cardinality
        else:
            pos += _BITMAP_CONTAINER_BYTES
    need(pos)
    return pos - start
