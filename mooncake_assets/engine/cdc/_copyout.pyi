# Type stub of the compiled COPY OUT block reader (_copyout.pyx).

COPY_WAIT: int
COPY_END: int
COPY_LOST: int
COPY_POLL_ERROR: int

class CopyOutReader:
    rows: int
    last_rows: int
    nbytes: int
    os_errno: int
    ended: bool
    def __init__(self, pgconn_ptr: int, libpq_path: str, prefix: bytes = b"") -> None: ...
    def read(self, max_bytes: int, max_rows: int, timeout: float) -> bytes | int: ...
