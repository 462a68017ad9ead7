"""httpfs vs s3fs (registered fsspec) in DuckDB, reading the same Parquet files from moto on loopback.

Not a test (pytest does not collect it): ``.venv/bin/python tests/storage/bench_duckdb_httpfs_vs_s3fs.py``
prints the median of 5 runs of three queries both ways and whether the answers agree (docs/storage.md)."""

import io
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.storage.conftest import CREDENTIALS, start_moto

os.environ.update(CREDENTIALS)
from mooncake_assets.engine.storage import configure_duckdb_s3, resolve_s3

srv = start_moto()
try:
    b = srv.create_bucket()
    cfg = resolve_s3(hints={"endpoint": srv.endpoint})
    fs = cfg.filesystem()
    n = 200_000
    t = pa.table({"id": np.arange(n), "v": np.random.default_rng(1).random(n), "s": [f"row{i}" for i in range(n)]})
    paths = []
    for i in range(4):
        buf = io.BytesIO()
        pq.write_table(t, buf, row_group_size=50_000)
        fs.pipe_file(f"{b}/d/f{i}.parquet", buf.getvalue())
        paths.append(f"s3://{b}/d/f{i}.parquet")
    lst = "[" + ",".join(f"'{p}'" for p in paths) + "]"
    qs = {
        "full scan": f"SELECT count(*), sum(v), max(s) FROM read_parquet({lst})",
        "one column": f"SELECT sum(v) FROM read_parquet({lst})",
        "filtered": f"SELECT count(*) FROM read_parquet({lst}) WHERE id < 1000",
    }

    def run(con, q, k=5):
        con.execute(q).fetchall()
        ts = []
        for _ in range(k):
            t0 = time.perf_counter()
            r = con.execute(q).fetchall()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), r

    h = duckdb.connect()
    configure_duckdb_s3(h, cfg)
    f = duckdb.connect()
    f.register_filesystem(cfg.filesystem())
    for name, q in qs.items():
        th, rh = run(h, q)
        tf, rf = run(f, q)
        same = [tuple(round(x, 6) if isinstance(x, float) else x for x in r) for r in rh] == [
            tuple(round(x, 6) if isinstance(x, float) else x for x in r) for r in rf
        ]
        rh = rf = same
        print(f"{name:12s} httpfs {th * 1000:8.1f} ms   s3fs {tf * 1000:8.1f} ms   ratio {tf / th:5.1f}x  same={same}")
finally:
    srv.stop()
