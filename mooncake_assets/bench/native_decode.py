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

``--receive`` adds the receive loop on a real stream (:func:`receive`; ``--dsn`` an admin DSN, else a
throwaway embedded cluster): three slots made before one workload (the ingest suite's narrow or wide
rows in transactions of 10), read to the same end LSN by ``pg_recvlogical`` (to ``/dev/null``), by
:meth:`~..engine.cdc.stream.ReplicationConnection.read_transactions` + the native decoder, and by
``read()`` + the reference assembler + ``columnar_transaction``: wall seconds and CPU µs per row.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import tempfile
import time
from pathlib import Path

from ..engine.cdc.columnar import columnar_transaction
from ..engine.cdc.native import NativeDecoder
from ..engine.cdc.txn import TransactionAssembler

__all__ = ["generated_wal", "measure", "receive"]


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


def _consume(dsn: str, slot: str, pub: str, end_lsn: int, native: bool) -> tuple[float, float, int]:
    """Read ``slot`` until a transaction ends at or past ``end_lsn``: (wall s, CPU s, rows)."""
    from ..engine.cdc.stream import ReplicationConnection

    rows = 0
    t0, c0 = time.perf_counter(), time.process_time()
    rc = ReplicationConnection(dsn)
    try:
        rc.start(slot, [pub])
        dec, asm = NativeDecoder(), TransactionAssembler()
        last = 0
        while last < end_lsn:
            if native:
                txns = rc.read_transactions(dec, 1.0)
            else:
                txns = [columnar_transaction(t) for w, p in rc.read(1.0) for t in asm.feed_payload(p, w)]
            for t in txns:
                rows += t.rows
                last = max(last, t.end_lsn)
            if txns:
                rc.send_status(last, last, last)
    finally:
        rc.close()
    return time.perf_counter() - t0, time.process_time() - c0, rows


def receive(admin_dsn: str, rows: int = 200_000, shape: str = "narrow") -> dict:
    """The receive loops against ``pg_recvlogical`` on one WAL (module docstring)."""
    from ..engine.lsn import Lsn
    from .common import BenchDatabase
    from .ingest import DECODING_MEM, NARROW_DDL, WIDE_DDL, _dsn_with, _recvlogical, _workload

    with BenchDatabase(admin_dsn, "mooncake_nat") as db:
        db.execute((NARROW_DDL if shape == "narrow" else WIDE_DDL).format(t="t"))
        db.execute("CREATE PUBLICATION p FOR TABLE t")
        for slot in ("s_recv", "s_nat", "s_ref"):
            db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        _workload(db.dsn, "t", shape, "small", rows)
        with psycopg_connect(db.dsn) as c:
            end = Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        recv_s = _recvlogical(db.dsn, "s_recv", "p", str(end), 600)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        recv_cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        dsn = _dsn_with(db.dsn, DECODING_MEM)
        nat_s, nat_cpu, n1 = _consume(dsn, "s_nat", "p", end, True)
        ref_s, ref_cpu, n2 = _consume(dsn, "s_ref", "p", end, False)
    assert n1 == n2 == rows, (n1, n2, rows)
    return {
        "shape": shape,
        "rows": rows,
        "recvlogical_s": round(recv_s, 3),
        "recvlogical_cpu_us_per_row": round(recv_cpu / rows * 1e6, 3),
        "native_s": round(nat_s, 3),
        "native_cpu_us_per_row": round(nat_cpu / rows * 1e6, 3),
        "native_ratio_vs_recvlogical": round(recv_s / nat_s, 2),
        "reference_s": round(ref_s, 3),
        "reference_cpu_us_per_row": round(ref_cpu / rows * 1e6, 3),
        "reference_ratio_vs_recvlogical": round(recv_s / ref_s, 2),
    }


def psycopg_connect(dsn: str):
    import psycopg

    return psycopg.connect(dsn, autocommit=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--receive", action="store_true", help="also the receive loops vs pg_recvlogical")
    ap.add_argument("--dsn", help="admin DSN of the source cluster for --receive (default: a throwaway one)")
    a = ap.parse_args()
    doc: dict = {"decode": measure(a.rows, a.repeat)}
    if a.receive:
        from ..engine.pg.embedded import EmbeddedPostgres

        pg = None
        admin = a.dsn
        if admin is None:
            pg = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="mooncake-nat-bench-", dir="/var/tmp")) / "state")
            admin = pg.start()
        try:
            doc["receive"] = [receive(admin, a.rows, shape) for shape in ("narrow", "wide")]
        finally:
            if pg is not None:
                pg.destroy()
    print(json.dumps(doc, indent=2))
