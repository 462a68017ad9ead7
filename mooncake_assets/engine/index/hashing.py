"""Key hashing for the FileIndex and the MemIndex (seed 000, "GlobalIndex": ``splitmix64`` of the key).

Every index in this package is keyed by a 64-bit hash of the row's key:

* **one integer column** (int8 … int64, uint8 … uint64): ``splitmix64(value)``, the value taken as an
  unsigned 64-bit integer in two's complement (so int32 ``-1`` and int64 ``-1`` both become
  ``0xFFFF_FFFF_FFFF_FFFF``). ``splitmix64`` is a bijection of the 64-bit integers, so the hash *is*
  the key: a hit needs no re-check (:func:`key_is_exact`).
* **anything else** (text, numeric, several columns, whole rows of tables without a primary key):
  ``splitmix64(stable_hash(row))`` where ``stable_hash`` hashes the *canonical bytes* of each key value
  and folds the columns in key order (below). Different keys can share a hash, so the caller re-checks
  the row on every hit (the index returns every candidate).

The hash never depends on the process, the machine or a random seed (no Python ``hash()``): index
blocks written by one process are read by another after a restart.

Canonical bytes of one value (``B(v)``), by Arrow type:

==========================================  ====================================================
integer, date32/64, time32/64, timestamp,   8 bytes, little-endian, the value (or its physical
duration                                    integer: days, ms, µs, ns, as stored) as int64 two's
                                            complement (uint64 values ≥ 2⁶³ wrap)
bool                                        1 byte, 0 or 1
float16/32/64                               8 bytes, little-endian IEEE-754 double; ``-0.0`` is
                                            written as ``0.0`` and every NaN as ``0x7FF8…0``
                                            (PostgreSQL treats ``-0 = 0`` and ``NaN = NaN``)
decimal128 / decimal256                     16 / 32 bytes, the unscaled integer, little-endian
                                            two's complement (the scale is fixed by the type)
string, large_string, string_view           the UTF-8 bytes
binary, large_binary, binary_view,          the bytes
fixed_size_binary
dictionary                                  ``B`` of the decoded value
anything else (lists, structs, …)           UTF-8 of ``json.dumps(value.as_py(), sort_keys=True,
                                            separators=(",", ":"), default=str)`` (slow path, one
                                            Python call per row)
==========================================  ====================================================

Hash of one value's bytes ``b`` of length ``L`` (``w_j`` = the ``j``-th 8-byte little-endian word of
``b``, the last one zero-padded; all arithmetic mod 2⁶⁴)::

    H(b)    = splitmix64(L * K_LEN + sum_j splitmix64(w_j + j * K_POS))
    H(null) = NULL_HASH

Row hash over the key columns ``c_1 … c_k`` in key order::

    h = ROW_SEED;  for each column: h = splitmix64(h XOR H(value))
    stable_hash(row) = h;   index hash = splitmix64(h)

A sum of per-word mixes is order-dependent through ``j * K_POS`` and lets numpy hash every string of a
column at once (one gather per 8 bytes), instead of one ``hashlib`` call per row. It is not a
cryptographic hash; collisions only cost a re-check.

Nulls: a null in any key column hashes as ``NULL_HASH`` in the canonical path. A single integer column
with nulls (possible only for tables without a primary key) hashes its non-null rows exactly and its
null rows through the canonical path; :func:`key_is_exact` is then False.
"""
from __future__ import annotations

import json
from typing import Sequence, Union

import numpy as np
import pyarrow as pa

__all__ = [
    "splitmix64",
    "hash_keys",
    "key_is_exact",
    "stable_hash_bytes",
    "SPLITMIX64_GAMMA",
    "K_LEN",
    "K_POS",
    "NULL_HASH",
    "ROW_SEED",
]

M64 = (1 << 64) - 1
SPLITMIX64_GAMMA = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB

#: multiplier of the byte length in :func:`stable_hash_bytes`
K_LEN = 0xC2B2AE3D27D4EB4F
#: multiplier of the word position in :func:`stable_hash_bytes`
K_POS = 0x165667B19E3779F9
#: hash of a null key value
NULL_HASH = 0x27D4EB2F165667C5
#: start value of the fold over key columns
ROW_SEED = 0x85EBCA77C2B2AE63

