"""The ``mooncake`` command line (docs/architecture.md#command-line)."""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from .commands import CTX, call, console, create_with_progress, err, fail, n_rows, run_verify
from .commands import service_client as _service_client
from .config import Settings, load_settings
from .help_format import PlainCommand, PlainGroup

app = typer.Typer(
    cls=PlainGroup,  # --help names parameters as command-line tools do (help_format.py)
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Live, queryable Iceberg mirrors of PostgreSQL tables (moonlink design), with union reads "
    "through DuckDB and Dagster orchestration.",
)
pg_app = typer.Typer(
    cls=PlainGroup,
    no_args_is_help=True,
    help="The embedded local Postgres (wal_level=logical). Its data directory is under /var/tmp, where the "
    "postgres user can reach it; <state>/pg/location records where.",
)
app.add_typer(pg_app, name="pg")


@app.callback()
def main_options(
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="State directory (env MOONCAKE_STATE_DIR; default ./.mooncake)"
    ),
    dsn: str | None = typer.Option(
        None,
        "--dsn",
        help="Source Postgres DSN (env MOONCAKE_PG_DSN; default: the embedded local Postgres). Saved without its password: later commands take it from PGPASSWORD, ~/.pgpass (PGPASSFILE), a service= entry or MOONCAKE_PG_DSN",
    ),
    warehouse: str | None = typer.Option(
        None,
        "--warehouse",
        help="Warehouse URI: file://, s3://, gs://, abfs:// or az:// (env MOONCAKE_WAREHOUSE; default file://<state>/warehouse; credentials: docs/storage.md)",
    ),
    catalog_uri: str | None = typer.Option(
        None,
        "--catalog-uri",
        help="Iceberg catalog URI: sqlite:///…, postgresql://…, http(s)://… REST (env MOONCAKE_CATALOG_URI; default sqlite:///<state>/catalog.db)",
    ),
    publication: str | None = typer.Option(
        None,
        "--publication",
        help="Use this publication, created by an administrator "
        "(FOR TABLE …, FOR TABLES IN SCHEMA …, FOR ALL TABLES), instead of the "
        "service's own; mooncake never alters it (env MOONCAKE_PUBLICATION)",
    ),
    s3_endpoint: str | None = typer.Option(
        None,
        "--s3-endpoint",
        help="S3 endpoint URL for s3:// warehouses \\[env MOONCAKE_S3_ENDPOINT or AWS_ENDPOINT_URL; default AWS]",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        metavar="FILE",
        help="Sources file (env MOONCAKE_CONFIG; default ./mooncake.yaml when no --state-dir is given): "
        "several sources, each its own state directory (docs/sources.md)",
    ),
    source: str | None = typer.Option(
        None,
        "--source",
        metavar="NAME",
        help="The source of the sources file a command works on (before the command: mooncake --source NAME sync)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log more."),
):
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from .engine.pg.conninfo import install_log_scrubber

    install_log_scrubber()  # a password this process was given is blanked out of every log line
    CTX.config, CTX.source, CTX._settings = None, source, None
    from .sources import ConfigError, find_config, load_config

    try:
        path = find_config(config, state_dir_given=state_dir is not None)
        CTX.config = load_config(path) if path else None
    except ConfigError as e:
        fail(str(e), code=2)
    if CTX.config is not None:
        given = {"--state-dir": state_dir, "--dsn": dsn, "--warehouse": warehouse, "--catalog-uri": catalog_uri}
        given |= {"--publication": publication, "--s3-endpoint": s3_endpoint}
        clash = [k for k, v in given.items() if v is not None]
        if clash:
            fail(f"{', '.join(clash)}: set per source in {CTX.config.path}, not with --config", code=2)
        if source is not None and source not in CTX.config.sources:
            fail(
                f"--source {source}: no such source in {CTX.config.path} (sources: {', '.join(CTX.config.sources)})",
                code=2,
            )
        return
    if source is not None:
        fail("--source needs a sources file (--config FILE, $MOONCAKE_CONFIG or ./mooncake.yaml)", code=2)
    try:
        CTX.settings = load_settings(
            state_dir,
            dsn=dsn,
            warehouse=warehouse,
            catalog_uri=catalog_uri,
            s3_endpoint=s3_endpoint,
            publication=publication,
        )
    except ValueError as e:  # a DSN libpq cannot parse: refused before anything is saved
        fail(str(e), code=2)


# ---------------------------------------------------------------------------------------- pg
@pg_app.command("start", cls=PlainCommand)
def pg_start():
    """Create (first time) and start the embedded Postgres; prints its DSN. No-op when running."""
    from .engine.pg import EmbeddedPostgres, PostgresNotFound

    try:
        print(EmbeddedPostgres(CTX.settings.state_dir).start())
    except (PostgresNotFound, RuntimeError) as e:
        fail(str(e))


@pg_app.command("stop", cls=PlainCommand)
def pg_stop():
    """Stop the embedded Postgres (fast shutdown); says whether it was running."""
    from .engine.pg import EmbeddedPostgres

    pg = EmbeddedPostgres(CTX.settings.state_dir)
    if not pg.is_running():
        console.print("embedded Postgres was not running")
        return
    pg.stop()
    if pg.is_running():
        fail(f"embedded Postgres in {pg.data_dir} did not stop (see its log there)")
    console.print(f"embedded Postgres stopped (data kept in {pg.data_dir}; `mooncake pg start` starts it again)")


@pg_app.command("dsn", cls=PlainCommand)
def pg_dsn():
    """Print the embedded Postgres's DSN."""
    from .engine.pg import EmbeddedPostgres

    try:
        print(EmbeddedPostgres(CTX.settings.state_dir).dsn())
    except RuntimeError as e:
        fail(str(e))


# ---------------------------------------------------------------------------------------- service
_MEMORY_LIMIT_HELP = (
    "Memory budget of the service for open transactions and buffered changes, e.g. 512MiB or 2GiB "
    "(default: a quarter of the machine's memory); past it buffers flush early, large transactions "
    "spill to the state directory and, last, the stream pauses. Saved in settings.json"
)


def _set_memory_limit(text: str | None) -> None:
    """``--memory-limit``: parse, check against the minimum and keep it in the settings (saved when
    the service is started); one-line failure otherwise. Without one, the budget kept in settings.json
    (perhaps edited by hand) is checked the same way, the file named in the failure."""
    from .engine.service.memory import check_memory_limit, parse_size

    if text is None:
        saved = CTX.settings.memory_limit
        where = f"memory_limit in {CTX.settings.state_dir / 'settings.json'}"
        if saved is not None and (isinstance(saved, bool) or not isinstance(saved, int)):
            fail(f"{where}: {saved!r} is not a number of bytes; set the budget with --memory-limit SIZE")
        try:
            if saved is not None:
                check_memory_limit(saved)
        except ValueError as e:
            fail(f"{where}: {e}; set another with --memory-limit SIZE")
        return
    try:
        CTX.settings.memory_limit = check_memory_limit(parse_size(text))
    except ValueError as e:
        fail(f"--memory-limit: {e}")


@app.command(cls=PlainCommand)
def serve(
    maintenance: str = typer.Option(None, help="auto (flush/persist by policy) or dagster (assets drive it)"),
    memory_limit: str | None = typer.Option(None, "--memory-limit", help=_MEMORY_LIMIT_HELP),
):
    """Run the replicator service in the foreground (Ctrl-C stops it)."""
    from .engine.service.flight import serve as _serve

    s = CTX.settings
    if maintenance:
        s.maintenance = maintenance
    _set_memory_limit(memory_limit)
    if memory_limit is not None:
        s.save()
    logging.getLogger().setLevel(logging.INFO)
    try:
        import dataclasses

        from .sources import patterns_reloader

        # a sources file's service re-reads its patterns when the file is edited (table discovery)
        _serve(dataclasses.replace(s.service_config(), discover_reload=patterns_reloader(s)))
    except Exception as e:
        from .engine.storage.errors import CatalogUnavailable

        if isinstance(e, CatalogUnavailable):  # already one line: the catalog's URI (no password), why, a hint
            fail(str(e))
        fail(f"the service stopped: {type(e).__name__}: {e}")


