"""The bench's Markdown summary and PNG plots (matplotlib, Agg backend), from the bench JSON document."""

from __future__ import annotations

from pathlib import Path

SHARES = (("d1", 1), ("d10", 10), ("d30", 30))


def _f(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int,)) or (isinstance(v, float) and abs(v) >= 1000):
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _ingest_section(ing: dict) -> list[str]:
    """The ``## Ingest`` table (rows/s ours vs pg_recvlogical)."""
    lines = [
        "## Ingest (rows/s applied vs pg_recvlogical on the same WAL)",
        "",
        "| workload | rows | ours rows/s | pg_recvlogical rows/s | ratio | ours CPU µs/row | pg_recvlogical CPU µs/row |",
        "|---|---|---|---|---|---|---|",
    ]
    what = {
        "narrow": "narrow inserts, 10-row transactions",
        "wide": "wide inserts, 10-row transactions",
        "narrow_large": "narrow inserts, one streamed transaction",
        "wide_large": "wide inserts, one streamed transaction",
        "updates": "narrow updates of flushed rows, 10 per transaction",
        "deletes": "narrow deletes of flushed rows, 10 per transaction",
    }
    rounds = None
    for k, label in what.items():
        v = ing.get(k)
        if v:
            rounds = v.get("rounds", rounds)
            lines.append(
                f"| {k} ({label}) | {_f(v['rows'])} | {_f(v['rows_per_s'])} | {_f(v['recvlogical_rows_per_s'])} | "
                f"{_f(v['ratio'])} | {_f(v.get('cpu_us_per_row'))} | {_f(v.get('recvlogical_cpu_us_per_row'))} |"
            )
    lines += [
        "",
        f"Medians of {rounds or 1} rotated round(s). CPU: this process's CPU time (the apply loop) per row, "
        "pg_recvlogical's (user + system) per row; the walsenders' is on neither side.",
        "",
        f"Both consumers: {ing.get('protocol')}, logical_decoding_work_mem {ing.get('logical_decoding_work_mem')}.",
        "",
    ]
    return lines


def _sysbench_section(sb: dict) -> list[str]:
    """The ``## Sysbench`` table (tps, replication lag, catch-up) and the verify outcome."""
    lines = [
        "## Sysbench (replication lag under load, catch-up after it)",
        "",
        f"sysbench 1.0, pgsql driver, one table of {_f(sb.get('table_rows'))} rows mirrored by a running service "
        "(maintenance auto); lag = `pg_current_wal_lsn() - write_lsn` of the service's slot "
        "(`pg_stat_replication`), sampled once a second; catch-up = from sysbench's exit until a read-your-writes "
        "union read answers. Targets: lag ≤ 16 MiB, catch-up ≤ 1 s.",
        "",
        "| workload | threads × s | tps | max lag MiB | max durable lag MiB | catch-up s | WAL MiB |",
        "|---|---|---|---|---|---|---|",
    ]

    def mib(v):
        return _f(None if v is None else v / 2**20)

    for w, v in sb.items():
        if isinstance(v, dict) and "tps" in v:
            lines.append(
                f"| {w} | {v.get('threads')} × {v.get('seconds')} | {_f(v['tps'])} | {mib(v.get('max_lag_bytes'))} | "
                f"{mib(v.get('max_durable_lag_bytes'))} | {_f(v.get('catch_up_seconds'))} | {mib(v.get('wal_bytes'))} |"
            )
    vf = sb.get("verify")
    if vf:
        lines += ["", f"verify (union reader) at LSN {vf.get('lsn')}: {'; '.join(vf.get('tables', []))}."]
    return lines + [""]


#: (reader, line style, colour) of the read-time plot: one of each per reader (by name, so a reader added
#: to :data:`_SHORT` does not shift the others' lines onto each other's)
_LINES = (
    ("clean", ".-", "black"),
    ("union", "o-", "tab:blue"),
    ("union_cold", "o:", "tab:cyan"),
    ("anti_join", "s--", "tab:orange"),
    ("equality_deletes_model", "v:", "tab:green"),
    ("duckdb_iceberg_v2_equality_deletes", "^-", "tab:red"),
    ("duckdb_iceberg_v3", "D-", "tab:purple"),
)
_SHORT = {
    "clean": "clean",
    "union": "union",
    "union_cold": "union (new reader per query)",
    "anti_join": "anti join",
    "equality_deletes_model": "eq. model",
    "duckdb_iceberg_v2_equality_deletes": "DuckDB v2 eq.",
    "duckdb_iceberg_v3": "DuckDB v3",
}


