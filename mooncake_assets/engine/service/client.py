"""Client of the replicator service: Arrow Flight over the service's Unix socket (docs/architecture.md#processes).

Control calls are Flight *actions* whose body and result are JSON; the in-memory rows of a ReadState
come back as an Arrow stream from ``do_get`` on the ticket the ReadState names.

Errors: :class:`ServiceUnavailable` when nothing answers on the socket (retrying after
``mooncake start`` helps); :class:`ServiceError` carrying the service's one-line message otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.flight as flight

from ..lsn import Lsn
from ..table.read_state import ReadState
from .board import BoardReader, board_path

#: the client holds the in-memory rows of the tables it last read between ``read_states`` calls, up to
#: this many bytes in all and this many tables (the least recently read dropped first; a reader
#: registering the rows holds the same objects, so they cost nothing more while it reads the table)
HOLD_BYTES = 256 << 20
HOLD_TABLES = 256


class ServiceError(RuntimeError):
    """The service refused or failed a call; the message is the service's own."""


class ServiceUnavailable(ServiceError):
    """No service answers on the socket (temporary: start it with `mooncake start`)."""


class ServiceClient:
    """Flight client bound to one service socket (``<state>/service.sock``)."""

    def __init__(self, socket_path: str | os.PathLike[str], timeout: float = 600.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._client: Any = None  # a pyarrow FlightClient once connected (pyarrow has no type information)
        self._held: dict[str, tuple[str, ReadState]] = {}  # name -> (token, its last ReadState with rows)
        self.unchanged = 0  # read_states answers that were "unchanged" (the held state at a new LSN)
        self.board = BoardReader(board_path(self.socket_path))
        # (tables, match) -> (board incarnation, epoch, the answer) of the last read_states at the
        # applied LSN, while its rows are within HOLD_BYTES (read_states' fast path)
        self._answers: dict[tuple[Any, Any], tuple[int, int, list[ReadState]]] = {}
        self.skipped = 0  # read_states calls answered from the board, without a round trip

    def _conn(self) -> flight.FlightClient:
        if self._client is None:
            if not self.socket_path.exists():
                raise ServiceUnavailable(f"no mooncake service at {self.socket_path} (run `mooncake start`)")
            self._client = flight.connect(flight.Location.for_grpc_unix(str(self.socket_path)))
        return self._client

    def call(self, action: str, timeout: float | None = None, **body: Any) -> dict[str, Any]:
        """Run one action; returns its JSON result as a dict."""
        opts = flight.FlightCallOptions(timeout=timeout or self.timeout)
        try:
            results = list(self._conn().do_action(flight.Action(action, json.dumps(body).encode()), opts))
        except flight.FlightUnavailableError as e:
            self.close()
            raise ServiceUnavailable(f"mooncake service at {self.socket_path} is not answering: {_clean(e)}") from None
        except flight.FlightError as e:
            raise ServiceError(_clean(e)) from None
        if not results:
            return {}
        return cast(dict[str, Any], json.loads(results[0].body.to_pybytes()))

    def ping(self, timeout: float = 2.0) -> bool:
        """Is a service answering on the socket within ``timeout`` seconds? (False on a Flight error;
        ``ServiceUnavailable`` when there is no socket file.)"""
        try:
            self.call("ping", timeout=timeout)
            return True
        except ServiceError:
            return False

    def fetch(self, ticket: str) -> pa.Table:
        """The Arrow rows behind a ticket (``do_get``): a ReadState's in-memory rows, or a ``changes``
        feed. Each ticket is taken once; ``ServiceError`` (one line) for an unknown or expired one."""
        try:
            reader = self._conn().do_get(flight.Ticket(ticket.encode()))
            return reader.read_all()
        except flight.FlightError as e:
            raise ServiceError(_clean(e)) from None

    # convenience wrappers (the Dagster resource and the CLI use these)
    def status(self) -> dict[str, Any]:
        """The service's ``status`` document (:meth:`~.service.ReplicatorService.status`: ``tables``,
        LSNs as ``X/Y`` text, slot, publication, stream and source fields)."""
        return self.call("status")

    def read_state(self, table: str, lsn: str | None = None) -> ReadState:
        """The table's :class:`ReadState` at ``lsn`` (``X/Y``; None: all applied), with the ``ticket``
        :meth:`fetch` takes for its in-memory rows (once) and ``mem_rows``."""
        return ReadState.from_wire(self.call("read_state", table=table, lsn=lsn))

    def read_states(
        self,
        tables: list[str] | None = None,
        match: list[str] | None = None,
        lsn: str | None = None,
        wait_lsn: str | None = None,
        timeout: float = 30.0,
    ) -> list[ReadState]:
        """ReadStates *with* their in-memory rows (``mem``) in **one** round trip (the ``read_states``
        action, :mod:`.flight`): after waiting up to ``timeout`` s until ``wait_lsn`` is applied (when
        given; ``ServiceError`` "timed out…" after), the states of ``tables`` (names, each must exist),
        or of every readable mirror whose lower-cased name is in ``match`` (None: all), at ``lsn``
        (``X/Y``; None: all applied). Returns them in the order of ``tables`` / the registry.

        The client holds the last state of each table (rows: :data:`HOLD_BYTES` in all) with its token:
        when the service finds a table unchanged it sends only the new LSN, and the state returned
        is the held one (the same ``mem`` object) at that LSN. ``unchanged`` counts such answers.

        **No round trip** when the service's read board (:mod:`.board`) shows the incarnation and epoch
        the last answer to the same ``tables``/``match`` (at the applied LSN, ``lsn`` None) was taken at,
        and an applied LSN at or past ``wait_lsn``: nothing any reader sees has changed since, so that
        answer (the same objects) is returned. ``skipped`` counts such calls."""
        req = (tuple(tables) if tables is not None else None, tuple(match) if match is not None else None)
        if lsn is None:
            fast = self._from_board(req, wait_lsn)
            if fast is not None:
                return fast
        held = dict(self._held)  # this call's view of the held states (another thread may replace them)
        if tables is not None:
            held = {t: v for t, v in held.items() if t in tables}
        elif match is not None:
            wanted = {m.lower() for m in match}
            held = {t: v for t, v in held.items() if t.lower() in wanted}
        body = {
            "tables": tables,
            "match": match,
            "lsn": lsn,
            "wait_lsn": wait_lsn,
            "timeout_s": timeout,
            "known": {t: token for t, (token, _) in held.items()},
        }
        opts = flight.FlightCallOptions(timeout=max(self.timeout, timeout + 10))
        try:
            results = iter(self._conn().do_action(flight.Action("read_states", json.dumps(body).encode()), opts))
            head = json.loads(next(results).body.to_pybytes())
            out: list[ReadState] = []
            for wire in head["states"]:
                if wire.get("same") is not None:  # unchanged: the held state and rows, at the new LSN
                    token, same = held[wire["key"]]  # the service answers so only to a token sent from held
                    if token != wire["same"]:
                        raise ServiceError(f"read_states: {wire['table']} answered for a state this client never held")
                    out.append(same.with_(lsn=Lsn.parse(wire["lsn"])))
                    self._touch(wire["key"], token, same)
                    self.unchanged += 1
                    continue
                mem = pa.ipc.open_stream(next(results).body).read_all()
                rs = ReadState.from_wire(wire).with_(mem=mem)
                out.append(rs)
                self._hold(wire.get("key"), wire.get("token"), rs)
        except flight.FlightUnavailableError as e:
            self.close()
            raise ServiceUnavailable(f"mooncake service at {self.socket_path} is not answering: {_clean(e)}") from None
        except flight.FlightError as e:
            raise ServiceError(_clean(e)) from None
        board = head.get("board")
        self._answers.pop(req, None)
        if lsn is None and board is not None and sum(cast(pa.Table, rs.mem).nbytes for rs in out) <= HOLD_BYTES:
            self._answers[req] = (int(board["incarnation"]), int(board["epoch"]), out)
            while len(self._answers) > HOLD_TABLES:
                self._answers.pop(next(iter(self._answers)))
        return list(out)

    def _from_board(self, req: tuple[Any, Any], wait_lsn: str | None) -> list[ReadState] | None:
        """The last answer to ``req`` when the read board shows it is still the service's answer (same
        incarnation and epoch; applied LSN at or past ``wait_lsn``), else None (take the round trip)."""
        last = self._answers.get(req)
        if last is None:
            return None
        snap = self.board.snapshot()
        if snap is None or snap.incarnation != last[0] or snap.epoch != last[1]:
            return None
        if wait_lsn is not None and snap.applied < Lsn.parse(wait_lsn):
            return None
        self.skipped += 1
        return list(last[2])

    def _hold(self, key: str | None, token: str | None, rs: ReadState) -> None:
        """Keep ``rs`` (with its rows) under ``key`` (the name the service answered it for) and its
        ``token`` for the next :meth:`read_states`, unless its rows exceed :data:`HOLD_BYTES` (then
        nothing is held for it). A service without tokens (None) holds nothing."""
        if key is None:
            return
        mem = cast(pa.Table, rs.mem)
        if token is None or mem.nbytes > HOLD_BYTES:
            self._held.pop(key, None)
            return
        self._held.pop(key, None)  # re-inserted last: the least recently read go first
        self._held[key] = (token, rs)
        while (
            len(self._held) > HOLD_TABLES
            or sum(cast(pa.Table, h.mem).nbytes for _, h in self._held.values()) > HOLD_BYTES
        ):
            self._held.pop(next(iter(self._held)))

    def _touch(self, key: str, token: str, rs: ReadState) -> None:
        """An unchanged ``rs`` (held under ``key``, ``token``) was read again: it goes last (read recently)."""
        self._held.pop(key, None)
        self._held[key] = (token, rs)

    def changes(
        self, table: str, since: str, until: str | None = None, timeout: float = 30.0, deletes: str = "rows"
    ) -> tuple[dict[str, Any], pa.Table]:
        """The change feed of ``table`` over ``[since, until)`` (``X/Y`` text; ``until`` None: all applied,
        ``"persisted"``: the current snapshot's LSN), the ``changes`` action (:mod:`.flight`; shape: :mod:`..table.changes`). LSNs not
        applied yet are waited for up to ``timeout`` s. ``deletes``: ``rows`` (deleted rows in full) or
        ``keys`` (deleted rows as their primary key, other columns null: :mod:`..table.change_keys`). Returns ``({"table", "since", "until",
        "rows", "sources"}, feed)`` (``sources``: where the deleted rows came from — delete logs or data files —
        :func:`..table.changes.feed_sources`); ``ServiceError`` with the service's one-line message otherwise."""
        body = {"table": table, "since": since, "until": until, "timeout_s": timeout, "deletes": deletes}
        opts = flight.FlightCallOptions(timeout=max(self.timeout, timeout + 10))
        try:
            results = list(self._conn().do_action(flight.Action("changes", json.dumps(body).encode()), opts))
            head = json.loads(results[0].body.to_pybytes())
            feed = self.fetch(head.pop("ticket"))
        except flight.FlightUnavailableError as e:
            self.close()
            raise ServiceUnavailable(f"mooncake service at {self.socket_path} is not answering: {_clean(e)}") from None
        except flight.FlightError as e:
            raise ServiceError(_clean(e)) from None
        return head, feed

    def wait_lsn(self, lsn: str, timeout: float = 30.0) -> dict[str, Any]:
        """Block until every commit below ``lsn`` (``X/Y`` text) is applied, at most ``timeout`` seconds
        (the Flight call gets 10 s more); ``ServiceError`` with the service's ``TimeoutError`` text otherwise."""
        return self.call("wait_lsn", lsn=lsn, timeout=timeout + 10, timeout_s=timeout)

    def close(self) -> None:
        """Close the Flight connection (the next call reconnects); errors while closing are ignored."""
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None
        self._answers.clear()
        self.board.close()


def _clean(e: Exception) -> str:
    """Strip gRPC's decoration from a Flight error message."""
    msg = str(e)
    if "Python exception: " in msg:
        msg = msg.split("Python exception: ", 1)[1]
    msg = msg.split("\ngRPC client debug context")[0]
    if ". Detail:" in msg:  # gRPC appends ". Detail: …"; the message itself may contain one (PyArrow's OSErrors)
        msg = msg.rsplit(". Detail:", 1)[0]
    return msg.strip()
