"""Probe: ways to hand the files with deletes to DuckDB in an arrow-mode scan (CPU medians, rotated rounds).

Builds the union_read bench's files for one delete share (no in-memory rows, no Flight) and times the
files-with-deletes part alone against a clean Parquet scan. ``python scripts/probe_masked_variants.py
ROWS SHARE ROUNDS [x]``; with ``x`` the keep-column path (``v0_before``) against filtering in Arrow with and without Arrow's threads
and pre-buffering (``v1_after``: commit 031a1a6, reverted: worse at 5M). A registered
``RecordBatchReader`` is the cheapest scan but is consumed by the first scan: a statement that scans the
view twice, or a second query, silently sees no rows (so the reader does not use it)."""

import sys
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import FrozenBitMap64

from mooncake_assets.bench import union_read as ur
from mooncake_assets.bench.common import interleaved, med
from mooncake_assets.engine.read.cache import ReadCache
from mooncake_assets.engine.read.union import _pool
from mooncake_assets.engine.table.read_state import FileState

n, share, rounds = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
work = Path(tempfile.mkdtemp(prefix="probe-var-"))
base = ur._base_files(work, n)
h = ur._simulate(work, n, share, base, seed=int(share * 1000))
a, b = h.mem_range
mem = ur._rows(h.keys[a:b], h.balances[a:b])
clean = ur._clean_copy(h.files, mem, h.mem_deleted)
ur._write(clean, work / "clean.parquet")
files = [
    FileState(f["path"].split("/")[-1], f["path"], f["rows"], FrozenBitMap64(sorted(f["committed"] + f["pending"])))
    for f in h.files
]
cols = ["abalance", "bid"]
cache = ReadCache()
con = duckdb.connect()
con.execute("SET parquet_metadata_cache = true")
Q = "SELECT count(*) AS n, sum(abalance) AS s, sum(bid) AS b FROM "


def _read_masked_old(files, cols, cache):
    """The arrow mode's read before this change: keep column appended, nested threads, pre-buffering."""
    known = {f.path: (cache.keep(f.path, f.rows, f.deleted), cache.metadata(f.path)) for f in files}

    def one(f):
        (live, keep), md = known[f.path]
        pf = pq.ParquetFile(f.path, metadata=md)
        t = pf.read(columns=cols) if live is None else pf.read_row_groups(list(live), columns=cols)
        return t.append_column("__mc_keep", keep)

    return pa.concat_tables(list(_pool().map(one, files)))


def _read_variant(filter_rows, threads, pre_buffer):
    known = {f.path: (cache.keep(f.path, f.rows, f.deleted), cache.metadata(f.path)) for f in files}

    def one(f):
        (live, keep), md = known[f.path]
        pf = pq.ParquetFile(f.path, metadata=md, pre_buffer=pre_buffer)
        t = (
            pf.read(columns=cols, use_threads=threads)
            if live is None
            else pf.read_row_groups(list(live), columns=cols, use_threads=threads)
        )
        return t.filter(keep) if filter_rows else t.append_column("__mc_keep", keep)

    return pa.concat_tables(list(_pool().map(one, files)))


def variant(filter_rows, threads, pre_buffer):
    def run():
        rows = _read_variant(filter_rows, threads, pre_buffer)
        con.register("x9", rows)
        r = con.execute(Q + ("x9" if filter_rows else "(SELECT abalance, bid FROM x9 WHERE __mc_keep)")).fetchall()
        con.unregister("x9")
        return r

    return run


def v0():
    rows = _read_masked_old(files, cols, cache)
    con.register("x0", rows)
    r = con.execute(Q + "(SELECT abalance, bid FROM x0 WHERE __mc_keep)").fetchall()
    con.unregister("x0")
    return r


def read_filtered(f):
    (live, keep), md = cache.keep(f.path, f.rows, f.deleted), cache.metadata(f.path)
    pf = pq.ParquetFile(f.path, metadata=md, pre_buffer=False)
    t = (
        pf.read(columns=cols, use_threads=False)
        if live is None
        else pf.read_row_groups(list(live), columns=cols, use_threads=False)
    )
    return t.filter(keep)


for f in files:
    cache.keep(f.path, f.rows, f.deleted)
    cache.metadata(f.path)


