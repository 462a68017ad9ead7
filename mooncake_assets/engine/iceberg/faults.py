"""Fault injection for tests of the Iceberg commit path (moonlink-style: faults are injected, not mocked).

``crash_before_swap`` makes a table's commit fail at the worst moment: after every file of the new
snapshot (data-file metadata, DVs / position deletes, index Puffin, manifests, manifest list and, for v3,
the metadata JSON) is written, and before the catalog pointer is swapped. What a crash there must leave:
the previous snapshot current and readable, the written files as unreferenced orphans.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .table import IcebergMirrorTable


class SimulatedCrash(RuntimeError):
    """Raised by ``crash_before_swap`` in place of a process crash."""


@contextmanager
def crash_before_swap(table: IcebergMirrorTable, *, after_commits: int = 0) -> Iterator[list[str | None]]:
    """Within the block, the commit of ``table`` after ``after_commits`` successful ones raises
    ``SimulatedCrash`` right before its pointer swap (later commits are not affected). Yields a list that
    receives the metadata location the crashed commit would have swapped in (None on the
    ``commit_table`` path, where the catalog writes it). Restores the table's previous hook on exit.
    """
    previous = table.before_swap
    seen: list[str | None] = []
    count = 0

    def hook(location: str | None) -> None:
        nonlocal count
        if previous is not None:
            previous(location)
        count += 1
        if count == after_commits + 1:
            seen.append(location)
            raise SimulatedCrash(f"simulated crash before swapping the pointer of {table.identifier}")

    table.before_swap = hook
    try:
        yield seen
    finally:
        table.before_swap = previous
