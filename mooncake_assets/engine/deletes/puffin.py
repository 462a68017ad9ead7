"""Puffin files: blobs (deletion vectors, indexes, sketches) plus a JSON footer describing them.

Pure codec: bytes in, bytes out, never a path. File layout (Iceberg Puffin spec, version 1)::

    Magic Blob_1 ... Blob_n Footer
    Magic  = 50 46 41 31 ("PFA1")
    Footer = Magic FooterPayload FooterPayloadSize Flags Magic
        FooterPayload      UTF-8 JSON (below); compressed only if flag bit 0 is set
        FooterPayloadSize  4 bytes, little-endian: size of FooterPayload in bytes
        Flags              4 bytes; byte 0 bit 0 = "payload compressed" (LZ4), all others reserved (0)

FooterPayload, keys exactly as in the spec (optional keys are left out when empty, as the reference
writer does)::

    {"blobs": [{"type": str, "fields": [int], "snapshot-id": int, "sequence-number": int,
                "offset": int, "length": int, "compression-codec": str (optional),
                "properties": {str: str} (optional)}, ...],
     "properties": {str: str} (optional)}

``offset``/``length`` locate each blob's stored (possibly compressed) bytes in the file. Codecs:
absent (uncompressed) and ``"zstd"`` are written and read; ``"lz4"`` is recognized but not
supported. ``deletion-vector-v1`` blobs are never compressed.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import zstandard
from pyroaring import BitMap64

from .deletion_vector import _frame, _to_bitmap

MAGIC = b"PFA1"
DELETION_VECTOR_V1 = "deletion-vector-v1"
_FOOTER_STRUCT_BYTES = 12  # FooterPayloadSize + Flags + trailing Magic
_FLAG_FOOTER_COMPRESSED = 1
_ZSTD_LEVEL = 3  # with a frame checksum this matches the reference writer's zstd output


@dataclass
class PuffinBlob:
    """One blob to write: ``data`` uncompressed; ``compression_codec`` None or ``"zstd"``."""

    type: str
    fields: list[int]
    data: bytes
    snapshot_id: int = -1
    sequence_number: int = -1
    properties: dict[str, str] = field(default_factory=dict)
    compression_codec: str | None = None


@dataclass
class PuffinBlobMetadata:
    """A footer entry: where the blob's stored bytes sit in the file (``offset``, ``length``)."""

    type: str
    fields: list[int]
    snapshot_id: int
    sequence_number: int
    offset: int
    length: int
    compression_codec: str | None = None
    properties: dict[str, str] = field(default_factory=dict)


@dataclass
class PuffinFile:
    """A parsed Puffin file: file ``properties``, footer ``blobs``, and the file bytes behind them."""

    properties: dict[str, str]
    blobs: list[PuffinBlobMetadata]
    _data: bytes = field(repr=False, default=b"")

    def blob_data(self, blob: int | PuffinBlobMetadata) -> bytes:
        """The blob's bytes, decompressed; ``blob`` is an index into ``blobs`` or a footer entry.

        Raises ``IndexError`` for a bad index, ``ValueError`` for an unsupported codec or data that
        does not decompress.
        """
        meta = self.blobs[blob] if isinstance(blob, int) else blob
        stored = self._data[meta.offset : meta.offset + meta.length]
        return _decompress(meta.compression_codec, stored)


def write_puffin(
    blobs: list[PuffinBlob], properties: dict[str, str] | None = None
) -> tuple[bytes, list[PuffinBlobMetadata]]:
    """Write a whole Puffin file; returns its bytes and each blob's footer entry, in input order.

    The footer JSON is compact (no spaces) with keys in spec order, as the reference writer emits.
    Raises ``ValueError`` for an unknown codec or a compressed ``deletion-vector-v1`` blob.
    """
    out = bytearray(MAGIC)
    metas = []
    for blob in blobs:
        if blob.type == DELETION_VECTOR_V1 and blob.compression_codec is not None:
            raise ValueError(
                f"puffin: {DELETION_VECTOR_V1} blobs must be uncompressed, "
                f"found compression-codec {blob.compression_codec!r}"
            )
        stored = _compress(blob.compression_codec, bytes(blob.data))
        metas.append(
            PuffinBlobMetadata(
                type=blob.type,
                fields=list(blob.fields),
                snapshot_id=blob.snapshot_id,
                sequence_number=blob.sequence_number,
                offset=len(out),
                length=len(stored),
                compression_codec=blob.compression_codec,
                properties=dict(blob.properties),
            )
        )
        out += stored
    footer: dict[str, Any] = {"blobs": [_blob_json(m) for m in metas]}
    if properties:
        footer["properties"] = dict(properties)
    payload = json.dumps(footer, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    out += MAGIC + payload + struct.pack("<I", len(payload)) + bytes(4) + MAGIC
    return bytes(out), metas


def read_puffin(data: bytes) -> PuffinFile:
    """Parse a Puffin file's footer. Blob bytes are read lazily through ``PuffinFile.blob_data``.

    Raises ``ValueError`` (saying what was expected and found) when: the file is too short, either
    magic is wrong, FooterPayloadSize points outside the file, the footer is compressed (flag bit 0,
    unsupported) or has reserved flags set, the payload is not UTF-8 JSON of the shape in the module
    doc, or a blob's offset/length falls outside the blob area (between the leading magic and the
    footer).
    """
    data = bytes(data)
    minimum = len(MAGIC) + len(MAGIC) + _FOOTER_STRUCT_BYTES
    if len(data) < minimum:
        raise ValueError(f"puffin: expected at least {minimum} bytes, found {len(data)} (truncated?)")
    if data[:4] != MAGIC:
        raise ValueError(f"puffin: expected leading magic {MAGIC!r}, found {data[:4]!r}")
    if data[-4:] != MAGIC:
        raise ValueError(f"puffin: expected trailing magic {MAGIC!r}, found {data[-4:]!r} (truncated?)")
    payload_size, flags = struct.unpack_from("<II", data, len(data) - _FOOTER_STRUCT_BYTES)
    footer_start = len(data) - _FOOTER_STRUCT_BYTES - payload_size - len(MAGIC)
    if footer_start < len(MAGIC):
        raise ValueError(f"puffin: FooterPayloadSize {payload_size} does not fit in a {len(data)}-byte file")
    if data[footer_start : footer_start + 4] != MAGIC:
        raise ValueError(
            f"puffin: expected footer magic {MAGIC!r} at byte {footer_start}, "
            f"found {data[footer_start : footer_start + 4]!r}"
        )
    if flags & _FLAG_FOOTER_COMPRESSED:
        raise ValueError("puffin: footer payload is compressed (flag bit 0 set); compressed footers are not supported")
    if flags:
        raise ValueError(f"puffin: expected reserved flag bits to be 0, found flags {flags:#010x}")
    payload = data[footer_start + 4 : footer_start + 4 + payload_size]
    try:
        footer = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"puffin: footer payload is not UTF-8 JSON: {e}") from None
    if not isinstance(footer, dict) or not isinstance(footer.get("blobs"), list):
        raise ValueError(f'puffin: expected a footer object with a "blobs" list, found {str(footer)[:200]}')
    blobs = [_blob_from_json(i, b, footer_start) for i, b in enumerate(footer["blobs"])]
    properties = _str_dict(footer.get("properties", {}), "footer properties")
    return PuffinFile(properties=properties, blobs=blobs, _data=data)


