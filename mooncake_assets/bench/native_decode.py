"""Decode cost per row: the compiled pgoutput decoder vs the row-wise reference, on one generated WAL.

``python -m mooncake_assets.bench.native_decode [--rows N] [--repeat R]`` builds, in process (no
Postgres), a pgoutput stream of plain transactions of 1000 inserts each (PG docs, "Logical
Replication Message Formats": Relation, Begin, Insert with TupleData, Commit) for a narrow relation
(int, text, timestamp: 3 columns, ~35 value bytes) and a wide one (30 text columns, ~600 value bytes),
then times, best of ``R``:

- ``reference``: :class:`~..engine.cdc.txn.TransactionAssembler` (``feed_payload``: parse_message +
  assembly) and :func:`~..engine.cdc.columnar.columnar_transaction` (the columnar form the apply takes);
- ``native``: :class:`~..engine.cdc.native.NativeDecoder` ``feed`` (same output).

Prints one JSON object: µs of CPU per row for each, and the ratio. Not a test (no thresholds).
"""

from __future__ import annotations

import argparse
import json
import struct
import time

from ..engine.cdc.columnar import columnar_transaction
from ..engine.cdc.native import NativeDecoder
from ..engine.cdc.txn import TransactionAssembler

__all__ = ["generated_wal", "measure"]


def _s(t: str) -> bytes:
    return t.encode() + b"\0"


def _relation(oid: int, ncols: int) -> bytes:
    out = b"R" + struct.pack(">I", oid) + _s("public") + _s(f"t{oid}") + b"d" + struct.pack(">h", ncols)
    for i in range(ncols):
        out += bytes([1 if i == 0 else 0]) + _s(f"c{i}") + struct.pack(">Ii", 25, -1)
    return out


def _insert(oid: int, values: list[bytes]) -> bytes:
    out = b"I" + struct.pack(">I", oid) + b"N" + struct.pack(">h", len(values))
    for v in values:
        out += b"t" + struct.pack(">i", len(v)) + v
    return out


def generated_wal(rows: int, wide: bool, per_txn: int = 1000) -> list[tuple[int, bytes]]:
    """``[(wal_lsn, payload)]``: a Relation, then ``rows`` inserts in transactions of ``per_txn``."""
    oid = 16400
    ncols = 30 if wide else 3
    msgs = [(1, _relation(oid, ncols))]
    lsn, xid = 100, 1000
    for start in range(0, rows, per_txn):
        xid += 1
        msgs.append((lsn, b"B" + struct.pack(">QqI", lsn + 10**6, 0, xid)))
        for i in range(start, min(rows, start + per_txn)):
            lsn += 64
            if wide:
                vals = [str(i).encode()] + [f"value {j} of row {i}".encode() for j in range(1, ncols)]
            else:
                vals = [str(i).encode(), f"name-{i}-é".encode(), b"2026-12-01 15:04:05.123456+00"]
            msgs.append((lsn, _insert(oid, vals)))
        msgs.append((lsn, b"C" + struct.pack(">BQQq", 0, lsn + 1, lsn + 2, 0)))
    return msgs


def _reference(msgs: list[tuple[int, bytes]]) -> int:
    asm = TransactionAssembler()
    n = 0
    for lsn, p in msgs:
        for t in asm.feed_payload(p, lsn):
            n += columnar_transaction(t).rows
    return n


def _native(msgs: list[tuple[int, bytes]]) -> int:
    dec = NativeDecoder()
    n = 0
    for lsn, p in msgs:
        for t in dec.feed(p, lsn):
            n += t.rows
    return n


def _best(fn, msgs, repeat: int) -> tuple[float, int]:
    best, rows = float("inf"), 0
    for _ in range(repeat):
        t0 = time.process_time()
        rows = fn(msgs)
        best = min(best, time.process_time() - t0)
    return best, rows


def measure(rows: int = 200_000, repeat: int = 3) -> dict:
    """``{narrow|wide: {rows, reference_us_per_row, native_us_per_row, speedup}}`` (CPU time)."""
    out = {}
    for name, wide in (("narrow", False), ("wide", True)):
        msgs = generated_wal(rows, wide)
        ref_s, n1 = _best(_reference, msgs, repeat)
        nat_s, n2 = _best(_native, msgs, repeat)
        assert n1 == n2 == rows, (n1, n2, rows)
        out[name] = {
            "rows": rows,
            "reference_us_per_row": round(ref_s / rows * 1e6, 3),
            "native_us_per_row": round(nat_s / rows * 1e6, 3),
            "speedup": round(ref_s / nat_s, 2),
        }
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(json.dumps(measure(a.rows, a.repeat), indent=2))
