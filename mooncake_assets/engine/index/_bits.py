"""Bit packing of fixed-width records into little-endian 64-bit words, vectorized with numpy.

Bit order (used by the IndexBlock format): bit ``p`` of the stream is bit ``p % 64`` of the
little-endian uint64 word ``p // 64`` (LSB-first). Record ``i`` of width ``W`` occupies bits
``[i*W, (i+1)*W)``; its fields follow in order, each LSB-first. Streams carry one extra zero word at
the end so that a field read never needs a bounds check.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

from ._pack import or_field

_U64 = np.uint64
_ALL = _U64(0xFFFFFFFFFFFFFFFF)


def words_for_bits(nbits: int) -> int:
    """Number of uint64 words of a stream of ``nbits`` bits, including the trailing zero word."""
    return (nbits + 63) // 64 + 1


def _record_stream(fields: Sequence[tuple[np.ndarray, int]], n: int) -> tuple[int, np.ndarray]:
    """The record width ``W`` (bits) of ``fields`` and a zeroed stream for ``n`` records of it
    (``words_for_bits(n * W)`` uint64 words). Raises ``ValueError`` for records wider than 128 bits."""
    width_total = sum(w for _, w in fields)
    if width_total > 128:
        raise ValueError(f"records wider than 128 bits are not supported, found {width_total}")
    return width_total, np.zeros(words_for_bits(n * width_total), dtype=np.uint64)


def pack_records(fields: Sequence[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    """Pack ``n`` records; ``fields`` = [(values uint64 (n,), width bits 0..64), ...] in record order,
    total width ``W`` ≤ 128. Values must already fit their width (checked by the caller). Returns the
    stream as uint64 words (``words_for_bits(n * W)``), equal to :func:`pack_records_numpy`'s: each
    field is OR-ed in by a compiled loop (:func:`._pack.or_field`, ~5 ms per million records where the
    numpy form takes ~160 ms). Raises ``ValueError`` for records wider than 128 bits."""
    width_total, out = _record_stream(fields, n)
    if n == 0 or width_total == 0:
        return out
    offset = 0
    for values, width in fields:
        if width:
            v = np.ascontiguousarray(values, dtype=np.uint64)
            if v.ndim == 0:
                v = np.full(n, v, dtype=np.uint64)
            or_field(out, v, n, width_total, offset, width)
        offset += width
    return out


def pack_records_numpy(fields: Sequence[tuple[np.ndarray, int]], n: int) -> np.ndarray:
    """The reference form of :func:`pack_records` in numpy alone (the compiled one is tested against it).

    Values must already fit their width (checked by the caller). Returns the stream as uint64 words
    (``words_for_bits(n * W)``). Each record is first assembled as a 128-bit value (two uint64
    halves), then its three possible word pieces are scattered: with ``W ≥ 64`` every piece kind hits
    distinct words, otherwise runs of one word are OR-reduced (``bitwise_or.reduceat``) first. Fields
    never overlap, so OR is exact.
    """
    width_total, out = _record_stream(fields, n)
    if n == 0 or width_total == 0:
        return out
    lo = np.zeros(n, dtype=np.uint64)
    hi = np.zeros(n, dtype=np.uint64) if width_total > 64 else None
    offset = 0
    for values, width in fields:
        if width == 0:
            continue
        v = np.asarray(values, dtype=np.uint64)
        if offset < 64:
            lo |= v << _U64(offset)
            if offset + width > 64:
                assert hi is not None  # the record is wider than 64 bits
                hi |= v >> _U64(64 - offset)
        else:
            assert hi is not None  # the record is wider than 64 bits
            hi |= v << _U64(offset - 64)
        offset += width
    pos = np.arange(n, dtype=np.uint64) * _U64(width_total)
    word = pos >> _U64(6)
    shift = pos & _U64(63)
    del pos
    back = _U64(63) - shift
    unique = width_total >= 64
    # (x >> 1) >> (63 - s) == x >> (64 - s), and 0 when s == 0 (no undefined shift by 64)
    p1 = (lo >> _U64(1)) >> back
    if hi is not None:
        p1 |= hi << shift
    if unique:
        out[word] = lo << shift
    else:
        _or_scatter(out, word, lo << shift, False)
    word += _U64(1)
    _or_scatter(out, word, p1, unique)
    if hi is not None:
        word += _U64(1)
        _or_scatter(out, word, (hi >> _U64(1)) >> back, unique)
    return out


def _or_scatter(out: np.ndarray, idx: np.ndarray, vals: np.ndarray, unique: bool) -> None:
    if unique:
        out[idx] |= vals
        return
    if len(idx) == 0:
        return
    starts = np.flatnonzero(np.concatenate(([True], idx[1:] != idx[:-1])))
    red = np.bitwise_or.reduceat(vals, starts)
    out[idx[starts]] |= red


def read_field(words: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Read a ``width``-bit field (1..64) at each bit position ``pos`` (uint64 array) of ``words``."""
    word = pos >> _U64(6)
    shift = pos & _U64(63)
    v: np.ndarray = words[word] >> shift
    v |= (words[word + _U64(1)] << _U64(1)) << (_U64(63) - shift)
    if width < 64:
        v &= _U64((1 << width) - 1)
    return v


def unaligned_words(buf: bytes | bytearray | memoryview | mmap.mmap, offset: int, nbytes: int) -> np.ndarray:
    """Little-endian uint64 starting at every byte of ``buf[offset : offset + nbytes]`` (a strided,
    read-only view; the last 7 bytes start no word). For :func:`read_field_unaligned`."""
    return np.ndarray(shape=(max(nbytes - 7, 0),), dtype="<u8", buffer=buf, offset=offset, strides=(1,))


#: widest field :func:`read_field_unaligned` can read (64 bits minus a shift of up to 7)
MAX_UNALIGNED_WIDTH = 57


def read_field_unaligned(uwords: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """Like :func:`read_field` with one gather per field (``uwords`` from :func:`unaligned_words`);
    ``width`` ≤ 57."""
    v: np.ndarray = uwords[pos >> _U64(3)] >> (pos & _U64(7))
    v &= _U64((1 << width) - 1)
    return v


def read_field_py(buf: bytes | bytearray | memoryview | mmap.mmap, byte_offset: int, bitpos: int, width: int) -> int:
    """Scalar read of a ``width``-bit field at bit ``bitpos`` of the stream starting at ``byte_offset``
    of ``buf`` (bytes, mmap or memoryview)."""
    b0 = byte_offset + (bitpos >> 3)
    b1 = byte_offset + ((bitpos + width + 7) >> 3)
    return (int.from_bytes(buf[b0:b1], "little") >> (bitpos & 7)) & ((1 << width) - 1)
