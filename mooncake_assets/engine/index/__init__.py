"""Primary-key hash index of a mirrored table (seed 000 "GlobalIndex"; DESIGN.md §3).

* :func:`splitmix64`, :func:`hash_keys`, :func:`key_is_exact` — the 64-bit key hash (``hashing``);
* :class:`MemIndex` — hash → (batch, row) for the in-memory batches (``mem_index``);
* :class:`IndexBlock` — one immutable, bit-packed, memory-mapped bucket hash map file (``block``);
* :class:`FileIndex` — a table's blocks, lookups newest first, ``build_from_merge`` and
  ``build_from_compaction`` (``file_index``), with :class:`PositionMap` (``position_map``);
* :func:`build_flush_block`, :func:`build_block_from_mem_index` — the flush hand-over (``flush``);
* :class:`IndexMergePolicy` — when to merge (``policy``); ``bench.run_index_bench`` — the benchmark.

Pure core: no I/O but the block files themselves. Puffin blob type for saved blocks:
:data:`PUFFIN_BLOB_TYPE`.
"""
from .block import IndexBlock, IndexBlockFormatError, block_layout, next_power_of_two
from .file_index import BatchLookup, FileIndex, merge_sorted_runs
from .flush import build_block_from_mem_index, build_flush_block
from .hashing import hash_keys, key_is_exact, splitmix64, stable_hash_bytes
from .mem_index import MemIndex
from .policy import IndexMergePolicy
from .position_map import PositionMap

#: Puffin blob type of a saved IndexBlock (its :meth:`IndexBlock.to_bytes`), DESIGN.md §5
PUFFIN_BLOB_TYPE = "mooncake-hash-index-v1"

__all__ = [
    "BatchLookup",
    "FileIndex",
    "IndexBlock",
    "IndexBlockFormatError",
    "IndexMergePolicy",
    "MemIndex",
    "PUFFIN_BLOB_TYPE",
    "PositionMap",
    "block_layout",
    "build_block_from_mem_index",
    "build_flush_block",
    "hash_keys",
    "key_is_exact",
    "merge_sorted_runs",
    "next_power_of_two",
    "splitmix64",
    "stable_hash_bytes",
]