_U64 = np.uint64
_GAMMA_U = _U64(SPLITMIX64_GAMMA)
_C1_U = _U64(_C1)
_C2_U = _U64(_C2)
_CANON_NAN = 0x7FF8000000000000


def _splitmix64_int(x: int) -> int:
    x = (x + SPLITMIX64_GAMMA) & M64
    x = ((x ^ (x >> 30)) * _C1) & M64
    x = ((x ^ (x >> 27)) * _C2) & M64
    return x ^ (x >> 31)


def _as_u64_array(x: np.ndarray) -> np.ndarray:
    """Integer array -> uint64 (two's complement for signed types). Raises TypeError otherwise."""
    x = np.asarray(x)
    if x.dtype == np.uint64:
        return x
    if x.dtype == np.int64:
        return x.view(np.uint64)
    if x.dtype.kind == "i":
        return x.astype(np.int64).view(np.uint64)
    if x.dtype.kind in "ub":
        return x.astype(np.uint64)
    raise TypeError(f"splitmix64 expects integers, found an array of dtype {x.dtype}")


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    z = x + _GAMMA_U  # new array: the input is never modified
    z ^= z >> _U64(30)
    z *= _C1_U
    z ^= z >> _U64(27)
    z *= _C2_U
    z ^= z >> _U64(31)
    return z


def splitmix64(x: Union[int, np.integer, np.ndarray, Sequence[int]]):
    """SplitMix64 finalizer of unsigned 64-bit integers (Steele, Lea & Flood 2014; moonlink's key hash).

    ``z = x + 0x9E3779B97F4A7C15; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
    z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31`` (all mod 2⁶⁴).

    ``x``: a Python int in ``[-2⁶³, 2⁶⁴)`` (negative values are taken in two's complement) → int; a
    numpy integer scalar → int; an integer array (any width, signed ones sign-extended) or a list of
    ints → ``np.ndarray[uint64]`` of the same shape. ``splitmix64(0) == 0xE220A8397B1DCDAF``.

    Raises ``ValueError`` for an int out of range and ``TypeError`` for non-integers.
    """
    if type(x) is int and 0 <= x <= M64:  # fast path for the common scalar case
        x = (x + SPLITMIX64_GAMMA) & M64
        x = ((x ^ (x >> 30)) * _C1) & M64
        x = ((x ^ (x >> 27)) * _C2) & M64
        return x ^ (x >> 31)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError("splitmix64 expects integers, found a bool")
    if isinstance(x, (int, np.integer)):
        v = int(x)
        if not -(1 << 63) <= v <= M64:
            raise ValueError(f"splitmix64 expects a 64-bit integer, found {v}")
        return _splitmix64_int(v & M64)
    if isinstance(x, (list, tuple)):
        x = np.array([int(v) & M64 for v in x], dtype=np.uint64)
    return _splitmix64_array(_as_u64_array(x))


