"""Probe: where the CPU of one honest (hold_rows=False) union-read scan goes, against a clean Parquet scan.

Builds one delete share's table as the union_read bench does (its own helpers; no Iceberg tables), serves it
over Flight, and times ``clean`` vs ``union`` (UnionReader(hold_rows=False)) in rotated rounds (medians, CPU
of this process), then profiles the union reader's query. Usage:
``python scripts/probe_union_scan.py ROWS SHARE ROUNDS [--profile] [--filter]`` (``--filter``: the bench's
selective query instead of the scan).
"""

import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

from mooncake_assets.bench import union_read as ur
from mooncake_assets.bench.common import interleaved, med
from mooncake_assets.engine.read import UnionReader
from mooncake_assets.engine.service.client import ServiceClient
from mooncake_assets.engine.table.mirror import MirrorTable

n, share, rounds = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
work = Path(tempfile.mkdtemp(prefix="probe-union-"))
base = ur._base_files(work, n)
h = ur._simulate(work, n, share, base, seed=int(share * 1000))
a, b = h.mem_range
mem_rows = ur._rows(h.keys[a:b], h.balances[a:b])
table = MirrorTable("accounts", "public.accounts", ur._schema(), None, work / "table")
ur._load_engine_view(table, h.files, mem_rows, h.mem_deleted, lsn=100)
clean = ur._clean_copy(h.files, mem_rows, h.mem_deleted)
ur._write(clean, work / "clean.parquet")
sock = str(work / "flight.sock")
server, _ = ur._serve({"t": table}, sock)
client = ServiceClient(sock)
ur._wait_ready(client)
r = UnionReader(client, hold_rows=False)
import duckdb

con = duckdb.connect()
sql = ur.SCAN_SQL
if "--filter" in sys.argv:  # the bench's filter: 0.1 % of the keys from the middle
    lo = n // 2
    sql = ur.FILTER_SQL.replace("{lo}", str(lo)).replace("{hi}", str(lo + max(n // 1000, 10) - 1))
files = [(f["path"].split("/")[-1], f["rows"], len(f["committed"]) + len(f["pending"])) for f in h.files]
print(
    f"rows {n:,} share {share}: files {len(files)}, with deletes {sum(1 for f in files if f[2])}, mem rows {mem_rows.num_rows}"
)
c = {
    "clean": lambda: con.execute(sql.format(t=f"read_parquet('{work}/clean.parquet')")).fetchall(),
    "union": lambda: r.query(sql.format(t="t"), tables=["t"]).to_pylist(),
}
for f in c.values():
    print(f())
cpu: dict = {}
times, _ = interleaved(c, rounds, cpu=cpu)
for k in c:
    print(f"{k}: wall {med(times[k]) * 1000:.1f} ms  cpu {med(cpu[k]) * 1000:.1f} ms")
print(f"ratio wall {med(times['union']) / med(times['clean']):.2f}  cpu {med(cpu['union']) / med(cpu['clean']):.2f}")
if "--profile" in sys.argv:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        c["union"]()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
client.close()
import shutil

shutil.rmtree(work, ignore_errors=True)
