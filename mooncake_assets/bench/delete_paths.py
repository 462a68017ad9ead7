"""In-process harness: ways of applying deletion vectors to a Parquet scan, against a clean scan.

No service, no Postgres: it writes ``files`` Parquet data files with the mirror's writer
(:func:`~mooncake_assets.engine.table.disk_files.write_parquet`, ZSTD, 128 Ki-row row groups) in the shape
of ``pgbench_accounts``, deletes a random ``share`` of each file's rows (a deletion vector per file, as
a sorted position array), and writes the live rows as one clean file. Every approach then answers the
union-read bench's scan (``count(*), sum(abalance), sum(bid)``) and filter (``aid BETWEEN``) queries over
the files with deletes; every answer must equal the clean file's. Timing: rotated rounds
(:func:`~.common.interleaved`), medians of this process's CPU time (``time.process_time``, all threads).

Run: ``python -m mooncake_assets.bench.delete_paths --rows 5000000 --share 0.01 --rounds 7``.
``--clustered``: the deletes fall in the last tenth of each file (recent rows updated) instead of
uniformly, so most row groups are clean.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any, cast

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import FrozenBitMap64

from ..engine.lsn import Lsn
from ..engine.read.plan import arrow_mask, keep_mask, plan_file
from ..engine.read.union import UnionReader, _pool
from ..engine.table.disk_files import write_parquet
from ..engine.table.read_state import FileState, ReadState
from .common import interleaved

SCAN = "SELECT count(*) AS n, sum(abalance) AS s, sum(bid) AS b FROM {t}"
FILTER = "SELECT count(*) AS n, sum(abalance) AS s FROM {t} WHERE aid BETWEEN {lo} AND {hi}"
FILLER = " " * 84


class _Source:
    """A BatchedStateSource of one ReadState (table ``t``) over the built files, with ``mem`` in memory."""

    def __init__(self, b: dict[str, Any]):
        files = tuple(
            FileState(os.path.basename(f["path"]), f["path"], f["rows"], FrozenBitMap64(f["pos"].tolist()))
            for f in b["files"]
        )
        self.rs = ReadState("t", Lsn(16), files, tuple(b["mem"].column_names), mem=b["mem"])

    def read_states(
        self, tables: Any = None, match: Any = None, lsn: Any = None, wait_lsn: Any = None, timeout: float = 0
    ) -> list[ReadState]:
        return [self.rs]


class Capsule:
    """An Arrow table handed to DuckDB through the Arrow PyCapsule stream interface: DuckDB reads the
    stream straight (no PyArrow dataset scanner in between), and can scan it again (a new stream per scan)."""

    def __init__(self, table: pa.Table):
        self.table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.table.__arrow_c_stream__(requested_schema)


def _table(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    aid = np.arange(start, start + n, dtype=np.int32)
    return pa.table(
        {
            "aid": pa.array(aid),
            "bid": pa.array((aid // 100_000 + 1).astype(np.int32)),
            "abalance": pa.array(rng.integers(-5000, 5000, n, dtype=np.int32)),
            "filler": pa.array(np.full(n, FILLER, dtype=object), pa.string()),
        }
    )


def build(
    d: str, rows: int, files: int, share: float, clustered: bool, seed: int = 7, mem_rows: int = 0
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    per = rows // files
    out: list[dict[str, Any]] = []
    live_parts = []
    for i in range(files):
        t = _table(i * per + 1, per, rng)
        path = os.path.join(d, f"f{i}.parquet")
        write_parquet(t, path)
        k = int(per * share)
        lo = int(per * 0.9) if clustered else 0
        pos = np.sort(rng.choice(np.arange(lo, per), size=k, replace=False)).astype(np.uint32)
        keep = keep_mask(per, pos)
        live_parts.append(t.filter(arrow_mask(keep)))
        out.append({"path": path, "rows": per, "pos": pos})
    mem = _table(files * per + 1, mem_rows, rng)  # in-memory rows (only the union_query approach reads them)
    clean = os.path.join(d, "clean.parquet")
    write_parquet(pa.concat_tables(live_parts + ([mem] if mem_rows else [])), clean)
    files_only = os.path.join(d, "clean_files.parquet")  # the reference of the approaches that skip ``mem``
    write_parquet(pa.concat_tables(live_parts), files_only)
    return {"files": out, "clean": clean, "files_only": files_only, "rows": rows, "mem": mem}


def _lit(paths: list[str]) -> str:
    return "[" + ", ".join("'" + p + "'" for p in paths) + "]"


class Approaches:
    """Each method registers view ``t`` on a fresh read (its per-query work) and runs ``sql``."""

    def __init__(self, b: dict[str, Any], cols: list[str]):
        self.b = b
        self.cols = cols
        self.con = duckdb.connect()
        self.con.execute("SET parquet_metadata_cache = true")
        self.files = b["files"]
        self.md = {f["path"]: pq.ParquetFile(f["path"]).metadata for f in self.files}
        # per-file masks / indices as a long-lived reader's cache holds them
        self.keep = {f["path"]: keep_mask(f["rows"], f["pos"]) for f in self.files}
        self.amask = {p: arrow_mask(m) for p, m in self.keep.items()}
        self.idx = {p: pa.array(np.flatnonzero(m).astype(np.int64)) for p, m in self.keep.items()}
        self.rg_rows = {p: [md.row_group(i).num_rows for i in range(md.num_row_groups)] for p, md in self.md.items()}
        self.plans = {
            f["path"]: plan_file(f["path"], f["rows"], f["pos"], tuple(self.rg_rows[f["path"]])) for f in self.files
        }
        bits = [self.plans[f["path"]].dv_bits for f in self.files]
        self.con.register(
            "dv", pa.table({"c": pa.array(range(len(bits)), pa.int32()), "b": pa.array(bits, pa.binary())})
        )
        self.con.execute("CREATE TEMP TABLE dvb AS SELECT c, b::BIT AS b FROM dv")
        self.reader = UnionReader(cast(Any, _Source(b)))  # a BatchedStateSource: read_states only
        self.con.register("kt", pa.table({"k": pa.concat_arrays([self.amask[f["path"]] for f in self.files])}))

    def _read(self, f: dict[str, Any]) -> pa.Table:
        return pq.ParquetFile(f["path"], metadata=self.md[f["path"]]).read(columns=self.cols)

    def run(self, sql: str, obj: Any = None) -> Any:
        if obj is not None:
            self.con.execute("DROP VIEW IF EXISTS t")
            self.con.register("t", obj)
        return self.con.execute(sql).fetchall()

    # -------------------------------------------------------------- the approaches
    def clean(self, sql: str) -> Any:
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW t AS SELECT * FROM read_parquet('{self.b['clean']}')")
        return self.run(sql)

    def arrow_keepcol(self, sql: str) -> Any:  # today's arrow mode
        t = pa.concat_tables([self._read(f).append_column("__mc_keep", self.amask[f["path"]]) for f in self.files])
        self.con.register("raw", t)
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS SELECT * EXCLUDE (__mc_keep) FROM raw WHERE __mc_keep")
        return self.run(sql)

    def arrow_keepcol_capsule(self, sql: str) -> Any:
        t = pa.concat_tables([self._read(f).append_column("__mc_keep", self.amask[f["path"]]) for f in self.files])
        self.con.register("raw", Capsule(t))
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS SELECT * EXCLUDE (__mc_keep) FROM raw WHERE __mc_keep")
        return self.run(sql)

    def arrow_filter(self, sql: str) -> Any:
        t = pa.concat_tables([self._read(f).filter(self.amask[f["path"]]) for f in self.files])
        return self.run(sql, t)

    def arrow_filter_pool(self, sql: str) -> Any:
        """As arrow_filter, files read and filtered in parallel (the reader's thread pool)."""
        t = pa.concat_tables(list(_pool().map(lambda f: self._read(f).filter(self.amask[f["path"]]), self.files)))
        return self.run(sql, t)

    def arrow_keepcol_pool(self, sql: str) -> Any:
        t = pa.concat_tables(
            list(_pool().map(lambda f: self._read(f).append_column("__mc_keep", self.amask[f["path"]]), self.files))
        )
        self.con.register("raw", t)
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS SELECT * EXCLUDE (__mc_keep) FROM raw WHERE __mc_keep")
        return self.run(sql)

    def arrow_keepcol_pool_1t(self, sql: str) -> Any:
        """As arrow_keepcol_pool, each file's read single-threaded (no PyArrow thread pool nested in ours)."""

        def one(f: dict[str, Any]) -> pa.Table:
            pf = pq.ParquetFile(f["path"], metadata=self.md[f["path"]])
            return pf.read(columns=self.cols, use_threads=False).append_column("__mc_keep", self.amask[f["path"]])

        self.con.register("raw", pa.concat_tables(list(_pool().map(one, self.files))))
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS SELECT * EXCLUDE (__mc_keep) FROM raw WHERE __mc_keep")
        return self.run(sql)

    def hybrid_rowgroups(self, sql: str) -> Any:
        """Row groups with deletes through PyArrow with a keep column; clean row groups of the same files
        by DuckDB's Parquet reader, one ``file_row_number BETWEEN`` branch per clean segment."""
        parts, dirty = [], []
        cols = ", ".join(self.cols)
        for f in self.files:
            plan, rgs = self.plans[f["path"]], self.rg_rows[f["path"]]
            starts = np.concatenate([[0], np.cumsum(rgs)])
            m = self.keep[f["path"]]
            groups = [
                k for k in range(len(rgs)) for s in plan.segments if s.has_deletes and s.start <= starts[k] < s.stop
            ]
            if groups:
                pf = pq.ParquetFile(f["path"], metadata=self.md[f["path"]])
                mask = arrow_mask(np.concatenate([m[starts[k] : starts[k + 1]] for k in groups]))
                dirty.append(pf.read_row_groups(groups, columns=self.cols).append_column("__mc_keep", mask))
            for s in plan.segments:
                if not s.has_deletes:
                    parts.append(
                        f"SELECT {cols} FROM read_parquet('{f['path']}', file_row_number = true) "
                        f"WHERE file_row_number BETWEEN {s.start} AND {s.stop - 1}"
                    )
        self.con.register("raw", pa.concat_tables(dirty))
        parts.append(f"SELECT {cols} FROM raw WHERE __mc_keep")
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS " + " UNION ALL ".join(parts))
        return self.run(sql)

    def arrow_filter_capsule(self, sql: str) -> Any:
        t = pa.concat_tables([self._read(f).filter(self.amask[f["path"]]) for f in self.files])
        return self.run(sql, Capsule(t))

    def arrow_take_capsule(self, sql: str) -> Any:
        t = pa.concat_tables([self._read(f).take(self.idx[f["path"]]) for f in self.files])
        return self.run(sql, Capsule(t))

    def union_query(self, sql: str) -> Any:
        """The engine's union read itself (:meth:`UnionReader.query`, mode ``auto``) over an in-process source."""
        return [tuple(r.values()) for r in self.reader.query(sql).to_pylist()]

    def x_read_only(self, sql: str) -> Any:
        """Floor: PyArrow's read alone (no deletes applied, no DuckDB) -- not a union read."""
        return pa.concat_tables([self._read(f) for f in self.files]).num_rows

    def rg_stream(self, sql: str) -> Any:
        """One record batch per row group, produced while DuckDB consumes the stream."""
        schema = self._read_schema()

        def batches() -> Any:
            for f in self.files:
                pf = pq.ParquetFile(f["path"], metadata=self.md[f["path"]])
                m, start = self.keep[f["path"]], 0
                for g, n in enumerate(self.rg_rows[f["path"]]):
                    t = pf.read_row_group(g, columns=self.cols)
                    start += n
                    yield from t.filter(arrow_mask(m[start - n : start])).to_batches()

        return self.run(sql, pa.RecordBatchReader.from_batches(schema, batches()))

    def _read_schema(self) -> pa.Schema:
        return (
            pq.ParquetFile(self.files[0]["path"], metadata=self.md[self.files[0]["path"]])
            .schema_arrow.empty_table()
            .select(self.cols)
            .schema
        )

    def lazy_get_bit(self, sql: str) -> Any:
        paths = [f["path"] for f in self.files]
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW t AS SELECT {', '.join('d.' + c for c in self.cols)} FROM read_parquet({_lit(paths)}, "
            "file_row_number = true) d JOIN dvb m ON d.file_index = m.c "
            "WHERE get_bit(m.b, d.file_row_number::INTEGER) = 0"
        )
        return self.run(sql)

    def positional_mask(self, sql: str) -> Any:
        paths = [f["path"] for f in self.files]
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW t AS SELECT * EXCLUDE (k) FROM (SELECT * FROM read_parquet({_lit(paths)})) "
            "POSITIONAL JOIN kt WHERE k"
        )
        return self.run(sql)

    def duck_to_arrow_filter(self, sql: str) -> Any:
        """DuckDB decodes the files (its parquet reader), PyArrow filters, DuckDB scans the result."""
        paths = [f["path"] for f in self.files]
        cols = ", ".join(self.cols)
        t = self.con.execute(f"SELECT {cols} FROM read_parquet({_lit(paths)})").to_arrow_table()
        mask = arrow_mask(np.concatenate([self.keep[f["path"]] for f in self.files]))
        return self.run(sql, t.filter(mask))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--files", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--clustered", action="store_true")
    ap.add_argument("--mem", type=int, default=0, help="in-memory rows (then compare union_query only)")
    ap.add_argument("--only", default="")
    ap.add_argument("--query", default="scan,filter")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mc_delpaths_") as d:
        b = build(d, a.rows, a.files, a.share, a.clustered, mem_rows=a.mem)
        names = ["clean"] + [n for n in vars(Approaches) if not n.startswith("_") and n not in ("run", "clean")]
        if a.only:
            names = ["clean"] + [n for n in a.only.split(",") if n != "clean"]
        lo = a.rows // 3
        for q in a.query.split(","):
            tmpl, hi = (SCAN if q == "scan" else FILTER), lo + a.rows // 1000 - 1
            sql = tmpl.format(t="t", lo=lo, hi=hi)
            cols = ["abalance", "bid"] if q == "scan" else ["aid", "abalance"]
            ap_ = Approaches(b, cols)
            fns: dict[str, Callable[[], object]] = {n: functools.partial(getattr(ap_, n), sql) for n in names}
            cpu: dict[str, list[float]] = {}
            _, res = interleaved(fns, a.rounds, cpu)
            ref = res["clean"]
            files_ref = duckdb.sql(tmpl.format(t=f"read_parquet('{b['files_only']}')", lo=lo, hi=hi)).fetchall()
            c0 = statistics.median(cpu["clean"])
            print(
                f"{q} rows={a.rows:,} files={a.files} share={a.share} clustered={a.clustered} mem={a.mem} rounds={a.rounds}"
            )
            for n in names:
                c = statistics.median(cpu[n])
                ok = (
                    "(a floor, not a read)"
                    if n.startswith("x_")
                    else "ok"
                    if res[n] == (ref if n in ("clean", "union_query") else files_ref)
                    else f"MISMATCH {res[n]} != {ref}"
                )
                lo_ = min(cpu[n]) / min(cpu["clean"])
                print(f"  {n:24s} cpu {c * 1000:8.1f} ms  ratio {c / c0:5.2f}  (of minima {lo_:5.2f})  {ok}")


if __name__ == "__main__":
    main()
