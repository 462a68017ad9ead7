"""Test helpers: a mooncake state dir bound to a test database, the service as a real background process."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from mooncake_assets.config import Settings, load_settings
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import start_service, stop_service

REPO = Path(__file__).resolve().parent.parent


def make_settings(state_dir: Path, dsn: str, **kw) -> Settings:
    s = load_settings(state_dir, dsn=dsn)
    for k, v in kw.items():
        setattr(s, k, v)
    s.save()
    return s


@contextlib.contextmanager
def running_service(settings: Settings):
    start_service(settings)
    client = ServiceClient(settings.socket_path)
    try:
        yield client
    finally:
        client.close()
        stop_service(settings)


def mooncake(settings: Settings, *args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `mooncake` command line against a state dir."""
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(settings.state_dir)]
    if settings.dsn:
        cmd += ["--dsn", settings.dsn]
    r = subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"mooncake {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def wait_until(pred, timeout: float = 30.0, what: str = "condition", step: float = 0.2):
    """Poll ``pred()`` every ``step`` seconds until it returns something truthy (returned), or raise
    ``AssertionError`` naming ``what`` after ``timeout`` seconds (a hang guard, not a speed claim)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_sql(dsn: str, *stmts: str):
    """Run ``stmts`` on ``dsn`` in autocommit; returns the last statement's rows (None when it returns none)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        out = None
        for s in stmts:
            cur = c.execute(s)
            out = cur.fetchall() if cur.description else None
        return out


def service_tables(settings: Settings) -> dict:
    """The running service's ``status()`` tables by name, straight from its socket (for polling: no
    CLI start-up per look)."""
    c = ServiceClient(settings.socket_path)
    try:
        return {t["name"]: t for t in c.status()["tables"]}
    finally:
        c.close()


@contextlib.contextmanager
def replication_role(admin_dsn: str, db_dsn: str, prefix: str, password: str):
    """A throwaway role with exactly ``LOGIN REPLICATION`` and a SCRAM password (created over
    ``admin_dsn``); yields its name. On exit what it owns in ``db_dsn``'s database is dropped, then the
    role."""
    import uuid

    import psycopg

    role = prefix + uuid.uuid4().hex[:8]
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{password}'")
    try:
        yield role
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as c:
            c.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute(f"DROP ROLE IF EXISTS {role}")
