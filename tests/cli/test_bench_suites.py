"""`mooncake bench` suites one at a time at toy size: the sysbench suite's figures, the ingest suite's
update- and delete-heavy shapes and CPU figures, the suites listed by `bench --help`, and an embedded
Postgres started by the bench stopped at its end."""

from __future__ import annotations

import json
import shutil

import pytest

from mooncake_assets.bench import CHANGES_KEYS, INGEST_KEYS, LARGE_TXN_KEYS, SUITES, SYSBENCH_WORKLOADS, run_bench
from mooncake_assets.bench.common import SIZES
from mooncake_assets.config import Settings

from ..helpers import make_settings, mooncake


def _bench(s, state_dir, monkeypatch, suite: str) -> dict:
    out = state_dir / "out"
    monkeypatch.setenv("MOONCAKE_BENCH_SIZE", "tiny")
    r = mooncake(s, "bench", "--quick", "--suite", suite, "--json", str(out / "bench.json"), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["size"] == "tiny" and doc["suites"] == [suite] and not doc["errors"], doc.get("tracebacks")
    doc["_md"] = (out / "bench.md").read_text()
    return doc


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sysbench") is None, reason="sysbench is not installed (make install installs it)")
def test_sysbench_suite_reports_tps_lag_catch_up_and_a_matching_mirror(pg_cluster, state_dir, monkeypatch):
    doc = _bench(make_settings(state_dir, pg_cluster.dsn()), state_dir, monkeypatch, "sysbench")
    sb = doc["sysbench"]
    for w in SYSBENCH_WORKLOADS:
        f = sb[w]
        assert f["tps"] > 0 and f["transactions"] > 0 and f["threads"] == 4, (w, f)
        assert f["seconds"] == SIZES["tiny"].sysbench_seconds
        assert isinstance(f["max_lag_bytes"], int) and f["max_lag_bytes"] >= 0, (w, f)
        assert f["catch_up_seconds"] > 0 and f["wal_bytes"] > 0, (w, f)
        assert 0 < f["catch_up_apply_seconds"] <= f["catch_up_seconds"], (w, f)
        assert f["lag_samples"] and all(s["durable_lag_bytes"] >= 0 for s in f["lag_samples"])
        for key in ("max_lag_bytes", "catch_up_seconds"):
            t = doc["targets"][f"sysbench.{w}.{key}"]
            assert t["value"] == f[key] and isinstance(t["met"], bool)
    assert sb["oltp_insert"]["rows_after"] > sb["table_rows"]  # the inserts are visible to read-your-writes
    assert sb["verify"]["match"] is True, sb["verify"]
    assert [k for k in doc["missing_keys"] if k.startswith("sysbench.")] == []
    assert "Sysbench" in doc["_md"] and "oltp_update_index" in doc["_md"]


@pytest.mark.slow
def test_ingest_suite_has_every_shape_with_cpu_per_row_from_rotated_rounds(pg_cluster, state_dir, monkeypatch):
    doc = _bench(make_settings(state_dir, pg_cluster.dsn()), state_dir, monkeypatch, "ingest")
    ing, tiny = doc["ingest"], SIZES["tiny"]
    for k in INGEST_KEYS:
        f = ing[k]
        assert f["ratio"] > 0 and f["cpu_us_per_row"] > 0 and f["recvlogical_cpu_us_per_row"] >= 0, (k, f)
        assert f["rounds"] == tiny.ingest_rounds == len(f["per_round"]), (k, f)
        # which consumer reads first alternates per round
        assert [r["first"] for r in f["per_round"]] == ["recvlogical", "ours"][: tiny.ingest_rounds]
        assert f["missing_keys"] == 0, (k, f)
    seed, n = tiny.ingest_seed_rows, ing["updates"]["rows"]
    assert n == ing["deletes"]["rows"] > 0
    # every update found its row (a deletion vector for the flushed one, the new version buffered) …
    assert ing["updates"]["rows_applied"] == n + 1 and ing["updates"]["mirror_live_rows"] == seed + 1
    # … and every delete did; only the sentinel row is buffered
    assert ing["deletes"]["rows_applied"] == 1 and ing["deletes"]["mirror_live_rows"] == seed - n + 1
    assert [k for k in doc["missing_keys"] if k.startswith("ingest.")] == []
    assert "updates" in doc["_md"] and "CPU µs/row" in doc["_md"]


@pytest.mark.slow
def test_memory_suite_times_a_large_update_against_recvlogical(pg_cluster, state_dir, monkeypatch):
    """One UPDATE of every row under a memory budget, applied by a service process: peak RSS (VmHWM),
    seconds per million rows and the ratio to pg_recvlogical on the same WAL, from rotated rounds, and
    the mirror equals Postgres after every round."""
    doc = _bench(make_settings(state_dir, pg_cluster.dsn()), state_dir, monkeypatch, "memory")
    lt, tiny = doc["memory"]["large_txn"], SIZES["tiny"]
    print({k: v for k, v in lt.items() if k != "per_round"}, lt["per_round"])
    for k in LARGE_TXN_KEYS:
        assert lt[k] > 0, (k, lt)
    assert lt["rows"] == tiny.large_txn_rows and lt["memory_limit_bytes"] == tiny.large_txn_memory_limit
    assert lt["rounds"] == tiny.large_txn_rounds == len(lt["per_round"])
    assert [r["first"] for r in lt["per_round"]] == ["recvlogical", "ours"][: tiny.large_txn_rounds]
    for r in lt["per_round"]:
        assert r["seconds"] > 0 and r["recvlogical_seconds"] > 0 and r["cpu_seconds"] > 0, r
        assert r["peak_rss_bytes"] > 0 and r["verify_match"] is True, r
    assert lt["verify_match"] is True
    assert lt["cpu_seconds_per_million_rows"] > 0 and lt["recvlogical_cpu_seconds_per_million_rows"] >= 0
    assert [k for k in doc["missing_keys"] if k.startswith("memory.")] == []
    assert "One UPDATE of" in doc["_md"]


@pytest.mark.slow
def test_changes_suite_times_the_feed_of_one_percent_against_a_full_read(pg_cluster, state_dir, monkeypatch):
    """The change feed between two cuts around 1 % of the rows changed vs a full union read, in rotated
    rounds; every round's feed holds exactly the changed rows (an UPDATE as a delete and an insert)."""
    doc = _bench(make_settings(state_dir, pg_cluster.dsn()), state_dir, monkeypatch, "changes")
    ch, tiny = doc["changes"], SIZES["tiny"]
    print({k: v for k, v in ch.items() if k != "per_round"})
    for k in CHANGES_KEYS:
        assert ch[k] > 0, (k, ch)
    assert ch["ratio_vs_full_read"] == ch["seconds"] / ch["full_read_seconds"]
    assert ch["keys_ratio_vs_full_read"] == ch["keys_seconds"] / ch["full_read_seconds"]
    rows, upd, dele, ins = ch["rows"], ch["updated_rows"], ch["deleted_rows"], ch["inserted_rows"]
    assert rows == tiny.changes_rows and upd + dele + ins == ch["changed_rows"] == rows // 100
    assert upd > 0 and dele > 0 and ins > 0
    assert ch["rounds"] == tiny.changes_rounds == len(ch["per_round"])
    assert [r["first"] for r in ch["per_round"]] == ["changes", "changes_keys", "full_read"][: tiny.changes_rounds]
    for r in ch["per_round"]:
        assert r["changes"]["rows"] == 2 * upd + dele + ins, r
        assert (r["changes"]["inserts"], r["changes"]["deletes"]) == (upd + ins, upd + dele), r
        assert r["full_read"]["rows"] == rows - dele + ins, r
        assert (r["changes_keys"]["rows"], r["changes_keys"]["deletes"]) == (2 * upd + dele + ins, upd + dele), r
        assert r["changes"]["ok"] and r["changes_keys"]["ok"] and r["full_read"]["ok"], r
        for side in ("changes", "changes_keys", "full_read"):
            assert r[side]["seconds"] > 0 and r[side]["cpu_seconds"] > 0, r
    assert ch["check"]["ok"] is True
    t = doc["targets"]["changes.ratio_vs_full_read"]
    assert t["value"] == ch["ratio_vs_full_read"] and isinstance(t["met"], bool)
    assert [k for k in doc["missing_keys"] if k.startswith("changes.")] == []
    assert "## Change feed" in doc["_md"] and "keys_ratio_vs_full_read" in doc["_md"]


def test_bench_help_lists_every_suite(state_dir):
    r = mooncake(Settings(state_dir=state_dir), "bench", "--help", check=True)
    text = " ".join(r.stdout.split())
    for s in SUITES:
        assert s in text, s


@pytest.mark.slow
def test_bench_stops_the_embedded_postgres_it_started(tmp_path):
    from mooncake_assets.engine.pg import EmbeddedPostgres

    state = tmp_path / "state"
    logs: list[str] = []
    try:
        rc = run_bench(
            Settings(state_dir=state), suites=["memory"], size="tiny", json_file=tmp_path / "b.json", log=logs.append
        )
        assert rc == 0, logs
        assert not EmbeddedPostgres(state).is_running()
        assert any("stopped the embedded Postgres" in m for m in logs), logs
    finally:
        EmbeddedPostgres(state).destroy()
