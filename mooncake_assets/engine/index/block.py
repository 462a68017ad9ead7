"""IndexBlock: one immutable, memory-mapped bucket hash map of key-hash → (data file, row offset).

Follows docs/architecture.md#file-index: one block per flush (and one per merge or compaction), ``num_buckets =
next_power_of_two(num_entries // 4 + 2)``, the bucket of a hash is its top ``N = log2(num_buckets)``
bits, entries are sorted by hash and bit-packed as (the remaining ``64 - N`` hash bits, the file id in
``ceil(log2(files in block))`` bits, the row offset in 32 bits), a bucket-start table finds a bucket's
entries. The block is a file on local disk, memory-mapped for lookups, and never modified after it is
written (it is written to a temporary name and renamed into place).

Byte layout (version 1; every integer little-endian)::

    offset  size  field
    0       8     magic b"MCIDXBLK"
    8       2     version = 1
    10      1     hash_upper_bits   N = log2(num_buckets), 1..63
    11      1     hash_lower_bits   64 - N
    12      1     file_id_bits      ceil(log2(num_files)), 0 for a single file
    13      1     row_bits          32
    14      1     bucket_bits       bit length of num_entries (at least 1)
    15      1     flags             0 (reserved)
    16      8     num_entries
    24      8     num_buckets       2**N
    32      4     num_files
    36      4     file_list_nbytes
    40      8     entries_offset    multiple of 8
    48      8     entries_nbytes    multiple of 8
    56      8     buckets_offset    = entries_offset + entries_nbytes
    64      8     buckets_nbytes    multiple of 8
    72      4     data_crc32        CRC-32 (zlib) of bytes [80, end of file)
    76      4     header_crc32      CRC-32 (zlib) of bytes [0, 76)
    80      ...   file list: per file, u32 byte length + UTF-8 name; zero padding to entries_offset
    entries_offset   entries bit stream: entry i at bits [i*W, (i+1)*W), W = lower + file_id + row
                     bits, fields in that order, LSB-first within little-endian u64 words (see
                     ``_bits``), then one zero word
    buckets_offset   bucket-start bit stream: num_buckets + 1 values of bucket_bits bits, value b =
                     index of the first entry of bucket b (the last one = num_entries), one zero word

Size: W/8 bytes per entry plus ``bucket_bits/8`` per bucket (≈ ``bucket_bits/8 / 2..4`` per entry);
1M entries in 8 files take 81 bits + 20/3.8 bits ≈ 10.8 bytes per entry.

Errors: bad bytes or a file that is not a block raise :class:`IndexBlockFormatError` (a ``ValueError``;
permanent: retrying cannot help, rebuild the block). Bad arguments raise ``ValueError``/``TypeError``
(permanent). ``OSError`` from the file system passes through (may be temporary).
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ._bits import (
    MAX_UNALIGNED_WIDTH,
    pack_records,
    read_field,
    read_field_unaligned,
    unaligned_words,
    words_for_bits,
)

__all__ = ["IndexBlock", "IndexBlockFormatError", "block_layout", "next_power_of_two", "MAGIC", "VERSION"]

MAGIC = b"MCIDXBLK"
VERSION = 1
ROW_BITS = 32
_HEADER = struct.Struct("<8sHBBBBBBQQIIQQQQII")
HEADER_SIZE = _HEADER.size  # 80
_U64 = np.uint64
_M64 = (1 << 64) - 1
#: queries per vectorized step of :meth:`IndexBlock.lookup_batch` (keeps temporaries in cache)
LOOKUP_CHUNK = 1 << 15

PathLike = str | os.PathLike[str]


class IndexBlockFormatError(ValueError):
    """The bytes are not a valid index block (permanent: rebuild the block from its source)."""


def next_power_of_two(x: int) -> int:
    """Smallest power of two ≥ ``x`` (1 for x ≤ 1)."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def block_layout(num_entries: int, num_files: int) -> dict[str, int]:
    """Bit widths of a block of ``num_entries`` entries over ``num_files`` files (docs/architecture.md#file-index).

    Returns ``{"num_buckets", "hash_upper_bits", "hash_lower_bits", "file_id_bits", "row_bits",
    "bucket_bits", "entry_bits"}``.
    """
    if num_entries < 0 or num_files < 0:
        raise ValueError(f"counts must be ≥ 0, found num_entries={num_entries}, num_files={num_files}")
    num_buckets = next_power_of_two(num_entries // 4 + 2)
    upper = num_buckets.bit_length() - 1
    if upper > 63:
        raise ValueError(f"too many entries for one block: {num_entries}")
    lower = 64 - upper
    file_bits = (num_files - 1).bit_length() if num_files > 1 else 0
    bucket_bits = max(1, num_entries.bit_length())
    return {
        "num_buckets": num_buckets,
        "hash_upper_bits": upper,
        "hash_lower_bits": lower,
        "file_id_bits": file_bits,
        "row_bits": ROW_BITS,
        "bucket_bits": bucket_bits,
        "entry_bits": lower + file_bits + ROW_BITS,
    }


def _as_hashes(hashes: npt.ArrayLike) -> np.ndarray:
    if isinstance(hashes, (list, tuple)):
        return np.array([int(h) & _M64 for h in hashes], dtype=np.uint64)
    a = np.asarray(hashes)
    if a.dtype == np.uint64:
        return a.reshape(-1)
    if a.dtype == np.int64:
        return a.view(np.uint64).reshape(-1)
    if a.dtype.kind in "ui" and a.size == 0:
        return a.astype(np.uint64).reshape(-1)
    raise TypeError(f"hashes must be uint64 (or int64 bits), found dtype {a.dtype}")


def _encode_files(files: Sequence[str]) -> bytes:
    parts = []
    for f in files:
        b = f.encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def _decode_files(buf: bytes | mmap.mmap, num_files: int, nbytes: int) -> tuple[str, ...]:
    files = []
    pos = HEADER_SIZE
    end = HEADER_SIZE + nbytes
    for _ in range(num_files):
        if pos + 4 > end:
            raise IndexBlockFormatError(f"file list truncated: expected {num_files} names in {nbytes} bytes")
        (ln,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if pos + ln > end:
            raise IndexBlockFormatError(f"file list truncated: name of {ln} bytes at {pos} past {end}")
        files.append(bytes(buf[pos : pos + ln]).decode("utf-8"))
        pos += ln
    if pos != end:
        raise IndexBlockFormatError(f"file list: expected {nbytes} bytes, names use {pos - HEADER_SIZE}")
    return tuple(files)


def _check_files(files: Sequence[str]) -> tuple[str, ...]:
    files = tuple(files)
    for f in files:
        if not isinstance(f, str) or not f:
            raise ValueError(f"file names must be non-empty strings, found {f!r}")
    if len(set(files)) != len(files):
        raise ValueError(f"file names in one block must be unique, found {list(files)}")
    if len(files) >= 1 << 32:
        raise ValueError("too many files for one block")
    return files


def _serialize_sorted(
    hashes: np.ndarray, file_ids: np.ndarray, rows: np.ndarray, files: tuple[str, ...]
) -> list[bytes]:
    """Block bytes (as parts) of entries already sorted by hash and validated."""
    n = len(hashes)
    lay = block_layout(n, len(files))
    lower = lay["hash_lower_bits"]
    nb = lay["num_buckets"]
    bb = lay["bucket_bits"]
    lmask = _U64((1 << lower) - 1)
    entries = pack_records([(hashes & lmask, lower), (file_ids, lay["file_id_bits"]), (rows, ROW_BITS)], n)
    counts = np.bincount((hashes >> _U64(lower)).astype(np.intp), minlength=nb)
    starts = np.zeros(nb + 1, dtype=np.uint64)
    np.cumsum(counts, out=starts[1:])
    buckets = pack_records([(starts, bb)], nb + 1)
    file_list = _encode_files(files)
    entries_offset = (HEADER_SIZE + len(file_list) + 7) // 8 * 8
    pad = b"\0" * (entries_offset - HEADER_SIZE - len(file_list))
    eb = entries.astype("<u8", copy=False).tobytes()
    bbytes = buckets.astype("<u8", copy=False).tobytes()
    crc = zlib.crc32(file_list)
    crc = zlib.crc32(pad, crc)
    crc = zlib.crc32(eb, crc)
    crc = zlib.crc32(bbytes, crc)
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        lay["hash_upper_bits"],
        lower,
        lay["file_id_bits"],
        ROW_BITS,
        bb,
        0,
        n,
        nb,
        len(files),
        len(file_list),
        entries_offset,
        len(eb),
        entries_offset + len(eb),
        len(bbytes),
        crc,
        0,
    )
    head = head[:76] + struct.pack("<I", zlib.crc32(head[:76]))
    return [head, file_list, pad, eb, bbytes]


def _write_atomic(path: Path, parts: Sequence[bytes]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _parse_header(buf: bytes | mmap.mmap, size: int, verify_data: bool) -> dict[str, Any]:
    if size < HEADER_SIZE:
        raise IndexBlockFormatError(f"index block: expected at least {HEADER_SIZE} bytes, found {size}")
    fields = _HEADER.unpack_from(buf, 0)
    (magic, version, upper, lower, fbits, rbits, bb, flags, n, nb, nfiles, flen, eoff, enb, boff, bnb, dcrc, hcrc) = (
        fields
    )
    if magic != MAGIC:
        raise IndexBlockFormatError(f"index block: expected magic {MAGIC!r}, found {bytes(magic)!r}")
    if version != VERSION:
        raise IndexBlockFormatError(f"index block: expected version {VERSION}, found {version}")
    if zlib.crc32(bytes(buf[:76])) != hcrc:
        raise IndexBlockFormatError("index block: header CRC-32 does not match (corrupt header)")
    lay = block_layout(n, nfiles)
    expect = (
        lay["hash_upper_bits"],
        lay["hash_lower_bits"],
        lay["file_id_bits"],
        ROW_BITS,
        lay["bucket_bits"],
        lay["num_buckets"],
    )
    found = (upper, lower, fbits, rbits, bb, nb)
    if expect != found:
        raise IndexBlockFormatError(
            f"index block: for {n} entries in {nfiles} files expected (upper, lower, file, row, bucket bits, "
            f"buckets) = {expect}, found {found}"
        )
    exp_eoff = (HEADER_SIZE + flen + 7) // 8 * 8
    exp_enb = 8 * words_for_bits(n * lay["entry_bits"])
    exp_bnb = 8 * words_for_bits((nb + 1) * bb)
    if (eoff, enb, boff, bnb) != (exp_eoff, exp_enb, exp_eoff + exp_enb, exp_bnb) or flags != 0:
        raise IndexBlockFormatError(
            f"index block: expected sections (entries at {exp_eoff}, {exp_enb} bytes; buckets at "
            f"{exp_eoff + exp_enb}, {exp_bnb} bytes), found ({eoff}, {enb}; {boff}, {bnb}), flags {flags}"
        )
    total = boff + bnb
    if size != total:
        raise IndexBlockFormatError(f"index block: expected {total} bytes, found {size} (truncated or padded)")
    if verify_data and zlib.crc32(buf[HEADER_SIZE:total]) != dcrc:
        raise IndexBlockFormatError("index block: data CRC-32 does not match (corrupt file list, entries or buckets)")
    files = _decode_files(buf, nfiles, flen)
    return {
        "layout": lay,
        "num_entries": n,
        "files": files,
        "entries_offset": eoff,
        "entries_nbytes": enb,
        "buckets_offset": boff,
        "buckets_nbytes": bnb,
        "size": total,
        "data_crc32": dcrc,
    }


class IndexBlock:
    """One immutable index block file, memory-mapped (docs/architecture.md#data-path).

    Attributes: ``path`` (Path), ``files`` (tuple of data file *names*; file id = position),
    ``num_entries``, ``num_buckets``, ``hash_upper_bits``, ``hash_lower_bits``, ``file_id_bits``,
    ``row_bits``, ``bucket_bits``, ``entry_bits``, ``size_bytes`` (file size, bytes).

    Make one with :meth:`build` (writes the file), :meth:`open` (an existing file) or
    :meth:`from_bytes` (restore saved bytes to a file). Lookups return *every* entry whose full 64-bit
    hash equals the query: several rows may share a key (tables without a primary key, or a key deleted
    and inserted again), and non-integer keys may collide, so callers filter by deletion vectors and
    re-check rows (unless :attr:`~.key_hash.KeyHash.exact`).
    """

    def __init__(self, path: Path, fh: IO[bytes], mm: mmap.mmap, meta: dict[str, Any]):
        self.path = Path(path)
        self._fh = fh
        self._mm = mm
        lay = meta["layout"]
        self.files: tuple[str, ...] = meta["files"]
        self.num_entries: int = meta["num_entries"]
        self.num_buckets: int = lay["num_buckets"]
        self.hash_upper_bits: int = lay["hash_upper_bits"]
        self.hash_lower_bits: int = lay["hash_lower_bits"]
        self.file_id_bits: int = lay["file_id_bits"]
        self.row_bits: int = lay["row_bits"]
        self.bucket_bits: int = lay["bucket_bits"]
        self.entry_bits: int = lay["entry_bits"]
        self.size_bytes: int = meta["size"]
        self._eoff = meta["entries_offset"]
        self._boff = meta["buckets_offset"]
        # the four views of the mapping; None once closed
        self._entries: np.ndarray | None = np.frombuffer(
            mm, dtype="<u8", count=meta["entries_nbytes"] // 8, offset=self._eoff
        )
        self._buckets: np.ndarray | None = np.frombuffer(
            mm, dtype="<u8", count=meta["buckets_nbytes"] // 8, offset=self._boff
        )
        self._entries_u: np.ndarray | None = unaligned_words(mm, self._eoff, meta["entries_nbytes"])
        self._buckets_u: np.ndarray | None = unaligned_words(mm, self._boff, meta["buckets_nbytes"])
        self._lmask = (1 << self.hash_lower_bits) - 1
        self._fmask = (1 << self.file_id_bits) - 1
        self._closed = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        path: PathLike,
        hashes: npt.ArrayLike,
        file_ids: npt.ArrayLike,
        rows: npt.ArrayLike,
        files: Sequence[str],
    ) -> IndexBlock:
        """Write a block of the entries (hash, file id, row offset) to ``path`` and open it.

        ``hashes``: uint64 (n,) key hashes (:mod:`~.key_hash`); ``file_ids``: int (n,) or one int,
        positions in ``files``; ``rows``: int (n,) row offsets in ``[0, 2³²)``; ``files``: unique data
        file names. Entries need not be sorted (they are sorted by hash here, O(n log n)). Raises
        ``ValueError``/``TypeError`` for bad arguments.
        """
        h = _as_hashes(hashes)
        fid, rw, files = _check_entries(len(h), file_ids, rows, files)
        order = np.argsort(h)
        return cls._build_sorted(path, h[order], fid[order], rw[order], files)

    @classmethod
    def _build_sorted(
        cls, path: PathLike, hashes: np.ndarray, file_ids: np.ndarray, rows: np.ndarray, files: tuple[str, ...]
    ) -> IndexBlock:
        """Write entries already sorted by hash (merge and compaction outputs) and open the block."""
        path = Path(path)
        _write_atomic(path, _serialize_sorted(hashes, file_ids, rows, files))
        return cls.open(path)

    @classmethod
    def open(cls, path: PathLike, verify: bool = False) -> IndexBlock:
        """Memory-map an existing block file. Checks the header (magic, version, CRC, widths, sizes);
        ``verify=True`` also checks the data CRC (reads the whole file). Raises
        :class:`IndexBlockFormatError` or ``OSError``."""
        path = Path(path)
        fh = open(path, "rb")
        try:
            size = os.fstat(fh.fileno()).st_size
            if size < HEADER_SIZE:
                raise IndexBlockFormatError(f"index block {path}: expected at least {HEADER_SIZE} bytes, found {size}")
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                meta = _parse_header(mm, size, verify)
            except BaseException:
                mm.close()
                raise
        except BaseException:
            fh.close()
            raise
        return cls(path, fh, mm, meta)

    @classmethod
    def from_bytes(cls, data: bytes, path: PathLike) -> IndexBlock:
        """Restore a block from its bytes (:meth:`to_bytes`, e.g. a Puffin blob of type
        ``mooncake-hash-index-v1``): checks everything including the data CRC, writes ``path``
        atomically and opens it. Raises :class:`IndexBlockFormatError` for bad bytes."""
        data = bytes(data)
        _parse_header(data, len(data), True)
        path = Path(path)
        _write_atomic(path, [data])
        return cls.open(path)

    @staticmethod
    def validate_bytes(data: bytes) -> None:
        """Raise :class:`IndexBlockFormatError` unless ``data`` is a complete, uncorrupted block."""
        _parse_header(data, len(data), True)

    def to_bytes(self) -> bytes:
        """The block file's bytes (for a Puffin blob ``mooncake-hash-index-v1``)."""
        self._check_open()
        return bytes(self._mm[: self.size_bytes])

    def verify(self) -> None:
        """Check the data CRC of the mapped file; raises :class:`IndexBlockFormatError`."""
        self._check_open()
        _parse_header(self._mm, self.size_bytes, True)

    # ------------------------------------------------------------------ lookups
    def lookup(self, h: int) -> list[tuple[str, int]]:
        """Every (file name, row offset) whose entry hash equals ``h`` (an int in [0, 2⁶⁴), or an
        int64 taken as its bits). Scalar path over the mapped bytes: one bucket, a few entries."""
        if self._closed:
            raise ValueError(f"index block {self.path} is closed")
        h = int(h) & _M64
        mm = self._mm
        lower = self.hash_lower_bits
        bb = self.bucket_bits
        # bucket start and end: two consecutive bucket_bits fields
        bit = (h >> lower) * bb
        b0 = self._boff + (bit >> 3)
        v = int.from_bytes(mm[b0 : b0 + (((bit & 7) + 2 * bb + 7) >> 3)], "little") >> (bit & 7)
        bmask = (1 << bb) - 1
        start = v & bmask
        count = ((v >> bb) & bmask) - start
        if count <= 0:
            return []
        w = self.entry_bits
        bit = start * w
        b0 = self._eoff + (bit >> 3)
        x = int.from_bytes(mm[b0 : b0 + (((bit & 7) + count * w + 7) >> 3)], "little") >> (bit & 7)
        lmask = self._lmask
        ql = h & lmask
        out = []
        for _ in range(count):
            low = x & lmask
            if low == ql:
                e = x >> lower
                out.append((self.files[e & self._fmask], (e >> self.file_id_bits) & 0xFFFFFFFF))
            elif low > ql:  # entries are sorted by hash within the bucket
                break
            x >>= w
        return out

    def lookup_batch(self, hashes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized lookup of many hashes.

        ``hashes``: uint64 (q,) (or int64 bits). Returns ``(query_index int64 (m,), file_id int32
        (m,), row uint32 (m,))``: one row per matching entry, ``query_index`` non-decreasing, file ids
        into ``self.files``. Works in chunks of ``LOOKUP_CHUNK`` queries: per chunk, the bucket range
        of every query, then every candidate entry's low hash bits, compared with the query's.
        """
        self._check_open()
        q = _as_hashes(hashes)
        out_q, out_f, out_r = [], [], []
        for c0 in range(0, len(q), LOOKUP_CHUNK):
            r = self._lookup_chunk(q[c0 : c0 + LOOKUP_CHUNK])
            if r is not None:
                qi, f, rw = r
                out_q.append(qi + c0)
                out_f.append(f)
                out_r.append(rw)
        if not out_q:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint32)
        return np.concatenate(out_q), np.concatenate(out_f), np.concatenate(out_r)

    def _read_entries(self, pos: np.ndarray, width: int) -> np.ndarray:
        assert self._entries is not None and self._entries_u is not None  # open: callers ran _check_open
        if width <= MAX_UNALIGNED_WIDTH:
            return read_field_unaligned(self._entries_u, pos, width)
        return read_field(self._entries, pos, width)

    def _bucket_ranges(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self._buckets is not None and self._buckets_u is not None  # open: callers ran _check_open
        bb = self.bucket_bits
        pos = b * _U64(bb)
        if 2 * bb <= MAX_UNALIGNED_WIDTH:
            v = read_field_unaligned(self._buckets_u, pos, 2 * bb)
            return v & _U64((1 << bb) - 1), v >> _U64(bb)
        if 2 * bb <= 64:
            v = read_field(self._buckets, pos, 2 * bb)
            return v & _U64((1 << bb) - 1), v >> _U64(bb)
        return read_field(self._buckets, pos, bb), read_field(self._buckets, pos + _U64(bb), bb)

    def _lookup_chunk(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        lower = self.hash_lower_bits
        start, end = self._bucket_ranges(q >> _U64(lower))
        cnt = (end - start).astype(np.intp)
        total = int(cnt.sum())
        if total == 0:
            return None
        rep = np.repeat(np.arange(len(q), dtype=np.intp), cnt)
        first = np.cumsum(cnt)
        first -= cnt
        # candidate entry index = start[query] + (k - first[query]) for the k-th candidate overall
        cand = np.repeat(start - first.astype(np.uint64), cnt)
        cand += np.arange(total, dtype=np.uint64)
        pos = cand * _U64(self.entry_bits)
        low = self._read_entries(pos, lower)
        hit = np.flatnonzero(low == (q & _U64(self._lmask))[rep])
        if len(hit) == 0:
            return None
        fid, row = self._read_locations(pos[hit] + _U64(lower))
        return rep[hit].astype(np.int64), fid, row

    def _read_locations(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(file id int32, row uint32) of the entries whose file id field starts at bit ``pos``."""
        assert self._entries is not None and self._entries_u is not None  # open: callers ran _check_open
        fb = self.file_id_bits
        if fb + ROW_BITS <= MAX_UNALIGNED_WIDTH:
            v = read_field_unaligned(self._entries_u, pos, fb + ROW_BITS)
            return (v & _U64(self._fmask)).astype(np.int32), (v >> _U64(fb)).astype(np.uint32)
        fid = read_field(self._entries, pos, fb).astype(np.int32)
        return fid, read_field(self._entries, pos + _U64(fb), ROW_BITS).astype(np.uint32)

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All entries in hash order: ``(hashes uint64 (n,), file_ids int32 (n,), rows uint32 (n,))``.
        One linear decode of the block (used by merge and compaction)."""
        self._check_open()
        n = self.num_entries
        nb = self.num_buckets
        if n == 0:
            return np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.uint32)
        assert self._buckets is not None  # open: _check_open above
        starts = read_field(
            self._buckets, np.arange(nb + 1, dtype=np.uint64) * _U64(self.bucket_bits), self.bucket_bits
        )
        counts = np.diff(starts).astype(np.intp)
        lower = self.hash_lower_bits
        hashes = np.repeat(np.arange(nb, dtype=np.uint64), counts)
        hashes <<= _U64(lower)
        pos = np.arange(n, dtype=np.uint64) * _U64(self.entry_bits)
        hashes |= self._read_entries(pos, lower)
        pos += _U64(lower)
        fid, rows = self._read_locations(pos)
        return hashes, fid, rows

    # ------------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"index block {self.path} is closed")

    def close(self) -> None:
        """Unmap the file (idempotent). Arrays returned earlier stay valid (they are copies)."""
        if self._closed:
            return
        self._closed = True
        self._entries = self._buckets = self._entries_u = self._buckets_u = None
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with it
            pass
        self._fh.close()

    def unlink(self) -> None:
        """Close the block and delete its file (after it left the FileIndex)."""
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> IndexBlock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"IndexBlock({str(self.path)!r}, entries={self.num_entries}, files={len(self.files)}, "
            f"buckets={self.num_buckets}, bytes={self.size_bytes})"
        )


def _check_entries(
    n: int, file_ids: npt.ArrayLike, rows: npt.ArrayLike, files: Sequence[str]
) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    files = _check_files(files)
    fid = np.asarray(file_ids)
    if fid.ndim == 0:
        fid = np.full(n, int(fid), dtype=np.int64)
    rw = np.asarray(rows)
    if fid.shape != (n,) or rw.shape != (n,):
        raise ValueError(f"hashes, file_ids and rows must have one length, found {n}, {fid.shape}, {rw.shape}")
    if n and fid.dtype.kind not in "ui" or n and rw.dtype.kind not in "ui":
        raise TypeError(f"file_ids and rows must be integers, found {fid.dtype} and {rw.dtype}")
    if n:
        if int(fid.min()) < 0 or int(fid.max()) >= len(files):
            raise ValueError(f"file ids must be in [0, {len(files)}), found [{int(fid.min())}, {int(fid.max())}]")
        if int(rw.min()) < 0 or int(rw.max()) >= 1 << ROW_BITS:
            raise ValueError(f"row offsets must be in [0, 2**32), found [{int(rw.min())}, {int(rw.max())}]")
    return fid.astype(np.uint64), rw.astype(np.uint64), files
