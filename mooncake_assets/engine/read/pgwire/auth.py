"""Password authentication for the SQL endpoint: SCRAM-SHA-256 verifiers and the server's exchange.

Sources: RFC 5802 (SCRAM), RFC 7677 (SCRAM-SHA-256), and the PostgreSQL manual, "Frontend/Backend
Protocol / SASL Authentication" (the SCRAM-SHA-256 profile: the user name in ``client-first-message``
is ignored — the startup packet's ``user`` counts —, no channel binding without TLS) and
"Password Authentication" (the verifier text ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``,
base64 parts, as ``pg_authid.rolpassword`` stores it).

Passwords are never stored: a users file holds one ``name:verifier`` per line (``#`` comments,
blank lines ignored) and must not be readable by group or others (mode 0600, as ``~/.pgpass``).
:func:`make_verifier` builds a line's verifier; ``mooncake sql-server-user`` writes one.
Passwords are used as their UTF-8 bytes (Postgres applies SASLprep first; for ASCII passwords the
two agree).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 4096  # Postgres's default scram_iterations


class AuthFailed(Exception):
    """The client's proof does not match the verifier, or its messages are malformed (``28P01``)."""


class UsersFileError(ValueError):
    """A users file that cannot be used: unreadable, readable by others, or a malformed line (the
    message names the file and the line)."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


@dataclass(frozen=True)
class Verifier:
    """A SCRAM-SHA-256 verifier: ``salt`` (bytes), ``iterations``, ``stored_key`` = H(ClientKey) and
    ``server_key`` = HMAC(SaltedPassword, "Server Key") (RFC 5802 §3)."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def text(self) -> str:
        """Postgres's text form ``SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>``."""
        return f"{MECHANISM}${self.iterations}:{_b64(self.salt)}${_b64(self.stored_key)}:{_b64(self.server_key)}"

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """Parse :meth:`text`'s form; ``ValueError`` when it is not one."""
        try:
            mech, head, keys = text.strip().split("$")
            it, salt = head.split(":")
            stored, server = keys.split(":")
            if mech != MECHANISM:
                raise ValueError(mech)
            return cls(int(it), base64.b64decode(salt), base64.b64decode(stored), base64.b64decode(server))
        except Exception:
            raise ValueError(
                "not a SCRAM-SHA-256 verifier (SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>)"
            ) from None


def make_verifier(password: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> Verifier:
    """The verifier of ``password`` (RFC 5802 §3: SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, i))."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Verifier(iterations, salt, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"))


def load_users(path: Path) -> dict[str, Verifier]:
    """The ``name:verifier`` lines of a users file. ``UsersFileError`` when the file is readable by group
    or others (chmod 600 it), cannot be read, or a line is not ``name:SCRAM-SHA-256$…``."""
    try:
        st = path.stat()
    except OSError as e:
        raise UsersFileError(f"users file {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsersFileError(
            f"users file {path} has mode {stat.S_IMODE(st.st_mode):04o}: it must not be accessible by group "
            f"or others (chmod 600 {path})"
        )
    users: dict[str, Verifier] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, ver = line.partition(":")
        if not sep or not name:
            raise UsersFileError(f"users file {path} line {n}: expected name:SCRAM-SHA-256$…")
        try:
            users[name] = Verifier.parse(ver)
        except ValueError as e:
            raise UsersFileError(f"users file {path} line {n}: {e}") from None
    return users


def write_user(path: Path, name: str, password: str) -> None:
    """Add (or replace) ``name``'s verifier in a users file, created with mode 0600."""
    if ":" in name or not name:
        raise ValueError("a user name must be non-empty and hold no ':'")
    lines = []
    if path.exists():
        lines = [ln for ln in path.read_text().splitlines() if ln.partition(":")[0].strip() != name]
    lines.append(f"{name}:{make_verifier(password).text()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def _attrs(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        k, sep, v = part.partition("=")
        if sep and len(k) == 1:
            out.setdefault(k, v)
    return out


class ScramExchange:
    """The server side of one SCRAM-SHA-256 exchange (RFC 5802 §5): :meth:`first` takes the
    client-first-message and returns the server-first-message; :meth:`final` takes the
    client-final-message, checks the proof and returns the server-final-message (``v=…``).
    ``AuthFailed`` on a wrong proof or a malformed message. ``verifier`` None (unknown user): the
    exchange runs with a made-up salt and always fails, as Postgres does (no user enumeration)."""

    def __init__(self, verifier: Verifier | None, server_nonce: str | None = None):
        self._server_nonce = server_nonce  # tests pin it (RFC 7677's example); else 18 random bytes
        self.verifier = verifier or make_verifier(secrets.token_hex(16), iterations=ITERATIONS)
        self.known = verifier is not None
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._gs2 = ""

    def first(self, client_first: str) -> str:
        if client_first[:2] not in ("n,", "y,") or client_first.startswith("p="):
            raise AuthFailed("channel binding is not supported without TLS")
        gs2_end = client_first.find(",", 2)
        if gs2_end < 0:
            raise AuthFailed("malformed SCRAM client-first-message")
        self._gs2 = client_first[: gs2_end + 1]
        self._first_bare = client_first[gs2_end + 1 :]
        cnonce = _attrs(self._first_bare).get("r")
        if not cnonce:
            raise AuthFailed("malformed SCRAM client-first-message: no nonce")
        self._nonce = cnonce + (self._server_nonce or _b64(secrets.token_bytes(18)))
        v = self.verifier
        self._server_first = f"r={self._nonce},s={_b64(v.salt)},i={v.iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        attrs = _attrs(client_final)
        proof_at = client_final.rfind(",p=")
        if proof_at < 0 or "c" not in attrs or attrs.get("r") != self._nonce:
            raise AuthFailed("malformed SCRAM client-final-message")
        if base64.b64decode(attrs["c"]) != self._gs2.encode():
            raise AuthFailed("SCRAM channel binding mismatch")
        without_proof = client_final[:proof_at]
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        v = self.verifier
        signature = _hmac(v.stored_key, auth_message)
        proof = base64.b64decode(client_final[proof_at + 3 :])
        if len(proof) != len(signature):
            raise AuthFailed("malformed SCRAM proof")
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not self.known or not hmac.compare_digest(hashlib.sha256(client_key).digest(), v.stored_key):
            raise AuthFailed("password authentication failed")
        return "v=" + _b64(_hmac(v.server_key, auth_message))