def deletion_vector_blob(referenced_data_file: str, positions: Iterable[int] | BitMap64) -> PuffinBlob:
    """A ``deletion-vector-v1`` blob for one data file, as the spec requires it.

    ``positions``: iterable of ints or ``pyroaring.BitMap64``. The blob has fields [], snapshot-id and
    sequence-number -1, no compression, and properties ``referenced-data-file`` and ``cardinality``
    (decimal). Raises ``ValueError`` on a position out of range (see ``encode_deletion_vector``).
    """
    bitmap = _to_bitmap(positions)
    return PuffinBlob(
        type=DELETION_VECTOR_V1,
        fields=[],
        data=_frame(bitmap),
        properties={"referenced-data-file": referenced_data_file, "cardinality": str(len(bitmap))},
    )


def _blob_json(meta: PuffinBlobMetadata) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": meta.type,
        "fields": meta.fields,
        "snapshot-id": meta.snapshot_id,
        "sequence-number": meta.sequence_number,
        "offset": meta.offset,
        "length": meta.length,
    }
    if meta.compression_codec is not None:
        entry["compression-codec"] = meta.compression_codec
    if meta.properties:
        entry["properties"] = meta.properties
    return entry


def _blob_from_json(i: int, entry: object, footer_start: int) -> PuffinBlobMetadata:
    where = f"puffin: footer blob {i}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object, found {entry!r}")

    def get(key: str, kind: type, required: bool = True, default: Any = None) -> Any:
        if key not in entry:
            if required:
                raise ValueError(f"{where}: missing required {key!r}")
            return default
        value = entry[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{where}: expected {key!r} to be {kind.__name__}, found {value!r}")
        return value

    fields = get("fields", list)
    if not all(isinstance(f, int) and not isinstance(f, bool) for f in fields):
        raise ValueError(f'{where}: expected "fields" to be a list of ints, found {fields!r}')
    codec = entry.get("compression-codec")
    if codec is not None and not isinstance(codec, str):
        raise ValueError(f'{where}: expected "compression-codec" to be a string, found {codec!r}')
    meta = PuffinBlobMetadata(
        type=get("type", str),
        fields=fields,
        snapshot_id=get("snapshot-id", int),
        sequence_number=get("sequence-number", int),
        offset=get("offset", int),
        length=get("length", int),
        compression_codec=codec,
        properties=_str_dict(get("properties", dict, required=False, default={}), f"blob {i} properties"),
    )
    if meta.offset < len(MAGIC) or meta.length < 0 or meta.offset + meta.length > footer_start:
        raise ValueError(
            f"{where}: offset {meta.offset} + length {meta.length} is outside the blob area "
            f"[{len(MAGIC)}, {footer_start})"
        )
    return meta


def _str_dict(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"puffin: expected {what} to map strings to strings, found {value!r}")
    return value


def _compress(codec: str | None, data: bytes) -> bytes:
    if codec is None:
        return data
    if codec == "zstd":
        return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True).compress(data)
    raise ValueError(f"puffin: expected compression codec None or 'zstd', found {codec!r}")


def _decompress(codec: str | None, data: bytes) -> bytes:
    if codec is None:
        return data
    if codec == "zstd":
        stream = zstandard.ZstdDecompressor().decompressobj()
        try:
            out = stream.decompress(data)
        except zstandard.ZstdError as e:
            raise ValueError(f"puffin: zstd blob does not decompress: {e}") from None
        if not stream.eof:
            raise ValueError(f"puffin: zstd blob is truncated: {len(data)} bytes end mid-frame")
        return out
    raise ValueError(f"puffin: expected compression codec None or 'zstd', found {codec!r}")
