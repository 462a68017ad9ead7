"""A table's FileIndex as one saved byte string (the *index blob*), and the one parser of its header.

Each persist saves the table's whole FileIndex next to the Iceberg snapshot (the file named by the
snapshot summary's ``mooncake.index-file``, ``engine/iceberg/state.py``), so a restart restores the
index without reading a data file. Layout::

    offset      size  field
    0           4     n: byte length of the header (unsigned, little-endian)
    4           n     header: UTF-8 JSON {"blocks": [{"name": str, "size": int}, ...], "key_hash": int}
    4 + n       ...   each IndexBlock file's bytes (:mod:`.block`), in the header's order (newest first)

``key_hash`` is the :data:`~.key_hash.KEY_HASH_VERSION` the blocks' hashes were computed with; blobs
written before versions existed have no such field (:attr:`IndexBlob.key_hash` is None) and
:func:`~.key_hash.blob_needs_rebuild` says whether they must be rebuilt.

:func:`encode_index_blob` writes the layout and :func:`decode_index_blob` reads it; nothing else
parses it. Errors: bytes that do not have this layout raise :class:`~.block.IndexBlockFormatError`
(permanent: rebuild the index from the data files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from .block import IndexBlockFormatError
from .key_hash import KEY_HASH_VERSION

__all__ = ["IndexBlob", "decode_index_blob", "encode_index_blob"]

_LEN = 4  # bytes of the header length


@dataclass(frozen=True)
class IndexBlob:
    """A decoded index blob: ``key_hash``: the key hash version its blocks were hashed with (None:
    written before versions); ``blocks``: ``(file name, the block file's bytes)``, newest first."""

    key_hash: int | None
    blocks: tuple[tuple[str, bytes], ...]


def encode_index_blob(blocks: Iterable[tuple[str, bytes]], key_hash: int = KEY_HASH_VERSION) -> bytes:
    """The index blob of ``blocks`` (``(file name, block bytes)``, newest first), hashed under key hash
    version ``key_hash`` (default: today's)."""
    data = list(blocks)
    meta = [{"name": name, "size": len(b)} for name, b in data]
    head = json.dumps({"blocks": meta, "key_hash": key_hash}).encode()
    return len(head).to_bytes(_LEN, "little") + head + b"".join(b for _, b in data)


def decode_index_blob(blob: bytes) -> IndexBlob:
    """Parse an index blob (module docstring): its header once, then each block's bytes.
    Raises :class:`~.block.IndexBlockFormatError` when the header is cut short, is not the JSON
    object above, or names more bytes than the blob holds."""
    if len(blob) < _LEN:
        raise IndexBlockFormatError(f"index blob: {len(blob)} bytes, too short for its header length")
    n = int.from_bytes(blob[:_LEN], "little")
    try:
        head = json.loads(blob[_LEN : _LEN + n])
        metas = [(str(m["name"]), int(m["size"])) for m in head["blocks"]]
        version = head.get("key_hash")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise IndexBlockFormatError(f"index blob: bad header ({type(e).__name__}: {e})") from None
    off = _LEN + n
    out = []
    for name, size in metas:
        if off + size > len(blob):
            raise IndexBlockFormatError(
                f"index blob: block {name!r} ({size} bytes at {off}) runs past the end ({len(blob)} bytes)"
            )
        out.append((name, blob[off : off + size]))
        off += size
    return IndexBlob(key_hash=None if version is None else int(version), blocks=tuple(out))
