"""MemIndex: key hash → (batch id, row) for the rows of the in-memory MemSlice.

docs/architecture.md#apply: INSERT adds
the row's location, a DELETE that hits the MemIndex marks the batch's deletion vector and removes the
location here, and at flush the flushed batches' locations become file locations in one new IndexBlock
(built by the table's flush from the drained hashes) and are dropped from here.

The table is compiled (``_mem_index.pyx``): open addressing over one flat array of 16-byte slots (the
mixed uint64 hash, the location packed as ``batch_id << 32 | row``), linear probing in Robin Hood
order, backward-shift deletion, growth by rehash (×1.3 past a load of 7/8). A hash with several
locations (tables without a primary key holding equal rows, a key deleted and inserted again, distinct
keys sharing a non-exact hash) keeps them in an overflow vector in insertion order. No hash value is
reserved: the empty-slot marker lives in the location word, which a real location never takes.

Measured (``python -m mooncake_assets.engine.index.mem_index_bench``, distinct random hashes, one
batch per 16384 rows; tracemalloc of the build, and the process's RSS growth):

MEASUREMENTS_PLACEHOLDER
"""

from __future__ import annotations

from ._mem_index import MAX_BATCH_ID, MemIndex

__all__ = ["MAX_BATCH_ID", "MemIndex"]