def v1():  # commit 031a1a6 (reverted): filtered in Arrow, files side by side without Arrow's threads or pre-buffering
    return variant(True, False, False)()


def v1s():  # serial, no pool
    rows = pa.concat_tables([read_filtered(f) for f in files])
    con.register("x1", rows)
    r = con.execute(Q + "x1").fetchall()
    con.unregister("x1")
    return r


def read_only():
    return pa.concat_tables(list(_pool().map(read_filtered, files))).num_rows


def duck_dirty():  # DuckDB reading every file plainly (ignoring deletes): the floor
    fl = ", ".join(f"'{f.path}'" for f in files)
    return con.execute(Q + f"read_parquet([{fl}])").fetchall()


def clean_():
    return con.execute(Q + f"read_parquet('{work}/clean.parquet')").fetchall()


c = (
    {}
    if len(sys.argv) > 4
    else {
        "clean": clean_,
        "v0_current": v0,
        "v1_filter_in_arrow": v1,
        "v1s_serial": v1s,
        "arrow_read_only": read_only,
        "duck_ignore_deletes": duck_dirty,
    }
)
for k, f in c.items():
    print(k, f())
cpu: dict = {}
times, _ = interleaved(c, rounds, cpu=cpu) if c else ({}, {})
base_c = med(cpu["clean"]) if c else 1
for k in c:
    print(
        f"{k:22s} wall {med(times[k]) * 1000:7.1f} ms  cpu {med(cpu[k]) * 1000:7.1f} ms  cpu/clean {med(cpu[k]) / base_c:.2f}"
    )


class Stream:
    def __init__(self, t):
        self.t = t

    def __arrow_c_stream__(self, requested_schema=None):
        return self.t.__arrow_c_stream__(requested_schema)


def v2():
    rows = pa.concat_tables(list(_pool().map(read_filtered, files)))
    con.register("x2", Stream(rows))
    r = con.execute(Q + "x2").fetchall()
    con.unregister("x2")
    return r


class Stream2:
    def __init__(self, t):
        self.t = t

    def __arrow_c_stream__(self, requested_schema=None):
        return pa.RecordBatchReader.from_batches(self.t.schema, self.t.to_batches()).__arrow_c_stream__(
            requested_schema
        )


def w2():
    rows = pa.concat_tables(list(_pool().map(read_filtered, files)))
    con.register("x3", Stream2(rows))
    r = con.execute(Q + "x3").fetchall()
    con.unregister("x3")
    return r


def v2b():  # the arrow table's batches as a record batch reader
    rows = pa.concat_tables(list(_pool().map(read_filtered, files)))
    con.register("x4", pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches()))
    r = con.execute(Q + "x4").fetchall()
    con.unregister("x4")
    return r


def dv_sql():
    return None


from mooncake_assets.engine.read.union import UnionReader

lz = UnionReader(None, mode="lazy", hold_rows=False)
from mooncake_assets.engine.table.read_state import ReadState


def v3():
    lz.register_state(RS, mem.slice(0, 0), "t", columns=cols, mode="lazy")
    return lz.con.execute(Q + "t").fetchall()


c2 = (
    {
        "clean": clean_,
        "v0_before": v0,
        "v1_after": v1,
        "filter_threads_pb": variant(True, True, True),
        "keep_nothreads_nopb": variant(False, False, False),
        "filter_threads_nopb": variant(True, True, False),
    }
    if len(sys.argv) > 4
    else {"clean": clean_, "v1_after": v1, "v2_capsule": v2, "v2b_reader": v2b, "v3_lazy_getbit": v3}
)
import inspect

print(inspect.signature(ReadState))
RS = ReadState("t", 100, tuple(files), ("aid", "bid", "abalance", "filler"))
for k, f in c2.items():
    print(k, f())
cpu = {}
times, _ = interleaved(c2, rounds, cpu=cpu)
base_c = med(cpu["clean"])
for k in c2:
    print(
        f"{k:22s} wall {med(times[k]) * 1000:7.1f} ms  cpu {med(cpu[k]) * 1000:7.1f} ms  cpu/clean {med(cpu[k]) / base_c:.2f}"
    )

import shutil

shutil.rmtree(work, ignore_errors=True)
