"""deletion-vector-v1 codec against the Iceberg golden files, bad bytes, and random round trips."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap64

from mooncake_assets.engine.deletes import (
    MAX_POSITION,
    decode_deletion_vector,
    decode_portable_roaring64,
    encode_deletion_vector,
)

POSITION_INDEXES = [
    "empty-position-index.bin",
    "small-alternating-values-position-index.bin",
    "small-and-large-values-position-index.bin",
    "all-container-types-position-index.bin",
]


@pytest.fixture(scope="module")
def golden(golden_dir):
    root = golden_dir
    expected = json.loads((root / "expected.json").read_text())
    return root, expected


def expected_positions(entry) -> BitMap64:
    bitmap = BitMap64(entry.get("positions", []))
    for start, end in entry.get("ranges_half_open", []):
        bitmap.add_range(start, end)
    return bitmap


@pytest.mark.parametrize("name", POSITION_INDEXES)
def test_golden_position_index_decodes_and_reencodes(golden, name):
    root, expected = golden
    entry = expected[f"deletes/{name}"]
    blob = (root / "deletes" / name).read_bytes()

    decoded = decode_deletion_vector(blob)

    assert decoded == expected_positions(entry)
    if "cardinality" in entry:
        assert len(decoded) == entry["cardinality"]
    assert encode_deletion_vector(expected_positions(entry)) == blob
    assert encode_deletion_vector(sorted(expected_positions(entry), reverse=True)) == blob


def test_golden_bare_bitmaps(golden):
    root, expected = golden
    read = lambda name: decode_portable_roaring64((root / "deletes" / name).read_bytes())

    assert len(read("64mapempty.bin")) == expected["deletes/64mapempty.bin"]["cardinality"] == 0
    assert list(read("64map32bitvals.bin")) == expected["deletes/64map32bitvals.bin"]["positions"]
    spread, want = read("64mapspreadvals.bin"), expected["deletes/64mapspreadvals.bin"]
    assert (len(spread), spread.min(), spread.max()) == (want["cardinality"], want["min"], want["max"])


def test_golden_high_keys_rejected(golden):
    root, _ = golden
    with pytest.raises(ValueError, match=r"key \d+ .*allows keys up to 2147483646"):
        decode_portable_roaring64((root / "deletes/64maphighvals.bin").read_bytes())


def test_max_position_is_the_reference_cap():
    assert MAX_POSITION == 0x7FFF_FFFE_8000_0000
    assert decode_deletion_vector(encode_deletion_vector([0, MAX_POSITION])) == BitMap64([0, MAX_POSITION])


@pytest.mark.parametrize("bad", [-1, MAX_POSITION + 1, 2**63, 2**64])
def test_encode_rejects_out_of_range(bad):
    with pytest.raises(ValueError, match=f"found {bad}"):
        encode_deletion_vector([1, bad])


def test_encode_does_not_touch_callers_bitmap():
    bitmap = BitMap64(range(1000))
    before = bitmap.serialize()
    encode_deletion_vector(bitmap)
    assert bitmap.serialize() == before


def test_decode_rejects_position_above_cap_with_valid_key():
    vector = BitMap64([MAX_POSITION + 1]).serialize()
    body = b"\xd1\xd3\x39\x64" + vector
    blob = struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    with pytest.raises(ValueError, match="exceeds MAX_POSITION"):
        decode_deletion_vector(blob)


def test_bad_crc_rejected():
    blob = bytearray(encode_deletion_vector([1, 3, 5]))
    blob[-1] ^= 0xFF
    with pytest.raises(ValueError, match="CRC-32 mismatch, stored 0x[0-9a-f]{8}, computed 0x[0-9a-f]{8}"):
        decode_deletion_vector(bytes(blob))


def test_flipped_vector_bit_rejected_by_crc():
    blob = bytearray(encode_deletion_vector([1, 3, 5]))
    blob[20] ^= 0x01
    with pytest.raises(ValueError, match="CRC-32 mismatch"):
        decode_deletion_vector(bytes(blob))


def test_wrong_magic_rejected():
    blob = bytearray(encode_deletion_vector([1]))
    blob[4:8] = b"\xd1\xd3\x39\x65"
    with pytest.raises(ValueError, match="expected magic d1 d3 39 64, found d1 d3 39 65"):
        decode_deletion_vector(bytes(blob))


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_length_rejected(delta):
    blob = bytearray(encode_deletion_vector([1]))
    length = struct.unpack_from(">I", blob)[0]
    struct.pack_into(">I", blob, 0, length + delta)
    with pytest.raises(ValueError, match=f"length field says magic \\+ vector is {length + delta} bytes"):
        decode_deletion_vector(bytes(blob))


def test_too_short_and_truncated_rejected():
    with pytest.raises(ValueError, match="at least 12 bytes"):
        decode_deletion_vector(b"\x00\x00")
    vector = BitMap64(range(100)).serialize()
    with pytest.raises(ValueError, match="truncated"):
        decode_portable_roaring64(vector[:-3])
    with pytest.raises(ValueError, match="found .* bytes"):
        decode_portable_roaring64(vector + b"\x00")


def test_unsorted_keys_rejected():
    one = BitMap64([5 << 32]).serialize()[8:]
    two = BitMap64([3 << 32]).serialize()[8:]
    with pytest.raises(ValueError, match="strictly ascending, found 3 after 5"):
        decode_portable_roaring64(struct.pack("<Q", 2) + one + two)


positions = st.one_of(
    st.sets(st.integers(0, MAX_POSITION), max_size=200),
    st.sets(st.integers(0, 2**33), max_size=200),
    st.lists(st.tuples(st.integers(0, MAX_POSITION - 70_000), st.integers(1, 70_000)), max_size=4).map(
        lambda runs: {p for start, n in runs for p in range(start, start + n)}
    ),
)


@settings(max_examples=150, deadline=None)
@given(positions)
def test_round_trip(values):
    blob = encode_deletion_vector(values)
    decoded = decode_deletion_vector(blob)
    assert decoded == BitMap64(values)
    assert encode_deletion_vector(decoded) == blob
