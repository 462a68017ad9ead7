"""The key identity: how the key of a row becomes the unsigned 64-bit hash every index stores.

The key of a row is its primary-key columns (or the columns of its replica identity index); a table
without one is mirrored with REPLICA IDENTITY FULL and its key is the whole row. Keys arrive as
PostgreSQL **text** — pgoutput tuple data in text mode and ``COPY … (FORMAT csv)`` both carry each
value's text output — and the sessions that produce it pin ``TimeZone=UTC``, ``DateStyle=ISO``,
``extra_float_digits=3``, ``bytea_output=hex`` (see :mod:`mooncake_assets.engine.pg.conninfo`), so a
value has one text form. The hash is therefore defined on text values (``None`` = SQL NULL); the
MemIndex, the FileIndex's IndexBlocks, the initial copy, the apply path and compaction all use it.

Definition (version :data:`KEY_HASH_VERSION`; all arithmetic is on unsigned 64-bit integers, mod 2⁶⁴)::

    splitmix64(x) = z ^ (z >> 31)  where  z = x + 0x9E3779B97F4A7C15
                                          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
                                          z = (z ^ (z >> 27)) * 0x94D049BB133111EB

**Exact keys** — one key column of type ``smallint``/``integer``/``bigint`` of a table with a
primary key or replica identity index (so the value is never NULL)::

    key_hash = splitmix64(int(text) as 64-bit two's complement)

``splitmix64`` is a bijection of the 64-bit integers, so equal hashes mean equal keys: a hit needs no
re-check (:attr:`KeyHash.exact`).

**Every other key** (text, numeric, uuid, …, several columns, whole rows), over the key columns'
texts ``v_1 … v_k`` in key order::

    R(v)    = (b read as one little-endian unsigned integer) mod P,   P = 2⁶¹ − 1
              where b = the UTF-8 bytes of v, L = len(b) (the empty string: R = 0)
    V(v)    = R(v) + L * K_LEN;          V(NULL) = NULL_HASH
    h_0 = ROW_SEED;   h_i = (h_(i-1) XOR V(v_i)) * K_FOLD;   key_hash = splitmix64(h_k)

with the constants :data:`K_LEN`, :data:`K_FOLD` (odd), :data:`NULL_HASH` and :data:`ROW_SEED`
below. Different keys can share a hash, so the table re-checks the row on every hit (``R`` is linear:
texts of more than 23 bytes that differ in a few bytes by related amounts can share it; that costs a
re-check, never a wrong row).

Why this form: in Python, ``int.from_bytes(b, "little") % P`` is two C calls whatever the length, so
the per-change scalar path costs one multiplication per key column and one ``splitmix64``; over
Arrow's offsets and data buffers, ``R`` is a sum of the 8-byte words ``w_j`` (zero-padded) times
``2⁶⁴ʲ ≡ 2^(3j mod 61) (mod P)`` — a 61-bit rotation — so numpy hashes a whole column at once
(:func:`text_key_hashes`); in C it is a loop of ``r = (r·2⁶⁴ + w_j) mod P`` over the words, last to
first.

The hash depends on nothing but the text: not on the process, the machine, a seed or the Arrow type
the value decodes to, so IndexBlocks written by one process are read by another after a restart.

Index blobs written before this version (a blake2b-based hash for non-exact keys; the exact hash was
the same) carry no version; :func:`blob_needs_rebuild` says when a restore must rebuild the index
from the data files (:mod:`mooncake_assets.engine.table.key_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "KEY_HASH_VERSION",
    "INT_KEY_TYPES",
    "K_LEN",
    "P61",
    "NULL_HASH",
    "ROW_SEED",
    "K_FOLD",
    "KeyHash",
    "splitmix64",
    "text_key_hash",
    "text_key_hashes",
    "int_key_hashes",
    "value_hash",
    "blob_needs_rebuild",
]

#: version of the definition above, written in every index blob (``"key_hash"``)
KEY_HASH_VERSION = 2
#: pg_type oids of the integer types an exact key may have: int8, int2, int4
INT_KEY_TYPES = frozenset({20, 21, 23})

M64 = (1 << 64) - 1
SPLITMIX64_GAMMA = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
#: multiplier of the byte length in ``V``
K_LEN = 0xC2B2AE3D27D4EB4F
#: the Mersenne prime 2⁶¹ − 1 of ``R``
P61 = (1 << 61) - 1
#: ``V`` of a NULL key value
NULL_HASH = 0x27D4EB2F165667C5
#: start of the fold over the key columns
ROW_SEED = 0x85EBCA77C2B2AE63
#: odd multiplier of the fold over the key columns (a bijection mod 2⁶⁴)
K_FOLD = 0x9FB21C651E98DF25

_U64 = np.uint64
_GAMMA_U, _C1_U, _C2_U = _U64(SPLITMIX64_GAMMA), _U64(_C1), _U64(_C2)
_K_LEN_U, _NULL_U, _P_U = _U64(K_LEN), _U64(NULL_HASH), _U64(P61)


# ------------------------------------------------------------------------------------ splitmix64


def _splitmix64_int(x: int) -> int:
    x = (x + SPLITMIX64_GAMMA) & M64
    x = ((x ^ (x >> 30)) * _C1) & M64
    x = ((x ^ (x >> 27)) * _C2) & M64
    return x ^ (x >> 31)


def _as_u64_array(x: npt.ArrayLike) -> np.ndarray:
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
    z = x + _GAMMA_U  # a new array: the input is never modified
    z ^= z >> _U64(30)
    z *= _C1_U
    z ^= z >> _U64(27)
    z *= _C2_U
    z ^= z >> _U64(31)
    return z


@overload
def splitmix64(x: int | np.integer[Any]) -> int: ...
@overload
def splitmix64(x: np.ndarray | Sequence[int]) -> np.ndarray: ...
def splitmix64(x: int | np.integer[Any] | np.ndarray | Sequence[int]) -> int | np.ndarray:
    """SplitMix64 finalizer of unsigned 64-bit integers (Steele, Lea & Flood, "Fast splittable
    pseudorandom number generators", OOPSLA 2014); the formula is in the module docstring.

    ``x``: a Python int in ``[-2⁶³, 2⁶⁴)`` (negative values are taken in two's complement) → int; a
    numpy integer scalar → int; an integer array (any width, signed ones sign-extended) or a list of
    ints → ``np.ndarray[uint64]`` of the same shape. ``splitmix64(0) == 0xE220A8397B1DCDAF``.

    Raises ``ValueError`` for an int out of range and ``TypeError`` for non-integers.
    """
    if type(x) is int and 0 <= x <= M64:  # the common scalar case
        return _splitmix64_int(x)
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


# ------------------------------------------------------------------------------------ scalar path


def value_hash(text: str | None) -> int:
    """``V`` of one key value's text (None = NULL), an int in ``[0, 2⁶⁴)``; module docstring."""
    if text is None:
        return NULL_HASH
    b = text.encode("utf-8")
    return (int.from_bytes(b, "little") % P61 + len(b) * K_LEN) & M64


def text_key_hash(values: Sequence[str | None]) -> int:
    """Key hash of one non-exact key given as its columns' texts (None = NULL), in key order.

    Returns an int in ``[0, 2⁶⁴)``. Raises ``ValueError`` for a key of no columns."""
    if not values:
        raise ValueError("a key has at least one column, found none")
    h = ROW_SEED
    for v in values:  # value_hash inlined: this runs once per applied change
        if v is None:
            x = NULL_HASH
        else:
            b = v.encode("utf-8")
            x = (int.from_bytes(b, "little") % P61 + len(b) * K_LEN) & M64
        h = ((h ^ x) * K_FOLD) & M64
    x = (h + SPLITMIX64_GAMMA) & M64  # splitmix64, inlined
    x = ((x ^ (x >> 30)) * _C1) & M64
    x = ((x ^ (x >> 27)) * _C2) & M64
    return x ^ (x >> 31)


# ------------------------------------------------------------------------------------ vectorised path


def _string_array(col: pa.Array | pa.ChunkedArray | Sequence[str | None]) -> pa.Array:
    """A key column as one Arrow ``string``/``large_string`` array (lists of str/None are converted)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not isinstance(col, pa.Array):
        col = pa.array(col, type=pa.string())
    t = col.type
    if pa.types.is_dictionary(t):
        return _string_array(col.dictionary_decode())
    if pa.types.is_string_view(t):
        return col.cast(pa.large_string())
    if pa.types.is_null(t):
        return pa.nulls(len(col), pa.string())
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise TypeError(f"key columns are Postgres text, found an Arrow column of type {t}")
    return col


def _mod_p(x: np.ndarray) -> np.ndarray:
    """``x mod P61`` of uint64 values (2⁶¹ ≡ 1, so the top 3 bits fold onto the bottom)."""
    y = (x & _P_U) + (x >> _U64(61))
    return np.where(y >= _P_U, y - _P_U, y)


def _rotl61(r: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``r · 2ᵏ mod P61`` for ``r`` < 2⁶¹ and 0 ≤ k < 61: a rotation of the low 61 bits."""
    return cast(np.ndarray, ((r << k) & _P_U) | (r >> (_U64(61) - k)))


def _value_hashes(arr: pa.Array) -> np.ndarray:
    """``V`` of every value of a string array, uint64 (n,), from its offsets and data buffers."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    bufs = arr.buffers()
    off_t = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(bufs[1], dtype=off_t, count=arr.offset + n + 1)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    padded = np.zeros(hi - lo + 8, dtype=np.uint8)  # every word can be read 8 bytes wide
    padded[: hi - lo] = data[lo:hi]
    words = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    nwords = (lengths + 7) >> 3
    out: np.ndarray = lengths.astype(np.uint64) * _K_LEN_U
    total = int(nwords.sum())
    if total:
        end = np.cumsum(nwords)
        owner = np.repeat(np.arange(n, dtype=np.int64), nwords)
        j = np.arange(total, dtype=np.int64) - (end - nwords)[owner]
        w = words[(starts - lo)[owner] + 8 * j].astype(np.uint64)
        rem = np.minimum(lengths[owner] - 8 * j, 8).astype(np.uint64)  # bytes of this word in the value
        w &= _U64(M64) >> (_U64(64) - _U64(8) * rem)
        t = _rotl61(_mod_p(w), ((3 * j) % 61).astype(np.uint64))  # w_j · 2^(64j) mod P, < 2⁶¹
        # per-row sums of t in two 32-bit halves (no uint64 overflow), then mod P
        sums = []
        for half in (t >> _U64(32), t & _U64(0xFFFFFFFF)):
            csum = np.zeros(total + 1, dtype=np.uint64)
            np.cumsum(half, out=csum[1:])
            sums.append(_mod_p(csum[end] - csum[end - nwords]))
        r = _rotl61(sums[0], np.full(n, 32, dtype=np.uint64)) + sums[1]
        out += np.where(r >= _P_U, r - _P_U, r)
    if arr.null_count:
        out[~arr.is_valid().to_numpy(zero_copy_only=False)] = _NULL_U
    return out


def text_key_hashes(columns: Sequence[pa.Array | pa.ChunkedArray | Sequence[str | None]]) -> np.ndarray:
    """Key hashes of many non-exact keys given column-wise: ``np.ndarray[uint64]`` of shape (rows,).

    ``columns``: the key columns in key order, each a ``pyarrow`` string/large_string array (or
    chunked array) or a sequence of ``str | None``. Equal to :func:`text_key_hash` per row. Raises
    ``ValueError`` (no columns, lengths differ) or ``TypeError`` (a column that is not text)."""
    cols = [_string_array(c) for c in columns]
    if not cols:
        raise ValueError("a key has at least one column, found none")
    if len({len(c) for c in cols}) != 1:
        raise ValueError(f"key columns must have one length, found {[len(c) for c in cols]}")
    h = np.full(len(cols[0]), ROW_SEED, dtype=np.uint64)
    for c in cols:
        h ^= _value_hashes(c)
        h *= _U64(K_FOLD)
    return _splitmix64_array(h)


def int_key_hashes(column: npt.ArrayLike | pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Key hashes of exact keys: ``splitmix64`` of one integer column's texts (or ints), uint64 (n,).

    Raises ``ValueError`` for a NULL or a text that is not an integer."""
    if isinstance(column, np.ndarray) and column.dtype.kind in "iu":
        return _splitmix64_array(_as_u64_array(column))
    arr = column if isinstance(column, (pa.Array, pa.ChunkedArray)) else pa.array(column)
    if arr.null_count:
        raise ValueError("an exact (integer primary) key is never NULL, found a NULL")
    if not pa.types.is_integer(arr.type):
        try:
            arr = pc.cast(arr, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ValueError(f"an integer key text is not an integer: {e}") from None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return _splitmix64_array(_as_u64_array(arr.to_numpy(zero_copy_only=False)))


# ------------------------------------------------------------------------------------ per table


class KeyHash:
    """The key hash of one table's key.

    ``key_type_oids``: pg_type oids of the key columns, in key order; ``keyed``: the key is a primary
    key or replica identity index (its columns are NOT NULL), False for a whole-row key.
    ``exact`` is True for one integer column of a keyed table: equal hashes then mean equal keys.
    """

    __slots__ = ("exact",)

    def __init__(self, key_type_oids: Sequence[int], keyed: bool = True) -> None:
        self.exact = bool(keyed) and len(key_type_oids) == 1 and key_type_oids[0] in INT_KEY_TYPES

    def hash_one(self, values: Sequence[str | None]) -> int:
        """Hash of one key (its columns' text values, None = NULL). Returns an int in [0, 2**64).

        Raises ``ValueError`` when an exact key's text is not an integer (or is NULL)."""
        if self.exact:
            v = values[0]
            if v is None:
                raise ValueError("an exact (integer primary) key is never NULL, found a NULL")
            return _splitmix64_int(int(v) & M64)
        return text_key_hash(values)

    def hash_columns(self, columns: Sequence[Any]) -> np.ndarray:
        """Hashes of many keys given column-wise (per key column: a sequence of text values or a
        pyarrow string array). Returns ``np.ndarray[uint64]`` of length = rows; equal to
        :meth:`hash_one` per row."""
        if not columns:
            return np.zeros(0, dtype=np.uint64)
        if self.exact:
            return int_key_hashes(columns[0])
        return text_key_hashes(columns)


def blob_needs_rebuild(version: int | None, exact: bool) -> bool:
    """Whether index blocks saved under key hash ``version`` (None: written before versions) must be
    rebuilt for a table whose key is ``exact``: the exact hash never changed, the other did."""
    return version != KEY_HASH_VERSION and not exact
