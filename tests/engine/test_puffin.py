"""Puffin codec against the Iceberg golden files, bad files, and random round trips."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.deletes import (
    MAX_POSITION,
    PuffinBlob,
    PuffinBlobMetadata,
    decode_deletion_vector,
    deletion_vector_blob,
    encode_deletion_vector,
    read_puffin,
    write_puffin,
)

SAMPLES = [
    "empty-puffin-uncompressed.bin",
    "sample-metric-data-uncompressed.bin",
    "sample-metric-data-compressed-zstd.bin",
]


@pytest.fixture(scope="module")
def golden(golden_dir):
    root = golden_dir
    return root, json.loads((root / "expected.json").read_text())


def sample_blobs(entry) -> list[PuffinBlob]:
    """The blobs the reference test wrote: snapshot-id 2, sequence-number 1 (as its footer shows)."""
    return [
        PuffinBlob(
            type=b["type"],
            fields=b["fields"],
            data=b["data_utf8"].encode(),
            snapshot_id=2,
            sequence_number=1,
            compression_codec=b["codec"],
        )
        for b in entry["blobs"]
    ]


@pytest.mark.parametrize("name", SAMPLES)
def test_golden_files_read_as_expected(golden, name):
    root, expected = golden
    entry = expected[f"puffin/{name}"]

    puffin = read_puffin((root / "puffin" / name).read_bytes())

    assert puffin.properties == entry.get("file_properties", {})
    assert len(puffin.blobs) == len(entry["blobs"])
    for i, (meta, want) in enumerate(zip(puffin.blobs, entry["blobs"])):
        assert (meta.type, meta.fields, meta.compression_codec) == (want["type"], want["fields"], want["codec"])
        assert (meta.snapshot_id, meta.sequence_number, meta.properties) == (2, 1, {})
        if "offset" in want:
            assert (meta.offset, meta.length) == (want["offset"], want["length"])
        assert puffin.blob_data(i) == puffin.blob_data(meta) == want["data_utf8"].encode()


@pytest.mark.parametrize("name", SAMPLES)
def test_golden_files_written_back_byte_for_byte(golden, name):
    root, expected = golden
    entry = expected[f"puffin/{name}"]
    original = (root / "puffin" / name).read_bytes()

    written, metas = write_puffin(sample_blobs(entry), entry.get("file_properties"))

    assert written == original
    assert metas == read_puffin(original).blobs


def footer_file(payload: bytes, flags: int = 0) -> bytes:
    return b"PFA1" + b"PFA1" + payload + struct.pack("<I", len(payload)) + struct.pack("<I", flags) + b"PFA1"


def test_compressed_footer_refused():
    with pytest.raises(ValueError, match="footer payload is compressed.*not supported"):
        read_puffin(footer_file(b'{"blobs":[]}', flags=1))


def test_reserved_flags_refused():
    with pytest.raises(ValueError, match="reserved flag bits"):
        read_puffin(footer_file(b'{"blobs":[]}', flags=0x100))


@pytest.mark.parametrize(
    "data, message",
    [
        (b"PFA1", "at least 20 bytes"),
        (b"XXXX" + footer_file(b'{"blobs":[]}')[4:], "leading magic"),
        (footer_file(b'{"blobs":[]}')[:-1], "trailing magic"),
        (footer_file(b'{"blobs":[]}')[:-12] + struct.pack("<I", 999) + bytes(4) + b"PFA1", "does not fit"),
        (footer_file(b'{"blobs":[]}')[:-12] + struct.pack("<I", 11) + bytes(4) + b"PFA1", "footer magic"),
        (footer_file(b'{"blobs":['), "not UTF-8 JSON"),
        (footer_file(b'\xff{"blobs":[]}'), "not UTF-8 JSON"),
        (footer_file(b'{"blob":[]}'), 'a "blobs" list'),
        (footer_file(b'{"blobs":[{"type":"x","fields":[]}]}'), "missing required 'snapshot-id'"),
        (
            footer_file(
                b'{"blobs":[{"type":"x","fields":["a"],"snapshot-id":1,"sequence-number":1,"offset":4,"length":0}]}'
            ),
            "list of ints",
        ),
        (
            footer_file(
                b'{"blobs":[{"type":"x","fields":[],"snapshot-id":1,"sequence-number":1,"offset":4,"length":10}]}'
            ),
            r"offset 4 \+ length 10 is outside",
        ),
        (footer_file(b'{"blobs":[],"properties":{"a":1}}'), "map strings to strings"),
    ],
)
def test_bad_files_rejected(data, message):
    with pytest.raises(ValueError, match=message):
        read_puffin(data)


def test_truncated_zstd_blob_rejected():
    data, metas = write_puffin([PuffinBlob("x", [], b"hello" * 100, compression_codec="zstd")])
    short = PuffinBlobMetadata(**{**metas[0].__dict__, "length": metas[0].length - 5})
    with pytest.raises(ValueError, match="zstd blob"):
        read_puffin(data).blob_data(short)


def test_unknown_codec_rejected():
    with pytest.raises(ValueError, match="found 'lz4'"):
        write_puffin([PuffinBlob("x", [], b"abc", compression_codec="lz4")])


def test_deletion_vector_blob():
    blob = deletion_vector_blob("s3://bucket/data/a.parquet", [7, 3, 2**40])
    assert (blob.type, blob.fields, blob.snapshot_id, blob.sequence_number, blob.compression_codec) == (
        "deletion-vector-v1",
        [],
        -1,
        -1,
        None,
    )
    assert blob.properties == {"referenced-data-file": "s3://bucket/data/a.parquet", "cardinality": "3"}
    assert blob.data == encode_deletion_vector([3, 7, 2**40])

    data, metas = write_puffin([blob], {"created-by": "mooncake-assets"})
    stored = data[metas[0].offset : metas[0].offset + metas[0].length]
    assert list(decode_deletion_vector(stored)) == [3, 7, 2**40]
    assert read_puffin(data).blobs == metas

    blob.compression_codec = "zstd"
    with pytest.raises(ValueError, match="must be uncompressed"):
        write_puffin([blob])


text = st.text(max_size=20)
blobs = st.builds(
    PuffinBlob,
    type=text,
    fields=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
    data=st.binary(max_size=300),
    snapshot_id=st.integers(-1, 2**63 - 1),
    sequence_number=st.integers(-1, 2**63 - 1),
    properties=st.dictionaries(text, text, max_size=3),
    compression_codec=st.sampled_from([None, "zstd"]),
)
dv_blobs = st.builds(deletion_vector_blob, text, st.sets(st.integers(0, MAX_POSITION), max_size=50))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(blobs, dv_blobs), max_size=5), st.dictionaries(text, text, max_size=3))
def test_round_trip(blob_list, properties):
    data, metas = write_puffin(blob_list, properties)
    puffin = read_puffin(data)
    assert puffin.properties == properties
    assert puffin.blobs == metas
    for i, blob in enumerate(blob_list):
        assert puffin.blob_data(i) == blob.data
        if blob.type == "deletion-vector-v1" and "cardinality" in blob.properties:
            assert len(decode_deletion_vector(puffin.blob_data(i))) == int(blob.properties["cardinality"])
