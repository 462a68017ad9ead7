"""What the service pays to answer "unchanged" for a table with ``N`` buffered rows (issue 15): the old
content token (the in-memory rows serialized to Arrow IPC and hashed with BLAKE2b on every query) against
today's (the MemSlice's incarnation and version, rows not gathered). Medians of 30 calls, CPU ms. Run:

    .venv/bin/python scripts/probe_token_cost.py 100000 1000000
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from mooncake_assets.engine.pg.schema import ColumnSpec, TableSchema, assign_field_ids
from mooncake_assets.engine.service.flight import state_token
from mooncake_assets.engine.table.mirror import MirrorTable


def table(n: int) -> MirrorTable:
    cols = [
        ColumnSpec("id", 20, -1, "bigint", pa.int64(), not_null=True, is_key=True),
        ColumnSpec("v", 25, -1, "text", pa.string()),
        ColumnSpec("n", 23, -1, "integer", pa.int32()),
    ]
    assign_field_ids(cols)
    t = MirrorTable("t", "public.t", TableSchema("public", "t", 1, cols, ["id"], True, "d"), None, tempfile.mkdtemp())
    arrays = [pa.array(np.arange(n), pa.int64()), pa.array(["x" * 40] * n), pa.array(np.arange(n, dtype=np.int32))]
    t.mem.append_batch(pa.RecordBatch.from_arrays(arrays, schema=t.arrow_schema), np.arange(n, dtype=np.uint64), 10)
    t.applied_lsn = 11
    return t


def cpu_ms(f, k: int = 30) -> float:
    f()
    xs = []
    for _ in range(k):
        c = time.process_time()
        f()
        xs.append(time.process_time() - c)
    return 1000 * statistics.median(xs)


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [100_000]:
        t = table(n)

        def old(t: MirrorTable = t) -> str:
            rs = t.read_state()
            mem = rs.mem
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, mem.schema) as w:
                w.write_table(mem)
            return state_token(rs.with_(mem_rows=mem.num_rows).to_wire(), sink.getvalue())

        tok = t.read_state().token
        new = cpu_ms(lambda t=t, tok=tok: t.read_state(known=tok))
        print(f"{n:,} buffered rows: old (IPC + BLAKE2b) {cpu_ms(old):.2f} ms CPU, version token {new:.3f} ms CPU")


if __name__ == "__main__":
    main()
