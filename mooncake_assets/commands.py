"""What the ``mooncake`` commands share: the consoles, the command's settings, errors, the service client.

``cli`` (the Typer app), ``demo`` and ``ui`` import these; none of them imports another for a helper,
so the command modules form no import cycle (``cli`` imports ``demo`` and ``ui`` only to run them).

- ``console`` / ``err``: rich consoles on stdout / stderr (off a terminal, lines up to 400 columns).
- ``CTX.settings``: the :class:`~mooncake_assets.config.Settings` of this invocation, set by the CLI's
  global options (absent when ``demo``/``ui`` are called without the CLI).
- :func:`fail`: prints ``error: <message>`` (passwords scrubbed) and exits with ``code``.
- :func:`service_client`, :func:`call`: the service's client, started when needed; a refused call fails.
- :func:`create_with_progress`: ``create_table`` with a progress bar of the initial copy.
- :func:`run_verify`: ``mooncake verify``'s report and exit code.
"""

from __future__ import annotations

import sys
import threading

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .config import Settings


def _width(stream) -> int | None:
    """Off a terminal (piped, redirected, captured) rich would cut everything to 80 columns; lines are as
    wide as they need then (up to 400 columns). A terminal or ``COLUMNS`` keeps rich's own width."""
    import os

    return None if stream.isatty() or os.environ.get("COLUMNS") else 400


console = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))


class Ctx:
    """The invocation's context. ``settings``: given by the CLI (one-source mode), or, with a
    configuration file (``config``, a :class:`~mooncake_assets.sources.MooncakeConfig`), those of the
    source ``source`` (``--source``; None: the only one), resolved on first use; a command that needs
    one source when the file has several fails then, asking for ``--source``. Without either reading
    it raises ``AttributeError`` (``demo``/``ui`` called without the CLI)."""

    config = None
    source: str | None = None
    failed = False  # a command over every source: one of them failed (its exit code is then 1)
    _settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None and self.config is not None:
            from .sources import MissingDsn

            try:
                self._settings = self.config.source(self.source).settings()
            except (ValueError, MissingDsn) as e:
                fail(str(e), code=2)
        if self._settings is None:
            raise AttributeError("settings")
        return self._settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self._settings = value


CTX = Ctx()


def n_rows(n) -> str:
    """``"1 row"``, ``"2 rows"``: a row count as a message says it."""
    return f"{n} row" if n == 1 else f"{n} rows"


def fail(msg: str, code: int = 1):
    """Print ``error: msg`` on stderr (passwords scrubbed, a password hint added when one is missing)
    and raise ``typer.Exit(code)``."""
    from rich.markup import escape  # a message may hold brackets ("[errno 1]") that are not markup

    from .engine.pg.conninfo import scrub, with_password_hint

    err.print(f"[red]error:[/red] {escape(with_password_hint(scrub(msg)))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def service_client(start: bool = True, settings: Settings | None = None, report: bool = False):
    """A client of the service (started when it is not running; a running one must mirror from this
    command's DSN, see ``check_source``). ``report``: return ``(client, started_here)``."""
    from .engine.service import ServiceClient
    from .engine.service.process import SourceMismatch, check_source, start_service

    s = settings or CTX.settings
    started = False
    if start:
        try:
            _, started = start_service(s, report=True)
        except Exception as e:
            fail(str(e))
    else:
        c = ServiceClient(s.socket_path)
        try:
            if c.ping():
                check_source(s, c.call("ping", timeout=5))
        except SourceMismatch as e:
            fail(str(e))
        except Exception:
            pass
        finally:
            c.close()
    client = ServiceClient(s.socket_path)
    return (client, started) if report else client


def call(client, action: str, **kw) -> dict:
    """``client.call(action, **kw)``; a :class:`ServiceError` (the service refused) becomes :func:`fail`."""
    from .engine.service import ServiceError

    try:
        return client.call(action, **kw)
    except ServiceError as e:
        fail(str(e))


def create_with_progress(
    client, dst, src, delete_format="deletion-vectors", quiet=False, column_types=None, exclude=None, refused=None
) -> dict:
    """The service's ``create_table`` of mirror ``dst`` from source ``src`` (initial copy, then CDC) with a
    progress bar of the copied rows on a terminal (``quiet``: none). Sends the publication of this
    command's settings when there are some (``CTX.settings``). Returns the service's result (``table``,
    ``source``, ``rows``, ``copy_lsn``, ``seconds``, ``key``, …); a refused create is :func:`fail`
    (``refused``: an object whose ``check(message)`` may raise its own exception first)."""
    from .engine.service import ServiceClient, ServiceError, ServiceUnavailable

    box: dict = {}

    def run():
        try:
            box["res"] = client.call(
                "create_table",
                dst=dst,
                src=src,
                delete_format=delete_format,
                timeout=3600,
                # the publication this command was given (demo/ui call in without a CLI context)
                **({"publication": CTX.settings.publication} if hasattr(CTX, "settings") else {}),
                **({"column_types": column_types} if column_types else {}),
                **({"exclude": exclude} if exclude else {}),
            )
        except ServiceUnavailable:  # the service went away mid-copy (`mooncake stop`, a crash)
            box["err"] = (
                f"the copy of {src} as {dst} was interrupted: the service stopped; nothing of it is kept (the "
                f"next start drops the partial copy): start the service and run create-table {dst} {src} again"
            )
        except ServiceError as e:
            box["err"] = str(e)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    poll = ServiceClient(client.socket_path)
    with Progress(
        TextColumn("copying {task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} rows"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet or not err.is_terminal,
    ) as prog:
        task = prog.add_task(f"{src} → {dst}", total=None)
        while th.is_alive():
            th.join(0.3)
            try:
                for t in poll.status()["tables"]:
                    if t["name"] == dst and t.get("progress"):
                        p = t["progress"]
                        prog.update(
                            task,
                            completed=p.get("rows", 0),
                            total=max(p.get("total_rows") or 0, p.get("rows", 0)) or None,
                        )
            except ServiceError:
                pass
    poll.close()
    if "err" in box:
        if refused is not None:
            refused.check(box["err"])
        fail(box["err"])
    return box["res"]


def run_verify(tables, reader: str, settings: Settings | None = None) -> int:
    """Print one line per table and the closing ``verified: K/N tables match at LSN …``; returns the exit code."""
    from .verify import verify as _verify

    settings = settings or CTX.settings
    client = service_client(settings=settings) if reader == "union" else None
    try:
        results, lsn = _verify(settings, tables, reader, client)
    except Exception as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    for r in results:
        print(r.line(), flush=True)
    skipped = [r for r in results if r.skipped]  # read-only mirrors of dropped source tables
    checked = [r for r in results if not r.skipped]
    ok = sum(r.match for r in checked)
    tail = f" ({len(skipped)} read-only, skipped)" if skipped else ""
    print(f"verified: {ok}/{len(checked)} tables match at LSN {lsn}{tail}", flush=True)
    return 0 if ok == len(checked) and results else 1