@app.command(cls=PlainCommand)
def start(
    maintenance: str | None = typer.Option(
        None,
        "--maintenance",
        help="auto: the service flushes and persists by policy; dagster: the Dagster assets "
        "do (the service only caps its memory). For this service only; default: "
        "settings.json's (auto)",
    ),
    memory_limit: str | None = typer.Option(None, "--memory-limit", help=_MEMORY_LIMIT_HELP),
):
    """Start the replicator service in the background (no-op when it is running); with a sources file,
    every source's (or --source's)."""
    if maintenance not in (None, "auto", "dagster"):
        fail(f"--maintenance must be auto or dagster, not {maintenance!r}")
    CTX.failed = False
    for name in _each_source():
        _start_one(maintenance, memory_limit, f"source {name}: " if name else "")
    if CTX.failed:
        raise typer.Exit(1)


def _start_one(maintenance: str | None, memory_limit: str | None, prefix: str) -> None:
    """``start`` of this command's state directory (``prefix`` starts its line; ``memory_limit``: the
    ``--memory-limit`` text, kept in this state directory's settings)."""
    from .engine.service import ServiceClient
    from .engine.service.process import clear_stopped_mark, start_service

    _set_memory_limit(memory_limit)
    _check_source_login(prefix)
    try:  # a start that fails keeps `mooncake stop`'s stop (only a service that answers clears it)
        pid, started = start_service(CTX.settings, report=True, maintenance=maintenance)
    except Exception as e:
        fail(str(e))
    clear_stopped_mark(CTX.settings)  # found running: `mooncake start` ends the stop too
    c = ServiceClient(CTX.settings.socket_path)
    try:
        ping = c.call("ping", timeout=5)
    except Exception:
        ping = {}
    finally:
        c.close()
    mode = ping.get("maintenance")
    if not started and maintenance and mode and mode != maintenance:
        fail(
            f"the mooncake service is already running (pid {pid}) with maintenance: {mode}; `mooncake stop` "
            f"first to run it with maintenance: {maintenance}"
        )
    running_limit, wanted = ping.get("memory_limit"), CTX.settings.memory_limit
    if not started and memory_limit is not None and running_limit and running_limit != wanted:
        from .engine.service.memory import format_size

        fail(
            f"the mooncake service is already running (pid {pid}) with memory limit {format_size(running_limit)}; "
            f"`mooncake stop` first to run it with --memory-limit {format_size(int(wanted or 0))}"
        )
    console.print(
        f"{prefix}mooncake service running (pid {pid}, socket {CTX.settings.socket_path}, maintenance: {mode})",
        highlight=False,
    )


def _check_source_login(prefix: str) -> None:
    """Before a service is started: log in to the source once (``connect_timeout`` 10 s). When the
    server answers and refuses the login (a wrong password, an unknown role or database, no
    ``pg_hba.conf`` entry), ``start`` fails in one line (the DSN without its password) rather than
    starting a service that says it runs but can never mirror anything. When the source cannot be
    reached now (refused, timed out, starting up, too many connections), the service starts anyway
    and retries, as it does after an outage; one warning line says so and ``mooncake status`` shows
    when the source is reachable. Nothing is checked when a service already answers, or for the
    embedded Postgres (no DSN: started by the service)."""
    import psycopg

    from .engine.pg.conninfo import connect_error, login_refused, redact
    from .engine.service import ServiceClient, ServiceUnavailable

    dsn = CTX.settings.dsn
    if not dsn:
        return
    c = ServiceClient(CTX.settings.socket_path)
    try:
        if c.ping(timeout=1.0):
            return
    except ServiceUnavailable:
        pass
    finally:
        c.close()
    try:
        psycopg.connect(dsn, connect_timeout=10).close()
    except psycopg.Error as e:
        if login_refused(str(e)):
            fail(f"{prefix}not started: cannot log in to the source {redact(dsn)}: {connect_error(e)}")
        from rich.markup import escape

        err.print(
            f"[yellow]warning:[/yellow] {escape(prefix)}the source {escape(redact(dsn))} cannot be reached now "
            f"({escape(connect_error(e))}); the service starts and retries (`mooncake status` says when it is reachable)",
            highlight=False,
            soft_wrap=True,
        )


@app.command(cls=PlainCommand)
def stop():
    """Stop the background replicator service (with a sources file: every source's, or --source's). It
    stays stopped until `mooncake start`: the commands that need it say so instead of starting it."""
    CTX.failed = False
    for name in _each_source(need_dsn=False):
        if name is not None:
            console.print(f"source {name}: ", end="", highlight=False)
        _stop_one()
    if CTX.failed:
        raise typer.Exit(1)


def _stop_one() -> None:
    from .engine.service import ServiceClient
    from .engine.service.process import stop_service

    c = ServiceClient(CTX.settings.socket_path)
    try:  # a copy running now is interrupted: say so (the next start drops what it copied)
        copying = [t for t in c.status()["tables"] if t.get("state") == "copying"]
    except Exception:
        copying = []
    finally:
        c.close()
    for t in copying:
        console.print(
            f"interrupting the copy of {t['source']} as {t['name']}: nothing of it is kept; after `mooncake start`, "
            f"run create-table {t['name']} {t['source']} again",
            highlight=False,
            soft_wrap=True,
        )
    if stop_service(CTX.settings, mark=True):
        console.print("mooncake service stopped (`mooncake start` starts it again)")
    else:
        console.print("mooncake service was not running")


def _each_source(need_dsn: bool = True):
    """With a sources file and no ``--source``: yield each source's name after making its settings
    this command's (a source whose DSN variable is unset is reported on stderr and skipped, and the
    command then exits 1 — ``CTX.failed``; not ``need_dsn``: it is not needed, see
    ``SourceConfig.settings``). Otherwise yield None once (one-source mode or ``--source``)."""
    if CTX.config is None or CTX.source is not None:
        yield None
        return

    for src in CTX.config.sources.values():
        try:
            CTX.settings = src.settings(need_dsn=need_dsn)
        except ValueError as e:  # MissingDsn, or a DSN that does not parse
            err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            CTX.failed = True
            continue
        yield src.name


@app.command(cls=PlainCommand)
def status():
    """Is the service running, and what is it doing (with a sources file: of every source, or --source's).

    Exit 3 when a service is not running, 1 when a source's DSN variable is unset."""
    CTX.failed = False
    running = True
    for name in _each_source():
        if name is not None:
            console.print(f"source {name} (state {CTX.settings.state_dir}):", highlight=False, soft_wrap=True)
        running = _status_one() and running
    raise typer.Exit(1 if CTX.failed else (0 if running else 3))


