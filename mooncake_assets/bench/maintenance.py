"""Maintenance benchmark: what index merge and compaction buy union reads, and what
compaction costs. ``mooncake bench --suite maintenance`` calls :func:`run_maintenance_bench`.

One run, one process, side by side, on a scratch table in the source Postgres mirrored by a scratch
service (its own state directory, slot and publication; everything is dropped at the end):

1. ``rows`` rows are copied, then ``batches`` update batches each update ``updates_per_batch`` random
   keys and are persisted (one new data file, its IndexBlock and the DVs of the older files each);
2. union reads (``UnionReader.query``: ReadState over Flight, view, DuckDB), each timed end to end as
   the median of ``repeat`` rotated rounds (wall time; CPU time too, :func:`.common.interleaved`), in
   four states of the same rows:
   ``no_maintenance``; ``index_merge_only`` (``merge_index --all``); ``compacted`` (policy compaction
   run to its fixpoint, default policy: here the 20-odd update files are rewritten, the large initial
   copy keeps its deletion vector); ``compacted_full`` (``compact --full`` after that);
3. the reference: the same rows (read once by the union reader) written to a clean Parquet file by the
   mirror's own writer (``engine.table.disk_files.write_parquet``: PyArrow, ZSTD, row groups of 128 Ki
   rows, as the mirror's data files) and the same SQL run by
   DuckDB over ``read_parquet`` of it (``clean_ms``), timed beside each state (rounds interleaved with
   the union reads, medians of each) so both sides see the same machine load. Every state reports
   ``ratio_vs_clean`` = union ms / clean ms and ``cpu_ratio_vs_clean`` (the same of CPU times).

Queries: ``scan`` — an aggregate over every row (``SELECT count(*), sum(v), max(pad) …``: whole-table
reads, the reader's ``arrow`` mode); ``filter`` — a selective one (``WHERE k < 50``: ``lazy`` mode).

Compaction cost (``compaction``): the policy compaction of step 2 (its runs summed; with the default
policy every file of this table is small, so it rewrites all of them): rows in/out, seconds split
into rewrite (read + DV + write), upload, index rebuild (``build_from_compaction``) and commit;
``rows_per_s`` = rows in / (rewrite + upload) — the data work — and ``index_entries_per_s`` = old
index entries / index rebuild seconds, reported apart; ``lock_seconds`` = how long the apply loop was
held (the final swap).

Units: ``*_ms`` milliseconds, ``*_seconds`` seconds, ``*_per_s`` per second, ratios plain numbers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import duckdb
import psycopg

from ..engine.table.disk_files import write_parquet
from .common import interleaved, med

__all__ = ["run_maintenance_bench"]

QUERIES = {
    "scan": "SELECT count(*) AS n, sum(v) AS sv, max(pad) AS mp FROM {t}",
    "filter": "SELECT count(*) AS n, sum(v) AS sv FROM {t} WHERE k < 50",
}


def _lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _compaction_summary(runs: list[dict]) -> dict:
    """The ``compaction`` section: the policy runs' reports added up, with rates (rows/s, entries/s)."""
    tot = {
        k: sum(r[k] for r in runs)
        for k in (
            "files_in",
            "files_out",
            "rows_in",
            "rows_out",
            "bytes_in",
            "bytes_out",
            "deleted_rows_dropped",
            "index_entries_in",
            "index_entries_out",
            "rewrite_seconds",
            "upload_seconds",
            "index_seconds",
            "commit_seconds",
            "lock_seconds",
            "seconds",
        )
    }
    data_s = tot["rewrite_seconds"] + tot["upload_seconds"]
    return {
        "runs": len(runs),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in tot.items()},
        "rows_per_s": round(tot["rows_in"] / data_s) if data_s else None,
        "index_entries_per_s": round(tot["index_entries_in"] / tot["index_seconds"]) if tot["index_seconds"] else None,
        "rows_per_s_with_index": round(tot["rows_in"] / (data_s + tot["index_seconds"])) if data_s else None,
        "index_share_of_seconds": round(tot["index_seconds"] / tot["seconds"], 4) if tot["seconds"] else None,
    }