def _same_rows(ck: dict) -> bool:
    sides = {(v["rows"], v["checksum"]) for v in ck.values() if isinstance(v, dict) and "rows" in v}
    return bool(ck.get("results_equal")) and len(sides) == 1


def _union_read_table(ur: dict, sec_root: dict, readers: list[str], ratio_key: str, ratio_label: str) -> list[str]:
    """One table of median ms per reader, query and delete share, with the union/clean and one more ratio."""
    shown = [
        r
        for r in readers
        if any(r in s for q in ("scan", "filter") for s in sec_root.get(q, {}).get("seconds", {}).values())
    ]
    lines = [
        "| query | deletes | "
        + " | ".join(f"{_SHORT[r]} ms" for r in shown)
        + f" | union / clean (CPU) | {ratio_label} | eq. model / union | rows & checksums equal |",
        "|---|---|" + "---|" * len(shown) + "---|---|---|---|",
    ]
    for q in ("scan", "filter"):
        sec = sec_root.get(q, {})
        for d, pct in SHARES:
            s = sec.get("seconds", {}).get(d)
            if not s:
                continue
            ck = sec_root.get("check", {}).get(d, {}).get(q, {})
            ms = " | ".join(f"{s[r] * 1000:.1f}" if r in s else "—" for r in shown)
            lines.append(
                f"| {q} | {pct}% | {ms} | {_f(sec['ratio_vs_clean'][d])} ({_f(sec.get('cpu_ratio_vs_clean', {}).get(d))}) | "
                f"{_f(sec.get(ratio_key, {}).get(d))} | {_f(sec.get('speedup_vs_equality_deletes_model', {}).get(d))} | "
                f"{'yes' if _same_rows(ck) else '**NO**'} |"
            )
    return lines + [""]


def _identity_full_sentence(full: dict) -> str:
    """The change feed of the same table with REPLICA IDENTITY FULL (deleted rows from the delete logs)."""
    if not full:
        return ""
    src = full.get("sources") or {}
    return (
        f"The same table and changes with `REPLICA IDENTITY FULL` at the source (deleted rows from the delete "
        f"logs: {_f(src.get('rows_logged'))} logged, {_f(src.get('rows_read'))} read from data files): "
        f"{_f(None if full.get('seconds') is None else full['seconds'] * 1000)} ms, "
        f"`identity_full.ratio_vs_full_read` **{_f(full.get('ratio_vs_full_read'))}** "
        f"(CPU {_f(full.get('cpu_ratio_vs_full_read'))}). "
    )


def _changes_section(ch: dict) -> list[str]:
    """The ``## Change feed`` paragraph: the feed of 1 % of a table vs a full union read of it."""
    ms = lambda v: _f(None if v is None else v * 1000)
    return [
        f"## Change feed (the changes of 1% of a {_f(ch.get('rows'))}-row table vs a full union read)",
        "",
        f"{_f(ch.get('changed_rows'))} rows changed between two consistent cuts ({_f(ch.get('updated_rows'))} "
        f"updated, {_f(ch.get('deleted_rows'))} deleted, {_f(ch.get('inserted_rows'))} inserted); "
        f"`ServiceClient.changes` returned {_f(ch.get('feed_rows'))} rows in {ms(ch.get('seconds'))} ms "
        f"(CPU {ms(ch.get('cpu_seconds'))} ms), a union read `SELECT *` of the table's "
        f"{_f(ch.get('full_read_rows'))} rows took {ms(ch.get('full_read_seconds'))} ms "
        f"(CPU {ms(ch.get('full_read_cpu_seconds'))} ms): `ratio_vs_full_read` **{_f(ch.get('ratio_vs_full_read'))}** "
        f"(CPU {_f(ch.get('cpu_ratio_vs_full_read'))}; target ≤ 0.05). With deletes as keys "
        f'(`deletes="keys"`) the feed took {ms(ch.get("keys_seconds"))} ms (CPU {ms(ch.get("keys_cpu_seconds"))} ms): '
        f"`keys_ratio_vs_full_read` **{_f(ch.get('keys_ratio_vs_full_read'))}** "
        f"(CPU {_f(ch.get('keys_cpu_ratio_vs_full_read'))}). "
        + _identity_full_sentence(ch.get("identity_full") or {})
        + f"Medians of {ch.get('rounds')} rotated rounds; "
        f"CPU = this process + the service process; row counts as expected in every round: "
        f"{'yes' if (ch.get('check') or {}).get('ok') else '**NO**'}.",
        "",
    ]


