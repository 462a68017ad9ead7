# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled COPY OUT block reader (see :mod:`.copyread` for the public face).

``COPY … TO STDOUT`` sends one CopyData message per row (PG docs, "COPY Operations" in "Message
Flow"); libpq's ``PQgetCopyData`` returns them one at a time. Reading them through psycopg costs a
Python call, a generator step and a ``memoryview`` per row. :class:`CopyOutReader` instead loops over
``PQgetCopyData`` in async mode in C, with the GIL released, appending each row to one growable
buffer, and hands back whole blocks of rows (one Python ``bytes`` per block) — the shape
``pyarrow.csv`` parses best. While the socket has nothing, it ``poll``\\ s on ``PQsocket`` (GIL
released) and calls ``PQconsumeInput`` when readable.

The libpq functions are looked up at run time with ``dlsym`` in the libpq that owns psycopg's
``PGconn`` (:func:`.native.libpq_path`), for the reasons given in ``_native.pyx``.
"""

from libc.stdlib cimport free, realloc
from libc.string cimport memcpy
from libc.errno cimport errno, EINTR
from cpython.bytes cimport PyBytes_FromStringAndSize


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

ctypedef int (*PQgetCopyData_f)(void* conn, char** buffer, int async_) noexcept nogil
ctypedef void (*PQfreemem_f)(void* ptr) noexcept nogil
ctypedef int (*PQconsumeInput_f)(void* conn) noexcept nogil
ctypedef int (*PQsocket_f)(const void* conn) noexcept nogil

cdef enum:
    _WAIT = 0
    _END = -1
    _LOST = -2
    _POLL_ERROR = -3
    _COPY_NOMEM = -4  # realloc failed (raised as MemoryError)
    _FULL = 1

#: CopyOutReader.read statuses (an int instead of a block)
COPY_WAIT = _WAIT  # the timeout passed before a block was full: call again
COPY_END = _END  # the server ended COPY (PQgetCopyData -1) and every row was returned: collect the result
COPY_LOST = _LOST  # PQgetCopyData -2 or PQconsumeInput failed: libpq's error message says why
COPY_POLL_ERROR = _POLL_ERROR  # poll() failed (errno in CopyOutReader.os_errno)


cdef class CopyOutReader:
    """Reads the rows of one ``COPY … TO STDOUT`` in progress on a ``PGconn`` in blocks.

    ``pgconn_ptr``: the ``PGconn*`` address (``psycopg.pq.PGconn.pgconn_ptr``), in COPY OUT state
    (psycopg's ``cursor.copy()`` started it). ``libpq_path``: the library that owns it. ``prefix``:
    bytes put at the start of every block (e.g. a UTF-8 BOM for ``pyarrow.csv``). Attributes:
    ``rows`` (rows read so far), ``last_rows`` (rows of the last block returned), ``nbytes`` (their bytes), ``os_errno``.
    """

    cdef void* conn
    cdef PQgetCopyData_f get_copy_data
    cdef PQfreemem_f freemem
    cdef PQconsumeInput_f consume_input
    cdef PQsocket_f socket
    cdef char* buf
    cdef Py_ssize_t cap, used, block_rows, nprefix
    cdef bytes prefix
    cdef public bint ended
    cdef public long long rows
    cdef public Py_ssize_t last_rows
    cdef public long long nbytes
    cdef public int os_errno

    def __init__(self, size_t pgconn_ptr, str libpq_path, bytes prefix=b""):
        if pgconn_ptr == 0:
            raise ValueError("CopyOutReader: null PGconn pointer")
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
        self.conn = <void*>pgconn_ptr
        self.prefix = prefix
        self.nprefix = len(prefix)
        self.cap = 0
        self.buf = NULL
        self._reserve(1 << 20)
        self._restart()
        self.ended = False
        self.rows = self.nbytes = 0
        self.last_rows = 0
        self.os_errno = 0

    def __dealloc__(self):
        free(self.buf)

    cdef int _reserve(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self.cap if self.cap else 1 << 20
        cdef void* p
        if need <= self.cap:
            return 0
        while cap < need:
            cap *= 2
        p = realloc(self.buf, cap)
        if p == NULL:
            raise MemoryError("CopyOutReader: cannot grow the block buffer")
        self.buf = <char*>p
        self.cap = cap
        return 0

    cdef int _grow(self, Py_ssize_t need) noexcept nogil:
        cdef Py_ssize_t cap = self.cap
        cdef void* p
        while cap < need:
            cap *= 2
        p = realloc(self.buf, cap)
        if p == NULL:
            return -1
        self.buf = <char*>p
        self.cap = cap
        return 0

    cdef void _restart(self) noexcept:
        if self.nprefix:
            memcpy(self.buf, <const char*>self.prefix, self.nprefix)
        self.used = self.nprefix
        self.block_rows = 0

    cdef object _take(self):
        out = PyBytes_FromStringAndSize(self.buf, self.used)
        self.last_rows = self.block_rows
        self._restart()
        return out

    def read(self, Py_ssize_t max_bytes, Py_ssize_t max_rows, double timeout):
        """The next block: ``bytes`` (the prefix, then whole rows: ``max_rows`` of them, or as many as
        reach ``max_bytes`` bytes, or the last ones of the COPY), or a status: ``COPY_WAIT`` (nothing
        came for ``timeout`` seconds; the rows read so far stay buffered), ``COPY_END`` (every row
        was returned; the COPY's result is pending in libpq), ``COPY_LOST``, ``COPY_POLL_ERROR``."""
        cdef char* row
        cdef int n, rc
        cdef int status = _FULL
        cdef pollfd pfd
        cdef int ms = <int>(timeout * 1000.0) if timeout > 0 else 0
        if self.ended:
            return COPY_END
        if max_rows < 1:
            max_rows = 1
        with nogil:
            while True:
                row = NULL
                n = self.get_copy_data(self.conn, &row, 1)
                if n > 0:
                    if self.used + n > self.cap and self._grow(self.used + n) != 0:
                        self.freemem(row)
                        status = _COPY_NOMEM
                        break
                    memcpy(self.buf + self.used, row, n)
                    self.freemem(row)
                    self.used += n
                    self.block_rows += 1
                    self.rows += 1
                    self.nbytes += n
                    if self.block_rows >= max_rows or self.used - self.nprefix >= max_bytes:
                        break
                    continue
                if n == -1:
                    status = _END
                    break
                if n < -1:
                    status = _LOST
                    break
                pfd.fd = self.socket(self.conn)
                pfd.events = POLLIN
                pfd.revents = 0
                rc = poll(&pfd, 1, ms)
                if rc < 0:
                    if errno == EINTR:
                        continue
                    self.os_errno = errno
                    status = _POLL_ERROR
                    break
                if rc == 0:
                    status = _WAIT
                    break
                if self.consume_input(self.conn) == 0:
                    status = _LOST
                    break
        if status == _FULL:
            return self._take()
        if status == _COPY_NOMEM:
            raise MemoryError("CopyOutReader: cannot grow the block buffer")
        if status == _END:
            self.ended = True
            if self.block_rows:
                return self._take()
        return status


cdef void* _sym(void* h, const char* name) except NULL:
    cdef void* f = dlsym(h, name)
    if f == NULL:
        raise OSError(f"libpq has no {name.decode()}")
    return f
