"""Primary-key hash index of a mirrored table (docs/architecture.md#data-path).

* :class:`KeyHash`, :func:`splitmix64` — the key identity: how a key's text becomes the 64-bit hash
  every index stores (``key_hash``);
* :class:`MemIndex` — hash → (batch, row) for the in-memory batches (``mem_index``);
* :class:`IndexBlock` — one immutable, bit-packed, memory-mapped bucket hash map file (``block``);
* :class:`FileIndex` — a table's blocks, lookups newest first, ``build_from_merge`` and
  ``build_from_compaction`` (``file_index``), with :class:`PositionMap` (``position_map``);
* :class:`IndexMergePolicy` — when to merge (``policy``); ``bench.run_index_bench`` — the benchmark.
* :func:`~.saved.encode_index_blob`, :func:`~.saved.decode_index_blob` — a table's FileIndex as the one
  byte string saved with each Iceberg snapshot, and the one parser of its header (``saved``).

Pure core: no I/O but the block files themselves. Puffin blob type for saved blocks:
:data:`PUFFIN_BLOB_TYPE`.
"""

from .block import IndexBlock, IndexBlockFormatError, block_layout, next_power_of_two
from .file_index import BatchLookup, FileIndex, dead_file_maps, merge_sorted_runs
from .key_hash import KEY_HASH_VERSION, KeyHash, splitmix64, text_key_hash, text_key_hashes
from .mem_index import MemIndex
from .policy import IndexMergePolicy
from .position_map import PositionMap

#: Puffin blob type of a saved IndexBlock (its :meth:`IndexBlock.to_bytes`), docs/architecture.md#storage
PUFFIN_BLOB_TYPE = "mooncake-hash-index-v1"

__all__ = [
    "BatchLookup",
    "FileIndex",
    "IndexBlock",
    "IndexBlockFormatError",
    "IndexMergePolicy",
    "KEY_HASH_VERSION",
    "KeyHash",
    "MemIndex",
    "PUFFIN_BLOB_TYPE",
    "PositionMap",
    "block_layout",
    "dead_file_maps",
    "merge_sorted_runs",
    "next_power_of_two",
    "splitmix64",
    "text_key_hash",
    "text_key_hashes",
]