def _measure(client, expected: dict, ref: duckdb.DuckDBPyConnection, repeat: int) -> dict:
    """One maintenance state of the scratch table ``bench``: its file/index/delete counts and each query
    of ``QUERIES`` timed through the union read next to the clean Parquet copy ``ref`` (rotated rounds,
    medians of ``repeat``, wall ms and a CPU ratio). Raises ``RuntimeError`` when a union read's answer
    differs from ``expected`` {query: rows}."""
    from ..engine.read import UnionReader

    st = {t["name"]: t for t in client.status()["tables"]}["bench"]
    r = UnionReader(client)
    union, ref_ms, cpu_ratio = {}, {}, {}
    for q, sql in QUERIES.items():
        sql = sql.format(t="bench")
        got = r.query(sql, tables=["bench"])
        if [tuple(x.values()) for x in got.to_pylist()] != expected[q]:
            raise RuntimeError(f"maintenance bench: union read {q} differs from the clean copy")
        # rotated rounds, so both sides see the same machine load; medians, wall and CPU
        cpu: dict = {}
        times, _ = interleaved(
            {"union": lambda: r.query(sql, tables=["bench"]), "clean": lambda: ref.execute(sql).fetchall()},
            repeat,
            cpu=cpu,
        )
        union[q], ref_ms[q] = round(1000 * med(times["union"]), 2), round(1000 * med(times["clean"]), 2)
        cpu_ratio[q] = round(med(cpu["union"]) / med(cpu["clean"]), 2) if med(cpu["clean"]) else None
    return {
        "data_files": st["data_files"],
        "index_blocks": st["index_blocks"],
        "deleted_rows": st["deleted_rows"],
        "live_rows": st["live_rows"],
        "union_ms": union,
        "clean_ms": ref_ms,
        "ratio_vs_clean": {q: round(union[q] / max(ref_ms[q], 1e-3), 2) for q in QUERIES},
        "cpu_ratio_vs_clean": cpu_ratio,
    }


def _sizes(quick: bool) -> tuple[int, int, int, int]:
    """(rows, batches, updates per batch, repetitions) for the run (see ``run_maintenance_bench``)."""
    if os.environ.get("MOONCAKE_BENCH_SIZE") == "tiny":  # the test that keeps the bench from rotting
        return 20_000, 4, 1_000, 2
    if quick:
        return 100_000, 10, 5_000, 5
    return 1_000_000, 20, 25_000, 7


def _maintain(client, states: dict, out: dict, measure) -> list[dict]:
    """Index merge, the compaction policy to its fixpoint, then a full compaction, measuring each state
    into ``states`` and the merge/full-compaction reports into ``out``; returns the policy's runs."""
    merge = client.call("merge_index", table="bench", full=True)
    keys = ("blocks_in", "blocks_out", "entries_in", "entries_out", "dead_entries_dropped", "seconds", "lock_seconds")
    out["index_merge"] = {k: merge.get(k) for k in keys}
    states["index_merge_only"] = measure()
    runs = []
    for _ in range(8):  # the policy, to its fixpoint
        r = client.call("compact", table="bench")
        if not r.get("compacted"):
            break
        runs.append(r)
    states["compacted"] = measure()
    full = client.call("compact", table="bench", full=True)
    fkeys = ("files_in", "files_out", "rows_in", "rows_out", "deleted_rows_dropped", "seconds", "lock_seconds")
    out["full_compaction"] = {k: full.get(k) for k in fkeys}
    states["compacted_full"] = measure()
    return runs


