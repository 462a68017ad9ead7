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

Bytes per entry, measured (2026-12-01, x86-64, CPython 3.11; distinct random hashes inserted in
batches of 16384; each size in a fresh process; tracemalloc of the build / growth of VmRSS):
``python -m mooncake_assets.engine.index.mem_index_bench --sizes 1000000 10000000`` (this table) and
the same with ``--impl`` naming the previous ``dict`` version's file (``git show b7b0187:mooncake_assets/engine/index/mem_index.py``):

==========  ===================  ======================  ==================
entries     this table (load)    dict version            ratio (RSS)
==========  ===================  ======================  ==================
1,000,000   23.6 / 24.1 (0.678)  153.2 / 407.8           17x
10,000,000  19.2 / 19.3 (0.832)  144.9 / 399.3           21x
==========  ===================  ======================  ==================

The load factor stays in [0.67, 0.875], so the table holds 18.3–23.8 bytes per distinct hash.
Per-row calls from Python (CPU time per call, best of 7 interleaved rounds of 100,000 random hashes,
a 100,000-entry table): ``insert_one`` 421 ns (dict version 1396 ns), ``lookup`` 293 ns (642 ns),
``remove`` 439 ns (1195 ns).
"""

from __future__ import annotations

from ._mem_index import MAX_BATCH_ID, MemIndex

__all__ = ["MAX_BATCH_ID", "MemIndex"]
