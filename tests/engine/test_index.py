"""Tests of mooncake_assets.engine.index: the key hash, IndexBlock, FileIndex, MemIndex, policy."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.index import (
    KEY_HASH_VERSION,
    PUFFIN_BLOB_TYPE,
    FileIndex,
    IndexBlock,
    IndexBlockFormatError,
    IndexMergePolicy,
    KeyHash,
    MemIndex,
    PositionMap,
    block_layout,
    merge_sorted_runs,
    next_power_of_two,
    splitmix64,
    text_key_hash,
    text_key_hashes,
)
from mooncake_assets.engine.index.bench import run_index_bench
from mooncake_assets.engine.index.key_hash import K_FOLD, K_LEN, NULL_HASH, P61, ROW_SEED, int_key_hashes, value_hash

from .index_blocks import build_block_from_mem_index, build_flush_block

M64 = (1 << 64) - 1


def brute(entries, h):
    """(file, row) pairs of ``entries`` [(hash, file, row)] under hash ``h``, sorted."""
    return sorted((f, r) for hh, f, r in entries if hh == h)


# ------------------------------------------------------------------------------------------ hashing


def test_splitmix64_known_values():
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(1) == 0x910A2DEC89025CC1
    arr = splitmix64(np.array([0, 1], dtype=np.uint64))
    assert arr.dtype == np.uint64
    assert arr.tolist() == [0xE220A8397B1DCDAF, 0x910A2DEC89025CC1]


def test_splitmix64_int_and_array_agree_and_twos_complement():
    vals = [0, 1, 2, 12345, (1 << 63) - 1, 1 << 63, M64]
    arr = splitmix64(np.array(vals, dtype=np.uint64))
    assert arr.tolist() == [splitmix64(v) for v in vals]
    assert splitmix64(-1) == splitmix64(M64)
    assert splitmix64(np.int64(-5)) == splitmix64((-5) & M64)
    assert splitmix64(np.array([-1, -2], dtype=np.int32)).tolist() == [splitmix64(M64), splitmix64(M64 - 1)]
    assert splitmix64([3, -3]).tolist() == [splitmix64(3), splitmix64(-3)]
    inp = np.array([7], dtype=np.uint64)
    splitmix64(inp)
    assert inp[0] == 7  # input untouched


def test_splitmix64_rejects_bad_input():
    with pytest.raises(ValueError):
        splitmix64(1 << 64)
    with pytest.raises(ValueError):
        splitmix64(-(1 << 63) - 1)
    with pytest.raises(TypeError):
        splitmix64(np.array([1.5]))
    with pytest.raises(TypeError):
        splitmix64(True)


def _ref_value(text):
    """``V`` of the module docstring the way a C loop computes it: Horner over 8-byte words, last first."""
    if text is None:
        return NULL_HASH
    b = text.encode()
    padded = b + bytes(-len(b) % 8)
    words = [int.from_bytes(padded[i : i + 8], "little") for i in range(0, len(padded), 8)]
    r = 0
    for w in reversed(words):
        r = (r * (1 << 64) + w) % P61
    return (r + len(b) * K_LEN) % (1 << 64)


def _ref_key(texts):
    h = ROW_SEED
    for t in texts:
        h = ((h ^ _ref_value(t)) * K_FOLD) % (1 << 64)
    return splitmix64(h)


def test_exact_key_is_splitmix64():
    vals = [0, 1, -1, 2**40, -(2**63)]
    h = KeyHash([20]).hash_columns([[str(v) for v in vals]])
    assert h.tolist() == [splitmix64(v) for v in vals]
    assert [KeyHash([20]).hash_one([str(v)]) for v in vals] == h.tolist()
    # value-based: the same value in another integer width hashes the same
    assert KeyHash([21]).hash_columns([["5", "-7"]]).tolist() == KeyHash([20]).hash_columns([["5", "-7"]]).tolist()
    assert int_key_hashes(np.array([5], np.uint32)).tolist() == [splitmix64(5)]
    assert KeyHash([20]).exact
    assert KeyHash([23]).exact
    assert not KeyHash([25]).exact
    assert not KeyHash([20, 20]).exact
    assert not KeyHash([20], keyed=False).exact  # a whole-row key may hold NULL: re-checked
    with pytest.raises(ValueError):
        KeyHash([20]).hash_one([None])
    with pytest.raises(ValueError):
        KeyHash([20]).hash_columns([["1", None]])


def test_text_keys_match_reference_and_slicing():
    vals = ["hello", "", None, "x" * 17, "héllo wörld", "abcdefgh", "abcdefgh\0"]
    a = pa.array(vals)
    ref = [_ref_key([v]) for v in vals]
    assert [text_key_hash([v]) for v in vals] == ref
    assert text_key_hashes([a]).tolist() == ref
    assert text_key_hashes([a.slice(2, 4)]).tolist() == ref[2:6]
    assert text_key_hashes([a.cast(pa.large_string())]).tolist() == ref
    assert text_key_hashes([a.dictionary_encode()]).tolist() == ref
    assert text_key_hashes([pa.chunked_array([a.slice(0, 3), a.slice(3)])]).tolist() == ref
    assert text_key_hashes([a.cast(pa.string_view())]).tolist() == ref
    assert text_key_hashes([vals]).tolist() == ref  # lists of str, as the initial copy hands them over
    # trailing zero byte and length are part of the hash
    assert len(set(ref)) == len(ref)
    with pytest.raises(TypeError):
        text_key_hashes([pa.array([1, 2])])  # keys are Postgres text


def test_key_hash_is_pinned():
    # golden values: changing the hash orphans every saved index block (bump KEY_HASH_VERSION)
    assert KEY_HASH_VERSION == 2
    assert value_hash("") == 0
    assert value_hash("hello") == 14807105091916856819
    assert value_hash("x" * 17) == 727839640096078488
    assert text_key_hash([""]) == 11163754991739937888
    assert text_key_hash(["hello"]) == 17348850906339686350
    assert text_key_hash(["ünïcødé ✓"]) == 4951615473340223819
    assert text_key_hash([None]) == 10669332307086660987
    assert text_key_hashes([["1", "2", None], ["x", "y", "z"]]).tolist() == [
        17800366000960464152,
        16560483673351589402,
        1469134834305686392,
    ]
    assert text_key_hash(["a" * 30, ""]) == 17319725745509464769
    assert KeyHash([20]).hash_one(["-1"]) == 16490336266968443936 == splitmix64(-1)
    assert KeyHash([20]).hash_one(["42"]) == 13679457532755275413 == splitmix64(42)


def test_text_keys_multi_column_and_nulls():
    a = ["1", "2", None, "1"]
    b = ["x", "y", "z", None]
    h = text_key_hashes([a, b]).tolist()
    assert h == [_ref_key(["1", "x"]), _ref_key(["2", "y"]), _ref_key([None, "z"]), _ref_key(["1", None])]
    assert h == [KeyHash([23, 25]).hash_one(k) for k in zip(a, b)]
    # column order matters, swapped values do not collide
    assert text_key_hash(["a", "b"]) != text_key_hash(["b", "a"])
    # NULL is not the empty string, and a NULL of a whole-row key hashes like any NULL
    assert text_key_hash([None]) != text_key_hash([""])
    assert KeyHash([20], keyed=False).hash_one([None]) == text_key_hash([None])
    assert text_key_hashes([[None, None]]).tolist() == [_ref_key([None])] * 2
    assert NULL_HASH != value_hash("")
    with pytest.raises(ValueError):
        text_key_hashes([])
    with pytest.raises(ValueError):
        text_key_hash([])
    with pytest.raises(ValueError):
        text_key_hashes([["1"], ["1", "2"]])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(st.none(), st.text(max_size=40), st.integers(-(2**63), 2**63 - 1).map(str)),
            min_size=3,
            max_size=3,
        ),
        min_size=0,
        max_size=30,
    ),
    st.integers(1, 3),
)
def test_scalar_and_vectorised_paths_agree(rows, width):
    keys = [r[:width] for r in rows]
    columns = [[k[i] for k in keys] for i in range(width)]
    h = KeyHash([25] * width)
    if not rows:
        assert h.hash_columns(columns).tolist() == []
        return
    vec = h.hash_columns(columns).tolist()
    assert vec == [h.hash_one(k) for k in keys]
    assert vec == [_ref_key(k) for k in keys]
    assert h.hash_columns([pa.array(c, pa.string()) for c in columns]).tolist() == vec
    ints = [str(v) for v in range(-len(rows), len(rows))]
    assert KeyHash([20]).hash_columns([ints]).tolist() == [KeyHash([20]).hash_one([v]) for v in ints]


def test_key_hash_stable_across_processes():
    code = (
        "from mooncake_assets.engine.index import text_key_hashes;"
        "print(text_key_hashes([['a', 'bb', None], ['1.5', '2', None]]).tolist())"
    )
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        )
    assert len(outs) == 1
    here = text_key_hashes([["a", "bb", None], ["1.5", "2", None]]).tolist()
    assert outs.pop().strip() == str(here)


# ------------------------------------------------------------------------------------------ IndexBlock


def test_layout_follows_the_seed():
    # 1000 rows -> 256 buckets (N=8); 500 -> 128 (N=7); 2000 -> 512 (N=9); merged 3500 -> 1024
    for rows, nb, n in [(1000, 256, 8), (500, 128, 7), (2000, 512, 9), (3500, 1024, 10), (0, 2, 1), (1, 2, 1)]:
        lay = block_layout(rows, 1)
        assert (lay["num_buckets"], lay["hash_upper_bits"], lay["hash_lower_bits"]) == (nb, n, 64 - n)
        assert lay["num_buckets"] == next_power_of_two(rows // 4 + 2)
    assert [block_layout(10, f)["file_id_bits"] for f in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert block_layout(10, 8)["row_bits"] == 32
    assert block_layout(10, 8)["entry_bits"] == block_layout(10, 8)["hash_lower_bits"] + 3 + 32


def _random_block(tmp_path, n, nfiles, seed=0, dup=0.0, name="b.idx"):
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(0, 2, n).astype(
        np.uint64
    )
    if dup and n:
        k = int(n * dup)
        h[:k] = h[rng.integers(0, n, k)]
    fid = rng.integers(0, max(nfiles, 1), n)
    rows = rng.integers(0, 2**32, n, dtype=np.int64)
    files = [f"file-{i}.parquet" for i in range(nfiles)]
    b = IndexBlock.build(tmp_path / name, h, fid, rows, files)
    return b, list(zip(h.tolist(), [files[i] for i in fid], rows.tolist())), h


@pytest.mark.parametrize("n,nfiles", [(0, 1), (1, 1), (7, 1), (100, 3), (5000, 8), (3000, 1000)])
def test_block_lookups_match_brute_force(tmp_path, n, nfiles):
    b, entries, h = _random_block(tmp_path, n, nfiles, seed=n, dup=0.1)
    assert b.num_entries == n and b.files == tuple(f"file-{i}.parquet" for i in range(nfiles))
    rng = np.random.default_rng(1)
    queries = np.concatenate(
        [h[: min(n, 200)], rng.integers(0, 2**63, 50).astype(np.uint64), np.array([0, M64], dtype=np.uint64)]
    )
    for q in queries.tolist():
        assert sorted(b.lookup(q)) == brute(entries, q)
    qi, fid, row = b.lookup_batch(queries)
    assert qi.dtype == np.int64 and fid.dtype == np.int32 and row.dtype == np.uint32
    assert (np.diff(qi) >= 0).all()
    got = {}
    for i, f, r in zip(qi.tolist(), fid.tolist(), row.tolist()):
        got.setdefault(i, []).append((b.files[f], r))
    for i, q in enumerate(queries.tolist()):
        assert sorted(got.get(i, [])) == brute(entries, q)
    eh, ef, er = b.entries()
    assert (np.diff(eh.astype(object)) >= 0).all() if n > 1 else True
    assert sorted(zip(eh.tolist(), [b.files[f] for f in ef], er.tolist())) == sorted(entries)
    b.close()


def test_block_edge_hashes(tmp_path):
    # extreme hashes, hashes that differ in their lowest bit only, one bucket holding everything
    hs = [0, 1, M64, M64 - 1, 1 << 63, (1 << 63) + 1, 5, 5, 5]
    b = IndexBlock.build(
        tmp_path / "e.idx",
        np.array(hs, dtype=np.uint64),
        [0, 1, 0, 1, 0, 1, 0, 1, 1],
        [0, 1, 2, 3, 4, 5, 6, 7, 2**32 - 1],
        ["a", "b"],
    )
    assert b.lookup(0) == [("a", 0)]
    assert b.lookup(1) == [("b", 1)]
    assert b.lookup(M64) == [("a", 2)]
    assert b.lookup(-1) == [("a", 2)]
    assert sorted(b.lookup(5)) == [("a", 6), ("b", 7), ("b", 2**32 - 1)]
    assert b.lookup(2) == []
    qi, f, r = b.lookup_batch(np.array([5, M64, 3], dtype=np.uint64))
    assert qi.tolist() == [0, 0, 0, 1]
    assert b.lookup_batch(np.array([-1], dtype=np.int64))[2].tolist() == [2]


def test_block_size_at_most_12_bytes_per_entry(tmp_path):
    n = 1_000_000
    b, _, _ = _random_block(tmp_path, n, 8, seed=3)
    assert b.size_bytes == os.path.getsize(b.path)
    assert b.size_bytes / n <= 12.0
    assert b.entry_bits == 46 + 3 + 32  # 2**18 buckets: 46 low hash bits, 3 file bits, 32 row bits


def test_block_byte_layout(tmp_path):
    b = IndexBlock.build(
        tmp_path / "x.idx", np.array([3, (1 << 63) | 9], dtype=np.uint64), [1, 0], [7, 8], ["f0", "f1"]
    )
    data = b.to_bytes()
    assert data[:8] == b"MCIDXBLK"
    version, upper, lower, fbits, rbits, bbits = struct.unpack_from("<HBBBBB", data, 8)
    assert (version, upper, lower, fbits, rbits, bbits) == (1, 1, 63, 1, 32, 2)
    n, nb, nfiles, flen, eoff = struct.unpack_from("<QQIIQ", data, 16)
    assert (n, nb, nfiles) == (2, 2, 2) and eoff % 8 == 0
    assert data[80 : 80 + flen] == struct.pack("<I", 2) + b"f0" + struct.pack("<I", 2) + b"f1"
    words = np.frombuffer(data, dtype="<u8", offset=eoff, count=3)
    stream = int(words[0]) | int(words[1]) << 64 | int(words[2]) << 128
    w = 63 + 1 + 32
    e0, e1 = stream & ((1 << w) - 1), (stream >> w) & ((1 << w) - 1)
    # entry = low hash bits | file id << 63 | row << 64, sorted by hash
    assert e0 == 3 | (1 << 63) | (7 << 64)
    assert e1 == 9 | (0 << 63) | (8 << 64)


def test_block_persistence_round_trip(tmp_path):
    b, entries, h = _random_block(tmp_path, 2000, 4, seed=5)
    data = b.to_bytes()
    assert len(data) == b.size_bytes and PUFFIN_BLOB_TYPE == "mooncake-hash-index-v1"
    c = IndexBlock.from_bytes(data, tmp_path / "restored.idx")
    assert c.files == b.files and c.num_entries == b.num_entries
    for q in h[:50].tolist():
        assert sorted(c.lookup(q)) == brute(entries, q)
    d = IndexBlock.open(tmp_path / "restored.idx", verify=True)
    assert d.to_bytes() == data
    d.verify()
    for x in (b, c, d):
        x.close()


def test_block_rejects_bad_bytes(tmp_path):
    b, _, _ = _random_block(tmp_path, 300, 2)
    data = bytearray(b.to_bytes())
    b.close()
    cases = {
        "magic": lambda d: d.__setitem__(slice(0, 8), b"NOTABLOK"),
        "version": lambda d: d.__setitem__(slice(8, 10), b"\x09\x00"),
        "header crc": lambda d: d.__setitem__(20, d[20] ^ 1),
        "data crc": lambda d: d.__setitem__(len(d) - 20, d[len(d) - 20] ^ 0xFF),
    }
    for name, corrupt in cases.items():
        bad = bytearray(data)
        corrupt(bad)
        with pytest.raises(IndexBlockFormatError):
            IndexBlock.from_bytes(bytes(bad), tmp_path / f"bad-{name.replace(' ', '')}.idx")
    with pytest.raises(IndexBlockFormatError, match="expected"):
        IndexBlock.from_bytes(bytes(data[:-8]), tmp_path / "trunc.idx")
    with pytest.raises(IndexBlockFormatError):
        IndexBlock.from_bytes(b"short", tmp_path / "short.idx")
    # a corrupt data section is found by open(verify=True) but not by a plain open
    bad = bytearray(data)
    bad[len(bad) - 20] ^= 0xFF
    (tmp_path / "corrupt.idx").write_bytes(bytes(bad))
    IndexBlock.open(tmp_path / "corrupt.idx").close()
    with pytest.raises(IndexBlockFormatError, match="CRC"):
        IndexBlock.open(tmp_path / "corrupt.idx", verify=True)
    assert issubclass(IndexBlockFormatError, ValueError)


def test_block_is_immutable_and_closable(tmp_path):
    b, _, h = _random_block(tmp_path, 100, 2)
    before = b.path.read_bytes()
    b.lookup_batch(h)
    b.lookup(int(h[0]))
    with pytest.raises((ValueError, TypeError)):
        b._entries[0] = 1
    assert b.path.read_bytes() == before
    b.close()
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.lookup(1)
    b.unlink()
    assert not b.path.exists()


def test_block_build_validates(tmp_path):
    h = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(ValueError):
        IndexBlock.build(tmp_path / "a", h, [0, 2], [0, 1], ["a", "b"])
    with pytest.raises(ValueError):
        IndexBlock.build(tmp_path / "a", h, [0, 0], [0, 2**32], ["a"])
    with pytest.raises(ValueError):
        IndexBlock.build(tmp_path / "a", h, [0, 0], [0, 1], ["a", "a"])
    with pytest.raises(ValueError):
        IndexBlock.build(tmp_path / "a", h, [0], [0, 1], ["a"])
    with pytest.raises(TypeError):
        IndexBlock.build(tmp_path / "a", np.array([1.0, 2.0]), 0, [0, 1], ["a"])
    assert not (tmp_path / "a").exists()
    assert IndexBlock.build(tmp_path / "a", h, 0, [4, 5], ["only"]).lookup(2) == [("only", 5)]


# ------------------------------------------------------------------------------------------ FileIndex


def test_merge_sorted_runs_matches_sort():
    rng = np.random.default_rng(0)
    runs = []
    for k in range(7):
        h = np.sort(rng.integers(0, 1000, rng.integers(0, 50)).astype(np.uint64))
        runs.append((h, np.full(len(h), k, np.uint64)))
    h, p = merge_sorted_runs(runs)
    allh = np.concatenate([r[0] for r in runs])
    assert np.array_equal(h, np.sort(allh))
    # ties: earlier runs first
    for v in np.unique(h):
        ps = p[h == v]
        assert (np.diff(ps.astype(np.int64)) >= 0).all()
    assert len(merge_sorted_runs([])[0]) == 0


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 60), max_size=9), top=st.sampled_from([5, 1000, 2**64 - 1]), seed=st.integers(0, 9999)
)
def test_merge_sorted_runs_equals_the_pairwise_merge_tree(sizes, top, seed):
    """The stable-sort merge gives the entries and tie order of the pairwise merge tree it replaced."""
    from mooncake_assets.engine.index.file_index import merge_sorted_runs_pairwise

    rng = np.random.default_rng(seed)
    runs = [
        (
            np.sort(rng.integers(0, top, n, dtype=np.uint64, endpoint=True)),
            rng.integers(0, 2**64 - 1, n, dtype=np.uint64),
        )
        for n in sizes
    ]
    h, p = merge_sorted_runs(runs)
    rh, rp = merge_sorted_runs_pairwise(runs)
    assert h.dtype == p.dtype == np.uint64
    assert np.array_equal(h, rh) and np.array_equal(p, rp)


def _flush_blocks(tmp_path, nblocks, rows_per_block, seed=0, key_range=None):
    rng = np.random.default_rng(seed)
    fi = FileIndex()
    model = []  # (hash, file, row)
    for k in range(nblocks):
        n = rows_per_block
        keys = rng.integers(0, key_range or 2**62, n)
        h = int_key_hashes(keys)
        files = [f"d{k}a", f"d{k}b"]
        fid = rng.integers(0, 2, n)
        rows = np.arange(n)
        fi.add_block(IndexBlock.build(tmp_path / f"flush{k}.idx", h, fid, rows, files))
        model += list(zip(h.tolist(), [files[i] for i in fid], rows.tolist()))
    return fi, model


def test_file_index_lookup_newest_first_and_batch(tmp_path):
    fi, model = _flush_blocks(tmp_path, 5, 300, key_range=500)
    assert len(fi) == 5 and fi.num_entries == 1500
    assert fi.blocks[0].path.name == "flush4.idx"  # newest first
    assert set(fi.files) == {f"d{k}{s}" for k in range(5) for s in "ab"}
    hs = sorted({h for h, _, _ in model})[:100] + [12345]
    res = fi.lookup_batch(np.array(hs, dtype=np.uint64))
    lists = res.as_lists(len(hs))
    for i, h in enumerate(hs):
        single = fi.lookup(h)
        assert sorted(single) == brute(model, h)
        assert lists[i] == single  # same candidates, same newest-first order
        blocks_of = [int(f[1]) for f, _ in single]
        assert blocks_of == sorted(blocks_of, reverse=True)
    assert list(res.file_names[:3]) == [fi.files[i] for i in res.file_idx[:3]]


def test_build_from_merge(tmp_path):
    fi, model = _flush_blocks(tmp_path, 6, 400, key_range=1000)
    merged = FileIndex.build_from_merge(fi.blocks, tmp_path / "merged.idx")
    assert merged.num_entries == len(model)
    assert merged.num_buckets == next_power_of_two(len(model) // 4 + 2)
    assert set(merged.files) == set(fi.files)
    eh, ef, er = merged.entries()
    assert (eh[1:] >= eh[:-1]).all()
    assert sorted(zip(eh.tolist(), [merged.files[f] for f in ef], er.tolist())) == sorted(model)
    old = list(fi.blocks)
    fi.replace_blocks(old[1:4], merged)
    assert fi.blocks == (old[0], merged, old[4], old[5])
    fi.replace_blocks([old[0], old[4], old[5]], None)
    assert fi.blocks == (merged,)
    for h in {h for h, _, _ in model[:200]}:
        assert sorted(fi.lookup(h)) == brute(model, h)
    with pytest.raises(ValueError):
        fi.remove_blocks([old[0]])


def test_build_from_compaction_seed_example(tmp_path):
    # parquet-1 [10, 20, 30 (deleted)], parquet-2 [40, 50] -> parquet-new [10, 20, 40, 50]
    h = {k: splitmix64(k) for k in (10, 20, 30, 40, 50)}
    b1 = IndexBlock.build(tmp_path / "1.idx", np.array([h[10], h[20], h[30]], np.uint64), 0, [0, 1, 2], ["parquet-1"])
    b2 = IndexBlock.build(tmp_path / "2.idx", np.array([h[40], h[50]], np.uint64), 0, [0, 1], ["parquet-2"])
    fi = FileIndex([b2, b1])
    pm = {
        "parquet-1": (["parquet-new"], np.array([0, 0, -1], np.int32), np.array([0, 1, 0], np.uint32)),
        "parquet-2": (["parquet-new"], np.array([0, 0], np.int32), np.array([2, 3], np.uint32)),
    }
    blocks = fi.blocks_for_files(["parquet-1", "parquet-2"])
    new = FileIndex.build_from_compaction(blocks, pm, tmp_path / "new.idx")
    fi.replace_blocks(blocks, new)
    assert new.files == ("parquet-new",) and new.num_entries == 4
    assert fi.lookup(h[10]) == [("parquet-new", 0)]
    assert fi.lookup(h[20]) == [("parquet-new", 1)]
    assert fi.lookup(h[30]) == []
    assert fi.lookup(h[40]) == [("parquet-new", 2)]
    assert fi.lookup(h[50]) == [("parquet-new", 3)]


def test_build_from_compaction_unmapped_files_and_errors(tmp_path):
    hs = np.array([splitmix64(k) for k in range(6)], np.uint64)
    b = IndexBlock.build(tmp_path / "b.idx", hs, [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1], ["A", "B", "C"])
    pm = PositionMap(
        ("N1", "N2"), {"A": (np.array([1, -1]), np.array([5, 0])), "B": (np.array([0, 0]), np.array([0, 1]))}
    )
    kept = FileIndex.build_from_compaction([b], pm, tmp_path / "k.idx")
    assert kept.files == ("N1", "N2", "C")
    got = {k: kept.lookup(int(hs[k])) for k in range(6)}
    assert got == {0: [("N2", 5)], 1: [], 2: [("N1", 0)], 3: [("N1", 1)], 4: [("C", 0)], 5: [("C", 1)]}
    dropped = FileIndex.build_from_compaction([b], pm, tmp_path / "d.idx", unmapped="drop")
    assert dropped.num_entries == 3 and dropped.lookup(int(hs[4])) == []
    with pytest.raises(ValueError, match="not in the position map"):
        FileIndex.build_from_compaction([b], pm, tmp_path / "e.idx", unmapped="error")
    short = PositionMap(("N",), {"A": (np.array([0]), np.array([0]))})
    with pytest.raises(ValueError, match="past its position map"):
        FileIndex.build_from_compaction([b], short, tmp_path / "s.idx")
    with pytest.raises(ValueError):
        PositionMap(("N",), {"A": (np.array([1]), np.array([0]))})


def test_position_map_from_dict_unites_file_lists():
    pm = PositionMap.from_dict(
        {
            "a": (["x", "y"], np.array([1, 0, -1]), np.array([0, 1, 0])),
            "b": (["y", "z"], np.array([0, 1]), np.array([2, 3])),
        }
    )
    assert pm.files == ("x", "y", "z")
    assert pm.map_rows("a", np.array([0, 1, 2]))[0].tolist() == [1, 0, -1]
    assert pm.map_rows("b", np.array([0, 1]))[0].tolist() == [1, 2]


# ------------------------------------------------------------------------------------------ MemIndex


def test_mem_index_insert_lookup_remove():
    m = MemIndex()
    m.insert(np.array([1, 2, 3], np.uint64), batch_id=0)
    m.insert(np.array([2, 2, 9], np.uint64), batch_id=1, rows=[5, 6, 7])
    assert len(m) == 6
    assert m.lookup(1) == [(0, 0)]
    assert m.lookup(2) == [(0, 1), (1, 5), (1, 6)]
    assert m.lookup(4) == []
    qi, bid, row = m.lookup_batch(np.array([2, 4, 9], np.uint64))
    assert list(zip(qi.tolist(), bid.tolist(), row.tolist())) == [(0, 0, 1), (0, 1, 5), (0, 1, 6), (2, 1, 7)]
    m.remove(2, (1, 5))
    assert m.lookup(2) == [(0, 1), (1, 6)]
    with pytest.raises(KeyError):
        m.remove(2, (1, 5))
    with pytest.raises(KeyError):
        m.remove(77, (0, 0))
    m.remove(1, (0, 0))
    assert m.lookup(1) == [] and len(m) == 4
    h, b, r = m.entries()
    assert sorted(zip(h.tolist(), b.tolist(), r.tolist())) == [(2, 0, 1), (2, 1, 6), (3, 0, 2), (9, 1, 7)]
    m.drop_batches([0])
    assert m.lookup(2) == [(1, 6)] and m.lookup(3) == [] and len(m) == 2 and m.batch_ids == [1]
    m.insert_one(9, 3, 0)
    m.insert_one(-1, 3, 1)
    assert m.lookup(9) == [(1, 7), (3, 0)] and m.lookup(M64) == [(3, 1)]
    assert m.batch_entries(3)[1].tolist() == [0, 1]
    m.clear()
    assert len(m) == 0 and m.lookup(9) == []
    with pytest.raises(ValueError):
        m.insert(np.array([1], np.uint64), batch_id=-1)


def test_flush_hand_over(tmp_path):
    m = MemIndex()
    k0 = np.array([10, 11, 12, 13])
    k1 = np.array([14, 10])
    m.insert(int_key_hashes(k0), 0)
    m.insert(int_key_hashes(k1), 1)
    m.remove(splitmix64(12), (0, 2))  # deleted in memory: not written, not indexed
    # the flush writes batch 0 rows 0,1,3 then batch 1 rows 0,1 into two files
    pm = PositionMap(
        ("f1", "f2"), {0: (np.array([0, 0, -1, 0]), np.array([0, 1, 0, 2])), 1: (np.array([1, 1]), np.array([0, 1]))}
    )
    b = build_block_from_mem_index(tmp_path / "flush.idx", m, pm)
    assert b.num_entries == 5 and b.files == ("f1", "f2")
    assert sorted(b.lookup(splitmix64(10))) == [("f1", 0), ("f2", 1)]
    assert b.lookup(splitmix64(12)) == []
    assert b.lookup(splitmix64(13)) == [("f1", 2)]
    m.drop_batches(pm.sources)
    assert len(m) == 0
    c = build_flush_block(
        tmp_path / "flush2.idx", ["g1", "g2"], [int_key_hashes(np.array([1, 2])), int_key_hashes(np.array([3]))]
    )
    assert c.lookup(splitmix64(3)) == [("g2", 0)] and c.lookup(splitmix64(2)) == [("g1", 1)]


# ------------------------------------------------------------------------------------------ policy, bench


def test_merge_policy(tmp_path):
    fi = FileIndex()
    pol = IndexMergePolicy(max_blocks=3, max_blocks_per_merge=3)
    for k, n in enumerate([50, 10, 20, 30]):
        fi.add_block(IndexBlock.build(tmp_path / f"{k}.idx", np.arange(n, dtype=np.uint64), 0, np.arange(n), [f"f{k}"]))
        if k < 3:
            assert pol.pick(fi) == []
    picked = pol.pick(fi)
    # the three smallest (10, 20, 30 entries), newest first
    assert [b.num_entries for b in picked] == [30, 20, 10]
    assert IndexMergePolicy().pick(fi) == []
    assert len(IndexMergePolicy(max_blocks=1).pick(fi)) == 4
    with pytest.raises(ValueError):
        IndexMergePolicy(max_blocks=0)
    with pytest.raises(ValueError):
        IndexMergePolicy(max_blocks_per_merge=1)


def test_run_index_bench_tiny():
    out = run_index_bench(sizes=(2000,), quick=True)
    fig = out["index"]["2000"]
    for key in (
        "bytes_per_entry",
        "build_entries_per_s",
        "lookup_ns_single",
        "lookup_ns_batched",
        "lookup_ns_batched_merged",
        "lookup_ns_dict",
        "merge_entries_per_s",
    ):
        assert fig[key] > 0, key


def test_index_blob_layout_and_one_parser():
    """The index blob (engine/index/saved.py): 4-byte LE header length, JSON header, block bytes in
    order; decode_index_blob is its one parser, and blobs written before key hash versions decode
    with key_hash None."""
    from mooncake_assets.engine.index import KEY_HASH_VERSION
    from mooncake_assets.engine.index.saved import decode_index_blob, encode_index_blob

    blob = encode_index_blob([("b.idx", b"\x01\x02\x03"), ("a.idx", b"xy")])
    head = b'{"blocks": [{"name": "b.idx", "size": 3}, {"name": "a.idx", "size": 2}], "key_hash": %d}' % (
        KEY_HASH_VERSION
    )
    assert blob == len(head).to_bytes(4, "little") + head + b"\x01\x02\x03xy"
    saved = decode_index_blob(blob)
    assert saved.key_hash == KEY_HASH_VERSION
    assert saved.blocks == (("b.idx", b"\x01\x02\x03"), ("a.idx", b"xy"))
    old_head = b'{"blocks": [{"name": "a.idx", "size": 2}]}'
    old = decode_index_blob(len(old_head).to_bytes(4, "little") + old_head + b"xy")
    assert old.key_hash is None and old.blocks == (("a.idx", b"xy"),)
    assert decode_index_blob(encode_index_blob([])).blocks == ()
    for bad in (b"", b"\x05\x00", blob[:-1], b"\x03\x00\x00\x00{x}", b"\x02\x00\x00\x00[]"):
        with pytest.raises(IndexBlockFormatError):
            decode_index_blob(bad)


def test_mem_index_grows_in_place():
    """A growth re-places the residents inside the reallocated slot array: the traced peak of building
    a 300k-entry MemIndex stays near its final size (holding the old array beside the new one, as
    before, peaked at ~1.77x the final array). Every entry is still found after the growths."""
    import tracemalloc

    rng = np.random.default_rng(7)
    hashes = rng.integers(0, 2**63, 300_000, dtype=np.int64).astype(np.uint64)
    rows = np.arange(10_000, dtype=np.uint64)
    m = MemIndex()
    tracemalloc.start()
    try:
        for b in range(30):
            m.insert(hashes[b * 10_000 : (b + 1) * 10_000], b, rows)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(m) == 300_000 and m.capacity > 300_000
    assert peak < 1.2 * m.nbytes, (peak, m.nbytes)
    for i in range(0, 300_000, 997):
        assert m.lookup(int(hashes[i])) == [(i // 10_000, i % 10_000)]


@pytest.mark.parametrize("sizes", [[0], [1], [5, 0, 7], [1000, 999, 1, 4096]])
def test_block_from_sorted_runs_equals_the_block_built_from_the_whole_file(tmp_path, sizes):
    """The initial copy's IndexBlock: per-batch sorted runs merged give the entries (and the bytes)
    that a sort of the whole file's hashes gives, duplicates included."""
    from mooncake_assets.engine.index.file_index import sorted_run

    rng = np.random.default_rng(sum(sizes) + len(sizes))
    n = sum(sizes)
    h = rng.integers(0, 2**63, n).astype(np.uint64)
    if n > 10:
        h[5] = h[n - 1]  # one key hash in two batches
        h[:3] = np.array([0, M64, 0], dtype=np.uint64)
    runs, first = [], 0
    for k in sizes:
        hs, rows = sorted_run(h[first : first + k])
        runs.append((hs, rows + np.uint64(first)))
        first += k
    merged = FileIndex.build_from_runs(runs, tmp_path / "runs.idx", "f.parquet")
    whole = IndexBlock.build(tmp_path / "whole.idx", h, 0, np.arange(n, dtype=np.uint32), ["f.parquet"])
    assert merged.num_entries == n and merged.files == ("f.parquet",)
    mh, _, mr = merged.entries()
    wh, _, wr = whole.entries()
    assert sorted(zip(mh.tolist(), mr.tolist())) == sorted(zip(wh.tolist(), wr.tolist()))
    assert sorted(zip(mh.tolist(), mr.tolist())) == sorted(zip(h.tolist(), range(n)))
    for q in h[:50].tolist():
        assert sorted(merged.lookup(q)) == sorted(("f.parquet", i) for i in range(n) if int(h[i]) == q)
    merged.close()
    whole.close()