def _union_read_section(ur: dict) -> list[str]:
    """The ``## Union read`` tables: per query and delete share the readers' median ms and the ratios, at
    the main size and on the DuckDB-iceberg comparison tables; the fixed cost per query."""
    names = ur.get("readers") or {}
    readers = [r for r in (names or _SHORT) if r in _SHORT]
    lines = [
        f"## Union read ({_f(ur['rows'])} live rows, {ur.get('rounds')} rotated rounds, medians)",
        "",
        f"scan: `{ur['queries']['scan']}`; filter: `{ur['queries']['filter']}`. Readers: "
        + "; ".join(f"**{_SHORT[r]}** = {names[r]}" for r in readers if r in names)
        + ".",
        "",
    ]
    lines += _union_read_table(ur, ur, readers, "duckdb_iceberg_v3_ratio_vs_clean", "DuckDB v3 / clean")
    comp = ur.get("duckdb_iceberg_comparison")
    if comp:
        lines += [
            f"DuckDB `iceberg_scan` on the Flink-style v2 table (equality deletes) vs on our v3 table — the "
            f"comparison users make — at {_f(comp['rows'])} rows ({comp.get('rounds')} rounds; the v2 read's cost "
            "grows with rows × deletes, so it is not timed at the size above):",
            "",
        ]
        lines += _union_read_table(
            ur, comp, readers, "speedup_vs_duckdb_iceberg_equality_deletes", "**DuckDB v2 eq. / DuckDB v3**"
        )
    fixed = ur.get("fixed")
    if fixed:
        lines += [
            f"Fixed cost per query ({_f(fixed['rows'])}-row table, {fixed['rounds']} rounds, median ms): "
            + "; ".join(
                f"{q}: "
                + ", ".join(
                    f"{_SHORT.get(r, r)} {_f(v)}" for r, v in ur[q].get("fixed_ms_per_query_by_reader", {}).items()
                )
                for q in ("scan", "filter")
                if q in ur
            )
            + ".",
            "",
        ]
    return lines