def _status_one() -> bool:
    """``status`` of this command's state directory; False when its service is not running."""
    from .engine.service import ServiceClient

    c = ServiceClient(CTX.settings.socket_path)
    if not c.ping():
        console.print("mooncake service: not running")
        return False
    service_client(start=False)  # refuses a --dsn that is not the running service's source
    st = c.status()
    console.print(
        f"mooncake service: running; maintenance: {st.get('maintenance')}; slot {st['slot']}, applied LSN "
        f"{st['applied_lsn']}, confirmed LSN {st['confirmed_lsn']}, {len(st['tables'])} table(s)"
        + (f"; stream error: {st['stream_error']}" if st.get("stream_error") else "")
        + (
            f"; {len(st['stream_faults'])} lost stream(s), last at {st['stream_faults'][-1]['at']}: "
            f"{st['stream_faults'][-1]['error']}"
            if st.get("stream_faults")
            else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    mem = st.get("memory")
    if mem:
        from .engine.service.memory import format_size

        console.print(
            f"memory: limit {format_size(mem['limit_bytes'])}, in use {format_size(mem['usage_bytes']['total'])} "
            f"(peak {format_size(mem['peak_usage_bytes'])}), spilled transactions {mem.get('spilled', 0)}, "
            f"backpressure: {'true' if mem['backpressure'] else 'false'}",
            highlight=False,
            soft_wrap=True,
        )
    if st.get("source_reachable"):
        console.print(
            f"source: {st.get('source')} (reachable, LSN {st.get('source_lsn')})", highlight=False, soft_wrap=True
        )
    else:
        console.print(
            f"source: {st.get('source')} NOT reachable: {st.get('source_error')}", highlight=False, soft_wrap=True
        )
    for t in st["tables"]:
        v = t.get("verify") or {}
        console.print(
            f"  {t['name']}: {t.get('state')}; last verify: "
            + (f"{v.get('result')} at LSN {v.get('lsn')} ({v.get('at')})" if v else "not yet")
            + "".join(f"; warning: {w}" for w in t.get("warnings") or []),
            highlight=False,
            soft_wrap=True,
        )
    return True


@app.command("check-source", cls=PlainCommand)
def check_source(
    tables: list[str] | None = typer.Argument(
        None, help="Source tables to check, schema.table (default: the mirrored ones)"
    ),
):
    """Pre-flight check of the source Postgres (run it first): wal_level, free replication slots and WAL
    senders, max_slot_wal_keep_size, the role's REPLICATION attribute, the server version, and per
    table SELECT, replica identity and publication membership. One line each: ok, warning or error,
    every problem with the SQL or setting that fixes it. Creates nothing. Exit 1 when any line is an error."""
    from .engine.pg import preflight
    from .verify import registry

    s = CTX.settings
    reg = registry(s)
    srcs = list(tables or []) or sorted({m["source"] for m in reg["tables"].values()})
    from .engine.service.service import default_names

    names = default_names(s.state_dir) | {k: reg[k] for k in ("slot", "publication") if k in reg}
    own, slot = names["publication"], names["slot"]
    try:
        dsn = s.source_dsn()
    except Exception as e:
        fail(str(e).splitlines()[0])
    options = {m["source"]: m for m in reg["tables"].values()}  # a mirror's --column-type/--exclude-column
    checks = preflight.check_source(
        dsn, srcs, publication=s.publication, own_publication=own, slot=slot, table_options=options
    )
    for c in checks:
        print(c.line(), flush=True)
    errors = sum(c.level == "error" for c in checks)
    warnings = sum(c.level == "warning" for c in checks)
    print(f"check-source: {errors} error(s), {warnings} warning(s)", flush=True)
    raise typer.Exit(1 if errors else 0)


# ---------------------------------------------------------------------------------------- tables
@app.command(cls=PlainCommand)
def sync(
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be mirrored"),
):
    """Mirror every table that the sources file picks (schemas/tables minus exclude) and that is not
    mirrored yet, in every source (or --source's). A pattern that matches no table is reported; a
    mirrored table the patterns no longer pick is kept (drop it with drop-table). Mirror names:
    <table> for schema public, else <schema>__<table>. Exit 1 when a table could not be mirrored."""
    if CTX.config is None:
        fail(
            "sync mirrors what a sources file names: give --config FILE (or $MOONCAKE_CONFIG, ./mooncake.yaml)", code=2
        )
    CTX.failed = False
    for name in _each_source():
        _sync_one(CTX.config.source(name or CTX.source), dry_run)
    raise typer.Exit(1 if CTX.failed else 0)


def _sync_one(src, dry_run: bool) -> None:
    """``sync`` of one source (``src``: a :class:`~mooncake_assets.sources.SourceConfig`) into this
    command's settings; a failure is printed and recorded in ``CTX.failed``."""
    from .engine.pg.names import format_name, split_qualified_name
    from .sources import mirror_name, source_tables
    from .verify import registry

    s = CTX.settings
    try:
        tables = source_tables(s.source_dsn())
    except Exception as e:
        err.print(f"[red]error:[/red] source {src.name}: cannot list its tables: {str(e).splitlines()[0]}")
        CTX.failed = True
        return
    picked, unmatched = src.pick(tables)
    for u in unmatched:
        err.print(f"warning: source {src.name}: {u} matches no table", highlight=False, soft_wrap=True)
    reg = registry(s)
    have = {tuple(split_qualified_name(m["source"])): n for n, m in reg["tables"].items()}
    todo = [t for t in picked if t not in have]
    print(
        f"source {src.name}: {len(picked)} table(s) picked, {len(picked) - len(todo)} mirrored already, "
        f"{len(todo)} to mirror",
        flush=True,
    )
    for parts, n in sorted(have.items(), key=lambda kv: kv[1]):
        if parts not in picked:
            print(f"  {n} ({format_name(*parts)}): mirrored, no longer picked by the file (kept)", flush=True)
    taken = set(reg["tables"])
    if todo and not dry_run and _skip_if_stopped(f"source {src.name}: "):
        return
    client = None
    for schema, table in todo:
        dst, qualified = mirror_name(schema, table), format_name(schema, table)
        if dst in taken:
            err.print(f"[red]error:[/red] source {src.name}: {qualified}: mirror name {dst} is taken")
            CTX.failed = True
            continue
        taken.add(dst)
        if dry_run:
            print(f"  would mirror {qualified} as {dst}", flush=True)
            continue
        client = client or service_client(begin=True)
        try:
            res = create_with_progress(client, dst, qualified, refused=_RaceRefusal)
        except _RaceRefusal as e:  # the service's table discovery mirrors it (discover_interval_s)
            print(f"  {qualified}: mirrored by the service's table discovery meanwhile ({e})", flush=True)
            continue
        except typer.Exit:  # fail() printed why
            err.print(f"  (source {src.name}: {qualified} → {dst})", highlight=False)
            CTX.failed = True
            continue
        print(f"  mirrored {res['source']} as {dst}: {n_rows(res['rows'])} copied at LSN {res['copy_lsn']}", flush=True)
    if client is not None:
        client.close()


class _RaceRefusal(Exception):
    """``sync``'s create of a table that the service mirrored (or began to) since sync listed the
    mirrors: its table discovery won the race; the message is the service's refusal."""

    @staticmethod
    def check(msg: str) -> None:
        if " is already mirrored as " in msg or " is being mirrored as " in msg:
            raise _RaceRefusal(msg.split(";")[0])


@app.command("create-table", cls=PlainCommand)
def create_table(
    dst: str = typer.Argument(
        ..., help="Name of the mirror: 1-63 ASCII letters, digits and _, not starting with a digit"
    ),
    src: str = typer.Argument(
        ...,
        help="Source table as SQL names it: schema.table or table (search_path); "
        "unquoted parts fold to lower case, quote the others: "
        '\'"Sales Data"."Q1 Orders"\', \'public."User"\'',
    ),
    delete_format: str = typer.Option(
        "deletion-vectors",
        help="deletion-vectors: Iceberg v3, deletes as Puffin deletion vectors (read by PyIceberg, DuckDB, "
        "iceberg-rust, polars); position-deletes: Iceberg v2 position-delete files, for readers without v3 "
        "deletion vectors (ClickHouse/chDB, Daft). Table: README.md, Reading the mirrors with other engines",
    ),
    column_type: list[str] = typer.Option(
        [],
        "--column-type",
        metavar="COL=text",
        help="Mirror column COL as Postgres's exact text output whatever its type (e.g. a numeric(10,2) "
        "holding 'NaN'); repeatable; recorded with the mirror",
    ),
    exclude_column: list[str] = typer.Option(
        [],
        "--exclude-column",
        metavar="COL",
        help="Leave column COL out of the mirror (not a key column); repeatable; recorded with the mirror",
    ),
):
    """Mirror Postgres table SRC as DST: consistent initial copy, then change data capture.

    Every column type is mirrored: structured where Iceberg has a faithful type (composite → struct,
    hstore → map, PostGIS → WKB), else as Postgres's exact text (ranges, tsvector, geometric types, …;
    one notice lists those columns). See docs/types.md."""
    if delete_format not in ("deletion-vectors", "position-deletes"):  # before a service is started for it
        fail(f"--delete-format must be deletion-vectors or position-deletes, not {delete_format!r}", code=2)
    types: dict[str, str] = {}
    for opt in column_type:
        col, sep, kind = opt.rpartition("=")
        if not sep or not col:
            err.print(f"error: --column-type {opt!r}: expected COL=text")
            raise typer.Exit(2)
        types[col] = kind.strip().lower()
    client, started = service_client(report=True, begin=True)
    try:
        res = create_with_progress(client, dst, src, delete_format, column_types=types, exclude=list(exclude_column))
    except typer.Exit:
        if started:  # a failed create leaves no service behind that it started
            from .engine.service.process import stop_service

            client.close()
            stop_service(CTX.settings)
        raise
    console.print(
        f"mirrored {res['source']} as {res['table']}: {n_rows(res['rows'])} copied at LSN {res['copy_lsn']} "
        f"in {res['seconds']:.1f}s (key: {', '.join(res['key']) or 'whole row'})"
    )
    if res.get("text_columns"):
        err.print(
            f"notice: {len(res['text_columns'])} column(s) mirrored as Postgres's exact text output: "
            + ", ".join(f"{n} ({t})" for n, t in res["text_columns"])
            + " (see docs/types.md)",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )


@app.command("drop-table", cls=PlainCommand)
def drop_table(dst: str = typer.Argument(..., help="Name of the mirror to drop (see `mooncake list-tables`)")):
    """Stop mirroring DST and delete its Iceberg table (the slot goes with the last table)."""
    res = call(service_client(), "drop_table", table=dst)
    console.print(f"dropped {dst}" + (" (and the replication slot)" if res.get("slot_dropped") else ""))


@app.command("list-tables", cls=PlainCommand)
def list_tables(as_json: bool = typer.Option(False, "--json", help="Machine-readable output")):
    """Per table: LSNs, lag, buffer rows/bytes, files, index blocks, deletion vectors (with a sources
    file: a table per source, or --source's; --json: {"sources": {name: {"tables", "maintenance"}}}).
    With table discovery on (a source's discover_interval_s), the tables it could not mirror are
    listed too, state error, with the reason (--json: "discovery": {"failed": [...], "unmatched": [...]})."""
    CTX.failed = False
    out = {}
    for name in _each_source():
        if name is not None and _skip_if_stopped(f"source {name}: "):
            continue
        st = call(service_client(), "status")
        doc = {"tables": st["tables"], "maintenance": st.get("maintenance")}
        if st.get("discovery"):  # the service mirrors new tables the patterns pick (docs/sources.md)
            doc["discovery"] = st["discovery"]
        if name is None:
            if as_json:
                print(json.dumps(doc, indent=1))
                return
            _print_tables(st, "")
            return
        out[name] = doc
        if not as_json:
            _print_tables(st, f"source {name}: ")
    if as_json:
        print(json.dumps({"sources": out}, indent=1))
    if CTX.failed:
        raise typer.Exit(1)


def _print_tables(st: dict, prefix: str) -> None:
    """``list-tables``' table of one service's ``status`` (``prefix`` starts its title)."""
    t = Table(title=f"{prefix}mirrored tables (applied LSN {st['applied_lsn']}, maintenance: {st.get('maintenance')})")
    cols = [
        "name",
        "source",
        "state",
        "applied_lsn",
        "flush_lsn",
        "lag",
        "buffer_rows",
        "data_files",
        "index_blocks",
        "pending_deletes",
        "deletion_vectors",
        "live_rows",
    ]
    for c in cols:
        t.add_column(c.replace("_", " "))
    t.add_column("verified")
    failed = list(((st.get("discovery") or {}).get("failed")) or [])  # picked, not mirrored: why
    for i, row in enumerate(st["tables"] + failed):
        row = dict(row, lag=_lag_text(row) if i < len(st["tables"]) else "not mirrored")
        v = row.get("verify") or {}
        state = row.get("state", "")
        if row.get("warnings") and state == "ready":
            state = "ready (warning)"
        t.add_row(
            *[state if c == "state" else str(row.get(c, "")) for c in cols],
            f"{v.get('result')} @ {v.get('lsn')} {v.get('at')}" if v else "not yet",
        )
    console.print(t)
    from rich.markup import escape

    for row in st["tables"] + failed:  # what the table view has no room for
        if row.get("error"):
            console.print(f"[red]{escape(row['name'])}:[/red] {escape(str(row['error']))}", highlight=False)
        for w in row.get("warnings") or []:
            console.print(
                f"[yellow]{escape(row['name'])}: warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True
            )
        if row.get("last_schema_change"):
            console.print(f"{escape(row['name'])}: {escape(row['last_schema_change'])}", highlight=False)
    for u in (st.get("discovery") or {}).get("unmatched") or []:
        console.print(f"[yellow]warning:[/yellow] {prefix}{escape(u)} matches no table", highlight=False)


def _lag_text(row: dict) -> str:
    """``list-tables``' lag column: bytes of WAL not applied yet and the age of the oldest such commit."""
    b = row.get("lag_bytes")
    if b is None:
        return "?" if row.get("state") != "copying" else ""
    size = f"{b} B" if b < 1024 else (f"{b / 1024:.1f} kB" if b < 1024**2 else f"{b / 1024**2:.1f} MB")
    return f"{size}, {row.get('lag_seconds') or 0:.1f} s"


@app.command(cls=PlainCommand)
def query(
    sql: str = typer.Argument(..., help="One SELECT (or EXPLAIN) over the mirrors, by their DST names"),
    fmt: str = typer.Option(
        "table",
        "--format",
        help="table (psql's aligned format), csv (as psql --csv, with a "
        "header) or json (an array of objects); values as Postgres prints them",
    ),
    lsn: str | None = typer.Option(
        None,
        help="Read at this LSN (X/Y) instead of the source's current one, once the mirror has applied it (waits up to --max-wait)",
    ),
    max_wait: float = typer.Option(
        30.0,
        "--max-wait",
        metavar="SECONDS",
        min=0.0,
        help="How long the read-your-writes barrier waits for the service to apply "
        "every commit made before the query (then: an error naming both LSNs)",
    ),
    no_wait: bool = typer.Option(
        False,
        "--no-wait",
        help="Read what the service has applied now, without the barrier; the LSN read at is printed on stderr",
    ),
    as_of_lsn: str | None = typer.Option(
        None,
        "--as-of-lsn",
        help="Read the persisted consistent cut at this LSN (X/Y or its tag lsn-X-Y; see list-cuts): every "
        "table at its tagged Iceberg snapshot, without the service",
    ),
):
    """Union read: run SQL over the mirrors (visible by their DST names), read-your-writes.

    Read-only: statements other than SELECT/EXPLAIN are refused. NULL prints empty (json: null),
    booleans t/f, arrays as Postgres array text (json: arrays), infinity as infinity."""
    import psycopg

    from .engine.lsn import Lsn
    from .engine.read import MirrorNotReadable, UnionReader
    from .engine.read.render import FORMATS
    from .engine.read.union import ReadOnlyError, check_read_only
    from .engine.service import ServiceError

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}", code=2)
    if as_of_lsn is not None:
        if lsn is not None or no_wait:
            fail("--as-of-lsn reads a persisted cut: it excludes --lsn and --no-wait", code=2)
        _query_cut(sql, as_of_lsn, fmt)
        return
    if lsn is not None:
        try:
            Lsn.parse(lsn)
        except (ValueError, TypeError):
            fail(f"--lsn {lsn!r} is not an LSN: expected two hexadecimal numbers as X/Y, e.g. 0/16B3748", code=2)
        if no_wait:
            fail("--lsn and --no-wait exclude each other (a read at --lsn never waits for the source)", code=2)
    _refuse_to_start()
    try:
        reader = UnionReader(service_client(), None if no_wait else CTX.settings.source_dsn(), wait_timeout=max_wait)
        check_read_only(sql, reader.con)  # every statement is a read, before any runs
        results = [(stmt, reader.query(stmt, lsn=lsn)) for stmt in _statements(sql)]
    except ReadOnlyError as e:
        fail(str(e), code=2)
    except MirrorNotReadable as e:  # copying, stopped, interrupted, or no such mirror: one line saying which
        fail(str(e))
    except psycopg.OperationalError as e:  # the barrier asks the source for its current LSN
        fail(_barrier_unreachable(e))
    except (TimeoutError, ServiceError) as e:
        _fail_ahead_of_source(e)
        hint = " (raise --max-wait, or read what is applied with --no-wait)" if str(e).startswith("timed out") else ""
        fail(str(e).splitlines()[0] + hint)
    except Exception as e:
        fail(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    # several statements: each result on its own, as psql prints them (tables a blank line apart)
    sys.stdout.write(("\n" if fmt == "table" else "").join(FORMATS[fmt](_postgres_names(q, r)) for q, r in results))
    sys.stdout.flush()
    _query_notes(reader, no_wait)


CHANGE_FORMATS = ("table", "csv", "json", "parquet")


@app.command(cls=PlainCommand)
def changes(
    dst: str = typer.Argument(..., help="The mirror (see `mooncake list-tables`)"),
    since: str = typer.Option(
        ...,
        "--since",
        metavar="LSN",
        help="First LSN of the range (X/Y or a cut tag lsn-X-Y), included. It must be a cut: a snapshot's "
        "LSN (list-tables' flush_lsn, the B that --until persisted printed, a list-cuts LSN) or one in the "
        "buffer window",
    ),
    until: str | None = typer.Option(
        None,
        "--until",
        metavar="LSN",
        help="End of the range (X/Y or lsn-X-Y), excluded; 'persisted': the table's current Iceberg snapshot "
        "(a cursor that stays valid); default: the source's current LSN once applied "
        "(read-your-writes; with --no-wait what the service has applied)",
    ),
    fmt: str = typer.Option("table", "--format", help="table, csv, json (as `query` prints them) or parquet"),
    output: Path | None = typer.Option(None, "--output", metavar="FILE", help="Write there instead of stdout"),
    max_wait: float = typer.Option(
        30.0, "--max-wait", metavar="SECONDS", min=0.0, help="How long to wait for an LSN not applied yet"
    ),
    no_wait: bool = typer.Option(
        False,
        "--no-wait",
        help="End at what the service applied now (instead of the source's current LSN), without waiting "
        "(a --since not applied yet is an error); excludes --until",
    ),
    deletes: str = typer.Option(
        "rows",
        "--deletes",
        help="rows: deleted rows in full; keys: deleted rows as their primary key only, other columns "
        "empty (much cheaper to read; needs a primary key)",
    ),
):
    """The rows that changed in DST between two LSNs: the table's columns plus _change (insert|delete)
    and _commit_lsn (X/Y, empty where only the persisted interval is known). See docs/changes.md.

    Applying the deletes (one equal row each) and inserts to DST read at --since gives DST read at
    --until. The range actually served is printed on stderr ("changes of DST in [A, B): …")."""
    import psycopg

    from .engine.lsn import Lsn
    from .engine.read.render import FORMATS
    from .engine.read.union import current_wal_lsn
    from .engine.service import ServiceError
    from .engine.table.changes import identity_note

    if fmt not in CHANGE_FORMATS:
        fail(f"--format must be one of {', '.join(CHANGE_FORMATS)}, not {fmt!r}", code=2)
    if deletes not in ("rows", "keys"):
        fail(f"--deletes must be rows or keys, not {deletes!r}", code=2)
    if until is not None and no_wait:
        fail(f"--no-wait and --until {until} exclude each other (--no-wait only chooses the end of the range)", code=2)
    since = _change_lsn("--since", since)
    if until not in (None, "persisted"):
        until = _change_lsn("--until", until)
    if until not in (None, "persisted") and Lsn.parse(since) > Lsn.parse(until):
        fail(f"--since {since} is after --until {until}", code=2)
    if fmt == "parquet" and output is None and sys.stdout.isatty():
        fail("--format parquet writes binary: give --output FILE (or redirect stdout)", code=2)
    _refuse_to_start()
    try:
        if until is None and not no_wait:
            until = current_wal_lsn(CTX.settings.source_dsn())
        head, feed = service_client().changes(dst, since, until, timeout=max_wait, deletes=deletes)
    except psycopg.OperationalError as e:  # the default end is the source's current LSN
        fail(_barrier_unreachable(e))
    except (TimeoutError, ServiceError) as e:
        _fail_ahead_of_source(e)
        hint = " (raise --max-wait)" if "timed out" in str(e) else ""
        fail(str(e).splitlines()[0] + hint)
    except Exception as e:
        fail(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(feed, str(output) if output is not None else sys.stdout.buffer)
    else:
        text = FORMATS[fmt](feed)
        if output is not None:
            output.write_text(text)
        else:
            sys.stdout.write(text)
    sys.stdout.flush()
    ins = sum(1 for c in feed.column("_change").to_pylist() if c == "insert") if feed.num_rows else 0
    err.print(
        f"changes of {dst} in [{head['since']}, {head['until']}): {ins} inserts, {feed.num_rows - ins} deletes",
        highlight=False,
    )
    note = identity_note(head.get("sources") or {}, dst, "--deletes keys")  # (None for --deletes keys)
    if note:
        err.print(note, highlight=False)


def _change_lsn(opt: str, value: str) -> str:
    """``value`` of ``changes``' ``opt`` as an LSN ``X/Y``: an LSN, or a cut tag ``lsn-X-Y`` (exit 2 otherwise)."""
    from .engine.iceberg.cuts import parse_cut_tag
    from .engine.lsn import Lsn

    try:
        return str(Lsn.parse(value))
    except (ValueError, TypeError):
        lsn = parse_cut_tag(value)
    if lsn is None:
        fail(
            f"{opt} {value!r} is not an LSN: expected X/Y (two hexadecimal numbers, e.g. 0/16B3748) or a cut tag lsn-X-Y",
            code=2,
        )
    return str(lsn)


@app.command("sql-server", cls=PlainCommand)
def sql_server(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(5433, help="TCP port (0: any free port, printed on stderr)"),
    users: Path | None = typer.Option(
        None,
        "--users",
        metavar="FILE",
        help="Users file: one name:SCRAM-SHA-256$… verifier per line, mode 0600 "
        "(write one with `mooncake sql-server-user FILE NAME`). Without it: env MOONCAKE_SQL_PASSWORD "
        "for the one user MOONCAKE_SQL_USER (default: mooncake)",
    ),
    trust_loopback: bool = typer.Option(
        False, "--trust-loopback", help="Let clients on 127.0.0.1/::1 connect without a password"
    ),
    max_wait: float = typer.Option(
        30.0,
        "--max-wait",
        metavar="SECONDS",
        min=0.0,
        help="How long a read waits for read-your-writes (a session changes it: SET mooncake.max_wait = '5s')",
    ),
    readers: int = typer.Option(
        4, "--readers", min=1, help="Statements over mirrors that run at once (one union reader each)"
    ),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", metavar="FILE", help="TLS certificate chain (PEM)"),
    tls_key: Path | None = typer.Option(None, "--tls-key", metavar="FILE", help="Its private key (PEM)"),
):
    """A read-only PostgreSQL-wire endpoint over the mirrors (psql, psycopg, BI tools).

    Every statement is a union read (SELECT/EXPLAIN; writes get SQLSTATE 25006), read-your-writes
    unless the session says SET mooncake.read = 'applied'. Authentication: SCRAM-SHA-256.
    Connect with: psql "host=127.0.0.1 port=5433 user=NAME dbname=mooncake". With a sources file one
    server serves one source: mooncake --source NAME sql-server. See docs/sql-server.md."""
    import os
    import signal

    import duckdb

    from .engine.read import UnionReader
    from .engine.read.pgwire import Backend, SqlServer, UsersFileError, load_users, make_verifier, tls_context
    from .engine.read.snapshots import SnapshotReader
    from .engine.service import ServiceClient
    from .engine.service.registry import NAMESPACE

    verifiers = {}
    if users is not None:
        try:
            verifiers = load_users(users)
        except UsersFileError as e:
            fail(str(e), code=2)
    elif os.environ.get("MOONCAKE_SQL_PASSWORD"):
        verifiers = {
            os.environ.get("MOONCAKE_SQL_USER", "mooncake"): make_verifier(os.environ["MOONCAKE_SQL_PASSWORD"])
        }
    if not verifiers and not trust_loopback:
        fail("no users: give --users FILE, set MOONCAKE_SQL_PASSWORD, or allow --trust-loopback", code=2)
    tls = None
    if (tls_cert is None) != (tls_key is None):
        fail("--tls-cert and --tls-key go together", code=2)
    if tls_cert is not None and tls_key is not None:
        try:
            tls = tls_context(str(tls_cert), str(tls_key))
        except OSError as e:  # ssl.SSLError is one
            fail(f"--tls-cert/--tls-key: {e}", code=2)
    _refuse_to_start()
    dsn = CTX.settings.source_dsn()
    db = duckdb.connect()  # the readers are cursors of one database: one memory limit
    db.execute("SET GLOBAL parquet_metadata_cache = true")

    def make_reader() -> UnionReader:  # the pool's other readers: the service is running by then
        return UnionReader(ServiceClient(CTX.settings.socket_path), dsn, con=db.cursor(), wait_timeout=max_wait)

    reader = UnionReader(service_client(), dsn, con=db.cursor(), wait_timeout=max_wait)
    backend = Backend(reader, make_reader, readers, SnapshotReader(_cut_catalog, NAMESPACE), max_wait)
    try:
        server = SqlServer(backend, host, port, verifiers, trust_loopback=trust_loopback, tls=tls)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror}")
    err.print(f"mooncake sql-server listening on {server.host}:{server.port}", highlight=False)
    sys.stderr.flush()

    def stop(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.close()
        backend.close()
        close = getattr(reader, "close", None)  # a long-lived reader keeps connections: end them
        if close is not None:
            close()


@app.command("sql-server-user", cls=PlainCommand)
def sql_server_user(
    file: Path = typer.Argument(..., help="The users file (created with mode 0600)"),
    name: str = typer.Argument(..., help="User name"),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin"),
):
    """Add or replace a user of `mooncake sql-server`: its password stored as a SCRAM-SHA-256 verifier."""
    from .engine.read.pgwire import write_user

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        fail("empty password", code=2)
    write_user(file, name, password)
    console.print(f"{name}: verifier written to {file}", highlight=False)


def _fail_ahead_of_source(e: BaseException) -> None:
    """When the service refused an LSN past the source's current WAL position (``--lsn``, ``--since``,
    ``--until``: :meth:`ReplicatorService.wait_lsn <.engine.service.service.ReplicatorService.wait_lsn>`,
    which names both LSNs and no password): its one line, exit 2 (bad input: waiting cannot help)."""
    from .engine.service.source_position import AHEAD_OF_SOURCE

    line = (str(e).splitlines() or [""])[0]
    if AHEAD_OF_SOURCE in line:
        fail(line, code=2)


def _barrier_unreachable(e: BaseException) -> str:
    """The one line of a read whose read-your-writes barrier could not ask the source (nor the service)
    for the source's current LSN: the source (no password), libpq's reason, and ``--no-wait``."""
    from .engine.pg.conninfo import connect_error, redact

    return (
        f"cannot reach the source {redact(CTX.settings.source_dsn())} for read-your-writes (its current LSN): "
        f"{connect_error(e)}; --no-wait reads what the service has applied (see `mooncake status`)"
    )


def _query_cut(sql: str, cut: str, fmt: str) -> None:
    """``mooncake query --as-of-lsn``: ``sql`` over the persisted cut ``cut`` (engine/read/cuts.py)."""
    from .engine.read.cuts import query_cut
    from .engine.read.render import FORMATS
    from .engine.read.union import ReadOnlyError
    from .engine.service.registry import NAMESPACE

    try:
        res, info = query_cut(_cut_catalog(), NAMESPACE, cut, sql)
    except ReadOnlyError as e:
        fail(str(e), code=2)
    except ValueError as e:
        fail(f"--as-of-lsn: {e}", code=2)
    except LookupError as e:
        fail(str(e).strip("'\""))
    except Exception as e:
        fail(f"{type(e).__name__}: {str(e).splitlines()[0]}")
    sys.stdout.write(FORMATS[fmt](_postgres_names(sql, res)))
    sys.stdout.flush()
    err.print(f"read the cut {info.tag} (LSN {info.lsn}): {', '.join(sorted(info.tables))}", highlight=False)


def _statements(sql: str) -> list[str]:
    """The statements of ``sql`` (DuckDB's parser), each run and printed on its own as psql does;
    ``[sql]`` when it does not parse (running it then reports DuckDB's error)."""
    import duckdb

    try:
        parts = [st.query.strip().rstrip(";").strip() for st in duckdb.extract_statements(sql)]
    except duckdb.Error:
        return [sql]
    return [p for p in parts if p] or [sql]


def _postgres_names(sql: str, res):
    """``res`` with the column names Postgres would give ``sql``'s select list (``count(*)`` -> ``count``,
    not DuckDB's ``count_star()``), as the sql-server names them; unchanged where they cannot be placed."""
    from .engine.read.pgwire.parsed import Parser

    names = Parser(keep=1).parse(sql).output_names(res.num_columns)
    if not names:
        return res
    return res.rename_columns([new or old for new, old in zip(names, res.column_names)])


def _query_notes(reader, no_wait: bool) -> None:
    """What ``mooncake query`` says on stderr after the rows: the LSN read at (``--no-wait``) and a
    warning per stopped mirror it read."""
    from rich.markup import escape

    if no_wait:
        lsns = {v: str(rs.lsn) for v, rs in reader.states.items()}
        if len(set(lsns.values())) <= 1:
            err.print(
                f"read at LSN {next(iter(lsns.values()), reader.client.status().get('applied_lsn'))} "
                "(--no-wait: later commits are not visible)",
                highlight=False,
            )
        else:
            err.print(
                "read at LSN "
                + ", ".join(f"{escape(v)} {x}" for v, x in lsns.items())
                + " (--no-wait: later commits are not visible)",
                highlight=False,
            )
    for t in reader.client.status()["tables"]:  # read-your-writes does not hold for a stopped mirror
        if t["name"] in reader.states and t.get("state") == "error":
            err.print(
                f"[yellow]warning:[/yellow] {escape(t['name'])} is stopped and shows its rows as of LSN "
                f"{t.get('applied_lsn')}, not the source's latest: {escape(str(t.get('error')))}",
                highlight=False,
            )


def service_client(
    start: bool = True, settings: Settings | None = None, report: bool = False, begin: bool = False
) -> Any:
    """The commands' way to the service: :func:`.commands.service_client` (started when it is not
    running, ``start``), except where :func:`_refuse_to_start` fails first. ``begin``: the command may
    begin a mooncake state where there is none (create-table, sync)."""
    if start:
        _refuse_to_start(settings, begin)
    return _service_client(start, settings=settings, report=report)


def _refuse_to_start(settings: Settings | None = None, begin: bool = False) -> None:
    """Fail, in one line, where a command must not start the service: after ``mooncake stop``
    (:func:`_refuse_if_stopped`) and where no mooncake state is (:func:`_refuse_if_nothing_here`)."""
    _refuse_if_stopped(settings)
    _refuse_if_nothing_here(settings, begin)


def _refuse_if_nothing_here(settings: Settings | None = None, begin: bool = False) -> None:
    """A command run where no mooncake state is (no ``settings.json``, no ``tables.json``: a wrong
    directory, a forgotten ``MOONCAKE_STATE_DIR``) does not set one up behind the user's back — a state
    directory, an embedded Postgres under /var/tmp, a background service — to answer "no mirrors":
    it fails in one line naming the directory. ``create-table`` and ``sync`` (``begin``) begin one
    there. A service already answering on the directory's socket is used as it is."""
    from .engine.service import ServiceClient

    s = settings or CTX.settings
    if begin or s.settings_file.exists() or (s.state_dir / "tables.json").exists():
        return
    c = ServiceClient(s.socket_path)
    try:
        if c.ping():
            return
    finally:
        c.close()
    where = s.state_dir.resolve()
    fail(
        f"no mooncake state in {where}: nothing is mirrored there; give the state directory of your mirrors "
        "(--state-dir or MOONCAKE_STATE_DIR), or begin one here with `mooncake create-table DST SCHEMA.TABLE`"
    )


def _stopped_message(settings: Settings | None = None) -> str | None:
    """The one line of :func:`_refuse_if_stopped` when the service of ``settings`` (default: the
    command's) is stopped by ``mooncake stop`` and not running; None otherwise."""
    from .engine.service import ServiceClient
    from .engine.service.process import stopped_mark

    s = settings or CTX.settings
    mark = stopped_mark(s)
    if mark is None:
        return None
    c = ServiceClient(s.socket_path)
    try:
        if c.ping():  # running all the same (`mooncake serve` in the foreground): it is used
            return None
    finally:
        c.close()
    return f"the mooncake service is stopped (`mooncake stop` at {mark}); start it with `mooncake start`, then run this command again"


def _refuse_if_stopped(settings: Settings | None = None) -> None:
    """After ``mooncake stop`` the service stays stopped until ``mooncake start``: no other command starts
    it behind the user's back. The rule: every command that would start the service because it needs
    it (list-tables, query, changes, sql-server, create-table, sync, drop-table, flush, persist, cut,
    merge-index, compact, verify with the union reader or --checksum) fails instead with one line, exit
    1, saying it is stopped and to run ``mooncake start``; they all get the service through
    :func:`service_client`, which checks first. Not refused: ``start`` (it clears the mark, once a
    service answers; a start that fails keeps it) and ``serve`` (the service in the foreground: while
    it answers, the other commands use it, the mark kept); the commands that need no service (status,
    stop, check-source, list-cuts, query --as-of-lsn, verify --reader of the Iceberg tables, pg …); and
    demo, ui, bench and chaos, which start services of their own on purpose. The mark is
    ``<state>/service.stopped`` (:func:`.engine.service.process.stopped_mark`)."""
    msg = _stopped_message(settings)
    if msg is not None:
        fail(msg)


def _skip_if_stopped(prefix: str) -> bool:
    """Over every source of a sources file: True, after one error line (``prefix`` first) and
    ``CTX.failed``, when this source's service is stopped (:func:`_refuse_if_stopped`); the command
    goes on with the other sources."""
    from rich.markup import escape

    msg = _stopped_message()
    if msg is None:
        return False
    err.print(f"[red]error:[/red] {escape(prefix + msg)}", highlight=False, soft_wrap=True)
    CTX.failed = True
    return True


def _maint(op: str, dst: str, **kw):
    res = call(service_client(), op, table=dst, **kw)
    console.print(
        f"{op.replace('_', '-')} {dst}: "
        + ", ".join(f"{k}={round(v, 3) if isinstance(v, float) else v}" for k, v in res.items())
    )


@app.command(cls=PlainCommand)
def flush(dst: str):
    """Write DST's in-memory rows to Parquet plus an index block (not yet in Iceberg)."""
    _maint("flush", dst)


@app.command(cls=PlainCommand)
def persist(
    dst: str | None = typer.Argument(None, help="The mirror to persist (or --all)"),
    persist_all: bool = typer.Option(
        False,
        "--all",
        help="Every mirror at ONE LSN, each snapshot tagged lsn-X-Y (a consistent cut, as `mooncake cut`)",
    ),
):
    """Flush, then commit data files, deletion vectors, index and flush LSN to Iceberg in one commit."""
    if persist_all == (dst is not None):
        fail("name one mirror, or --all for a consistent cut of every mirror", code=2)
    if persist_all:
        _cut(None, as_json=False)
    else:
        _maint("persist", dst)


def _cut(tables: list[str] | None, as_json: bool, max_wait: float = 30.0) -> None:
    """``mooncake cut`` / ``persist --all``: the service's ``cut`` action after the read-your-writes
    barrier (everything committed in the source before the command is in the cut)."""
    from .engine.read import current_wal_lsn

    client = service_client()
    barrier = current_wal_lsn(CTX.settings.source_dsn())
    res = call(client, "cut", tables=tables or None, wait_lsn=barrier, timeout_s=max_wait, timeout=3600)
    if as_json:
        print(json.dumps(res))
        return
    fresh = sum(1 for t in res["tables"].values() if t["committed"])
    console.print(
        f"cut {res['tag']} at LSN {res['lsn']}: {len(res['tables'])} table(s) "
        f"({fresh} committed, {len(res['tables']) - fresh} unchanged and tagged) in {res['seconds']:.2f}s",
        highlight=False,
    )


@app.command(cls=PlainCommand)
def cut(
    tables: list[str] | None = typer.Argument(None, help="Mirrors in the cut (default: all)"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
    max_wait: float = typer.Option(
        30.0, "--max-wait", metavar="SECONDS", help="How long to wait for replication to reach the source's current LSN"
    ),
):
    """A consistent cut: commit every mirror to Iceberg at ONE LSN and tag each snapshot lsn-X-Y, so any
    Iceberg engine reads all tables at one Postgres point (FOR VERSION AS OF 'lsn-X-Y')."""
    _cut(tables, as_json, max_wait)


def _cut_catalog():
    from .engine.iceberg import make_catalog
    from .engine.storage import catalog_properties

    s = CTX.settings
    return make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s))


@app.command("list-cuts", cls=PlainCommand)
def list_cuts_cmd(as_json: bool = typer.Option(False, "--json", help="Print the cuts as JSON")):
    """The consistent cuts in the warehouse (tags lsn-X-Y): LSN, time, tables. Reads the catalog only."""
    from .engine.read.cuts import list_cuts
    from .engine.service.registry import NAMESPACE
    from .engine.timefmt import iso_utc

    cuts = list_cuts(_cut_catalog(), NAMESPACE)
    rows = [{"tag": c.tag, "lsn": str(c.lsn), "time": iso_utc(c.timestamp_ms / 1000), "tables": c.tables} for c in cuts]
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        console.print("no cuts (take one with `mooncake cut`)")
        return
    table = Table("tag", "lsn", "time", "tables")
    for r in rows:
        table.add_row(r["tag"], r["lsn"], r["time"], ", ".join(sorted(r["tables"])))
    console.print(table)


@app.command("merge-index", cls=PlainCommand)
def merge_index(
    dst: str,
    merge_all: bool = typer.Option(False, "--all", help="Merge even below the policy's block count"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
):
    """Merge DST's index blocks (k-way merge by hash) when the policy says so (more than 16 blocks by default)."""
    res = call(service_client(), "merge_index", table=dst, full=merge_all)
    if as_json:
        print(json.dumps(res))
    elif not res.get("merged"):
        console.print(f"merge-index {dst}: nothing to merge ({res.get('reason')})")
    else:
        console.print(
            f"merge-index {dst}: {res['blocks_in']} blocks → 1 ({res['entries_out']:,} entries, "
            f"{res['dead_entries_dropped']:,} of gone files dropped) in {res['seconds']:.2f}s; "
            f"{res['blocks_after']} block(s) now"
        )


@app.command(cls=PlainCommand)
def compact(
    dst: str,
    full: bool = typer.Option(False, "--full", help="Rewrite every file"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what would be picked and why"),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON"),
):
    """Rewrite small and half-deleted files of DST (policy: settings.json extra.maintenance, see MaintenancePolicy)."""
    res = call(service_client(), "compact", table=dst, full=full, dry_run=dry_run)
    if as_json:
        print(json.dumps(res))
        return
    if dry_run:
        print(f"compact {dst} --dry-run: {res['picked']} file(s) would be rewritten")
        for c in res.get("checks", []):
            print(f"  check: {c}")
        for f in res.get("files", []):
            print(
                f"  {f['file']}: {f['rows']:,} rows, {f['deleted']:,} deleted ({f['delete_ratio_percent']}%), "
                f"{f['bytes']:,} bytes — {'; '.join(f['reasons'])}"
            )
        return
    if not res.get("compacted"):
        console.print(f"compact {dst}: nothing to compact ({'; '.join(res.get('checks', []))})", highlight=False)
        return
    console.print(
        f"compact {dst}: {res['files_in']} files → {res['files_out']}, rows {res['rows_in']:,} → "
        f"{res['rows_out']:,} ({res['deleted_rows_dropped']:,} deleted dropped, {res['deletes_remapped']:,} "
        f"re-mapped), bytes {res['bytes_in']:,} → {res['bytes_out']:,}, index blocks {res['blocks_in']} → "
        f"{res['blocks_out']}, {res['seconds']:.2f}s (lock held {res['lock_seconds']:.3f}s)",
        highlight=False,
    )


@app.command(cls=PlainCommand)
def verify(
    tables: list[str] | None = typer.Argument(None, help="Mirrors to check (default: all)"),
    reader: str = typer.Option(
        "union",
        help="union (the service's union read), or a reader of the persisted Iceberg table: pyiceberg, "
        "duckdb-iceberg, iceberg-rust (pyiceberg-core + DataFusion) or polars; the last two need "
        "pip install 'mooncake-assets\\[readers]'",  # help is rich markup: \\[ prints a bracket
    ),
    checksum: bool = typer.Option(
        False,
        "--checksum",
        help="Run the service's scheduled check now instead: "
        "row counts and checksums per key range at one LSN (no rows compared; "
        "its result shows in list-tables and status)",
    ),
):
    """Compare each mirror with its source at one LSN; exit 0 only if all match."""
    if not checksum and not tables and CTX.config is not None and CTX.source is None:
        CTX.failed, codes = False, []
        for name in _each_source():  # every source of the sources file
            print(f"source {name}:", flush=True)
            if reader == "union" and _skip_if_stopped(f"source {name}: "):
                continue
            codes.append(run_verify(None, reader))
        raise typer.Exit(0 if codes and not CTX.failed and not any(codes) else 1)
    if checksum:
        res = call(service_client(), "verify_now", tables=tables or None, timeout=3600)
        for name, r in res.items():
            print(f"{name}: {r['result']} at LSN {r.get('lsn')} — {r.get('detail')}", flush=True)
        ok = sum(r["result"] == "match" for r in res.values())
        print(f"checksums: {ok}/{len(res)} tables match", flush=True)
        raise typer.Exit(0 if res and ok == len(res) else 1)
    if reader == "union":  # the union reader is a client of the service (readers of Iceberg are not)
        _refuse_to_start()
    code = run_verify(tables or None, reader)
    raise typer.Exit(code)


@app.command(cls=PlainCommand)
def demo(
    seconds: int = typer.Option(30, help="How long pgbench runs"),
    scale: int = typer.Option(1, help="pgbench scale factor"),
    clients: int = typer.Option(4, help="pgbench clients"),
    dagster: bool = typer.Option(False, "--dagster", help="Drive maintenance through the Dagster assets"),
    warehouse: str | None = typer.Option(
        None, "--warehouse", help="Warehouse URI for this demo (same as the global option)"
    ),
    publication: str | None = typer.Option(
        None,
        "--publication",
        help="Use this publication, created by an administrator "
        "(FOR TABLE …, FOR TABLES IN SCHEMA …, FOR ALL TABLES), instead of the "
        "service's own; mooncake never alters it (env MOONCAKE_PUBLICATION)",
    ),
    s3_endpoint: str | None = typer.Option(None, "--s3-endpoint", help="S3 endpoint URL for an s3:// warehouse"),
):
    """End-to-end run on pgbench's tables: mirror, stream a workload, union-read, persist, verify."""
    from .demo import run_demo

    settings = CTX.settings
    if warehouse or s3_endpoint:
        settings = load_settings(
            settings.state_dir,
            dsn=settings.dsn,
            warehouse=warehouse or settings.warehouse,
            catalog_uri=settings.catalog_uri,
            s3_endpoint=s3_endpoint or settings.s3_endpoint,
        )
    raise typer.Exit(run_demo(settings, seconds=seconds, scale=scale, clients=clients, dagster=dagster))


@app.command(cls=PlainCommand)
def ui(
    port: int = typer.Option(3000, help="Webserver port"),
    host: str = typer.Option("127.0.0.1", help="Webserver address (loopback by default)"),
    scale: int = typer.Option(1, help="pgbench scale factor (when its tables are created)"),
    rate: int = typer.Option(20, help="pgbench workload in transactions per second (0: none)"),
    clients: int = typer.Option(2, help="pgbench clients"),
):
    """Dagster webserver + daemon on the demo tables, with the service and a pgbench workload running."""
    from .ui import run_ui

    raise typer.Exit(run_ui(CTX.settings, host=host, port=port, scale=scale, rate=rate, clients=clients))


@app.command(cls=PlainCommand)
def chaos(
    seed: int = typer.Option(1, "--seed", help="First seed"),
    steps: int = typer.Option(300, "--steps", help="Workload steps per seed"),
    seeds: int = typer.Option(1, "--seeds", help="Number of seeds to run: seed, seed+1, …"),
    phase: int = typer.Option(25, "--phase", help="Steps between verify phases"),
    schema_rate: float = typer.Option(
        0.0,
        "--schema-rate",
        min=0.0,
        max=1.0,
        help="Extra share of steps that are schema changes (ADD/DROP/RENAME "
        "COLUMN, widening), on top of the workload's ~2 %",
    ),
    cases: Path | None = typer.Option(
        None,
        "--cases",
        help="Where failing seeds are written \\[default: ./tests/cases when it exists, else <state>/chaos-cases]",
    ),
    jitter: bool = typer.Option(
        False,
        "--jitter",
        help="Seeded delays inside the service where timing matters "
        "(catalog lookups, the apply loop, persist against a schema switch, the stream "
        "of a restarted service): races found on purpose, a failing seed replays by "
        "its seed",
    ),
):
    """Seeded chaos: mixed workloads, maintenance and SIGKILLs of the real service, checked by verify."""
    from .chaos import run_chaos

    cases = cases or (Path("tests/cases") if Path("tests/cases").is_dir() else CTX.settings.state_dir / "chaos-cases")
    dsn = CTX.settings.source_dsn()
    bad = 0
    for s in range(seed, seed + seeds):
        res = run_chaos(
            s,
            steps,
            dsn,
            cases_dir=cases,
            phase=phase,
            log=lambda m: err.print(m, highlight=False),
            schema_rate=schema_rate,
            jitter=jitter,
        )
        print(res.line(), flush=True)
        for d in res.divergences[:5]:
            print(f"  divergence: {json.dumps(d)}", flush=True)
        bad += len(res.divergences) > 0
    print(f"chaos: {seeds} seed(s) x {steps} steps: {bad} with divergences", flush=True)
    raise typer.Exit(1 if bad else 0)


@app.command(cls=PlainCommand)
def bench(
    quick: bool = typer.Option(
        False, "--quick", help="Smaller sizes and fewer repetitions: a smoke run, with less stable numbers"
    ),
    json_file: Path | None = typer.Option(
        None,
        "--json",
        metavar="FILE",
        help="Write every measurement as JSON to FILE (default: <state>/bench/bench.json)",
    ),
    plots: Path | None = typer.Option(
        None,
        "--plots",
        metavar="DIR",
        help="Write PNG plots of the measurements into DIR (default: bench-plots beside the JSON)",
    ),
    suite: list[str] | None = typer.Option(
        None,
        "--suite",
        help="Run only this suite (repeatable; default: all): ingest, freshness, union_read, changes, "
        "maintenance, memory, index, sysbench",
    ),
):
    """Benchmarks reported as ratios measured side by side in one run.

    Suites: ingest (rows/s and CPU µs/row applied vs pg_recvlogical on the same WAL: inserts, updates,
    deletes; initial copy vs COPY TO STDOUT), freshness (commit → visible under pgbench load), union_read
    (vs clean Parquet and a Flink-style equality-delete table), changes (the change feed of 1 % of a
    table's rows vs a full union read of it), maintenance, memory (RSS per buffered row),
    index (IndexBlock lookups), sysbench (replication lag under oltp_update_index / oltp_insert and the
    catch-up until a read-your-writes query answers). An embedded Postgres the bench starts is stopped
    at the end.
    """
    from .bench import run_bench

    raise typer.Exit(run_bench(CTX.settings, quick=quick, json_file=json_file, plots=plots, suites=suite))


def _misplaced_main_option(argv: list[str]) -> str | None:
    """The one-line error for a ``mooncake`` option given after the command (``mooncake sync --source
    shop``), which click would only call "No such option"; None when ``argv`` has no such option."""
    import click

    group = typer.main.get_command(app)
    takes_value = {o for p in group.params if isinstance(p, click.Option) and not p.is_flag for o in p.opts}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] not in takes_value else 2
    commands = getattr(group, "commands", None)  # typer's TyperGroup is no click.Group, but has them
    if i >= len(argv) or not isinstance(commands, dict) or (cmd := commands.get(argv[i])) is None:
        return None
    if hasattr(cmd, "commands"):  # `mooncake pg …`: its commands have options of their own
        return None
    own = {o for p in cmd.params for o in getattr(p, "opts", ())}
    main_opts = {o for p in group.params for o in getattr(p, "opts", ()) if o.startswith("--")}
    for arg in argv[i + 1 :]:
        if arg == "--":
            break
        name = arg.split("=", 1)[0]
        if name in main_opts and name not in own:
            return f"{name} is an option of mooncake itself: give it before the command (mooncake {name} … {argv[i]} …)"
    return None


def _reflowed(doc: str) -> str:
    """A command's docstring as ``--help`` should print it: paragraphs (blank-line separated) kept, the
    line breaks inside a paragraph dropped. Typer's rich help keeps a docstring's own line breaks, so
    lines written ~100 characters wide broke again in an 80-column terminal into a ragged text."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for _typer_app in (app, pg_app):
    for _info in _typer_app.registered_commands:
        _doc = _info.help or (_info.callback.__doc__ if _info.callback else None)
        if _doc:
            _info.help = _reflowed(_doc)


def main():
    if (msg := _misplaced_main_option(sys.argv[1:])) is not None:
        err.print(f"[red]error:[/red] {msg}", highlight=False, soft_wrap=True)
        raise SystemExit(2)
    app()


if __name__ == "__main__":
    main()
