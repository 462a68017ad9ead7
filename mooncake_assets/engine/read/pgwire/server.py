"""The SQL endpoint's listener: a TCP server speaking PostgreSQL protocol 3.0, a thread per
connection, every statement a union read through one shared :class:`~.backend.Backend` (its pool
of readers). With ``tls`` (an ``ssl.SSLContext`` holding the server's certificate) a client's
SSLRequest is answered ``S`` and the connection goes on in TLS ("SSL Session Encryption").

CancelRequest ("Message Flow / Canceling Requests in Progress"): a new connection carrying a
session's process id and secret key (sent to it in BackendKeyData) interrupts that session's
running statement; a key that matches nothing is ignored, as Postgres does.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import secrets
import socket
import ssl
import threading

from .auth import Verifier
from .backend import Backend
from .session import Session

LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


class SqlServer:
    """Listens on ``host``:``port`` (port 0: any free one, see :attr:`port`) and serves each client in
    its own thread. ``users``: user name -> SCRAM-SHA-256 verifier; ``trust_loopback``: clients
    connecting from a loopback address need no password; ``tls``: the context connections are
    wrapped in when the client asks (:func:`tls_context`; None: TLS refused with ``N``)."""

    def __init__(
        self,
        backend: Backend,
        host: str = "127.0.0.1",
        port: int = 5433,
        users: dict[str, Verifier] | None = None,
        trust_loopback: bool = False,
        tls: ssl.SSLContext | None = None,
    ):
        self.backend = backend
        self.tls = tls
        self.users = dict(users or {})
        self.trust_loopback = trust_loopback
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(64)
        self.host, self.port = self.sock.getsockname()[:2]
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self._pids = itertools.count((os.getpid() % 10_000) * 1000 + 1)
        self._stop = threading.Event()

    def trusts(self, peer: str) -> bool:
        """True when ``peer`` (an address) may connect without a password."""
        if not self.trust_loopback:
            return False
        try:
            return peer in LOOPBACK or ipaddress.ip_address(peer).is_loopback
        except ValueError:
            return False

    def serve_forever(self) -> None:
        """Accept connections until :meth:`close`."""
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                raise
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                pid = next(self._pids) & 0x7FFFFFFF
                session = Session(self, conn, addr[0], pid, secrets.randbits(31))
                self._sessions[pid] = session
            threading.Thread(target=session.run, name=f"pgwire-{pid}", daemon=True).start()

    def forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.pid, None)

    def cancel(self, pid: int, key: int) -> None:
        """A CancelRequest: interrupt the matching session's running statement, if any."""
        with self._lock:
            s = self._sessions.get(pid)
        if s is not None and secrets.compare_digest(s.key.to_bytes(4, "big"), (key & 0xFFFFFFFF).to_bytes(4, "big")):
            self.backend.interrupt(s)

    def close(self) -> None:
        self._stop.set()
        try:
            self.sock.close()
        except OSError:
            pass


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) with the certificate chain ``cert`` and its private
    key ``key`` (PEM files). Raises ``ssl.SSLError``/``OSError`` for files that cannot be used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx
