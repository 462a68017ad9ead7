"""Type stub of the compiled module ``_native.pyx`` (the compiled pgoutput decoder and receive loop)."""

from .columnar import ColumnarBatch, ColumnarTransaction
from .pgoutput import Relation, Type
from .spill import Spiller

READ_OK: int
READ_END: int
READ_LOST: int
READ_POLL_ERROR: int

class NativeDecoder:
    relations: dict[int, Relation]
    types: dict[int, Type]
    in_stream: bool
    spill: Spiller | None
    fault_corrupt_oid: int | None
    fault_corrupt_short: bool
    spill_bytes: int
    batch: bool
    def __init__(self, batch: bool = False) -> None: ...
    @property
    def in_transaction(self) -> bool: ...
    @property
    def open_streams(self) -> list[int]: ...
    @property
    def buffered_changes(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def idle(self) -> bool: ...
    @property
    def committed_rows(self) -> int: ...
    def reset(self) -> None: ...
    def feed(
        self, payload: bytes | bytearray | memoryview, wal_lsn: int
    ) -> list[ColumnarTransaction | ColumnarBatch]: ...
    def take(self) -> list[ColumnarTransaction | ColumnarBatch]: ...

class Receiver:
    wal_end: int
    reply_requested: bool
    keepalives: int
    messages: int
    lib_version: int
    os_errno: int
    def __init__(self, pgconn_ptr: int, libpq_path: str) -> None: ...
    def read(self, decoder: NativeDecoder, timeout: float, max_messages: int = 10000) -> int: ...
