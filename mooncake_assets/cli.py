"""The ``mooncake`` command line (DESIGN.md §8)."""
from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .config import Settings, load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Live, queryable Iceberg mirrors of PostgreSQL tables (moonlink design), with union reads "
                       "through DuckDB and Dagster orchestration.")
pg_app = typer.Typer(no_args_is_help=True, help="The embedded local Postgres (wal_level=logical). Its data directory is under /var/tmp, where the "
                                                   "postgres user can reach it; <state>/pg/location records where.")
app.add_typer(pg_app, name="pg")
console = Console()
err = Console(stderr=True)


class Ctx:
    settings: Settings


CTX = Ctx()


def fail(msg: str, code: int = 1):
    from rich.markup import escape  # a message may hold brackets ("[errno 1]") that are not markup

    from .engine.pg.conninfo import scrub, with_password_hint

    err.print(f"[red]error:[/red] {escape(with_password_hint(scrub(msg)))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.callback()
def main_options(
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="State directory (env MOONCAKE_STATE_DIR; default ./.mooncake)"),
    dsn: Optional[str] = typer.Option(None, "--dsn", help="Source Postgres DSN (env MOONCAKE_PG_DSN; default: the embedded local Postgres). Saved without its password: later commands take it from PGPASSWORD, ~/.pgpass (PGPASSFILE), a service= entry or MOONCAKE_PG_DSN"),
    warehouse: Optional[str] = typer.Option(None, "--warehouse", help="Warehouse URI, file:// or s3:// (env MOONCAKE_WAREHOUSE; default file://<state>/warehouse)"),
    catalog_uri: Optional[str] = typer.Option(None, "--catalog-uri", help="Iceberg catalog URI: sqlite:///…, postgresql://…, http(s)://… REST (env MOONCAKE_CATALOG_URI; default sqlite:///<state>/catalog.db)"),
    s3_endpoint: Optional[str] = typer.Option(None, "--s3-endpoint", help="S3 endpoint URL for s3:// warehouses [env MOONCAKE_S3_ENDPOINT or AWS_ENDPOINT_URL; default AWS]"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log more."),
):
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .engine.pg.conninfo import install_log_scrubber

    install_log_scrubber()  # a password this process was given is blanked out of every log line
    CTX.settings = load_settings(state_dir, dsn=dsn, warehouse=warehouse, catalog_uri=catalog_uri, s3_endpoint=s3_endpoint)


def _client(start: bool = True, settings: Settings | None = None):
    from .engine.service import ServiceClient
    from .engine.service.process import start_service

    s = settings or CTX.settings
    if start:
        try:
            start_service(s)
        except Exception as e:
            fail(str(e))
    return ServiceClient(s.socket_path)


def _call(client, action: str, **kw) -> dict:
    from .engine.service import ServiceError

    try:
        return client.call(action, **kw)
    except ServiceError as e:
        fail(str(e))


# ---------------------------------------------------------------------------------------- pg
@pg_app.command("start")
def pg_start():
    """Create (first time) and start the embedded Postgres; prints its DSN. No-op when running."""
    from .engine.pg import EmbeddedPostgres, PostgresNotFound

    try:
        print(EmbeddedPostgres(CTX.settings.state_dir).start())
    except (PostgresNotFound, RuntimeError) as e:
        fail(str(e))


@pg_app.command("stop")
def pg_stop():
    """Stop the embedded Postgres."""
    from .engine.pg import EmbeddedPostgres

    EmbeddedPostgres(CTX.settings.state_dir).stop()


@pg_app.command("dsn")
def pg_dsn():
    """Print the embedded Postgres's DSN."""
    from .engine.pg import EmbeddedPostgres

    try:
        print(EmbeddedPostgres(CTX.settings.state_dir).dsn())
    except RuntimeError as e:
        fail(str(e))


# ---------------------------------------------------------------------------------------- service
@app.command()
def serve(maintenance: str = typer.Option(None, help="auto (flush/persist by policy) or dagster (assets drive it)")):
    """Run the replicator service in the foreground (Ctrl-C stops it)."""
    from .engine.service.flight import serve as _serve

    s = CTX.settings
    if maintenance:
        s.maintenance = maintenance
    logging.getLogger().setLevel(logging.INFO)
    try:
        _serve(s)
    except Exception as e:
        fail(f"the service stopped: {type(e).__name__}: {e}")


@app.command()
def start():
    """Start the replicator service in the background (no-op when it is running)."""
    from .engine.service.process import start_service

    try:
        pid = start_service(CTX.settings)
    except Exception as e:
        fail(str(e))
    console.print(f"mooncake service running (pid {pid}, socket {CTX.settings.socket_path})")


@app.command()
def stop():
    """Stop the background replicator service."""
    from .engine.service.process import stop_service

    if stop_service(CTX.settings):
        console.print("mooncake service stopped")
    else:
        console.print("mooncake service was not running")


@app.command()
def status():
    """Is the service running, and what is it doing."""
    from .engine.service import ServiceClient

    c = ServiceClient(CTX.settings.socket_path)
    if not c.ping():
        console.print("mooncake service: not running")
        raise typer.Exit(3)
    st = c.status()
    console.print(f"mooncake service: running; slot {st['slot']}, applied LSN {st['applied_lsn']}, "
                  f"confirmed LSN {st['confirmed_lsn']}, {len(st['tables'])} table(s)"
                  + (f"; stream error: {st['stream_error']}" if st.get("stream_error") else "")
                  + (f"; {len(st['stream_faults'])} lost stream(s), last at {st['stream_faults'][-1]['at']}: "
                     f"{st['stream_faults'][-1]['error']}" if st.get("stream_faults") else ""))


# ---------------------------------------------------------------------------------------- tables
@app.command("create-table")
def create_table(dst: str = typer.Argument(..., help="Name of the mirror: 1-63 ASCII letters, digits and _, not starting with a digit"),
                 src: str = typer.Argument(..., help="Source table as SQL names it: schema.table or table (search_path); "
                                                     "unquoted parts fold to lower case, quote the others: "
                                                     "'\"Sales Data\".\"Q1 Orders\"', 'public.\"User\"'"),
                 delete_format: str = typer.Option("deletion-vectors", help="deletion-vectors (Iceberg v3) or position-deletes (v2)"),
                 column_type: list[str] = typer.Option(
                     [], "--column-type", metavar="COL=text",
                     help="Mirror column COL as Postgres's exact text output whatever its type (e.g. a numeric(10,2) "
                          "holding 'NaN'); repeatable; recorded with the mirror"),
                 exclude_column: list[str] = typer.Option(
                     [], "--exclude-column", metavar="COL",
                     help="Leave column COL out of the mirror (not a key column); repeatable; recorded with the mirror")):
    """Mirror Postgres table SRC as DST: consistent initial copy, then change data capture.

    Every column type is mirrored: structured where Iceberg has a faithful type (composite → struct,
    hstore → map, PostGIS → WKB), else as Postgres's exact text (ranges, tsvector, geometric types, …;
    one notice lists those columns). See docs/types.md."""
    types: dict[str, str] = {}
    for opt in column_type:
        col, sep, kind = opt.rpartition("=")
        if not sep or not col:
            err.print(f"error: --column-type {opt!r}: expected COL=text")
            raise typer.Exit(2)
        types[col] = kind.strip().lower()
    res = _create_with_progress(_client(), dst, src, delete_format, column_types=types, exclude=list(exclude_column))
    console.print(f"mirrored {res['source']} as {res['table']}: {res['rows']} rows copied at LSN {res['copy_lsn']} "
                  f"in {res['seconds']:.1f}s (key: {', '.join(res['key']) or 'whole row'})")
    if res.get("text_columns"):
        err.print(f"notice: {len(res['text_columns'])} column(s) mirrored as Postgres's exact text output: "
                  + ", ".join(f"{n} ({t})" for n, t in res["text_columns"]) + " (see docs/types.md)",
                  soft_wrap=True, highlight=False, markup=False)


def _create_with_progress(client, dst, src, delete_format="deletion-vectors", quiet=False, column_types=None,
                          exclude=None) -> dict:
    from .engine.service import ServiceClient, ServiceError

    box: dict = {}

    def run():
        try:
            box["res"] = client.call("create_table", dst=dst, src=src, delete_format=delete_format, timeout=3600,
                                     **({"column_types": column_types} if column_types else {}),
                                     **({"exclude": exclude} if exclude else {}))
        except ServiceError as e:
            box["err"] = str(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    poll = ServiceClient(client.socket_path)
    with Progress(TextColumn("copying {task.description}"), BarColumn(), TextColumn("{task.completed:,.0f} rows"),
                  TimeElapsedColumn(), console=err, transient=True, disable=quiet or not err.is_terminal) as prog:
        task = prog.add_task(f"{src} → {dst}", total=None)
        while th.is_alive():
            th.join(0.3)
            try:
                for t in poll.status()["tables"]:
                    if t["name"] == dst and t.get("progress"):
                        p = t["progress"]
                        prog.update(task, completed=p.get("rows", 0), total=max(p.get("total_rows") or 0, p.get("rows", 0)) or None)
            except ServiceError:
                pass
    poll.close()
    if "err" in box:
        fail(box["err"])
    return box["res"]


@app.command("drop-table")
def drop_table(dst: str):
    """Stop mirroring DST and delete its Iceberg table (the slot goes with the last table)."""
    res = _call(_client(), "drop_table", table=dst)
    console.print(f"dropped {dst}" + (" (and the replication slot)" if res.get("slot_dropped") else ""))


@app.command("list-tables")
def list_tables(as_json: bool = typer.Option(False, "--json", help="Machine-readable output")):
    """Per table: LSNs, lag, buffer rows/bytes, files, index blocks, deletion vectors."""
    st = _call(_client(), "status")
    if as_json:
        print(json.dumps({"tables": st["tables"]}, indent=1))
        return
    t = Table(title=f"mirrored tables (applied LSN {st['applied_lsn']})")
    cols = ["name", "source", "state", "applied_lsn", "flush_lsn", "buffer_rows", "data_files", "index_blocks",
            "pending_deletes", "deletion_vectors", "live_rows"]
    for c in cols:
        t.add_column(c.replace("_", " "))
    for row in st["tables"]:
        t.add_row(*[str(row.get(c, "")) for c in cols])
    console.print(t)
    from rich.markup import escape

    for row in st["tables"]:  # what the table view has no room for
        if row.get("error"):
            console.print(f"[red]{escape(row['name'])}:[/red] {escape(str(row['error']))}", highlight=False)
        if row.get("last_schema_change"):
            console.print(f"{escape(row['name'])}: {escape(row['last_schema_change'])}", highlight=False)


@app.command()
def query(sql: str, fmt: str = typer.Option("table", "--format", help="table, csv or json"),
          lsn: Optional[str] = typer.Option(None, help="Read at this LSN instead of the current one")):
    """Union read: run SQL over the mirrors (visible by their DST names), read-your-writes."""
    from .engine.read import UnionReader
    from .engine.service import ServiceError

    try:
        reader = UnionReader(_client(), CTX.settings.source_dsn())
        res = reader.query(sql, lsn=lsn)
    except (ServiceError, TimeoutError) as e:
        fail(str(e))
    except Exception as e:
        fail(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    _print_arrow(res, fmt)
    from rich.markup import escape

    for t in reader.client.status()["tables"]:  # read-your-writes does not hold for a stopped mirror
        if t["name"] in reader.states and t.get("state") == "error":
            err.print(f"[yellow]warning:[/yellow] {escape(t['name'])} is stopped and shows its rows as of LSN "
                      f"{t.get('applied_lsn')}, not the source's latest: {escape(str(t.get('error')))}", highlight=False)


def _print_arrow(res, fmt: str):
    if fmt == "json":
        print(json.dumps(res.to_pylist(), default=str))
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(res, sys.stdout.buffer)
    else:
        t = Table()
        for n in res.column_names:
            t.add_column(n)
        for row in res.to_pylist():
            t.add_row(*["NULL" if v is None else str(v) for v in row.values()])
        console.print(t)


def _maint(op: str, dst: str, **kw):
    res = _call(_client(), op, table=dst, **kw)
    console.print(f"{op.replace('_', '-')} {dst}: " + ", ".join(f"{k}={v}" for k, v in res.items()))


@app.command()
def flush(dst: str):
    """Write DST's in-memory rows to Parquet plus an index block (not yet in Iceberg)."""
    _maint("flush", dst)


@app.command()
def persist(dst: str):
    """Flush, then commit data files, deletion vectors, index and flush LSN to Iceberg in one commit."""
    _maint("persist", dst)


@app.command("merge-index")
def merge_index(dst: str, merge_all: bool = typer.Option(False, "--all", help="Merge even below the policy's block count"),
                as_json: bool = typer.Option(False, "--json", help="Print the result as JSON")):
    """Merge DST's index blocks (k-way merge by hash) when the policy says so (more than 16 blocks by default)."""
    res = _call(_client(), "merge_index", table=dst, full=merge_all)
    if as_json:
        print(json.dumps(res))
    elif not res.get("merged"):
        console.print(f"merge-index {dst}: nothing to merge ({res.get('reason')})")
    else:
        console.print(f"merge-index {dst}: {res['blocks_in']} blocks → 1 ({res['entries_out']:,} entries, "
                      f"{res['dead_entries_dropped']:,} of gone files dropped) in {res['seconds']:.2f}s; "
                      f"{res['blocks_after']} block(s) now")


@app.command()
def compact(dst: str, full: bool = typer.Option(False, "--full", help="Rewrite every file"),
            dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be picked and why"),
            as_json: bool = typer.Option(False, "--json", help="Print the result as JSON")):
    """Rewrite small and half-deleted files of DST (policy: settings.json extra.maintenance, see MaintenancePolicy)."""
    res = _call(_client(), "compact", table=dst, full=full, dry_run=dry_run)
    if as_json:
        print(json.dumps(res))
        return
    if dry_run:
        print(f"compact {dst} --dry-run: {res['picked']} file(s) would be rewritten")
        for c in res.get("checks", []):
            print(f"  check: {c}")
        for f in res.get("files", []):
            print(f"  {f['file']}: {f['rows']:,} rows, {f['deleted']:,} deleted ({f['delete_ratio_percent']}%), "
                  f"{f['bytes']:,} bytes — {'; '.join(f['reasons'])}")
        return
    if not res.get("compacted"):
        console.print(f"compact {dst}: nothing to compact ({'; '.join(res.get('checks', []))})", highlight=False)
        return
    console.print(f"compact {dst}: {res['files_in']} files → {res['files_out']}, rows {res['rows_in']:,} → "
                  f"{res['rows_out']:,} ({res['deleted_rows_dropped']:,} deleted dropped, {res['deletes_remapped']:,} "
                  f"re-mapped), bytes {res['bytes_in']:,} → {res['bytes_out']:,}, index blocks {res['blocks_in']} → "
                  f"{res['blocks_out']}, {res['seconds']:.2f}s (lock held {res['lock_seconds']:.3f}s)", highlight=False)


@app.command()
def verify(tables: Optional[list[str]] = typer.Argument(None, help="Mirrors to check (default: all)"),
           reader: str = typer.Option("union", help="union, pyiceberg or duckdb-iceberg")):
    """Compare each mirror with its source at one LSN; exit 0 only if all match."""
    code = run_verify(tables or None, reader)
    raise typer.Exit(code)


def run_verify(tables, reader: str, settings: Settings | None = None) -> int:
    """Print one line per table and the closing ``verified: K/N tables match at LSN …``; returns the exit code."""
    from .verify import verify as _verify

    settings = settings or CTX.settings
    client = _client(settings=settings) if reader == "union" else None
    try:
        results, lsn = _verify(settings, tables, reader, client)
    except Exception as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    for r in results:
        print(r.line(), flush=True)
    ok = sum(r.match for r in results)
    print(f"verified: {ok}/{len(results)} tables match at LSN {lsn}", flush=True)
    return 0 if ok == len(results) and results else 1


@app.command()
def demo(seconds: int = typer.Option(30, help="How long pgbench runs"),
         scale: int = typer.Option(1, help="pgbench scale factor"),
         clients: int = typer.Option(4, help="pgbench clients"),
         dagster: bool = typer.Option(False, "--dagster", help="Drive maintenance through the Dagster assets"),
         warehouse: Optional[str] = typer.Option(None, "--warehouse", help="Warehouse URI for this demo (same as the global option)"),
         s3_endpoint: Optional[str] = typer.Option(None, "--s3-endpoint", help="S3 endpoint URL for an s3:// warehouse")):
    """End-to-end run on pgbench's tables: mirror, stream a workload, union-read, persist, verify."""
    from .demo import run_demo

    settings = CTX.settings
    if warehouse or s3_endpoint:
        settings = load_settings(settings.state_dir, dsn=settings.dsn, warehouse=warehouse or settings.warehouse,
                                 catalog_uri=settings.catalog_uri, s3_endpoint=s3_endpoint or settings.s3_endpoint)
    raise typer.Exit(run_demo(settings, seconds=seconds, scale=scale, clients=clients, dagster=dagster))


@app.command()
def ui(port: int = typer.Option(3000, help="Webserver port"),
       host: str = typer.Option("127.0.0.1", help="Webserver address (loopback by default)"),
       scale: int = typer.Option(1, help="pgbench scale factor (when its tables are created)"),
       rate: int = typer.Option(20, help="pgbench workload in transactions per second (0: none)"),
       clients: int = typer.Option(2, help="pgbench clients")):
    """Dagster webserver + daemon on the demo tables, with the service and a pgbench workload running."""
    from .ui import run_ui

    raise typer.Exit(run_ui(CTX.settings, host=host, port=port, scale=scale, rate=rate, clients=clients))


@app.command()
def chaos(seed: int = typer.Option(1, "--seed", help="First seed"),
          steps: int = typer.Option(300, "--steps", help="Workload steps per seed"),
          seeds: int = typer.Option(1, "--seeds", help="Number of seeds to run: seed, seed+1, …"),
          phase: int = typer.Option(25, "--phase", help="Steps between verify phases"),
          schema_rate: float = typer.Option(0.0, "--schema-rate", min=0.0, max=1.0,
                                            help="Extra share of steps that are schema changes (ADD/DROP/RENAME "
                                                 "COLUMN, widening), on top of the workload's ~2 %"),
          cases: Optional[Path] = typer.Option(None, "--cases", help="Where failing seeds are written "
                                               "[default: ./tests/cases when it exists, else <state>/chaos-cases]"),
          jitter: bool = typer.Option(False, "--jitter", help="Seeded delays inside the service where timing matters "
                                      "(catalog lookups, the apply loop, persist against a schema switch, the stream "
                                      "of a restarted service): races found on purpose, a failing seed replays by "
                                      "its seed")):
    """Seeded chaos: mixed workloads, maintenance and SIGKILLs of the real service, checked by verify."""
    from .chaos import run_chaos

    cases = cases or (Path("tests/cases") if Path("tests/cases").is_dir() else CTX.settings.state_dir / "chaos-cases")
    dsn = CTX.settings.source_dsn()
    bad = 0
    for s in range(seed, seed + seeds):
        res = run_chaos(s, steps, dsn, cases_dir=cases, phase=phase, log=lambda m: err.print(m, highlight=False),
                        schema_rate=schema_rate, jitter=jitter)
        print(res.line(), flush=True)
        for d in res.divergences[:5]:
            print(f"  divergence: {json.dumps(d)}", flush=True)
        bad += len(res.divergences) > 0
    print(f"chaos: {seeds} seed(s) x {steps} steps: {bad} with divergences", flush=True)
    raise typer.Exit(1 if bad else 0)


@app.command()
def bench(quick: bool = typer.Option(False, "--quick"), json_file: Optional[Path] = typer.Option(None, "--json"),
          plots: Optional[Path] = typer.Option(None, "--plots"),
          suite: Optional[list[str]] = typer.Option(None, "--suite", help="index, maintenance, ingest, freshness, union_read, memory (default: all)")):
    """Benchmarks reported as ratios measured side by side in one run."""
    from .bench import run_bench

    raise typer.Exit(run_bench(CTX.settings, quick=quick, json_file=json_file, plots=plots, suites=suite))


def main():
    app()


if __name__ == "__main__":
    main()
