# cython: boundscheck=False, wraparound=False, cdivision=True
"""Compiled bit packing of one field into an IndexBlock stream (see :mod:`._bits` for the bit order;
:func:`._bits.pack_records_numpy` is the reference it is tested against)."""

from libc.stdint cimport uint64_t


def or_field(uint64_t[::1] out, const uint64_t[::1] values, Py_ssize_t n, unsigned int record_bits,
             unsigned int offset, unsigned int width):
    """OR field values ``values[i]`` (``width`` bits, 1..64, already fitting) into ``out`` at bit
    ``i * record_bits + offset`` for ``i < n``, LSB-first in little-endian uint64 words. ``out`` must
    hold ``words_for_bits(n * record_bits)`` words (a field never runs past the last one)."""
    cdef Py_ssize_t i, word
    cdef uint64_t p, x
    cdef unsigned int s
    if width == 0 or n == 0:
        return
    if values.shape[0] < n:
        raise ValueError(f"{values.shape[0]} values for {n} records")
    if (<uint64_t>n * record_bits + 63) // 64 + 1 > <uint64_t>out.shape[0]:
        raise ValueError(f"an output of {out.shape[0]} words cannot hold {n} records of {record_bits} bits")
    with nogil:
        for i in range(n):
            p = <uint64_t>i * record_bits + offset
            word = <Py_ssize_t>(p >> 6)
            s = <unsigned int>(p & 63)
            x = values[i]
            out[word] |= x << s
            if s != 0 and s + width > 64:
                out[word + 1] |= x >> (64 - s)
