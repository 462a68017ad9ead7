"""CPU cost of ``merge_runs`` per one-row transaction of the compiled decoder (µs), in process.

Builds 5,000 one-row UPDATE (then DELETE) transactions of a pgbench_accounts-shaped table with the
pgoutput message builders of the decoder tests, decodes them with ``NativeDecoder`` and times
``merge_runs`` (best of 5, ``time.process_time``). No Postgres. Run from the repository root:
``nice -n 19 .venv/bin/python scripts/bench_merge_runs.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mooncake_assets.engine.cdc import columnar
from mooncake_assets.engine.cdc.native import NativeDecoder
from tests.engine.test_native_decoder import m_begin, m_commit, m_delete, m_relation, m_update

OID = 16384
COLS = [(1, "aid", 23, -1), (0, "bid", 23, -1), (0, "abalance", 23, -1), (0, "filler", 1042, 88)]


def transactions(n: int, kind: str) -> list[columnar.ColumnarTransaction]:
    msgs = []
    lsn = 1000
    for x in range(n):
        lsn += 1000
        msgs.append((lsn, m_begin(lsn + 900, 0, 700 + x)))
        if x == 0:
            msgs.append((lsn + 1, m_relation(None, OID, "public", "t", "d", COLS)))
        new = [("t", str(x).encode()), ("t", b"1"), ("t", str(x * 7).encode()), ("t", b"x" * 84)]
        old = [("t", str(x).encode()), ("n", None), ("n", None), ("n", None)]
        payload = m_update(None, OID, "K", old, new) if kind == "update" else m_delete(None, OID, "K", old)
        msgs.append((lsn + 2, payload))
        msgs.append((lsn + 900, m_commit(lsn + 900, lsn + 950, 0)))
    dec = NativeDecoder()
    return [t for at, p in msgs for t in dec.feed(p, at)]


def main() -> None:
    n = 5000
    for kind in ("update", "delete"):
        txns = transactions(n, kind)
        best = float("inf")
        for _ in range(5):
            t = time.process_time()
            out = columnar.merge_runs(txns)
            best = min(best, time.process_time() - t)
        print(f"{kind}: {len(out)} batch run(s), {best / n * 1e6:.2f} µs CPU per transaction")


if __name__ == "__main__":
    main()
