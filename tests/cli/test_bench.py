"""`mooncake bench` at toy size, through the real command line, so it cannot rot — every figure
is written, and each ratio's two sides read the same rows."""

from __future__ import annotations

import json
import os

import pytest

from mooncake_assets.bench import REQUIRED_KEYS
from mooncake_assets.bench.common import get_path

from ..helpers import make_settings, mooncake


@pytest.mark.slow
def test_tiny_bench_writes_every_figure_and_both_sides_read_the_same_rows(pg_cluster, state_dir, monkeypatch):
    s = make_settings(state_dir, pg_cluster.dsn())
    out = state_dir / "out"
    monkeypatch.setenv("MOONCAKE_BENCH_SIZE", "tiny")
    r = mooncake(s, "bench", "--quick", "--json", str(out / "bench.json"), "--plots", str(out / "plots"), timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["size"] == "tiny" and not doc["errors"], doc.get("tracebacks")
    for key in REQUIRED_KEYS:
        v = get_path(doc, key)
        assert v is not None, key
        if key != "machine":
            assert isinstance(v, (int, float)) and v > 0, (key, v)
    assert doc["missing_keys"] == []
    assert doc["machine"]["cpus"] and doc["machine"]["duckdb"]

    # union read: every side of every ratio read the same rows (count + checksum) and gave the same answer —
    # at the main size every reader but DuckDB's equality-delete read (hours there), on the comparison
    # tables every reader, the DuckDB iceberg_scan reads of both Iceberg tables included
    ur = doc["union_read"]
    readers = {"clean", "union", "anti_join", "equality_deletes_model", "duckdb_iceberg_v3"}
    for sec, expected in (
        (ur, readers),
        (ur["duckdb_iceberg_comparison"], readers | {"duckdb_iceberg_v2_equality_deletes"}),
    ):
        for d in ("d1", "d10", "d30"):
            assert sec["tables"][d]["live_rows"] == sec["rows"]
            for q in ("scan", "filter"):
                ck = sec["check"][d][q]
                sides = {k: (v["rows"], v["checksum"]) for k, v in ck.items() if isinstance(v, dict) and "rows" in v}
                assert set(sides) == expected, (d, q, set(sides))
                assert len(set(sides.values())) == 1, (d, q, sides)
                assert ck["results_equal"], (d, q, ck["results"])
                assert set(ck["results"]) == set(sides)
                assert sides["clean"][0] == (sec["rows"] if q == "scan" else max(sec["rows"] // 1000, 10))
                assert ur[q]["speedup_vs_duckdb_iceberg_equality_deletes"][d] > 0
            # the Flink-style v2 table: one data file and one equality-delete file per commit of 1% of the rows
            fl = sec["tables"][d]["flink_v2"]
            assert fl["equality_delete_files"] == fl["commits"] - 1 == fl["data_files"] - sec["tables"][d]["base_files"]
            assert fl["equality_delete_rows"] > 0 and sec["tables"][d]["mirror_v3"]["delete_files"] > 0
    # the fixed cost per query: the tiny table read alike by every reader timed on it
    for q in ("scan", "filter"):
        sides = {(v["rows"], v["checksum"]) for v in ur["fixed"]["check"][q].values()}
        assert len(ur["fixed"]["check"][q]) == 5 and len(sides) == 1, ur["fixed"]["check"][q]
        assert ur[q]["fixed_ms_per_query"] == ur[q]["fixed_ms_per_query_warm"] > 0
        assert ur[q]["fixed_ms_per_query_cold"] > 0 and ur["fixed"]["cold_equals_warm"][q]
    assert ur["tables"]["d30"]["files_with_deletes"] >= 2 and ur["tables"]["d30"]["pending_deletes"] > 0
    assert ur["tables"]["d30"]["memory_deleted"] >= 0 and ur["tables"]["d30"]["memory_rows"] > 0

    # ingest: our side applied exactly the workload's rows from the WAL pg_recvlogical read to the same end
    for k in ("narrow", "wide", "narrow_large", "wide_large"):
        f = doc["ingest"][k]
        assert f["rows_applied"] == f["rows"] and f["missing_keys"] == 0, (k, f)
        assert f["recvlogical_rows_per_s"] > 0 and f["ratio"] > 0
    ic = doc["initial_copy"]
    assert ic["copied_rows"] == ic["rows"] == ic["source_rows"]

    fr = doc["freshness"]
    assert fr["commits"] == len(fr["latencies_ms"]) > 0 and fr["p50_ms"] <= fr["p99_ms"]
    assert doc["memory"]["buffer_rows"] == doc["memory"]["rows"]

    md = (out / "bench.md").read_text()
    assert "Union read" in md and "Freshness" in md and "Ingest" in md
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert pngs == ["freshness.png", "union_read_ratios.png", "union_read_times.png"]
    assert all((out / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_bench_rejects_unknown_suite(state_dir, tmp_path):
    from mooncake_assets.bench import run_bench
    from mooncake_assets.config import Settings

    assert (
        run_bench(Settings(state_dir=state_dir), suites=["nope"], json_file=tmp_path / "b.json", log=lambda *a: None)
        == 2
    )
    assert not (tmp_path / "b.json").exists()
    assert os.environ.get("MOONCAKE_BENCH_SIZE") in (None, "tiny", "quick", "full")