def write_markdown(doc: dict, path: Path, plots: list[Path] | None = None, base: Path | None = None) -> None:
    m = doc.get("machine", {})
    lines = [
        f"# mooncake bench ({doc.get('size')})",
        "",
        f"Started {doc.get('started')}, {doc.get('seconds', {}).get('total', '?')} s in all. Machine: "
        f"{m.get('cpu_model', '?')}, {m.get('cpus')} CPUs, {(m.get('mem_total_bytes') or 0) / 2**30:.0f} GiB, "
        f"load average {_f(m.get('loadavg_at_start'))} at start; Python {m.get('python')}, DuckDB {m.get('duckdb')}, "
        f"PyArrow {m.get('pyarrow')}, Postgres {m.get('postgres', '?')}.",
        "",
        "Every figure was measured in the same run as its reference, interleaved (medians of rounds).",
        "",
    ]
    if doc.get("targets"):
        lines += ["## Targets", "", "| target | value | met |", "|---|---|---|"]
        for k, t in doc["targets"].items():
            lines.append(f"| {t['what']} (`{k}`) | {_f(t['value'])} | {'yes' if t['met'] else '**no**'} |")
        lines.append("")
    if doc.get("ingest"):
        lines += _ingest_section(doc["ingest"])
    ic = doc.get("initial_copy")
    if ic:
        lines += [
            "## Initial copy",
            "",
            f"{_f(ic['rows'])} rows: ours {_f(ic['rows_per_s'])} rows/s ({_f(ic['mb_per_s'])} MB/s of heap) — "
            f"{ic.get('what_ours_includes')}; reference {ic.get('reference')}: {_f(ic['psql_rows_per_s'])} rows/s "
            f"({_f(ic['psql_mb_per_s'])} MB/s); ratio {_f(ic['ratio'])}. Server-side `COPY … TO '/dev/null'`: "
            f"{_f(ic['server_dev_null_rows_per_s'])} rows/s.",
            "",
        ]
    fr = doc.get("freshness")
    if fr:
        lines += [
            "## Freshness (commit → visible in a union read)",
            "",
            f"{fr['commits']} single-row commits under pgbench {fr['background_load']['pgbench']} "
            f"({_f(fr['background_load'].get('tps'))} tps): p50 {_f(fr['p50_ms'])} ms, p90 {_f(fr['p90_ms'])} ms, "
            f"p99 {_f(fr['p99_ms'])} ms, max {_f(fr['max_ms'])} ms.",
            "",
        ]
    if doc.get("sysbench"):
        lines += _sysbench_section(doc["sysbench"])
    if doc.get("union_read"):
        lines += _union_read_section(doc["union_read"])
    if doc.get("changes"):
        lines += _changes_section(doc["changes"])
    mt = doc.get("maintenance")
    if mt:
        lines += ["## Maintenance", "", "```", _short_json(mt), "```", ""]
    mem = doc.get("memory")
    if mem:
        lines += [
            "## Memory",
            "",
            f"Service peak RSS per million buffered rows: {_f(mem.get('service_rss_bytes_per_million_rows', 0) / 1e6)} MB "
            f"({_f(mem.get('rows'))} rows buffered; MemSlice reports {_f(mem.get('buffer_bytes_per_row') or 0)} bytes/row). "
            f"Index: {_f(mem.get('index_bytes_per_row'))} bytes per row on disk.",
            "",
        ]
        lt = mem.get("large_txn")
        if lt:
            lines += [
                f"One UPDATE of {_f(lt.get('rows'))} rows under a {_f((lt.get('memory_limit_bytes') or 0) / 2**20)} MiB "
                f"budget: peak RSS {_f((lt.get('peak_rss_bytes') or 0) / 2**20)} MiB, "
                f"{_f(lt.get('seconds_per_million_rows'))} s per million rows (pg_recvlogical "
                f"{_f(lt.get('recvlogical_seconds_per_million_rows'))}), ratio {_f(lt.get('ratio'))}; CPU s per "
                f"million rows {_f(lt.get('cpu_seconds_per_million_rows'))} "
                f"({_f(lt.get('recvlogical_cpu_seconds_per_million_rows'))}); spilled {lt.get('spilled')}, "
                f"mirror matches {lt.get('verify_match')}.",
                "",
            ]
    ix = doc.get("index")
    if ix and "skipped" not in ix:
        lines += [
            "## Index",
            "",
            "| entries | bytes/entry | batched lookup ns (merged) | dict ns | merge entries/s |",
            "|---|---|---|---|---|",
        ]
        for n, v in ix.items():
            if isinstance(v, dict):
                lines.append(
                    f"| {_f(int(n))} | {_f(v.get('bytes_per_entry'))} | {_f(v.get('lookup_ns_batched_merged'))} | "
                    f"{_f(v.get('lookup_ns_dict'))} | {_f(v.get('merge_entries_per_s'))} |"
                )
        lines.append("")
    if doc.get("errors"):
        lines += ["## Errors", ""] + [f"- {k}: {v}" for k, v in doc["errors"].items()] + [""]
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            rel = p.relative_to(base) if base and p.is_relative_to(base) else p
            lines.append(f"![{p.stem}]({rel})")
        lines.append("")
    path.write_text("\n".join(lines))


def _short_json(d, limit: int = 4000) -> str:
    import json

    def prune(x):
        if isinstance(x, dict):
            return {k: prune(v) for k, v in x.items() if not (isinstance(v, list) and len(v) > 8)}
        if isinstance(x, float):
            return float(f"{x:.4g}")
        return x

    s = json.dumps(prune(d), indent=1, default=str)
    return s if len(s) <= limit else s[:limit] + "\n…"


