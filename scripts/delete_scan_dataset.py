"""Issue 15, item 2: deletes applied inside the scan by PyArrow's dataset API, measured against a clean
scan and today's union read, CPU (this process, all threads), rotated rounds, medians.

New approaches (each answers the union-read bench's scan and filter queries over files with deletes,
registered in DuckDB as the union reader would; every answer must equal the clean file's):

- ``ds_rowgroup_take``: per file a dataset fragment (``ParquetFileFormat.make_fragment``) scanned row
  group by row group (``batch_size`` = the row group, ``use_threads``), each batch reduced with Arrow
  ``take`` on the sorted keep indices of its row range, streamed to DuckDB as a RecordBatchReader (no
  table materialised);
- ``ds_rowgroup_filter``: the same with ``filter`` on the packed keep bitmap slice instead of ``take``;
- ``ds_dirty_only``: only row groups with deletes through the fragment (``row_groups=``) and ``take``;
  the clean row groups read by DuckDB's own Parquet reader (``file_row_number BETWEEN``): row-group
  skipping, which only helps when deletes cluster (``--clustered``).

Reference rows from :mod:`mooncake_assets.bench.delete_paths` (same files, same harness): ``clean``,
``union_query`` (the engine's reader today), ``arrow_take_capsule``, ``rg_stream``. Run:

    .venv/bin/python scripts/delete_scan_dataset.py --rows 5000000 --share 0.01 --rounds 5

Measured 2026-12-02 (2 shared cores; CPU ratio vs clean, medians; every answer equal to the clean one):

=====================  ===============  ===============  ===================  ====================
approach               scan, uniform    scan, uniform    scan, clustered      filter, uniform /
                       (5 rounds)       (7 rounds)       (5 rounds)           clustered (5 rounds)
=====================  ===============  ===============  ===================  ====================
union_query (today)    1.35             1.24             1.25                 2.09 / 2.17
arrow_take_capsule     1.60             1.44             1.52                 21.4 / 17.0
rg_stream              1.61             1.57             1.35                 24.4 / 18.8
ds_rowgroup_take       1.55             1.60             1.58                 23.0 / 19.1
ds_rowgroup_filter     1.45             1.54             1.50                 22.4 / 18.9
ds_dirty_only          1.40             1.50             1.99                 22.2 / 8.5
=====================  ===============  ===============  ===================  ====================

None beats today's reader: at 1 % uniform deletes every 128 Ki-row group has deletes, so skipping clean
row groups saves nothing, and PyArrow's decode plus the Arrow hand-over cost more than DuckDB's own
Parquet reader with the keep mask; a filter loses its pushdown and row-group statistics (17-24x).
With clustered deletes the clean row groups as one DuckDB branch each (39 here) cost more than they save.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from mooncake_assets.bench import delete_paths as dp
from mooncake_assets.bench.common import interleaved
from mooncake_assets.engine.read.plan import arrow_mask


class DatasetApproaches(dp.Approaches):
    def __init__(self, b: dict[str, Any], cols: list[str]):
        super().__init__(b, cols)
        self.fmt = ds.ParquetFileFormat()
        self.fs = pafs.LocalFileSystem()
        self.starts = {p: np.concatenate([[0], np.cumsum(r)]).astype(np.int64) for p, r in self.rg_rows.items()}
        # per row group, the keep indices relative to the group (sorted), as a long-lived reader caches them
        self.rg_idx = {
            p: [
                pa.array(np.flatnonzero(self.keep[p][s[k] : s[k + 1]]).astype(np.int32))
                for k in range(len(self.rg_rows[p]))
            ]
            for p, s in self.starts.items()
        }
        self.rg_dirty = {
            p: [k for k in range(len(self.rg_rows[p])) if not self.keep[p][s[k] : s[k + 1]].all()]
            for p, s in self.starts.items()
        }
        self.schema = self._read_schema()

    def _batches(self, path: str, groups: list[int], reduce: str) -> Any:
        frag = self.fmt.make_fragment(path, filesystem=self.fs, row_groups=groups)
        size = max(self.rg_rows[path])
        m = self.keep[path]
        s = self.starts[path]
        for k, batch in zip(groups, frag.to_batches(columns=self.cols, batch_size=size, use_threads=True)):
            if batch.num_rows != self.rg_rows[path][k]:
                raise RuntimeError(f"{path}: row group {k} came as {batch.num_rows} rows")
            if reduce == "take":
                yield batch.take(self.rg_idx[path][k])
            else:
                yield batch.filter(arrow_mask(m[s[k] : s[k + 1]]))

    def _stream(self, sql: str, reduce: str) -> Any:
        def gen() -> Any:
            for f in self.files:
                yield from self._batches(f["path"], list(range(len(self.rg_rows[f["path"]]))), reduce)

        return self.run(sql, pa.RecordBatchReader.from_batches(self.schema, gen()))

    def ds_rowgroup_take(self, sql: str) -> Any:
        return self._stream(sql, "take")

    def ds_rowgroup_filter(self, sql: str) -> Any:
        return self._stream(sql, "filter")

    def ds_dirty_only(self, sql: str) -> Any:
        parts = []
        cols = ", ".join(self.cols)
        for f in self.files:
            p, s = f["path"], self.starts[f["path"]]
            dirty = set(self.rg_dirty[p])
            for k in range(len(self.rg_rows[p])):
                if k not in dirty:
                    parts.append(
                        f"SELECT {cols} FROM read_parquet('{p}', file_row_number = true) "
                        f"WHERE file_row_number BETWEEN {s[k]} AND {s[k + 1] - 1}"
                    )

        def gen() -> Any:
            for f in self.files:
                if self.rg_dirty[f["path"]]:
                    yield from self._batches(f["path"], self.rg_dirty[f["path"]], "take")

        self.con.execute("DROP VIEW IF EXISTS t")
        self.con.register("raw", pa.RecordBatchReader.from_batches(self.schema, gen()))
        parts.append(f"SELECT {cols} FROM raw")
        self.con.execute("CREATE OR REPLACE TEMP VIEW t AS " + " UNION ALL ".join(parts))
        return self.con.execute(sql).fetchall()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--files", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--clustered", action="store_true")
    ap.add_argument("--query", default="scan,filter")
    a = ap.parse_args()
    names = [
        "clean",
        "union_query",
        "arrow_take_capsule",
        "rg_stream",
        "ds_rowgroup_take",
        "ds_rowgroup_filter",
        "ds_dirty_only",
    ]
    with tempfile.TemporaryDirectory(prefix="mc_dsdel_") as d:
        b = dp.build(d, a.rows, a.files, a.share, a.clustered)
        lo = a.rows // 3
        for q in a.query.split(","):
            tmpl, hi = (dp.SCAN if q == "scan" else dp.FILTER), lo + a.rows // 1000 - 1
            sql = tmpl.format(t="t", lo=lo, hi=hi)
            cols = ["abalance", "bid"] if q == "scan" else ["aid", "abalance"]
            x = DatasetApproaches(b, cols)
            fns = {n: functools.partial(getattr(x, n), sql) for n in names}
            cpu: dict[str, list[float]] = {}
            wall, res = interleaved(fns, a.rounds, cpu)
            ref = duckdb.sql(tmpl.format(t=f"read_parquet('{b['files_only']}')", lo=lo, hi=hi)).fetchall()
            c0 = statistics.median(cpu["clean"])
            print(f"{q} rows={a.rows:,} files={a.files} share={a.share} clustered={a.clustered} rounds={a.rounds}")
            for n in names:
                c = statistics.median(cpu[n])
                ok = "ok" if res[n] == ref else f"MISMATCH {res[n]} != {ref}"
                print(
                    f"  {n:20s} cpu {c * 1000:7.1f} ms  ratio {c / c0:5.2f}  wall {statistics.median(wall[n]) * 1000:7.1f} ms  {ok}"
                )


if __name__ == "__main__":
    main()
