"""Embedded local PostgreSQL cluster (``mooncake pg start|stop|dsn``).

The cluster is created with the system's ``initdb`` and run with ``pg_ctl`` (Debian's ``postgresql``
package, ``/usr/lib/postgresql/<major>/bin``), with ``wal_level=logical``, listening on 127.0.0.1 on a
free port. ``initdb`` and ``postgres`` refuse to run as root, so when we are root they run as the
``postgres`` user through ``runuser``, and the data directory lives where that user can reach it
(``/var/tmp/mooncake-pg-<hash of the state dir>``); ``<state>/pg/location`` records where it is, so
the cluster is found again from the state directory.

Errors: :class:`PostgresNotFound` when no binaries are found (the message says how to install them);
``RuntimeError`` naming the log file when the server does not start.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, cast

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found. Install them with "
    "`apt-get install postgresql` (Debian/Ubuntu), or set MOONCAKE_PG_BIN to the folder that holds "
    "them, or point mooncake at your own server with --dsn / MOONCAKE_PG_DSN."
)


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine (permanent until they are installed)."""


def find_pg_bin() -> Path:
    """Folder with ``initdb``/``pg_ctl``: ``$MOONCAKE_PG_BIN``, the newest ``/usr/lib/postgresql/*/bin``,
    or the folder of ``initdb`` on PATH. Raises :class:`PostgresNotFound`."""
    env = os.environ.get("MOONCAKE_PG_BIN")
    if env and (Path(env) / "initdb").exists():
        return Path(env)
    cands = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0,
    )
    if cands:
        return Path(cands[-1]).parent
    w = shutil.which("initdb")
    if w:
        return Path(w).parent
    raise PostgresNotFound(INSTALL_HINT)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released; a race with another process is possible)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return cast(int, s.getsockname()[1])


def reset_signals() -> None:  # pragma: no cover - runs in the child
    """``preexec_fn`` for servers we start: default SIGINT/SIGTERM/SIGQUIT/SIGHUP handlers (processes
    started in the background here inherit them ignored), so they can be stopped by their own pid."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


HBA = """\
# written by mooncake (engine/pg/embedded.py): the superuser without a password, everyone else by SCRAM
# TYPE  DATABASE     USER      ADDRESS        METHOD
local   all          postgres                 trust
local   replication  postgres                 trust
host    all          postgres  127.0.0.1/32   trust
host    replication  postgres  127.0.0.1/32   trust
local   all          all                      scram-sha-256
host    all          all       127.0.0.1/32   scram-sha-256
host    all          all       ::1/128        scram-sha-256
host    replication  all       127.0.0.1/32   scram-sha-256
"""


class EmbeddedPostgres:
    """A throwaway-or-kept local cluster tied to a mooncake state directory.

    ``state_dir``: the mooncake state directory; the cluster's bookkeeping is in ``<state>/pg``.
    ``settings``: server settings that replace or add to the defaults of :meth:`start` (e.g.
    ``{"wal_level": "replica", "max_replication_slots": 1}`` for a misconfigured test server); values
    are written to ``postgresql.auto.conf`` as given (quote strings: ``"'64MB'"``).

    Authentication (``pg_hba.conf``, :data:`HBA`): the ``postgres`` superuser connects without a
    password (local socket and loopback TCP, as before); every other role must give its password
    and is authenticated with ``scram-sha-256``.
    """

    def __init__(self, state_dir: str | os.PathLike[str], settings: dict[str, Any] | None = None):
        self.state_dir = Path(state_dir).resolve()
        self.meta_dir = self.state_dir / "pg"
        self.as_root = os.geteuid() == 0
        self.settings = dict(settings or {})

    # -- locations -------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        loc = self.meta_dir / "location"
        if loc.exists():
            return Path(loc.read_text().strip())
        if self.as_root:
            h = hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:12]
            return Path("/var/tmp") / f"mooncake-pg-{h}"
        return self.meta_dir / "data"

    @property
    def _conf_file(self) -> Path:
        return self.meta_dir / "server.json"

    def _conf(self) -> dict[str, Any]:
        return cast("dict[str, Any]", json.loads(self._conf_file.read_text())) if self._conf_file.exists() else {}

    @property
    def port(self) -> int | None:
        return cast("int | None", self._conf().get("port"))

    def dsn(self, dbname: str = "postgres") -> str:
        port = self.port
        if port is None:
            raise RuntimeError(f"the embedded Postgres in {self.meta_dir} was never started: run `mooncake pg start`")
        return f"postgresql://postgres@127.0.0.1:{port}/{dbname}"

    # -- process helpers -------------------------------------------------------------------
    def _run(self, args: list[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        if self.as_root:
            args = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(args, check=check, capture_output=True, text=True, cwd="/", **kw)

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        bin_dir = find_pg_bin()
        r = self._run([str(bin_dir / "pg_ctl"), "status", "-D", str(self.data_dir)], check=False)
        return r.returncode == 0

    def start(self) -> str:
        """Create the cluster if needed and start it (no-op when running). Returns its DSN."""
        bin_dir = find_pg_bin()
        from ..private import ensure_private_dir

        ensure_private_dir(self.state_dir)  # a state directory made here is owner-only too
        self.meta_dir.mkdir(parents=True, exist_ok=True)
        data = self.data_dir
        (self.meta_dir / "location").write_text(str(data))
        if self.is_running():
            return self.dsn()
        if not (data / "PG_VERSION").exists():
            data.mkdir(parents=True, exist_ok=True)
            if self.as_root:
                shutil.chown(data, "postgres", "postgres")
            os.chmod(data, 0o700)
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
            self._run(["sh", "-c", f"cat > '{data}/pg_hba.conf'"], input=HBA)
        port = free_port()
        conf = {
            "port": port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{data}'",
            "wal_level": "logical",
            "max_replication_slots": 32,
            "max_wal_senders": 32,
            "max_connections": 100,
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "'256MB'",
            "logical_decoding_work_mem": "'64MB'",
            "password_encryption": "'scram-sha-256'",
        }
        conf.update(self.settings)
        auto = "\n".join(f"{k} = {v}" for k, v in conf.items()) + "\n"
        self._run(["sh", "-c", f"cat > '{data}/postgresql.auto.conf'"], input=auto)
        log = data / "server.log"
        proc = subprocess.run(
            (["runuser", "-u", "postgres", "--"] if self.as_root else [])
            + [str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(data), "-l", str(log)],
            capture_output=True,
            text=True,
            cwd="/",
            start_new_session=True,
            preexec_fn=reset_signals,
        )
        if proc.returncode != 0:
            tail = ""
            try:
                tail = self._run(["tail", "-n", "20", str(log)], check=False).stdout
            except Exception:
                pass
            raise RuntimeError(f"embedded Postgres did not start (log {log}):\n{proc.stderr}{tail}")
        self._conf_file.write_text(json.dumps({"port": port, "data_dir": str(data), "bin_dir": str(bin_dir)}))
        # wait until it accepts TCP connections
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        return self.dsn()

    def stop(self) -> None:
        """Stop the cluster (fast shutdown); no-op when it is not running."""
        if not self.is_running():
            return
        bin_dir = find_pg_bin()
        self._run([str(bin_dir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data_dir)], check=False)

    def destroy(self) -> None:
        """Stop and delete the cluster's data directory."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.meta_dir, ignore_errors=True)

    def bin(self, name: str) -> str:
        """Path of a client binary (``pgbench``, ``psql``, ``pg_recvlogical``) of the same major version."""
        return str(find_pg_bin() / name)