def write_plots(doc: dict, out_dir: Path) -> list[Path]:
    """Freshness distribution and read ratios against delete share; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fr = doc.get("freshness")
    if fr and fr.get("latencies_ms"):
        import numpy as np

        ms = np.sort(np.array(fr["latencies_ms"]))
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.hist(ms, bins=min(40, max(5, len(ms) // 5)), color="#3b7dd8")
        a.set_xlabel("commit → visible (ms)")
        a.set_ylabel("commits")
        a.set_title("Freshness distribution")
        b.plot(ms, np.arange(1, len(ms) + 1) / len(ms), color="#3b7dd8")
        for p, st in ((50, "--"), (99, ":")):
            b.axvline(fr[f"p{p}_ms"], linestyle=st, color="gray", label=f"p{p} {fr[f'p{p}_ms']:.0f} ms")
        b.set_xlabel("commit → visible (ms)")
        b.set_ylabel("share of commits")
        b.set_title("Freshness CDF")
        b.legend()
        fig.tight_layout()
        p = out_dir / "freshness.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    ur = doc.get("union_read")
    if ur and ur.get("scan", {}).get("ratio_vs_clean"):
        written.append(_union_read_ratio_plot(plt, ur, out_dir / "union_read_ratios.png"))
        written.append(_union_read_time_plot(plt, ur, out_dir / "union_read_times.png"))
    return written


def _shares(sec: dict, key: str) -> tuple[list[int], list[str]]:
    ds = [d for d, _ in SHARES if d in sec.get(key, {})]
    return [pct for d, pct in SHARES if d in ds], ds


def _sections(ur: dict) -> list[tuple[str, dict]]:
    """(title, section) of the main tables and, when measured, the DuckDB-iceberg comparison tables."""
    out = [(f"{_f(ur.get('rows'))} rows", ur)]
    comp = ur.get("duckdb_iceberg_comparison")
    if comp and comp.get("scan"):
        out.append((f"{_f(comp.get('rows'))} rows, with the Flink v2 table", comp))
    return out


def _union_read_ratio_plot(plt, ur: dict, path: Path) -> Path:
    """Each reader's time ÷ the clean copy's against the delete share (log scale): scan and filter, one
    row of plots per table size."""
    secs = _sections(ur)
    fig, axes = plt.subplots(len(secs), 2, figsize=(11, 4.2 * len(secs)), squeeze=False)
    for row, (title, root) in zip(axes, secs):
        for ax, q in zip(row, ("scan", "filter")):
            sec = root.get(q, {})
            xs, ds = _shares(sec, "ratio_vs_clean")
            for key, label, style in (
                ("ratio_vs_clean", "mooncake union read (DVs)", "o-"),
                ("anti_join_ratio_vs_clean", "union read, anti join per file", "s--"),
                ("duckdb_iceberg_v3_ratio_vs_clean", "DuckDB iceberg_scan, our v3 table", "D-"),
                ("duckdb_iceberg_v2_ratio_vs_clean", "DuckDB iceberg_scan, Flink v2 equality deletes", "^-"),
                ("equality_deletes_model_ratio_vs_clean", "equality-delete model (engine-optimal)", "v:"),
            ):
                if key in sec:
                    ax.plot(xs, [sec[key][d] for d in ds], style, label=label)
            ax.axhline(1.0, color="gray", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_xlabel("rows deleted (%)")
            ax.set_ylabel("time ÷ clean Parquet (log, lower is better)")
            ax.set_title(f"{q}, {title}")
            ax.set_xticks(xs)
            ax.grid(alpha=0.3, which="both")
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _union_read_time_plot(plt, ur: dict, path: Path) -> Path:
    """Each reader's median read time (ms, log scale) against the delete share: scan and filter, one row
    of plots per table size; the union read's fixed cost per query as a dotted line."""
    secs = _sections(ur)
    names = ur.get("readers") or {r: r for r in _SHORT}
    styles, colors = {}, {}
    for r, style, color in _LINES:
        styles[r], colors[r] = style, color
    fig, axes = plt.subplots(len(secs), 2, figsize=(11, 4.2 * len(secs)), squeeze=False)
    for row, (title, root) in zip(axes, secs):
        for ax, q in zip(row, ("scan", "filter")):
            sec = root.get(q, {})
            xs, ds = _shares(sec, "seconds")
            for r in names:
                ys = [sec["seconds"][d].get(r) for d in ds]
                if ys and all(y is not None for y in ys):
                    ax.plot(xs, [1000 * y for y in ys], styles.get(r, "o-"), color=colors.get(r), label=names[r])
            fixed = ur.get(q, {}).get("fixed_ms_per_query")
            if fixed:
                ax.axhline(fixed, color="gray", linestyle=":", linewidth=0.8, label="union read, fixed cost per query")
            ax.set_yscale("log")
            ax.set_xlabel("rows deleted (%)")
            ax.set_ylabel("median read time (ms, log scale)")
            ax.set_title(f"{q}, {title}")
            ax.set_xticks(xs)
            ax.grid(alpha=0.3, which="both")
        row[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
