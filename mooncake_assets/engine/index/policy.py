"""IndexMergePolicy: when to merge index blocks and which ones (docs/architecture.md#maintenance, "index_merge").

 Every lookup probes every block, so
once a table has more than ``max_blocks`` blocks, the smallest ones (up to ``max_blocks_per_merge``)
are merged into one with ``FileIndex.build_from_merge``. With the defaults every block is merged,
so lookups go back to one bucket probe; a table with more than 32 blocks gets there in a few rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .block import IndexBlock
from .file_index import FileIndex

__all__ = ["IndexMergePolicy"]


@dataclass(frozen=True)
class IndexMergePolicy:
    """Index merge policy.

    ``max_blocks``: blocks a table may have without a merge (count, ≥ 1; default 16).
    ``max_blocks_per_merge``: most blocks merged into one at a time (count, ≥ 2; default 32), which
    bounds one merge's memory (about 16 bytes per entry while merging) and time.
    """

    max_blocks: int = 16
    max_blocks_per_merge: int = 32

    def __post_init__(self) -> None:
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks must be ≥ 1, found {self.max_blocks}")
        if self.max_blocks_per_merge < 2:
            raise ValueError(f"max_blocks_per_merge must be ≥ 2, found {self.max_blocks_per_merge}")

    def pick(self, file_index: FileIndex | Iterable[IndexBlock]) -> list[IndexBlock]:
        """Blocks to merge now, newest first; empty when the table has at most ``max_blocks`` blocks.

        Picks the ``min(len, max_blocks_per_merge)`` smallest blocks (by entries; ties: newer first),
        so big merged blocks are rewritten only when everything is merged.
        """
        blocks = list(file_index.blocks if isinstance(file_index, FileIndex) else file_index)
        if len(blocks) <= self.max_blocks:
            return []
        k = min(len(blocks), self.max_blocks_per_merge)
        order = sorted(range(len(blocks)), key=lambda i: (blocks[i].num_entries, i))[:k]
        return [blocks[i] for i in sorted(order)]