def stable_hash_bytes(b: bytes) -> int:
    """``H(b)`` of the module docstring for one byte string, in pure Python (reference and slow path).

    Returns an int in ``[0, 2⁶⁴)``; equal to what :func:`hash_keys` computes per value, vectorized.
    """
    b = bytes(b)
    total = 0
    for j in range(0, len(b), 8):
        w = int.from_bytes(b[j : j + 8], "little")
        total = (total + _splitmix64_int((w + (j // 8) * K_POS) & M64)) & M64
    return _splitmix64_int((len(b) * K_LEN + total) & M64)


# ---------------------------------------------------------------------------------------------
# column hashes (H of the canonical bytes, vectorized)
# ---------------------------------------------------------------------------------------------

_H8_LEN = _U64((8 * K_LEN) & M64)


def _hash_words8(u: np.ndarray) -> np.ndarray:
    """H of values whose canonical bytes are one 8-byte word ``u`` (L = 8)."""
    z = _splitmix64_array(u)
    z += _H8_LEN
    return _splitmix64_array(z)


def _hash_fixed_words(words: np.ndarray, length: int) -> np.ndarray:
    """H of values of ``length`` bytes given as ``words`` (n, k) little-endian uint64 words."""
    n, k = words.shape
    total = np.zeros(n, dtype=np.uint64)
    for j in range(k):
        total += _splitmix64_array(words[:, j] + _U64((j * K_POS) & M64))
    total += _U64((length * K_LEN) & M64)
    return _splitmix64_array(total)


def _unaligned_u64_view(data: np.ndarray) -> np.ndarray:
    """Little-endian uint64 at every byte offset of ``data`` (uint8, padded with ≥ 8 zero bytes)."""
    return np.ndarray(shape=(len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))


def _hash_var_bytes(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """H of variable-length values: ``offsets`` (n+1,) int64 into ``data`` (uint8)."""
    n = len(offsets) - 1
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    lo = int(starts.min()) if n else 0
    hi = int(offsets[1:].max()) if n else 0
    padded = np.zeros(max(hi - lo, 0) + 8, dtype=np.uint8)
    padded[: hi - lo] = data[lo:hi]
    words_view = _unaligned_u64_view(padded)
    nwords = (lengths + 7) // 8
    total_words = int(nwords.sum())
    word_end = np.cumsum(nwords)
    word_start = word_end - nwords
    if total_words:
        owner = np.repeat(np.arange(n, dtype=np.int64), nwords)
        j = np.arange(total_words, dtype=np.int64) - word_start[owner]
        pos = (starts - lo)[owner] + 8 * j
        w = words_view[pos].astype(np.uint64)
        rem = np.minimum(lengths[owner] - 8 * j, 8).astype(np.uint64)
        w &= _U64(M64) >> (_U64(64) - _U64(8) * rem)
        mixed = _splitmix64_array(w + j.astype(np.uint64) * _U64(K_POS))
        csum = np.zeros(total_words + 1, dtype=np.uint64)
        np.cumsum(mixed, out=csum[1:])
        sums = csum[word_end] - csum[word_start]
    else:
        sums = np.zeros(n, dtype=np.uint64)
    sums += lengths.astype(np.uint64) * _U64(K_LEN)
    return _splitmix64_array(sums)


def _binary_offsets_data(arr: pa.Array):
    """(offsets int64 (n+1,), data uint8) of a (large_)string/(large_)binary array, slice-aware."""
    bufs = arr.buffers()
    off_dtype = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=off_dtype, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _fixed_width_words(arr: pa.Array, width: int) -> np.ndarray:
    """(n, ceil(width/8)) little-endian uint64 words of a fixed-width array's values, zero-padded."""
    n = len(arr)
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8, count=(arr.offset + n) * width)[arr.offset * width :]
    k = (width + 7) // 8
    padded = np.zeros((n, k * 8), dtype=np.uint8)
    padded[:, :width] = raw.reshape(n, width)
    return padded.view("<u8").astype(np.uint64).reshape(n, k)


def _int_values_u64(arr: pa.Array) -> np.ndarray:
    """Values of an integer-like array as uint64 two's complement; null slots hold 0."""
    t = arr.type
    if pa.types.is_integer(t):
        np_t = t.to_pandas_dtype()
    else:  # temporal: the physical integer
        width = t.bit_width
        np_t = np.int32 if width == 32 else np.int64
        arr = arr.view(pa.int32() if width == 32 else pa.int64())
    values = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np_t, copy=False)
    return _as_u64_array(values)


def _column_hash(arr: pa.Array) -> np.ndarray:
    """H of every value of one key column (NULL_HASH where null), uint64 (n,)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        return _column_hash(arr.dictionary_decode())
    if pa.types.is_null(t):
        return np.full(n, NULL_HASH, dtype=np.uint64)
    if pa.types.is_integer(t) or pa.types.is_temporal(t) and not pa.types.is_interval(t):
        out = _hash_words8(_int_values_u64(arr))
    elif pa.types.is_boolean(t):
        v = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
        out = _hash_fixed_words(v.reshape(n, 1), 1)
    elif pa.types.is_floating(t):
        v = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        v = v + 0.0  # -0.0 + 0.0 == +0.0
        u = v.view(np.uint64).copy()
        u[np.isnan(v)] = _CANON_NAN
        out = _hash_words8(u)
    elif pa.types.is_decimal(t):
        width = t.bit_width // 8
        out = _hash_fixed_words(_fixed_width_words(arr, width), width)
    elif pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        if width == 0:
            out = np.full(n, _splitmix64_int(0), dtype=np.uint64)
        else:
            out = _hash_fixed_words(_fixed_width_words(arr, width), width)
    elif pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _column_hash(arr.cast(pa.large_string() if pa.types.is_string_view(t) else pa.large_binary()))
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        offsets, data = _binary_offsets_data(arr)
        out = _hash_var_bytes(offsets, data)
    else:
        vals = arr.to_pylist()
        out = np.array(
            [
                stable_hash_bytes(
                    json.dumps(v, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")
                )
                if v is not None
                else NULL_HASH
                for v in vals
            ],
            dtype=np.uint64,
        )
        return out
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        out[~valid] = _U64(NULL_HASH)
    return out


def _as_columns(columns) -> list:
    if isinstance(columns, (pa.Array, pa.ChunkedArray)):
        columns = [columns]
    cols = list(columns)
    if not cols:
        raise ValueError("hash_keys needs at least one key column, found none")
    n = len(cols[0])
    for c in cols:
        if not isinstance(c, (pa.Array, pa.ChunkedArray)):
            raise TypeError(f"key columns must be pyarrow arrays, found {type(c).__name__}")
        if len(c) != n:
            raise ValueError(f"key columns must have one length, found {[len(c) for c in cols]}")
    return cols


def _is_int_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def key_is_exact(columns) -> bool:
    """True when the index hash is a bijection of the key, so a hit needs no re-check.

    ``columns``: the key columns as a list of ``pyarrow.Array``/``ChunkedArray`` or of
    ``pyarrow.DataType`` (schema only). True exactly for one integer column without nulls (types can
    only say "integer": a nullable single-integer key of a table without primary key must be checked
    with its arrays). Everything else is False: the caller re-checks each candidate row.
    """
    if isinstance(columns, (pa.Array, pa.ChunkedArray, pa.DataType)):
        columns = [columns]
    cols = list(columns)
    if len(cols) != 1:
        return False
    c = cols[0]
    if isinstance(c, pa.DataType):
        return _is_int_type(c)
    return _is_int_type(c.type) and c.null_count == 0


def hash_keys(columns) -> np.ndarray:
    """Index hash of each row's key: ``np.ndarray[uint64]`` of shape (rows,).

    ``columns``: list of ``pyarrow.Array``/``ChunkedArray`` of one length (the key columns in key
    order), or one array. One integer column: ``splitmix64(value)``; otherwise
    ``splitmix64(stable_hash(row))`` over the canonical bytes (module docstring). Vectorized with numpy
    for every type except nested ones. Raises ``ValueError`` (no columns, lengths differ) or
    ``TypeError`` (not Arrow arrays); both permanent.
    """
    cols = _as_columns(columns)
    if len(cols) == 1 and _is_int_type(cols[0].type):
        arr = cols[0].combine_chunks() if isinstance(cols[0], pa.ChunkedArray) else cols[0]
        out = _splitmix64_array(_int_values_u64(arr))
        if arr.null_count:
            nulls = ~arr.is_valid().to_numpy(zero_copy_only=False)
            out[nulls] = _U64(_splitmix64_int(_splitmix64_int(ROW_SEED ^ NULL_HASH)))
        return out
    n = len(cols[0])
    h = np.full(n, ROW_SEED, dtype=np.uint64)
    for c in cols:
        h ^= _column_hash(c)
        h = _splitmix64_array(h)
    return _splitmix64_array(h)


def _row_hash_py(values: Sequence[bytes | None]) -> int:
    """Reference: index hash of one row from its canonical value bytes (None = null); for tests."""
    h = ROW_SEED
    for b in values:
        h = _splitmix64_int(h ^ (NULL_HASH if b is None else stable_hash_bytes(b)))
    return _splitmix64_int(h)
