"""Row deletes on Iceberg data files: deletion vectors and the Puffin files that hold them."""

from .deletion_vector import (
    MAX_POSITION,
    decode_deletion_vector,
    decode_portable_roaring64,
    encode_deletion_vector,
)
from .puffin import (
    PuffinBlob,
    PuffinBlobMetadata,
    PuffinFile,
    deletion_vector_blob,
    read_puffin,
    write_puffin,
)

__all__ = [
    "MAX_POSITION",
    "PuffinBlob",
    "PuffinBlobMetadata",
    "PuffinFile",
    "decode_deletion_vector",
    "decode_portable_roaring64",
    "deletion_vector_blob",
    "encode_deletion_vector",
    "read_puffin",
    "write_puffin",
]
