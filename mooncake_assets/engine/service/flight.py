"""Arrow Flight front of the replicator service, on a Unix socket (docs/architecture.md#processes).

Actions (JSON body → JSON result): ``ping``, ``status``, ``create_table {dst, src, delete_format, column_types, exclude[, publication]}``,
``drop_table {table}``, ``flush|persist|merge_index|compact {table, ...}``, ``read_state {table, lsn}``
(returns the ReadState with a ``ticket`` for its in-memory rows), ``wait_lsn {lsn, timeout_s}``,
``cut {tables, wait_lsn, timeout_s}`` (every mirror, or ``tables``, committed at one LSN and tagged
``lsn-X-Y``, after waiting for ``wait_lsn``: ``cut.py``), ``read_states`` (below), ``changes {table,
since, until, timeout_s, deletes}`` (the change feed, :mod:`..table.changes`; ``deletes``: rows|keys: a JSON ``{"table",
"since", "until", "rows", "sources", "ticket"}`` result, the feed's rows then streamed by ``do_get(ticket)``;
LSNs not applied yet are waited for up to ``timeout_s``), ``chunked_copy_begin {dst, src, delete_format, column_types, exclude,
parts, min_range_pages}`` / ``chunked_copy_finish {slot}`` / ``chunked_copy_abort {slot}`` (``chunked.py``),
``shutdown``.

``read_states {tables | match, lsn, wait_lsn, timeout_s}`` is a union read's **one round trip**: it
first waits (``timeout_s``) until ``wait_lsn`` is applied (when given), then answers the ReadStates of
``tables`` (names; a missing one is an error) or of every readable mirror whose lower-cased name is in
``match`` (None: every readable mirror), each at ``lsn`` (None: all applied), *with* their in-memory
rows. Its results are several Flight ``Result`` messages: the first a JSON ``{"states": [wire
ReadState, …]}`` (:meth:`~..table.read_state.ReadState.to_wire`, ``mem_rows`` set, no ticket), then
one per state, in order, the in-memory rows as an Arrow IPC stream (schema + batches). Each state
carries a ``token`` (the service's :meth:`~..table.read_state.ReadState.content_token`, kept by a
version of the in-memory rows, or for services without one :func:`state_token`; its content without
the LSN either way) and ``key`` (the name it was
asked by, or its registry name); a client that holds a state sends ``known {key: token}``, and a
state whose token is unchanged comes back as ``{"key", "table", "lsn", "same": token}`` without its
rows (nothing else travels). A service with a read board (:mod:`.board`) adds ``"board":
{"incarnation", "epoch"}`` to the JSON result: the board's epoch the states were taken at (one hold
of the service lock), with which a client that holds the answer may skip the next round trip while
the board shows that epoch. The socket is ``0600`` (owner only). ``do_get(ticket)`` streams the in-memory rows captured by ``read_state``, or a ``changes`` feed (once;
tickets expire after 10 minutes). Errors reach the client as one-line Flight errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from ..heap import fix_mmap_threshold
from ..lsn import Lsn
from ..pg.conninfo import install_log_scrubber, scrub, source_label
from ..private import ensure_private_dir, write_private
from .board import Board, EpochLock, board_path
from .config import ServiceConfig
from .process import select_memory_pool
from .service import MooncakeError, ReplicatorService

log = logging.getLogger("mooncake.flight")
TICKET_TTL_S = 600  # seconds a ticket (read_state rows, a changes feed) waits for its do_get


class MooncakeFlightServer(flight.FlightServerBase):  # type: ignore[misc]  # pyarrow has no type information, so its base class is Any
    """The Arrow Flight front of one :class:`ReplicatorService` on a Unix socket (mode 0600).

    Actions (``do_action``, JSON body in, one JSON result out): ``list_actions`` names them. A
    ``read_state`` result carries a ticket; ``do_get`` with it streams that ReadState's in-memory rows
    once (a ticket not taken within 600 s is dropped). Errors reach the client as ``FlightServerError`` with the message scrubbed
    of secrets (``engine/pg/conninfo.scrub``). Source: Arrow Flight RPC, "Actions" and "DoGet"."""

    def __init__(self, service: ReplicatorService, socket_path: str) -> None:
        if os.path.exists(socket_path):
            os.unlink(socket_path)
        super().__init__(flight.Location.for_grpc_unix(socket_path))
        os.chmod(socket_path, 0o600)  # owner only (the service's umask already made it so; be exact)
        self.service = service
        self.socket_path = socket_path
        self._tickets: dict[str, tuple[float, pa.Table]] = {}
        self._tlock = threading.Lock()
        # the read board (board.py): published under the service's EpochLock; services without one
        # (in-process doubles) have none, and their readers always take the round trip
        self.board: Board | None = None
        lock, applied = getattr(service, "lock", None), getattr(service, "board_applied_lsn", None)
        if isinstance(lock, EpochLock) and applied is not None:
            self.board = Board(board_path(socket_path))
            lock.attach(self.board, applied)

    # ------------------------------------------------------------------ actions
    def do_action(self, context: Any, action: Any) -> Iterator[Any]:
        """Run one action: ``action.type`` names it, ``action.body`` is its JSON arguments; yields one
        ``flight.Result`` of JSON. ``MooncakeError``/``TimeoutError``/``ValueError``/``LookupError`` become
        ``FlightServerError`` with their text; anything else is logged and sent as ``Type: text``."""
        body = json.loads(action.body.to_pybytes() or b"{}")
        try:
            if action.type == "read_states":  # several results: the JSON states, then each one's rows
                yield from self._read_states(body)
                return
            if action.type == "changes":  # two results: the JSON head, then the feed's rows
                yield from self._changes(body)
                return
            result = self._dispatch(action.type, body)
        except (MooncakeError, TimeoutError, ValueError, LookupError) as e:
            raise flight.FlightServerError(scrub(str(e))) from e
        except Exception as e:
            log.exception("action %s failed", action.type)
            raise flight.FlightServerError(scrub(f"{type(e).__name__}: {e}")) from e
        yield flight.Result(json.dumps(result, default=str).encode())

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        """``(action name, description)`` of every action :meth:`do_action` takes."""
        return [
            ("ping", "liveness"),
            ("status", "list-tables document"),
            ("create_table", "mirror a table"),
            ("drop_table", "stop mirroring"),
            ("flush", ""),
            ("persist", ""),
            ("cut", "commit every mirror at one LSN and tag the snapshots lsn-X-Y"),
            ("merge_index", ""),
            ("compact", ""),
            ("read_state", "ReadState + ticket"),
            ("read_states", "wait, then ReadStates + their in-memory rows (one round trip)"),
            ("wait_lsn", "read-your-writes barrier"),
            ("changes", "the change feed of a table between two LSNs"),
            ("verify_now", "the scheduled checksum verify, now"),
            ("chunked_copy_begin", "create-table up to its copy: the snapshot held, the CTID ranges planned"),
            ("chunked_copy_finish", "the staged chunks into the mirror, one commit at the snapshot's LSN"),
            ("chunked_copy_abort", "give up a chunked copy"),
            ("shutdown", "stop the service"),
        ]

    def _dispatch(self, kind: str, b: dict[str, Any]) -> Any:
        s = self.service
        if kind == "ping":
            return {
                "ok": True,
                "pid": os.getpid(),
                "maintenance": s.config.maintenance,
                "memory_limit": s.memory.limit,
                "source": source_label(s.dsn),
            }
        if kind == "verify_now":  # the scheduled verify, now (see verifier.py); returns {table: result}
            return s.verifier.run_once(b.get("tables") or None)
        if kind == "status":
            return s.status()
        if kind == "create_table":
            return s.create_table(
                b["dst"],
                b["src"],
                b.get("delete_format") or "deletion-vectors",
                column_types=b.get("column_types"),
                exclude=b.get("exclude"),
                **({"publication": b["publication"]} if "publication" in b else {}),
            )
        if kind == "drop_table":
            return s.drop_table(b["table"])
        if kind == "chunked_copy_begin":
            return s.chunked.begin(
                b["dst"],
                b["src"],
                b.get("delete_format") or "deletion-vectors",
                column_types=b.get("column_types"),
                exclude=b.get("exclude"),
                parts=int(b.get("parts", 4)),
                min_range_pages=int(b.get("min_range_pages", 1024)),
            )
        if kind == "chunked_copy_finish":
            return s.chunked.finish(b["slot"])
        if kind == "chunked_copy_abort":
            return s.chunked.abort(b["slot"])
        if kind in ("flush", "persist", "merge_index", "compact"):
            kw = {k: v for k, v in b.items() if k != "table"}
            return s.maintenance(kind, b["table"], **kw)
        if kind == "cut":
            if b.get("wait_lsn"):  # what was committed before the cut is in it
                s.wait_lsn(Lsn.parse(b["wait_lsn"]), float(b.get("timeout_s", 30)))
            return s.cut(b.get("tables") or None)
        if kind == "wait_lsn":
            applied = s.wait_lsn(Lsn.parse(b["lsn"]), float(b.get("timeout_s", 30)))
            return {"applied_lsn": str(Lsn(applied))}
        if kind == "read_state":
            lsn = Lsn.parse(b["lsn"]) if b.get("lsn") else None
            rs = s.read_state(b["table"], lsn)
            mem = rs.mem
            assert mem is not None  # an in-process ReadState carries its in-memory rows
            return rs.with_(ticket=self._ticket(mem), mem_rows=mem.num_rows).to_wire()  # the ReadState's one wire form
        if kind == "shutdown":
            threading.Thread(target=self._shutdown_soon, daemon=True).start()
            return {"ok": True}
        raise MooncakeError(f"unknown action {kind!r}")

    def _ticket(self, rows: pa.Table) -> str:
        """Keep ``rows`` for one ``do_get`` and return its ticket (tickets not taken within
        :data:`TICKET_TTL_S` seconds are dropped when the next one is made)."""
        ticket = uuid.uuid4().hex
        with self._tlock:
            now = time.time()
            for k in [k for k, (t, _) in self._tickets.items() if now - t > TICKET_TTL_S]:
                self._tickets.pop(k, None)
            self._tickets[ticket] = (now, rows)
        return ticket

    def _read_states(self, b: dict[str, Any]) -> Iterator[Any]:
        """The ``read_states`` action (module docstring): JSON result, then one IPC stream per state."""
        s = self.service
        if b.get("wait_lsn"):
            s.wait_lsn(Lsn.parse(b["wait_lsn"]), float(b.get("timeout_s", 30)))
        names = b.get("tables")
        if names is None:
            readable = getattr(s, "readable_tables", None)  # in-process doubles of the service may lack it
            if readable is not None:
                names = readable()
            else:
                names = [t["name"] for t in s.status()["tables"] if t.get("state") != "copying"]
            match = b.get("match")
            if match is not None:
                wanted = {str(m).lower() for m in match}
                names = [n for n in names if n.lower() in wanted]
        lsn = Lsn.parse(b["lsn"]) if b.get("lsn") else None
        known = b.get("known") or {}
        states, mems = [], []
        together = getattr(s, "read_states", None)  # one lock hold: a transaction is in every table or none
        asked = {n: known[n] for n in names if n in known}
        board: dict[str, int] | None = None
        # with a board: the epoch these states are at, taken in the same (reading) hold (board.py)
        with s.lock.reading() if self.board is not None else contextlib.nullcontext():
            if self.board is not None:
                board = {"incarnation": self.board.incarnation, "epoch": s.lock.epoch}
            got = together(names, lsn, asked) if together is not None else [s.read_state(n, lsn) for n in names]
        for name, rs in zip(names, got):
            if rs.token is not None and rs.token == known.get(name):  # the service's token: nothing serialized
                states.append({"key": name, "table": rs.table, "lsn": str(rs.lsn), "same": rs.token})
                continue
            mem = rs.mem
            assert mem is not None  # an in-process ReadState carries its in-memory rows
            wire = rs.with_(mem_rows=mem.num_rows).to_wire()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, mem.schema) as w:
                w.write_table(mem)
            rows = sink.getvalue()
            token = rs.token or state_token(wire, rows)  # services without tokens: one over the content
            if known.get(name) == token:  # the client holds this very state: only the LSN travels
                states.append({"key": name, "table": rs.table, "lsn": wire["lsn"], "same": token})
                continue
            states.append({**wire, "key": name, "token": token})
            mems.append(rows)
        head: dict[str, Any] = {"states": states}
        if board is not None:
            head["board"] = board
        yield flight.Result(json.dumps(head, default=str).encode())
        for rows in mems:
            yield flight.Result(rows)

    def _changes(self, b: dict[str, Any]) -> Iterator[Any]:
        """The ``changes`` action (module docstring): one JSON result ``{"table", "since", "until", "rows",
        "sources", "ticket"}`` (``sources``: where the deleted rows came from,
        :func:`..table.changes.feed_sources`); the feed's rows are streamed by ``do_get(ticket)``. (One
        action result of a few MB took 2–3× as long as the same rows as a DoGet record-batch stream:
        gRPC carries an action's result as one message.)"""
        since = Lsn.parse(b["since"])
        u = b.get("until")
        until = u if u == "persisted" else (Lsn.parse(u) if u else None)
        timeout_s = float(b.get("timeout_s", 30))
        sources: dict[str, Any] = {}
        end, feed = self.service.changes(
            b["table"], since, until, timeout_s, str(b.get("deletes") or "rows"), sources=sources
        )
        head = {
            "table": b["table"],
            "since": str(since),
            "until": str(end),
            "rows": feed.num_rows,
            "sources": sources,
            "ticket": self._ticket(feed),
        }
        yield flight.Result(json.dumps(head).encode())

    def _shutdown_soon(self) -> None:
        time.sleep(0.2)
        self.close_board()
        self.service.stop()
        self.shutdown()

    def close_board(self) -> None:
        """Stop publishing on the read board and remove it (readers then take the round trip, which
        tells them the service is gone)."""
        if self.board is not None:
            lock = getattr(self.service, "lock", None)
            if isinstance(lock, EpochLock):
                lock.detach()
            self.board.close()
            self.board = None

    # ------------------------------------------------------------------ streams
    def do_get(self, context: Any, ticket: Any) -> Any:
        """Stream the Arrow rows behind a ``read_state`` or ``changes`` ticket (each ticket is taken once);
        ``FlightServerError`` for an unknown or expired one."""
        key = ticket.ticket.decode()
        with self._tlock:
            item = self._tickets.pop(key, None)
        if item is None:
            raise flight.FlightServerError(f"unknown or expired ticket {key}")
        return flight.RecordBatchStream(item[1])


