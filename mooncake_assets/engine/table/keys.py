"""Row keys of a mirrored table, hashed for the MemIndex and the FileIndex.

The key of a row is its primary-key (or replica-identity index) columns; a table without one is
mirrored with REPLICA IDENTITY FULL and its key is the whole row. Keys are hashed from the values'
Postgres *text* representation, which is what both the replication stream and the initial copy carry
(the connections pin ``TimeZone=UTC``, ``DateStyle=ISO``, ``extra_float_digits=3``,
``bytea_output=hex``, so a value always has one text form):

- a single integer key column: ``splitmix64(int(text) mod 2**64)`` — a bijection, no re-check needed;
- anything else: ``splitmix64(blake2b-64(canonical bytes))`` where the canonical bytes are, per key
  column, ``b"\\x00"`` for NULL or ``b"\\x01" + len (4 bytes, little-endian) + UTF-8 text``.

blake2b is keyed by nothing and seeded by nothing, so the hash is the same in every process, on every
machine and across restarts (DESIGN.md §3).
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from ..index import splitmix64

INT_TYPES = {20, 21, 23}  # int8, int2, int4 (pg_type oids)
_MASK = (1 << 64) - 1


def canonical_key_bytes(values: Sequence[str | None]) -> bytes:
    """Canonical bytes of a key given as text values (None = NULL); see the module docstring."""
    out = bytearray()
    for v in values:
        if v is None:
            out += b"\x00"
        else:
            b = v.encode("utf-8")
            out += b"\x01" + len(b).to_bytes(4, "little") + b
    return bytes(out)


class KeyHasher:
    """Hashes key text values to the unsigned 64-bit hash the indexes store.

    ``exact`` is True for a single integer key column: equal hashes then mean equal keys.
    """

    def __init__(self, key_type_oids: Sequence[int]):
        self.exact = len(key_type_oids) == 1 and key_type_oids[0] in INT_TYPES

    def hash_one(self, values: Sequence[str | None]) -> int:
        """Hash of one key (its columns' text values). Returns an int in [0, 2**64)."""
        if self.exact:
            return int(splitmix64(int(values[0]) & _MASK))
        d = hashlib.blake2b(canonical_key_bytes(values), digest_size=8).digest()
        return int(splitmix64(int.from_bytes(d, "little")))

    def hash_columns(self, columns: Sequence[Sequence[str | None]]) -> np.ndarray:
        """Hashes of many keys given column-wise (one sequence of text values per key column).

        Returns ``np.ndarray[uint64]`` of length = rows.
        """
        if not columns:
            return np.zeros(0, dtype=np.uint64)
        if self.exact:
            ints = np.array([int(v) for v in columns[0]], dtype=np.int64).view(np.uint64)
            return splitmix64(ints)
        raw = np.fromiter(
            (int.from_bytes(hashlib.blake2b(canonical_key_bytes(vals), digest_size=8).digest(), "little")
             for vals in zip(*columns)),
            dtype=np.uint64,
            count=len(columns[0]),
        )
        return splitmix64(raw)
