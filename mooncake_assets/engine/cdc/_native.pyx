# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled pgoutput decoder and receive loop (see :mod:`.native` for the public face).

:class:`NativeDecoder` turns the XLogData payloads of one replication stream into
:class:`~.columnar.ColumnarTransaction` objects with no Python object per row. It implements, for
data messages, the PG docs "Logical Replication Message Formats" (PG 15 §55.9: Insert, Update,
Delete and TupleData, with the leading Int32 xid inside a stream chunk) in C, and Begin and Commit
too (one pair per transaction, the commonest control messages with small transactions); the other
control messages (Origin, Relation, Type, Truncate, Message, Stream Start/Stop/Commit/Abort; a few
per transaction, not per row, and a Begin/Commit too short to parse, for the reference's error) go
through the reference parser :func:`~.pgoutput.parse_message`. The
message flow is that of "Logical Replication Message Flow" / "Logical Streaming Replication
Protocol" (protocol version 2 streaming) exactly as :class:`~.txn.TransactionAssembler` handles it
(the differential test, tests/engine/test_native_decoder.py, holds the two to the same output).

Layout: every open transaction (the plain one and each buffered streamed one) is a :class:`_TxnBuf`,
three growable C arrays — row records (kind, relation OID, xid of the (sub)transaction, WAL LSN of
the XLogData, old-tuple kind, where its cells and bytes start), cell records (kind byte, offset and
length of the value) and the value bytes. A subtransaction abort compacts them (drops the rows
tagged with its subxid). At commit the rows are cut into runs (the boundaries of :mod:`.columnar`'s
docstring) and each run's columns are gathered into Arrow ``binary`` arrays whose buffers are
numpy arrays filled here (``pa.Array.from_buffers``, zero-copy from those).

:class:`Receiver` is the receive loop: libpq's ``PQgetCopyData`` in async mode on psycopg's own
``PGconn`` (PG docs "Streaming Replication Protocol", XLogData ``'w'`` and Primary keepalive ``'k'``
headers parsed in C), ``poll`` on ``PQsocket`` with the GIL released while waiting,
``PQconsumeInput`` when readable, payloads fed to the decoder without a Python ``bytes`` per message.

Why the libpq functions are looked up at run time (``dlsym`` on a handle of the already-loaded
library) instead of linking: psycopg[binary] ships its own libpq (``psycopg_binary.libs/libpq-*.so``)
and the ``PGconn`` belongs to it. A ``PGconn`` is an opaque struct whose layout and internal buffers
are private to the libpq build that made it; calling another copy of libpq (the system one a link
would pick) on it is undefined behaviour. :func:`.native.libpq_path` finds the library that owns it.
"""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcpy, memmove
from libc.errno cimport errno, EINTR
from cpython.bytes cimport PyBytes_FromStringAndSize

import numpy as np

import pyarrow as pa

from mooncake_assets.engine.cdc import columnar as _columnar
from mooncake_assets.engine.cdc.columnar import CellColumn, ChangeRun, ColumnarBatch, ColumnarTransaction
from mooncake_assets.engine.cdc.pgoutput import (
    BadMessage,
    Begin,
    Commit,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    PG_EPOCH,
    message_relation,
    parse_message,
    pg_time_to_datetime,
)
from mooncake_assets.engine.cdc.txn import ProtocolError


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    char* dlerror()
    int RTLD_NOW
    int RTLD_NOLOAD

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd* fds, unsigned long nfds, int timeout)
    short POLLIN

cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec* ts)
    int CLOCK_MONOTONIC


# -- byte order (pgoutput and the replication protocol are big-endian) ----------------------------------
cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]

cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | <uint64_t>_be32(p + 4)

cdef inline int16_t _be16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint32_t>p[0] << 8) | <uint32_t>p[1])


def _pg_us(dt):
    """An aware datetime → µs since 2000-01-01 UTC (the inverse of ``pg_time_to_datetime``)."""
    d = dt - PG_EPOCH
    return (d.days * 86400 + d.seconds) * 1000000 + d.microseconds


def _lsn_text(uint64_t lsn):
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


cdef enum:
    K_INSERT = 73  # 'I'
    K_UPDATE = 85  # 'U'
    K_DELETE = 68  # 'D'
    K_TRUNCATE = 84  # 'T'

ctypedef struct RowRec:
    uint64_t lsn  # WAL start of the XLogData that carried the change
    int64_t cell0  # index of the row's first cell (new tuple, then old tuple)
    int64_t data0  # offset of the row's first value byte
    int64_t nbytes  # value bytes of the row (new and old tuples; its data is contiguous)
    uint32_t oid  # relation OID (TRUNCATE: the first truncated OID, 0 for none)
    uint32_t xid  # (sub)transaction that made the change (streamed chunks), else the top xid
    int32_t rel  # index into _TxnBuf.rels (the Relation in effect, maybe None)
    int32_t aux  # TRUNCATE: index into _TxnBuf.truncs
    int32_t nnew  # cells of the new tuple (0: none)
    int32_t nold  # cells of the old tuple (0: none)
    uint8_t kind  # K_*
    uint8_t old_kind  # 'K', 'O' or 0

ctypedef struct CellRec:
    uint32_t off  # value offset from the row's data0
    int32_t len
    uint8_t kind  # 'n', 'u', 't', 'b'


cdef class _TxnBuf:
    """One open transaction's changes in row-major C arrays (module docstring)."""

    cdef RowRec* rows
    cdef CellRec* cells
    cdef uint8_t* data
    cdef Py_ssize_t nrows, caprows
    cdef int64_t ncells, capcells, ndata, capdata
    cdef list rels
    cdef object last_rel
    cdef int32_t last_rel_idx
    cdef list truncs
    cdef public uint32_t xid
    cdef public uint64_t final_lsn
    cdef public object origin
    cdef public list bad  # the transaction's BadMessages (kept when its rows spill)

    def __cinit__(self):
        self._reset()
        self.origin = None
        self.bad = []

    def __dealloc__(self):
        free(self.rows)
        free(self.cells)
        free(self.data)

    cdef int _grow_rows(self) except -1:
        cdef Py_ssize_t cap = self.caprows * 2 if self.caprows else 64
        cdef void* p = realloc(self.rows, cap * sizeof(RowRec))
        if p == NULL:
            raise MemoryError("native decoder: row records")
        self.rows = <RowRec*>p
        self.caprows = cap
        return 0

    cdef inline int _need_cells(self, int64_t extra) except -1:
        cdef int64_t cap
        cdef void* p
        if self.ncells + extra <= self.capcells:
            return 0
        cap = self.capcells * 2 if self.capcells else 256
        while cap < self.ncells + extra:
            cap *= 2
        p = realloc(self.cells, cap * sizeof(CellRec))
        if p == NULL:
            raise MemoryError("native decoder: cell records")
        self.cells = <CellRec*>p
        self.capcells = cap
        return 0

    cdef inline int _need_data(self, int64_t extra) except -1:
        cdef int64_t cap
        cdef void* p
        if self.ndata + extra <= self.capdata:
            return 0
        cap = self.capdata * 2 if self.capdata else 4096
        while cap < self.ndata + extra:
            cap *= 2
        p = realloc(self.data, cap)
        if p == NULL:
            raise MemoryError("native decoder: value bytes")
        self.data = <uint8_t*>p
        self.capdata = cap
        return 0

    cdef inline int32_t _rel_index(self, object rel):
        if self.last_rel_idx < 0 or rel is not self.last_rel:
            self.rels.append(rel)
            self.last_rel = rel
            self.last_rel_idx = len(self.rels) - 1
        return self.last_rel_idx

    cdef void _truncate_to(self, Py_ssize_t nrows, int64_t ncells, int64_t ndata) noexcept:
        self.nrows = nrows
        self.ncells = ncells
        self.ndata = ndata

    cdef void drop_xid(self, uint32_t sub) noexcept:
        """Drop the rows tagged with ``sub`` (a subtransaction's Stream Abort), compacting the arrays."""
        cdef Py_ssize_t r, w = 0
        cdef int64_t cw = 0, dw = 0, nc
        cdef RowRec row
        for r in range(self.nrows):
            row = self.rows[r]
            if row.xid == sub:
                continue
            nc = row.nnew + row.nold
            if cw != row.cell0:
                memmove(self.cells + cw, self.cells + row.cell0, nc * sizeof(CellRec))
            if dw != row.data0:
                memmove(self.data + dw, self.data + row.data0, row.nbytes)
            row.cell0 = cw
            row.data0 = dw
            self.rows[w] = row
            w += 1
            cw += nc
            dw += row.nbytes
        self.nrows = w
        self.ncells = cw
        self.ndata = dw
        if self.bad:
            self.bad = [m for m in self.bad if m.xid != sub]

    cdef int64_t used(self) noexcept:
        return self.nrows * <int64_t>sizeof(RowRec) + self.ncells * <int64_t>sizeof(CellRec) + self.ndata

    cdef int64_t allocated(self) noexcept:
        return self.caprows * <int64_t>sizeof(RowRec) + self.capcells * <int64_t>sizeof(CellRec) + self.capdata

    cdef int release(self) except -1:
        """Empty: the arrays freed (they grow again from small), the Relation and TRUNCATE lists cleared."""
        free(self.rows)
        free(self.cells)
        free(self.data)
        self._reset()
        return 0

    cdef int cut(self) except -1:
        """Empty after its rows were cut into runs (``NativeDecoder._spill``): the arrays kept for the
        transaction's next changes, the Relation and TRUNCATE lists cleared; ``origin`` and ``bad`` (the
        transaction's) kept."""
        self._truncate_to(0, 0, 0)
        self.rels = []
        self.last_rel = None
        self.last_rel_idx = -1
        self.truncs = []
        return 0

    cdef void _reset(self) noexcept:
        """The empty state (no arrays, no Relations, no TRUNCATEs), shared by ``__cinit__`` and
        ``release``; the arrays must be freed (or never allocated) before. ``origin`` is kept."""
        self.rows = NULL
        self.cells = NULL
        self.data = NULL
        self.nrows = self.caprows = 0
        self.ncells = self.capcells = self.ndata = self.capdata = 0
        self.rels = []
        self.last_rel = None
        self.last_rel_idx = -1
        self.truncs = []

    cdef int append_from(self, _TxnBuf src) except -1:
        """``src``'s rows, cells and value bytes appended after this buffer's (a committed transaction
        joining the decoder's batch buffer): row offsets, Relation and TRUNCATE indexes rebased."""
        cdef Py_ssize_t i, r0 = self.nrows
        cdef int64_t c0 = self.ncells, d0 = self.ndata
        cdef RowRec* r
        cdef int32_t rel_base
        if src.nrows == 0:
            return 0
        while self.caprows < self.nrows + src.nrows:
            self._grow_rows()
        self._need_cells(src.ncells)
        self._need_data(src.ndata)
        memcpy(self.rows + r0, src.rows, src.nrows * sizeof(RowRec))
        if src.ncells:
            memcpy(self.cells + c0, src.cells, src.ncells * sizeof(CellRec))
        if src.ndata:
            memcpy(self.data + d0, src.data, src.ndata)
        rel_base = len(self.rels)
        trunc_base = len(self.truncs)
        self.rels.extend(src.rels)
        self.truncs.extend(src.truncs)
        self.last_rel = None  # (the next _rel_index appends: the rels list is no longer deduplicated at its end)
        self.last_rel_idx = -1
        for i in range(r0, r0 + src.nrows):
            r = self.rows + i
            r.cell0 += c0
            r.data0 += d0
            if r.rel >= 0:
                r.rel += rel_base
            if r.aux >= 0:
                r.aux += trunc_base
        self.nrows += src.nrows
        self.ncells += src.ncells
        self.ndata += src.ndata
        return 0

    cdef int recycle(self, int64_t keep) except -1:
        """Empty for reuse: the arrays kept (freed when more than ``keep`` bytes are allocated), the
        Relation and TRUNCATE lists and the origin cleared."""
        if self.allocated() > keep:
            self.release()
        else:
            self.cut()
        self.origin = None
        self.bad = []
        return 0

    @property
    def rows_count(self):
        return self.nrows


cdef int _read_tuple(_TxnBuf b, const uint8_t* p, Py_ssize_t n, Py_ssize_t* pos, int64_t row_data0,
                     int32_t* ncols_out) except -1:
    """TupleData at ``p[pos]`` (PG docs, "Logical Replication Message Formats", TupleData): Int16 ncols,
    per column Byte1 'n' | 'u' | 't' Int32 len + bytes | 'b' Int32 len + bytes. Appends its cells and
    value bytes to ``b``; advances ``pos``."""
    cdef Py_ssize_t q = pos[0]
    cdef int32_t ncols, i, ln
    cdef uint8_t k
    cdef CellRec* c
    if q + 2 > n:
        raise ValueError("pgoutput: truncated TupleData (no column count)")
    ncols = _be16(p + q)
    q += 2
    if ncols < 0:
        raise ValueError(f"pgoutput: TupleData column count {ncols} is negative")
    b._need_cells(ncols)
    for i in range(ncols):
        if q >= n:
            raise ValueError(f"pgoutput: TupleData column {i} runs past the end of the message")
        k = p[q]
        q += 1
        c = b.cells + b.ncells
        c.kind = k
        c.off = 0
        c.len = 0
        if k == 116 or k == 98:  # 't', 'b'
            if q + 4 > n:
                raise ValueError(f"pgoutput: column {i} value length runs past the end of the message")
            ln = <int32_t>_be32(p + q)
            q += 4
            if ln < 0 or ln > n - q:
                raise ValueError(f"pgoutput: column {i} value runs past the end of the message")
            b._need_data(ln)
            memcpy(b.data + b.ndata, p + q, ln)
            c.off = <uint32_t>(b.ndata - row_data0)
            c.len = ln
            b.ndata += ln
            q += ln
        elif k != 110 and k != 117:  # 'n', 'u'
            raise ValueError(f"pgoutput: expected a column kind 'n', 'u', 't' or 'b', found {chr(k)!r}")
        b.ncells += 1
    pos[0] = q
    ncols_out[0] = ncols
    return 0


cdef int _read_row(_TxnBuf b, const uint8_t* p, Py_ssize_t n, Py_ssize_t pos, uint8_t kind, uint32_t oid,
                   uint32_t xid, uint64_t lsn, object rel, Py_ssize_t rel_ncols) except -1:
    """The rest of an Insert/Update/Delete after its OID (``pos``): one row record into ``b``."""
    cdef RowRec* r
    cdef uint8_t k
    cdef int32_t nnew = 0, nold = 0
    cdef uint8_t old_kind = 0
    cdef int64_t data0 = b.ndata
    cdef int64_t cell0 = b.ncells
    if pos >= n:
        raise ValueError(f"pgoutput: truncated {chr(kind)!r} message ({n} bytes)")
    k = p[pos]
    if kind == K_INSERT:
        if k != 78:
            raise ValueError(f"pgoutput: Insert expected 'N' before the new tuple, found {chr(k)!r}")
        pos += 1
        _read_tuple(b, p, n, &pos, data0, &nnew)
    elif kind == K_UPDATE:
        if k == 75 or k == 79:  # 'K', 'O'
            old_kind = k
            pos += 1
            # the old tuple's cells come first on the wire; the row keeps new cells first: read the old
            # one, then the new one, and swap the two cell blocks below
            _read_tuple(b, p, n, &pos, data0, &nold)
            if pos >= n:
                raise ValueError(f"pgoutput: truncated 'U' message ({n} bytes)")
            k = p[pos]
        if k != 78:
            raise ValueError(f"pgoutput: Update expected 'N' before the new tuple, found {chr(k)!r}")
        pos += 1
        _read_tuple(b, p, n, &pos, data0, &nnew)
        if nold:
            _swap_blocks(b, cell0, nold, nnew)
    else:
        if k != 75 and k != 79:
            raise ValueError(f"pgoutput: Delete expected 'K' or 'O' before the old tuple, found {chr(k)!r}")
        old_kind = k
        pos += 1
        _read_tuple(b, p, n, &pos, data0, &nold)
    if rel_ncols >= 0 and ((nnew and nnew != rel_ncols) or (nold and nold != rel_ncols)):
        raise ValueError(
            f"pgoutput: {chr(kind)!r} tuple of relation {oid} has {nnew or nold} columns, "
            f"its Relation message {rel_ncols}"
        )
    if b.nrows == b.caprows:
        b._grow_rows()
    r = b.rows + b.nrows
    r.lsn = lsn
    r.cell0 = cell0
    r.data0 = data0
    r.nbytes = b.ndata - data0
    r.oid = oid
    r.xid = xid
    r.rel = b._rel_index(rel)
    r.aux = -1
    r.nnew = nnew
    r.nold = nold
    r.kind = kind
    r.old_kind = old_kind
    b.nrows += 1
    return 0


cdef int _swap_blocks(_TxnBuf b, int64_t cell0, int32_t nold, int32_t nnew) except -1:
    """Cells ``[old…, new…]`` at ``cell0`` → ``[new…, old…]`` (through spare room at the end)."""
    b._need_cells(nold)
    cdef CellRec* base = b.cells + cell0
    memcpy(b.cells + b.ncells, base, nold * sizeof(CellRec))
    memmove(base, base + nold, nnew * sizeof(CellRec))
    memcpy(base + nnew, b.cells + b.ncells, nold * sizeof(CellRec))
    return 0


cdef object _lsn_array(_TxnBuf b, Py_ssize_t start, Py_ssize_t end):
    cdef Py_ssize_t i
    out = np.empty(end - start, dtype=np.uint64)
    cdef uint64_t[::1] v = out
    for i in range(start, end):
        v[i - start] = b.rows[i].lsn
    return out


cdef tuple _columns(_TxnBuf b, Py_ssize_t start, Py_ssize_t end, Py_ssize_t ncols, bint old):
    """The run ``rows[start:end]``'s new (or old) tuples as ``ncols`` CellColumns.

    One pass sums the value bytes, a second gathers the cells column after column into one Arrow
    ``binary`` array of ``ncols * rows`` values (validity bitmap, int32 offsets and bytes in numpy
    arrays handed to ``pa.Array.from_buffers`` as they are) and one ``(ncols, rows)`` kinds array;
    each column is a slice / row view of those (a small transaction's runs cost a few Python objects
    per column, not a set of buffers per column)."""
    cdef Py_ssize_t n = end - start, i, c, have, j
    cdef Py_ssize_t total_cells = n * ncols
    cdef RowRec* r
    cdef CellRec* cell
    cdef CellRec* cells
    cdef int64_t total = 0, nulls = 0
    cdef int32_t off = 0
    for i in range(start, end):
        r = b.rows + i
        have = r.nold if old else r.nnew
        cells = b.cells + r.cell0 + (r.nnew if old else 0)
        for c in range(have if have < ncols else ncols):
            if cells[c].kind == 116 or cells[c].kind == 98:
                total += cells[c].len
    if total > 0x7FFFFFFF:
        raise OverflowError(f"native decoder: a run's tuples hold {total} value bytes (> 2 GiB)")
    kinds = np.empty((ncols, n), dtype=np.uint8)
    offs = np.empty(total_cells + 1, dtype=np.int32)
    data = np.empty(total, dtype=np.uint8)
    valid = np.zeros((total_cells + 7) // 8, dtype=np.uint8)
    cdef uint8_t[:, ::1] kv = kinds
    cdef int32_t[::1] ov = offs
    cdef uint8_t[::1] dv = data
    cdef uint8_t[::1] vv = valid
    ov[0] = 0
    j = 0
    for c in range(ncols):
        for i in range(start, end):
            r = b.rows + i
            have = r.nold if old else r.nnew
            if c < have:
                cell = b.cells + r.cell0 + (r.nnew if old else 0) + c
                kv[c, i - start] = cell.kind
                if cell.kind == 116 or cell.kind == 98:
                    if cell.len:
                        memcpy(&dv[off], b.data + r.data0 + cell.off, cell.len)
                    off += cell.len
                    vv[j >> 3] |= <uint8_t>(1 << (j & 7))
                else:
                    nulls += 1
            else:
                kv[c, i - start] = 110  # 'n': no such tuple (or column) on this row
                nulls += 1
            j += 1
            ov[j] = off
    ob, db = pa.py_buffer(offs), pa.py_buffer(data)
    values = pa.Array.from_buffers(
        pa.binary(),
        total_cells,
        [pa.py_buffer(valid) if nulls else None, ob, db],
        null_count=nulls,
    )
    cols = tuple([CellColumn(kinds[c], values.slice(c * n, n)) for c in range(ncols)])
    # the run's layout as ``columnar._layout`` reads it (value bytes, kinds, offsets, data), so that
    # ``merge_runs`` need not read the buffers back from Arrow
    return cols, ((total, kinds, ob, db) if ncols else (0, None, None, None))


_NO_LAYOUT = (0, None, None, None)


cdef object _make_run(_TxnBuf b, Py_ssize_t start, Py_ssize_t end, object commits):
    cdef RowRec* r0 = b.rows + start
    cdef Py_ssize_t ncols, i
    cdef object rel
    lsns = _lsn_array(b, start, end)
    cl = None if commits is None else commits[start:end]
    if r0.kind == K_TRUNCATE:
        oids, cascade, restart = b.truncs[r0.aux]
        return ChangeRun("truncate", r0.oid, None, 1, lsns, truncate_oids=oids, cascade=cascade,
                         restart_identity=restart, commit_lsns=cl)
    rel = b.rels[r0.rel]
    if rel is not None:
        ncols = len(rel.columns)
    else:  # no Relation seen for this OID: the tuples' own width
        ncols = 0
        for i in range(start, end):
            ncols = max(ncols, b.rows[i].nnew, b.rows[i].nold)
    new = old = old_kinds = None
    if r0.kind == K_INSERT:
        kind = "insert"
    elif r0.kind == K_UPDATE:
        kind = "update"
    else:
        kind = "delete"
    lay_new = lay_old = _NO_LAYOUT
    if r0.kind != K_DELETE:
        new, lay_new = _columns(b, start, end, ncols, False)
    if r0.kind != K_INSERT:
        old, lay_old = _columns(b, start, end, ncols, True)
        old_kinds = np.empty(end - start, dtype=np.uint8)
        for i in range(start, end):
            old_kinds[i - start] = b.rows[i].old_kind
    return ChangeRun(kind, r0.oid, rel, end - start, lsns, new, old, old_kinds, commit_lsns=cl,
                     layouts=(lay_new, lay_old))


cdef list _runs(_TxnBuf b, object commits=None):
    """Cut ``b``'s rows into runs (the boundaries of :mod:`.columnar`'s docstring). ``commits``: for the
    batch buffer, the ``uint64`` commit LSN of every row (each run gets its slice as ``commit_lsns``)."""
    cdef Py_ssize_t max_rows = _columnar.MAX_RUN_ROWS
    cdef int64_t max_bytes = _columnar.MAX_RUN_BYTES
    cdef Py_ssize_t i = 0, start
    cdef int64_t nbytes
    cdef RowRec* r0
    cdef RowRec* r
    runs = []
    while i < b.nrows:
        start = i
        r0 = b.rows + i
        nbytes = r0.nbytes
        i += 1
        if r0.kind != K_TRUNCATE:
            while i < b.nrows and i - start < max_rows:
                r = b.rows + i
                if r.kind != r0.kind or r.oid != r0.oid:
                    break
                if r.rel != r0.rel:
                    a, z = b.rels[r0.rel], b.rels[r.rel]
                    if a is not z and a != z:
                        break
                if nbytes + r.nbytes > max_bytes:
                    break
                nbytes += r.nbytes
                i += 1
        runs.append(_make_run(b, start, i, commits))
    return runs


cdef class NativeDecoder:
    """Feed it every XLogData payload in arrival order; it returns the transactions each completes, as
    :class:`~.columnar.ColumnarTransaction` (the same as ``columnar_transaction`` of what
    :class:`~.txn.TransactionAssembler` returns for the same stream).

    ``relations`` / ``types``: oid → latest :class:`~.pgoutput.Relation` / :class:`~.pgoutput.Type`,
    kept as the assembler keeps them. A malformed row message of a readable relation inside a
    transaction becomes a :class:`~.pgoutput.BadMessage` of it (``ColumnarTransaction.bad``; the
    assembler's rule, txn.py). Errors: :class:`~.txn.ProtocolError` (same messages as the
    assembler) for a message out of place; ``ValueError`` for any other malformed message, naming the
    LSN of its XLogData. After an error nothing of an open transaction has been emitted; :meth:`reset` (or a
    new decoder) and a reconnect from the slot's confirmed position is the remedy.

    ``batch=True`` (the service's stream): a committed transaction that was not spilled is not cut into
    runs of its own; its rows join one batch buffer (the transaction's buffer adopted when the batch is
    empty, else appended: a few memcpy), and :meth:`take` cuts the whole buffer once into batch runs
    spanning the transactions (a :class:`~.columnar.ColumnarBatch`: the runs with each row's commit LSN,
    a table of the transactions) — what ``merge_runs`` makes of the per-transaction output, without a
    set of Arrow arrays per transaction. :meth:`feed` then returns only what a spilled transaction's
    commit pushed out (the batch so far, then that transaction), keeping commit order. The emptied
    transaction buffers are reused by the next Begin.
    """

    cdef public dict relations
    cdef public dict types
    cdef public bint in_stream
    cdef _TxnBuf _current
    cdef object _stream_xid
    cdef dict _streams
    cdef _TxnBuf _scratch
    cdef list _out
    cdef int64_t _c_oid
    cdef public object spill  # a .spill.Spiller, or None: open transactions stay in memory
    cdef public int64_t spill_bytes  # an open transaction's buffer spills past this (bytes)
    cdef object _c_rel
    cdef Py_ssize_t _c_ncols
    cdef public object fault_corrupt_oid  # fault injection (faults.corrupt_relation): None, or an OID whose
    #                                      Insert/Update/Delete payloads are cut after the OID
    cdef public bint fault_corrupt_short  # ... cut inside the OID instead (no table can be named)
    cdef public bint batch  # committed transactions join the batch buffer (see the class docstring)
    cdef _TxnBuf _batch  # the committed transactions not yet taken, rows end to end
    cdef _TxnBuf _spare  # an emptied transaction buffer, reused by the next Begin
    cdef list _bt_xid, _bt_commit, _bt_end, _bt_time, _bt_rowend, _bt_streamed, _bt_origin

    def __init__(self, bint batch=False):
        self.batch = batch
        self._batch = _TxnBuf()
        self._spare = None
        self._bt_clear()
        self.relations = {}
        self.types = {}
        self.in_stream = False
        self._current = None
        self._stream_xid = None
        self._streams = {}
        self._scratch = _TxnBuf()
        self._out = []
        self._c_oid = -1
        self.spill = None
        self.spill_bytes = 0
        self.fault_corrupt_oid = None
        self.fault_corrupt_short = False

    # -- state for observers (as TransactionAssembler) -------------------------------------------------
    @property
    def in_transaction(self):
        return self._current is not None

    @property
    def open_streams(self):
        return list(self._streams)

    @property
    def buffered_changes(self):
        cdef _TxnBuf s
        n = self._current.nrows if self._current is not None else 0
        for s in self._streams.values():
            n += s.nrows
        return n

    @property
    def buffered_bytes(self):
        """Bytes allocated for the open transactions' row, cell and value arrays (with ``batch``, also
        the batch buffer's and the spare buffer's kept for reuse)."""
        cdef _TxnBuf s
        n = self._current.allocated() if self._current is not None else 0
        n += self._batch.allocated() + (self._spare.allocated() if self._spare is not None else 0)
        for s in self._streams.values():
            n += s.allocated()
        return n

    @property
    def idle(self):
        return self._current is None and not self._streams and not self.in_stream

    @property
    def committed_rows(self):
        """Rows of the committed transactions not yet taken (the batch buffer and the output list)."""
        return self._batch.nrows + sum(t.rows for t in self._out)

    def reset(self):
        """Forget in-flight transactions and committed ones not yet taken (keeps the relation and type
        caches)."""
        self._batch.recycle(0)
        self._bt_clear()
        self._out = []
        self._current = None
        self._streams.clear()
        self.in_stream = False
        self._stream_xid = None
        if self.spill is not None:
            self.spill.discard_all()

    # -- feeding ------------------------------------------------------------------------------------
    def feed(self, payload, uint64_t wal_lsn):
        """One XLogData payload (bytes-like) at WAL start ``wal_lsn`` → the transactions it completes."""
        cdef const uint8_t[::1] v = memoryview(payload).cast("B")
        self._out = []
        if v.shape[0] == 0:
            self._feed(NULL, 0, wal_lsn)
        else:
            self._feed(&v[0], v.shape[0], wal_lsn)
        out, self._out = self._out, []
        return out

    def take(self):
        """The transactions completed since the last :meth:`take` (the receive loop's output); with
        ``batch``, the batch buffer cut into a :class:`~.columnar.ColumnarBatch` first."""
        self._flush_batch()
        out, self._out = self._out, []
        return out

    cdef void _bt_clear(self) noexcept:
        self._bt_xid = []
        self._bt_commit = []
        self._bt_end = []
        self._bt_time = []
        self._bt_rowend = []
        self._bt_streamed = []
        self._bt_origin = []

    cdef int _to_batch(self, _TxnBuf b, uint32_t xid, uint64_t commit_lsn, uint64_t end_lsn, int64_t ts,
                       bint streamed, object origin) except -1:
        """A committed transaction's buffer ``b`` joins the batch buffer (adopted when that is empty,
        else appended); ``b`` (or the old empty batch buffer) is kept for the next Begin."""
        cdef _TxnBuf old
        if self._batch.nrows == 0:
            old = self._batch
            self._batch = b
            old.recycle(1 << 22)
            self._spare = old
        else:
            self._batch.append_from(b)
            b.recycle(1 << 22)
            self._spare = b
        self._bt_xid.append(xid)
        self._bt_commit.append(commit_lsn)
        self._bt_end.append(end_lsn)
        self._bt_time.append(ts)
        self._bt_rowend.append(self._batch.nrows)
        self._bt_streamed.append(streamed)
        self._bt_origin.append(origin)
        return 0

    cdef int _flush_batch(self) except -1:
        """The batch buffer's transactions as one :class:`~.columnar.ColumnarBatch` on the output list
        (nothing when it holds none); the buffer emptied."""
        if not self._bt_xid:
            return 0
        commits = np.array(self._bt_commit, dtype=np.uint64)
        row_ends = np.array(self._bt_rowend, dtype=np.int64)
        per_row = np.repeat(commits, np.diff(row_ends, prepend=0))
        runs = _runs(self._batch, per_row)
        self._out.append(
            ColumnarBatch(
                runs,
                np.array(self._bt_xid, dtype=np.uint32),
                commits,
                np.array(self._bt_end, dtype=np.uint64),
                np.array(self._bt_time, dtype=np.int64),
                row_ends,
                self._bt_streamed,
                self._bt_origin,
            )
        )
        self._bt_clear()
        self._batch.recycle(1 << 22)
        return 0

    cdef int _feed(self, const uint8_t* p, Py_ssize_t n, uint64_t lsn) except -1:
        cdef uint8_t t = p[0] if n > 0 else 0
        cdef Py_ssize_t at
        if t == K_INSERT or t == K_UPDATE or t == K_DELETE:
            if self.fault_corrupt_oid is not None:  # fault injection: pgoutput.cut_after_relation's cut
                at = 5 if self.in_stream else 1
                if n >= at + 4 and _be32(p + at) == <uint32_t>self.fault_corrupt_oid:
                    n = at + (2 if self.fault_corrupt_short else 4)
            return self._data(p, n, lsn, t)
        if t == 66 and n >= 21:  # 'B' Begin: Int64 final LSN, Int64 commit time, Int32 xid
            return self._begin(_be32(p + 17), _be64(p + 1))
        if t == 67 and n >= 26:  # 'C' Commit: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 commit time
            return self._commit(_be64(p + 2), _be64(p + 10), <int64_t>_be64(p + 18))
        self._control(PyBytes_FromStringAndSize(<const char*>p, n), lsn)
        return 0

    cdef object _rel(self, uint32_t oid):
        if self._c_oid != oid:
            self._c_rel = self.relations.get(oid)
            self._c_oid = oid
            self._c_ncols = len(self._c_rel.columns) if self._c_rel is not None else -1
        return self._c_rel

    cdef _TxnBuf _target(self, uint32_t* xid):
        cdef _TxnBuf st
        if self.in_stream:
            st = self._streams[self._stream_xid]
            return st
        if self._current is not None:
            xid[0] = self._current.xid
            return self._current
        return None

    cdef int _data(self, const uint8_t* p, Py_ssize_t n, uint64_t lsn, uint8_t kind) except -1:
        cdef Py_ssize_t pos = 1
        cdef uint32_t xid = 0, oid
        cdef _TxnBuf b
        cdef Py_ssize_t nrows
        cdef int64_t ncells, ndata
        if self.in_stream:
            if n < 5:
                raise ValueError(f"pgoutput: truncated {chr(kind)!r} message ({n} bytes) at LSN {_lsn_text(lsn)}")
            xid = _be32(p + 1)
            pos = 5
        if pos + 4 > n:
            raise ValueError(f"pgoutput: truncated {chr(kind)!r} message ({n} bytes) at LSN {_lsn_text(lsn)}")
        oid = _be32(p + pos)
        pos += 4
        rel = self._rel(oid)
        b = self._target(&xid)
        if b is None:
            b = self._scratch
        nrows, ncells, ndata = b.nrows, b.ncells, b.ndata
        try:
            _read_row(b, p, n, pos, kind, oid, xid, lsn, rel, self._c_ncols)
        except ValueError as e:
            b._truncate_to(nrows, ncells, ndata)
            if b is self._scratch:
                raise ValueError(f"{e} (XLogData at LSN {_lsn_text(lsn)})") from None
            # a malformed row of a readable relation: a marker of the transaction (txn.py's docstring)
            b.bad.append(BadMessage(oid, lsn, chr(kind), f"{e} (XLogData at LSN {_lsn_text(lsn)})", xid))
            return 0
        if b is self._scratch:
            b._truncate_to(0, 0, 0)
            name = "Insert" if kind == K_INSERT else "Update" if kind == K_UPDATE else "Delete"
            raise ProtocolError(f"{name} for relation {oid} outside any transaction")
        if self.spill is not None and b.used() > self.spill_bytes:
            self._spill(b)
        return 0

    cdef int _spill(self, _TxnBuf b) except -1:
        """``b``'s changes so far to its spill file (``.spill``); ``b`` starts again empty, its arrays
        kept for the transaction's next changes (memory already faulted in: ``MemoryBudget.spill_bytes``)."""
        cdef Py_ssize_t i
        xids = np.empty(b.nrows, dtype=np.uint32)
        cdef uint32_t[::1] xv = xids
        for i in range(b.nrows):
            xv[i] = b.rows[i].xid
        self.spill.write(b.xid, _runs(b), xids)
        b.cut()
        return 0

    cdef object _spilled(self, uint32_t xid):
        # most transactions never spilled: a look in the spill's dict of open spills, not a method call
        if self.spill is None or not self.spill.open or xid not in self.spill.open:
            return None
        return self.spill.take(xid)

    cdef int _control(self, bytes payload, uint64_t lsn) except -1:
        cdef uint32_t xid = 0
        cdef _TxnBuf b
        try:
            msg = parse_message(payload, self.in_stream)
        except ValueError as e:
            text = f"{e} (XLogData at LSN {_lsn_text(lsn)})"
            at = message_relation(payload, self.in_stream)  # (a Relation here: Insert/Update/Delete go to _data)
            if at is None or not (self.in_stream or self._current is not None):
                raise ValueError(text) from None
            b = self._target(&xid)
            b.bad.append(BadMessage(at[1], lsn, chr(payload[0]), text, at[0] if at[0] is not None else xid))
            return 0
        t = type(msg)
        if t is Begin:
            self._begin(msg.xid, msg.final_lsn)
        elif t is Commit:
            self._commit(msg.commit_lsn, msg.end_lsn, _pg_us(msg.commit_time))
        elif t is Relation:
            self.relations[msg.oid] = msg
            self._c_oid = -1
        elif t is Type:
            self.types[msg.oid] = msg
        elif t is Origin:
            if self._current is not None:
                self._current.origin = msg.name
        elif t is Message:
            pass  # logical decoding messages are not row changes
        elif t is Truncate:
            self._on_truncate(msg, lsn)
        elif t is StreamStart:
            self._on_stream_start(msg)
        elif t is StreamStop:
            if not self.in_stream:
                raise ProtocolError("Stream Stop outside a stream")
            self.in_stream = False
            self._stream_xid = None
        elif t is StreamCommit:
            self._on_stream_commit(msg)
        elif t is StreamAbort:
            self._on_stream_abort(msg)
        else:
            raise ProtocolError(f"unexpected message {t.__name__}")
        return 0

    cdef int _begin(self, uint32_t xid, uint64_t final_lsn) except -1:
        if self._current is not None:
            raise ProtocolError(f"Begin of xid {xid} while xid {self._current.xid} is open")
        if self.in_stream:
            raise ProtocolError(f"Begin of xid {xid} inside the stream of xid {self._stream_xid}")
        if self._spare is not None:
            b = self._spare
            self._spare = None
        else:
            b = _TxnBuf()
        b.xid = xid
        b.final_lsn = final_lsn
        self._current = b
        return 0

    cdef int _commit(self, uint64_t commit_lsn, uint64_t end_lsn, int64_t ts) except -1:
        cur = self._current
        if cur is None:
            raise ProtocolError(f"Commit at {commit_lsn:X} without a Begin")
        self._current = None
        spilled = self._spilled(cur.xid)
        if self.batch and spilled is None and not cur.bad:
            return self._to_batch(cur, cur.xid, commit_lsn, end_lsn, ts, False, cur.origin)
        self._flush_batch()
        self._out.append(
            ColumnarTransaction(cur.xid, commit_lsn, end_lsn, pg_time_to_datetime(ts), _runs(cur), False, cur.origin,
                                spilled, cur.bad)
        )
        return 0

    cdef _on_truncate(self, msg, uint64_t lsn):
        cdef uint32_t xid = 0
        cdef _TxnBuf b = self._target(&xid)
        cdef RowRec* r
        oids = tuple(msg.relation_oids)
        first = oids[0] if oids else 0
        if b is None:
            raise ProtocolError(f"Truncate for relation {first} outside any transaction")
        if self.in_stream and msg.xid is not None:
            xid = msg.xid
        if b.nrows == b.caprows:
            b._grow_rows()
        b.truncs.append((oids, msg.cascade, msg.restart_identity))
        r = b.rows + b.nrows
        r.lsn = lsn
        r.cell0 = b.ncells
        r.data0 = b.ndata
        r.nbytes = 0
        r.oid = first
        r.xid = xid
        r.rel = -1
        r.aux = len(b.truncs) - 1
        r.nnew = r.nold = 0
        r.kind = K_TRUNCATE
        r.old_kind = 0
        b.nrows += 1

    cdef _on_stream_start(self, msg):
        if self.in_stream:
            raise ProtocolError(f"Stream Start of xid {msg.xid} inside the stream of xid {self._stream_xid}")
        if self._current is not None:
            raise ProtocolError(f"Stream Start of xid {msg.xid} inside plain transaction {self._current.xid}")
        if msg.first_segment:
            if self.spill is not None:
                self.spill.discard(msg.xid)
            b = _TxnBuf()  # a restart of a known xid begins afresh
            b.xid = msg.xid
            self._streams[msg.xid] = b
        elif msg.xid not in self._streams:
            raise ProtocolError(
                f"Stream Start of xid {msg.xid} continues a stream whose first segment was never received"
            )
        self.in_stream = True
        self._stream_xid = msg.xid

    cdef _on_stream_commit(self, msg):
        if self.in_stream:
            raise ProtocolError(f"Stream Commit of xid {msg.xid} inside a stream chunk")
        st = self._streams.pop(msg.xid, None)
        if st is None:
            raise ProtocolError(f"Stream Commit of xid {msg.xid}, which was never streamed")
        spilled = self._spilled(msg.xid)
        if self.batch and spilled is None and not st.bad:
            self._to_batch(st, msg.xid, msg.commit_lsn, msg.end_lsn, _pg_us(msg.commit_time), True, None)
            return
        self._flush_batch()
        self._out.append(
            ColumnarTransaction(msg.xid, msg.commit_lsn, msg.end_lsn, msg.commit_time, _runs(st), True, None,
                                spilled, st.bad)
        )

    cdef _on_stream_abort(self, msg):
        cdef _TxnBuf st
        if msg.subxid == msg.xid:
            self._streams.pop(msg.xid, None)
            if self.spill is not None:
                self.spill.discard(msg.xid)
        else:
            st = self._streams.get(msg.xid)
            if st is not None:
                st.drop_xid(msg.subxid)
            if self.spill is not None:
                self.spill.abort_sub(msg.xid, msg.subxid)


# -- the receive loop -----------------------------------------------------------------------------------
ctypedef int (*PQgetCopyData_f)(void* conn, char** buffer, int async_) noexcept nogil
ctypedef void (*PQfreemem_f)(void* ptr) noexcept nogil
ctypedef int (*PQconsumeInput_f)(void* conn) noexcept nogil
ctypedef int (*PQsocket_f)(const void* conn) noexcept nogil
ctypedef int (*PQlibVersion_f)() noexcept nogil

#: Receiver.read results
READ_OK = 0
READ_END = -1  # the server ended COPY (PQgetCopyData -1): collect the result
READ_LOST = -2  # PQgetCopyData -2 or PQconsumeInput failed: libpq's error message says why
READ_POLL_ERROR = -3  # poll() failed (errno in Receiver.os_errno)


cdef double _monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class Receiver:
    """The receive loop on one ``PGconn`` in COPY BOTH mode (module docstring).

    ``pgconn_ptr``: the ``PGconn*`` address (``psycopg.pq.PGconn.pgconn_ptr``). ``libpq_path``: the
    shared library that owns it (:func:`.native.libpq_path`); its functions are looked up with
    ``dlsym`` (``RTLD_NOLOAD``: it must be loaded already). Attributes: ``wal_end`` (largest WAL end
    seen in XLogData and keepalive headers), ``reply_requested`` (a keepalive asked for a status
    update; the caller answers and clears it), ``keepalives``, ``messages`` (XLogData fed),
    ``lib_version`` (``PQlibVersion()``), ``os_errno``.
    """

    cdef void* conn
    cdef PQgetCopyData_f get_copy_data
    cdef PQfreemem_f freemem
    cdef PQconsumeInput_f consume_input
    cdef PQsocket_f socket
    cdef public uint64_t wal_end
    cdef public bint reply_requested
    cdef public long keepalives
    cdef public long messages
    cdef public int lib_version
    cdef public int os_errno

    def __init__(self, size_t pgconn_ptr, str libpq_path):
        if pgconn_ptr == 0:
            raise ValueError("Receiver: null PGconn pointer")
        path = libpq_path.encode()
        cdef void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD)
        cdef char* err
        if h == NULL:
            err = dlerror()
            why = (<bytes>err).decode(errors="replace") if err != NULL else "?"
            raise OSError(f"{libpq_path} is not loaded in this process: {why}")
        self.get_copy_data = <PQgetCopyData_f>_sym(h, b"PQgetCopyData")
        self.freemem = <PQfreemem_f>_sym(h, b"PQfreemem")
        self.consume_input = <PQconsumeInput_f>_sym(h, b"PQconsumeInput")
        self.socket = <PQsocket_f>_sym(h, b"PQsocket")
        self.lib_version = (<PQlibVersion_f>_sym(h, b"PQlibVersion"))()
        self.conn = <void*>pgconn_ptr
        self.wal_end = 0
        self.reply_requested = False
        self.keepalives = self.messages = 0
        self.os_errno = 0

    def read(self, NativeDecoder decoder, double timeout, long max_messages=10000):
        """Read what is available, waiting up to ``timeout`` seconds for the first message; feed each
        XLogData payload to ``decoder`` (its completed transactions: ``decoder.take()``). Returns the
        number of XLogData messages fed (``>= 0``) once something was read and the socket is drained,
        ``max_messages`` were fed, a keepalive asked for a reply, or the timeout passed; or one of
        ``READ_END``, ``READ_LOST``, ``READ_POLL_ERROR``. Decoder errors propagate (the message's
        buffer freed)."""
        cdef char* buf
        cdef const uint8_t* p
        cdef int n, rc, ms
        cdef long got = 0
        cdef uint64_t end
        cdef pollfd pfd
        cdef double deadline = _monotonic() + (timeout if timeout > 0 else 0.0), remaining
        while got < max_messages:
            buf = NULL
            n = self.get_copy_data(self.conn, &buf, 1)
            if n > 0:
                p = <const uint8_t*>buf
                try:
                    if p[0] == 119 and n >= 25:  # 'w': WAL start, WAL end, send time, payload
                        end = _be64(p + 9)
                        if end > self.wal_end:
                            self.wal_end = end
                        got += 1
                        self.messages += 1
                        decoder._feed(p + 25, n - 25, _be64(p + 1))
                    elif p[0] == 107 and n >= 18:  # 'k': WAL end, send time, reply requested
                        self.keepalives += 1
                        end = _be64(p + 1)
                        if end > self.wal_end:
                            self.wal_end = end
                        if p[17]:
                            self.reply_requested = True
                finally:
                    self.freemem(buf)
                if self.reply_requested:
                    break
                continue
            if n == -1:
                return READ_END
            if n < -1:
                return READ_LOST
            if got:  # drained
                break
            remaining = deadline - _monotonic()
            if remaining <= 0:
                break
            pfd.fd = self.socket(self.conn)
            pfd.events = POLLIN
            pfd.revents = 0
            ms = <int>(remaining * 1000.0) + 1
            with nogil:
                rc = poll(&pfd, 1, ms)
            if rc < 0:
                if errno == EINTR:
                    continue
                self.os_errno = errno
                return READ_POLL_ERROR
            if rc > 0 and self.consume_input(self.conn) == 0:
                return READ_LOST
        return got


cdef void* _sym(void* h, const char* name) except NULL:
    cdef void* f = dlsym(h, name)
    if f == NULL:
        raise OSError(f"libpq has no {name.decode()}")
    return f