def test_block_from_runs_rejects_an_unsorted_run(tmp_path):
    with pytest.raises(ValueError, match="not sorted"):
        FileIndex.build_from_runs(
            [(np.array([3, 1], dtype=np.uint64), np.arange(2, dtype=np.uint64))], tmp_path / "b", "f"
        )
    with pytest.raises(ValueError, match="2 hashes but 1 rows"):
        FileIndex.build_from_runs(
            [(np.array([1, 3], dtype=np.uint64), np.zeros(1, dtype=np.uint64))], tmp_path / "b", "f"
        )


# ------------------------------------------------------------------ bit packing: compiled against numpy


@settings(max_examples=300, deadline=None)
@given(
    widths=st.lists(st.integers(0, 64), min_size=1, max_size=5).filter(lambda ws: sum(ws) <= 128),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_compiled_bit_packing_equals_the_numpy_reference(widths, n, seed):
    """The IndexBlock's record packing (compiled, one field at a time) writes the very words of the
    numpy reference for any field widths (0..64, records up to 128 bits) and values that fill them."""
    from mooncake_assets.engine.index._bits import pack_records, pack_records_numpy, read_field

    rng = np.random.default_rng(seed)
    fields = []
    for w in widths:
        top = np.uint64((1 << w) - 1) if w else np.uint64(0)
        v = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True) & top
        if n:
            v[0] = top  # every bit of the field set at least once
        fields.append((v, w))
    got = pack_records(fields, n)
    assert got.dtype == np.uint64 and np.array_equal(got, pack_records_numpy(fields, n))
    total, off = sum(widths), 0
    for v, w in fields:  # and the fields read back
        if w and n:
            pos = np.arange(n, dtype=np.uint64) * np.uint64(total) + np.uint64(off)
            assert np.array_equal(read_field(got, pos, w), v)
        off += w


def test_compiled_bit_packing_refuses_a_short_output():
    from mooncake_assets.engine.index._pack import or_field

    with pytest.raises(ValueError, match="cannot hold"):
        or_field(np.zeros(2, dtype=np.uint64), np.ones(10, dtype=np.uint64), 10, 64, 0, 64)
    with pytest.raises(ValueError, match="3 values for 10 records"):
        or_field(np.zeros(20, dtype=np.uint64), np.ones(3, dtype=np.uint64), 10, 64, 0, 64)