def serve(config: ServiceConfig, ready_cb: Callable[[], object] | None = None) -> None:
    """Run the service of ``config`` in the foreground until ``shutdown`` or SIGTERM/SIGINT."""
    os.umask(0o077)  # everything the service creates (state, staging, catalog, socket) is owner-only
    install_log_scrubber()
    select_memory_pool()
    fix_mmap_threshold()  # large transient buffers go back to the system when freed (engine/heap.py)
    ensure_private_dir(config.state_dir)
    pidfile = config.state_dir / "service.pid"
    service = ReplicatorService(config)
    service.start()  # restore tables and start streaming before the socket answers pings
    server = MooncakeFlightServer(service, str(config.socket_path))
    write_private(pidfile, str(os.getpid()))

    def _term(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server._shutdown_soon, daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(sig, _term)
        except ValueError:
            pass
    log.info("mooncake service listening on %s", config.socket_path)
    if ready_cb:
        ready_cb()
    try:
        server.serve()
    finally:
        server.close_board()
        try:
            if pidfile.exists() and pidfile.read_text().strip() == str(os.getpid()):
                pidfile.unlink()
        except OSError:
            pass


def state_token(wire: dict[str, Any], rows: Any) -> str:
    """A ReadState's content token for ``read_states``: 32 hex digits of BLAKE2b over its wire form
    without the LSN (files, paths, deletion vectors, schema, fields, storage, row count) and its
    in-memory rows' IPC bytes ``rows``. Equal tokens mean the same rows to read, at any LSN."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps({k: v for k, v in wire.items() if k != "lsn"}, sort_keys=True, default=str).encode())
    h.update(memoryview(rows))
    return h.hexdigest()
