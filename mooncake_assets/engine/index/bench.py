"""Index benchmark: block size, build, lookups before and after a merge, merge rate.

For each size ``n`` (in one run, one process): ``n`` distinct int64 keys are flushed as 16 blocks of
``n / 16`` rows (one data file each), then the 16 blocks are merged into one. Figures per size:

=============================  =============================================================
``bytes_per_entry``            bytes of the merged block (16 files) / n
``bytes_per_entry_blocks``     bytes of the 16 flush blocks / n
``build_entries_per_s``        n / seconds to hash the keys (``int_key_hashes``) and build the 16 blocks
``lookup_ns_single``           ns per key of ``FileIndex.lookup(splitmix64(key))`` one key at a
                               time, 16 blocks
``lookup_ns_single_merged``    the same after the merge (one block)
``lookup_ns_batched``          ns per key of ``FileIndex.lookup_batch(splitmix64(keys))``, 16 blocks
``lookup_ns_batched_merged``   the same after the merge
``lookup_ns_dict``             ns per key of ``d.get(key)`` one key at a time over the same keys in a
                               Python dict of all n keys (the reference)
``batched_merged_vs_dict``     lookup_ns_batched_merged / lookup_ns_dict (the issue asks ≤ 3)
``merge_entries_per_s``        n / seconds of ``FileIndex.build_from_merge`` of the 16 blocks
``queries``                    keys looked up in the batched and dict figures (min(n, 1M)), all hits
=============================  =============================================================

Lookup figures are the best of a few repetitions. Memory at 10M: ~2 GB (mostly the Python dict).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .block import IndexBlock
from .file_index import BatchLookup, FileIndex
from .key_hash import int_key_hashes, splitmix64

__all__ = ["run_index_bench", "QUICK_SIZES"]

QUICK_SIZES = (100_000, 1_000_000)
NUM_BLOCKS = 16


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls of ``fn`` (seconds; the least disturbed run on a noisy machine)."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _build_blocks(keys: np.ndarray, bounds: np.ndarray, workdir: Path) -> tuple[FileIndex, float]:
    """One IndexBlock per flush (keys ``bounds[k]:bounds[k+1]`` -> ``data-k.parquet``); (index, seconds)."""
    fi = FileIndex()
    t = time.perf_counter()
    for k in range(NUM_BLOCKS):
        chunk = keys[bounds[k] : bounds[k + 1]]
        h = int_key_hashes(chunk)
        fi.add_block(IndexBlock.build(workdir / f"flush-{k}.idx", h, 0, np.arange(len(chunk)), [f"data-{k}.parquet"]))
    return fi, time.perf_counter() - t


def _dict_baseline(keys: np.ndarray, bounds: np.ndarray, qkeys: np.ndarray, repeat: int) -> float:
    """Best seconds to look ``qkeys`` up one by one in a Python dict key -> packed (file, row) (the reference).

    The dict is freed before returning (the merge that follows needs the memory)."""
    n = len(keys)
    loc = (np.repeat(np.arange(NUM_BLOCKS, dtype=np.int64), np.diff(bounds)) << 32) | (
        np.arange(n, dtype=np.int64) - np.repeat(bounds[:-1], np.diff(bounds))
    )
    d = dict(zip(keys.tolist(), loc.tolist()))
    qlist = qkeys.tolist()

    def dict_lookup() -> None:
        get = d.get
        for k in qlist:
            get(k)

    gc.disable()
    try:
        dict_s = best_time(dict_lookup, repeat)
    finally:
        gc.enable()
    d.clear()  # free the reference dict before the merge (dict_lookup is not called again)
    del loc
    gc.collect()
    return dict_s


def _bench_one(n: int, workdir: Path, quick: bool, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    # n distinct pseudo-random int64 keys: an odd multiplier is a bijection mod 2**64
    keys = (rng.permutation(n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(12345)).view(np.int64)
    bounds = np.linspace(0, n, NUM_BLOCKS + 1).astype(np.int64)

    fi, build_s = _build_blocks(keys, bounds, workdir)
    bytes_blocks = fi.size_bytes

    q = min(n, 1_000_000)
    qsel = rng.permutation(n)[:q]
    qkeys = keys[qsel]
    file_of = np.searchsorted(bounds, qsel, side="right") - 1
    row_of = qsel - bounds[file_of]
    repeat = 2 if quick else 3

    single_keys = qkeys[: (500 if quick else 2000)].tolist()

    def single() -> None:
        lookup = fi.lookup
        for k in single_keys:
            lookup(splitmix64(k))

    def batched() -> BatchLookup:
        return fi.lookup_batch(splitmix64(qkeys))

    single_s = best_time(single, repeat)
    batched_s = best_time(batched, max(1, repeat - 1))
    res = batched()
    assert len(res.query_index) == q, "every key must be found exactly once"

    dict_s = _dict_baseline(keys, bounds, qkeys, repeat)

    t = time.perf_counter()
    merged = FileIndex.build_from_merge(fi.blocks, workdir / "merged.idx")
    merge_s = time.perf_counter() - t
    old = list(fi.blocks)
    fi.replace_blocks(old, merged)
    for b in old:
        b.unlink()

    single_m_s = best_time(single, repeat)
    batched_m_s = best_time(batched, repeat)
    res = batched()
    assert len(res.query_index) == q and np.array_equal(res.query_index, np.arange(q))
    names = np.array([f"data-{k}.parquet" for k in range(NUM_BLOCKS)], dtype=object)
    assert (res.file_names == names[file_of]).all() and np.array_equal(res.row, row_of.astype(np.uint32))

    out = {
        "bytes_per_entry": merged.size_bytes / n,
        "bytes_per_entry_blocks": bytes_blocks / n,
        "build_entries_per_s": n / build_s,
        "lookup_ns_single": single_s / len(single_keys) * 1e9,
        "lookup_ns_single_merged": single_m_s / len(single_keys) * 1e9,
        "lookup_ns_batched": batched_s / q * 1e9,
        "lookup_ns_batched_merged": batched_m_s / q * 1e9,
        "lookup_ns_dict": dict_s / q * 1e9,
        "merge_entries_per_s": n / merge_s,
        "queries": q,
    }
    out["batched_merged_vs_dict"] = out["lookup_ns_batched_merged"] / out["lookup_ns_dict"]
    merged.unlink()
    return out


def run_index_bench(
    sizes: Sequence[int] = (1_000_000, 10_000_000),
    quick: bool = False,
    workdir: str | None = None,
    seed: int = 0,
) -> dict[str, dict[str, dict[str, float]]]:
    """Run the index benchmark; returns ``{"index": {str(n): {figure: value}}}`` (module docstring).

    ``sizes``: entry counts (each ≥ 16); ``quick=True`` with the default sizes uses
    :data:`QUICK_SIZES` and fewer repetitions. ``workdir``: where block files go (a temporary
    directory, removed afterwards, by default). 10M entries take about a minute and ~2 GB.
    """
    if quick and tuple(sizes) == (1_000_000, 10_000_000):
        sizes = QUICK_SIZES
    for n in sizes:
        if int(n) < NUM_BLOCKS:
            raise ValueError(f"sizes must be ≥ {NUM_BLOCKS}, found {n}")
    tmp = Path(tempfile.mkdtemp(prefix="mooncake-index-bench-", dir=workdir))
    try:
        _bench_one(NUM_BLOCKS * 64, tmp, True, seed)  # warm-up: first-call costs stay out of the figures
        results = {str(int(n)): _bench_one(int(n), tmp, quick, seed) for n in sizes}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"index": results}


if __name__ == "__main__":  # python -m mooncake_assets.engine.index.bench [--quick]
    import json
    import sys

    print(json.dumps(run_index_bench(quick="--quick" in sys.argv), indent=2))
