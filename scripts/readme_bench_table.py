"""Print the README's benchmark table from one ``mooncake bench`` JSON (every figure from that run).

Usage: ``.venv/bin/python scripts/readme_bench_table.py bench.json > table.md`` — the header line names
the run (date, size, seconds, machine, load average at its start); paste the table into README.md's
"Benchmarks" section. A figure the run did not measure prints as ``n/a``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from mooncake_assets.bench.common import get_path as get

D = ("d1", "d10", "d30")
SHAPES = ("narrow", "wide", "narrow_large", "wide_large")


def f(v: Any, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}" if abs(v) < 100 else f"{v:,.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def met(doc: dict, key: str) -> str:
    t = doc.get("targets", {}).get(key)
    if not t or t["value"] is None:
        return ""
    return " (met)" if t["met"] else " (**not met**)"


def table(doc: dict) -> str:
    m = doc["machine"]
    ur = doc.get("union_read", {})
    rows: list[tuple[str, str, str]] = []
    ing = [f(get(doc, f"ingest.{k}.ratio")) for k in SHAPES]
    rows.append(
        (
            "ingest, ours / pg_recvlogical rows/s (medians of rotated rounds), narrow · wide · narrow_large · wide_large",
            " · ".join(ing),
            "≥ 0.8 each" + ("" if all(met(doc, f"ingest.{k}.ratio") == " (met)" for k in SHAPES) else " (not all met)"),
        )
    )
    rows.append(
        (
            "the same, update-heavy · delete-heavy",
            f"{f(get(doc, 'ingest.updates.ratio'))} · {f(get(doc, 'ingest.deletes.ratio'))}",
            "≥ 0.8 each",
        )
    )
    cpu = " · ".join(
        f"{f(get(doc, f'ingest.{k}.cpu_us_per_row'), 1)} ({f(get(doc, f'ingest.{k}.recvlogical_cpu_us_per_row'), 1)})"
        for k in (*SHAPES, "updates", "deletes")
    )
    rows.append(("ingest CPU µs/row, ours (pg_recvlogical), the six shapes in that order", cpu, ""))
    ic = doc.get("initial_copy", {})
    rows.append(
        (
            f"initial copy, {f(ic.get('rows'))} rows on {f(ic.get('copy_parallel'))} connections, ours / `psql COPY TO STDOUT` rows/s",
            f"{f(ic.get('rows_per_s'))} / {f(ic.get('psql_rows_per_s'))} = **{f(ic.get('ratio'))}**",
            "≥ 0.5" + met(doc, "initial_copy.ratio"),
        )
    )
    rows.append(
        (
            "freshness, commit → visible in a union read (under pgbench)",
            f"p50 {f(get(doc, 'freshness.p50_ms'), 0)} ms, p99 **{f(get(doc, 'freshness.p99_ms'), 0)} ms**",
            "p99 ≤ 1 s" + met(doc, "freshness.p99_ms"),
        )
    )
    for q, what in (("scan", "scan"), ("filter", "selective filter (0.1 % of the keys)")):
        wall = " · ".join(f(get(ur, f"{q}.ratio_vs_clean.{d}")) for d in D)
        cpu = " · ".join(f(get(ur, f"{q}.cpu_ratio_vs_clean.{d}")) for d in D)
        target = "CPU ≤ 1.3 at 1 %, ≤ 1.6 at 10 %" if q == "scan" else ""
        if q == "scan":
            ok = [met(doc, f"union_read.scan.cpu_ratio_vs_clean.{d}") for d in ("d1", "d10")]
            target += " (met)" if ok == [" (met)", " (met)"] else " (**not met**)"
        rows.append(
            (
                f"union read {what} / clean Parquet, 1 % · 10 % · 30 % deleted ({f(ur.get('rows'))} rows): wall (CPU)",
                f"{wall} (CPU **{cpu}**)",
                target,
            )
        )
    for q in ("scan", "filter"):
        rows.append(
            (
                f"union read {q}, fixed cost per query (1,000-row table): warm long-lived reader · clean Parquet · a cold reader per query",
                f"{f(get(ur, f'{q}.fixed_ms_per_query_warm'))} · {f(get(ur, f'{q}.fixed_ms_per_query_by_reader.clean'))} · "
                f"{f(get(ur, f'{q}.fixed_ms_per_query_cold'), 0)} ms",
                "≤ 2 ms warm" + met(doc, f"union_read.{q}.fixed_ms_per_query_warm"),
            )
        )
    ice = get(ur, "duckdb_iceberg_comparison.rows")
    for q in ("scan", "filter"):
        rows.append(
            (
                f"DuckDB `iceberg_scan`: Flink-style v2 table (equality deletes) ÷ our v3 table, {q}, 1 % · 10 % · 30 % ({f(ice)} rows)",
                " · ".join(f(get(ur, f"{q}.speedup_vs_duckdb_iceberg_equality_deletes.{d}"), 1) for d in D),
                ("≥ 50 at 10 %" + met(doc, "union_read.scan.speedup_vs_duckdb_iceberg_equality_deletes.d10"))
                if q == "scan"
                else "",
            )
        )
    rows.append(
        (
            f"union read vs DuckDB `iceberg_scan` on the Flink-style v2 table, scan ({f(ice)} rows): times faster",
            " · ".join(f(get(ur, f"scan.union_speedup_vs_duckdb_iceberg_equality_deletes.{d}"), 1) for d in D),
            "",
        )
    )
    rows.append(
        (
            f"union read vs an engine-optimal equality-delete model (one hash anti join on key and sequence number), scan ({f(ur.get('rows'))} rows): times faster",
            " · ".join(f(get(ur, f"scan.speedup_vs_equality_deletes_model.{d}"), 1) for d in D),
            "",
        )
    )
    ch = doc.get("changes", {})
    rows.append(
        (
            f"change feed of 1 % of a {f(ch.get('rows'))}-row table ÷ a full union read of it: full rows (default replica identity) · "
            "deletes as keys · full rows, REPLICA IDENTITY FULL (CPU)",
            f"{f(ch.get('ratio_vs_full_read'), 3)} · {f(ch.get('keys_ratio_vs_full_read'), 3)} · "
            f"{f(get(ch, 'identity_full.ratio_vs_full_read'), 3)} (CPU {f(ch.get('cpu_ratio_vs_full_read'), 3)} · "
            f"{f(ch.get('keys_cpu_ratio_vs_full_read'), 3)} · {f(get(ch, 'identity_full.cpu_ratio_vs_full_read'), 3)})",
            "≤ 0.05" + met(doc, "changes.ratio_vs_full_read"),
        )
    )
    mem = doc.get("memory", {})
    per_m = mem.get("service_rss_bytes_per_million_rows")
    rows.append(
        (
            f"service memory per million buffered rows ({f(mem.get('rows'))} rows; the buffer itself 100 B/row)",
            f"**{f(per_m / 1e6 if per_m else None, 0)} MB**",
            "≤ 150 MB" + met(doc, "memory.service_rss_bytes_per_million_rows"),
        )
    )
    lt = mem.get("large_txn", {})
    lim = lt.get("memory_limit_bytes")
    rows.append(
        (
            f"one UPDATE of {f(lt.get('rows'))} rows in one transaction under `--memory-limit {f(lim >> 20 if lim else None)}MiB`: "
            "peak RSS, s per million rows (pg_recvlogical)",
            f"{f(lt['peak_rss_bytes'] / 2**20 if lt.get('peak_rss_bytes') else None, 0)} MiB, "
            f"{f(lt.get('seconds_per_million_rows'), 1)} s ({f(lt.get('recvlogical_seconds_per_million_rows'), 1)} s), "
            f"spilled {f(lt.get('spilled'))}, mirror matches: {lt.get('verify_match')}",
            "",
        )
    )
    rows.append(("index size", f"{f(mem.get('index_bytes_per_row'), 1)} bytes per row", ""))
    for w in ("oltp_update_index", "oltp_insert"):
        s = get(doc, f"sysbench.{w}") or {}
        lag = s.get("max_lag_bytes")
        rows.append(
            (
                f"sysbench `{w}`, {f(s.get('threads'))} threads × {f(s.get('seconds'))} s: tps, max lag, catch-up to a read-your-writes answer",
                f"{f(s.get('tps'), 0)} tps, {f(lag / 2**20 if lag is not None else None)} MiB, **{f(s.get('catch_up_seconds'))} s**",
                "lag ≤ 16 MiB, catch-up ≤ 1 s"
                + (
                    " (met)"
                    if met(doc, f"sysbench.{w}.max_lag_bytes") == met(doc, f"sysbench.{w}.catch_up_seconds") == " (met)"
                    else " (**not met**)"
                ),
            )
        )
    head = (
        f"One `mooncake bench` run ({doc.get('size')} size, suites {', '.join(doc.get('suites', []))}): "
        f"{doc.get('started')}, {f(get(doc, 'seconds.total'), 0)} s, {m.get('cpu_model')}, {m.get('cpus')} CPUs, "
        f"{f(m.get('mem_total_bytes', 0) / 2**30, 0)} GiB, load average {f(m.get('loadavg_at_start'))} at start, "
        f"Python {m.get('python')}, DuckDB {m.get('duckdb')}, PyArrow {m.get('pyarrow')}, PostgreSQL {m.get('postgres')}.\n\n"
    )
    out = ["| figure | value | target |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return head + "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(json.loads(open(sys.argv[1]).read())))