def run_maintenance_bench(settings, quick: bool) -> dict:
    """Run the maintenance benchmark (module docstring) against ``settings``' source Postgres.

    ``quick``: 100k rows, 10 batches of 5k updates, 5 repetitions (well under a minute); otherwise 1M
    rows, 20 batches of 25k updates, 7 repetitions (a few minutes: the updates go through replication);
    ``MOONCAKE_BENCH_SIZE=tiny`` in the environment: 20k rows, 4 batches of 1k updates, 2 repetitions.
    Returns a JSON-serializable dict: ``rows``, ``batches``, ``updates_per_batch``, ``states`` {no_maintenance | index_merge_only | compacted | compacted_full:
    {data_files, index_blocks, deleted_rows, live_rows, union_ms {query: ms}, ratio_vs_clean {query:
    ratio}, cpu_ratio_vs_clean {query: ratio}, clean_ms {query: ms}}}, ``index_merge`` (the merge's report), ``compaction`` (the policy
    runs, see the module docstring), ``full_compaction``, ``ingest_seconds``, ``seconds``.
    Raises ``RuntimeError`` when the scratch service cannot start; scratch state is removed either way.

    The steps share the scratch service, its client, the source table and the clean reference, all
    torn down by the one ``finally``.
    """
    from ..engine.read import UnionReader
    from ..engine.service import ServiceClient
    from ..engine.service.process import start_service, stop_service

    rows, batches, per_batch, repeat = _sizes(quick)
    t_start = time.time()
    dsn = settings.source_dsn()
    tag = uuid.uuid4().hex[:8]
    src = f"mooncake_bench_maint_{tag}"
    scratch = Path(tempfile.mkdtemp(prefix="mooncake-bench-maint-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    # a state directory: mkdtemp makes it 0700, as mooncake wants one
    bs = dataclasses.replace(
        settings,
        state_dir=scratch,
        warehouse=None,
        catalog_uri=None,
        maintenance="dagster",
        extra={**(settings.extra or {}), "maintenance": {"snapshot_retention_s": 0, "retain_snapshots": 1}},
    )
    bs.dsn = dsn
    client = None
    out: dict = {
        "suite": "maintenance",
        "quick": quick,
        "rows": rows,
        "batches": batches,
        "updates_per_batch": per_batch,
        "repeat": repeat,
        "queries": QUERIES,
    }
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f"CREATE TABLE {src} (id bigint PRIMARY KEY, k int NOT NULL, v bigint NOT NULL, pad text)")
            c.execute(f"INSERT INTO {src} SELECT g, g %% 1000, 0, md5(g::text) FROM generate_series(1, %s) g", (rows,))
        start_service(bs)
        client = ServiceClient(bs.socket_path)
        t_ingest = time.perf_counter()
        client.call("create_table", dst="bench", src=f"public.{src}", timeout=3600)
        with psycopg.connect(dsn, autocommit=True) as c:
            for b in range(batches):  # random keys, the same in every run
                c.execute(
                    f"UPDATE {src} SET v = v + 1 WHERE id IN (SELECT (hashint8(g::bigint + %s) & 2147483647) "
                    f"%% %s + 1 FROM generate_series(1, %s) g)",
                    (b * 7919, rows, per_batch),
                )
                client.wait_lsn(_lsn(dsn), timeout=600)
                client.call("persist", table="bench")
        out["ingest_seconds"] = round(time.perf_counter() - t_ingest, 3)

        # the reference: the same rows, once, in a clean Parquet file
        reader = UnionReader(client)
        clean = scratch / "clean.parquet"
        # written by the mirror's own writer (PyArrow, its codec and row groups), not by DuckDB's COPY
        write_parquet(reader.query("SELECT * FROM bench", tables=["bench"], lsn=None), clean)
        ref = duckdb.connect()
        ref.execute(f"CREATE VIEW bench AS SELECT * FROM read_parquet('{clean}')")
        expected = {q: ref.execute(sql.format(t="bench")).fetchall() for q, sql in QUERIES.items()}

        def measure() -> dict:
            return _measure(client, expected, ref, repeat)

        states = {"no_maintenance": measure()}
        runs = _maintain(client, states, out, measure)
        out["states"] = states
        out["compaction"] = _compaction_summary(runs)
        out["seconds"] = round(time.time() - t_start, 2)
        return out
    finally:
        if client is not None:
            try:
                client.call("drop_table", table="bench")
            except Exception:
                pass
            client.close()
        stop_service(bs)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(f"DROP TABLE IF EXISTS {src}")
        except Exception:
            pass
        shutil.rmtree(scratch, ignore_errors=True)
