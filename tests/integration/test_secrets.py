"""Secrets that stay secret.

A role with a password that the server really checks (a ``scram-sha-256`` line for that role alone,
prepended to the test cluster's pg_hba.conf and removed after): a mirror made with a password DSN
keeps working, and then no file of the state directory holds the password, nothing in it is open
to other users, the socket is owner-only, and neither command output nor any log line shows it.
Later commands without the password take it from libpq's own places (PGPASSWORD, a password file).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.parse
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from mooncake_assets.config import load_settings
from mooncake_assets.engine.pg.conninfo import scrub, split_password, split_uri_password


@pytest.fixture()
def password_role(pg_cluster, pg_dsn):
    """``(role, password)``: a superuser that must log in with its password over TCP (scram)."""
    role = "pw_" + uuid.uuid4().hex[:8]
    password = "S3cr3t-" + uuid.uuid4().hex[:12] + "-p@ss"
    admin = pg_cluster.dsn()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("SET password_encryption = 'scram-sha-256'")
        c.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
        )
        hba = Path(c.execute("SHOW hba_file").fetchone()[0])
    line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    with open(hba, "r+") as f:  # in place: the file keeps its owner (postgres)
        old = f.read()
        f.seek(0)
        f.write(line + old)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("SELECT pg_reload_conf()")
    try:
        yield role, password
    finally:
        with open(hba, "r+") as f:
            text = f.read().replace(line, "")
            f.seek(0)
            f.write(text)
            f.truncate()
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute("SELECT pg_reload_conf()")
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # its publication; the database goes after
            c.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _run(state: Path, *args, dsn: str | None = None, env_extra: dict | None = None, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MOONCAKE_"))}
    env["PGPASSFILE"] = "/nonexistent/pgpass"  # nothing but what the test gives
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state)]
    if dsn:
        cmd += ["--dsn", dsn]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env, timeout=timeout)


def _assert_no_secret(state: Path, password: str, outputs: list[str]):
    forms = {password, urllib.parse.quote(password, safe=""), password.encode().hex()}
    for text in outputs:
        for f in forms:
            assert f not in text, text
    top = stat.S_IMODE(state.stat().st_mode)
    assert top == 0o700, oct(top)
    for p in state.rglob("*"):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if stat.S_ISREG(st.st_mode):
            data = p.read_bytes()
            for f in forms:
                assert f.encode() not in data, p
        if p.parent == state or p.name in ("settings.json", "tables.json", "service.log", "catalog.db"):
            assert not stat.S_IMODE(st.st_mode) & 0o077, (p, oct(st.st_mode))


@pytest.mark.slow
def test_password_dsn_never_stored_or_shown(pg_cluster, pg_dsn, password_role, tmp_path):
    role, password = password_role
    db = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    plain = f"postgresql://{role}@127.0.0.1:{pg_cluster.port}/{db}"
    secret_dsn = f"postgresql://{role}:{urllib.parse.quote(password, safe='')}@127.0.0.1:{pg_cluster.port}/{db}"
    with pytest.raises(psycopg.OperationalError):  # the server really wants the password
        psycopg.connect(plain + "?passfile=/nonexistent", connect_timeout=5).close()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acct (id int PRIMARY KEY, owner text)")
        c.execute("INSERT INTO acct SELECT g, 'o' || g FROM generate_series(1, 50) g")
    state = tmp_path / "state"  # made by mooncake
    outputs = []
    try:
        r = _run(state, "-v", "create-table", "acct", "public.acct", dsn=secret_dsn)
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0, r.stdout + r.stderr
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE acct SET owner = 'x' WHERE id < 10")
        for args in (
            ["status"],
            ["list-tables", "--json"],
            ["persist", "acct"],
            ["query", "SELECT count(*) AS n FROM acct WHERE owner = 'x'", "--format", "json"],
            ["verify"],
        ):
            r = _run(state, "-v", *args, dsn=secret_dsn)
            outputs += [r.stdout, r.stderr]
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        assert json.loads(outputs[-4]) == [{"n": 9}]
        saved = json.loads((state / "settings.json").read_text())
        assert saved["dsn"] and "password" not in saved["dsn"] and role in saved["dsn"]

        # later commands without the password: the running service has it (its environment only)
        r = _run(state, "query", "SELECT count(*) AS n FROM acct", "--format", "json")
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0 and json.loads(r.stdout) == [{"n": 50}], r.stdout + r.stderr
        pid = int((state / "service.pid").read_text())
        assert password not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        sock = load_settings(state).socket_path
        assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600
        # what needs the source itself says where the password may come from
        r = _run(state, "verify")
        outputs += [r.stdout, r.stderr]
        assert r.returncode != 0 and "PGPASSWORD" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

        # a restarted service without the password: one clear error; with PGPASSWORD or a password file: works
        _run(state, "stop")
        r = _run(state, "start")
        outputs += [r.stdout, r.stderr]
        assert r.returncode != 0 and "password" in r.stderr, r.stdout + r.stderr
        r = _run(state, "start", env_extra={"PGPASSWORD": password})
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0, r.stdout + r.stderr
        _run(state, "stop")
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"127.0.0.1:{pg_cluster.port}:{db}:{role}:{password}\n")
        passfile.chmod(0o600)
        r = _run(state, "start", env_extra={"PGPASSFILE": str(passfile)})  # after `stop` only `start` starts it
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0, r.stdout + r.stderr
        r = _run(state, "verify", env_extra={"PGPASSFILE": str(passfile)})
        outputs += [r.stdout, r.stderr]
        assert r.returncode == 0 and "verified: 1/1" in r.stdout, r.stdout + r.stderr

        # a wrong password: the error names the problem, not the password
        bad = "Wr0ng-" + password[::-1]
        wrong = secret_dsn.replace(urllib.parse.quote(password, safe=""), urllib.parse.quote(bad, safe=""))
        r = _run(state, "verify", dsn=wrong)
        outputs += [r.stdout, r.stderr]
        assert r.returncode != 0 and "password authentication failed" in r.stderr, r.stderr
        assert bad[3:] not in r.stdout + r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        # ... and one with an '@' left unencoded, which libpq splits into user info and host
        r = _run(state, "verify", dsn=wrong.replace(urllib.parse.quote(bad, safe=""), bad))
        outputs += [r.stdout, r.stderr]
        assert r.returncode != 0 and not any(p in r.stdout + r.stderr for p in bad.split("@")), r.stderr
        log = (state / "service.log").read_text()
        assert "mooncake service listening" in log
        outputs.append(log)
        _assert_no_secret(state, password, outputs)
    finally:
        _run(state, "stop", env_extra={"PGPASSWORD": password})


def test_state_dir_private_and_open_one_warned(tmp_path):
    from mooncake_assets.config import Settings

    s = Settings(
        state_dir=tmp_path / "new",
        dsn="host=h user=u password=Xy-123 dbname=d",
        catalog_uri="postgresql+psycopg://cat:CatPw-9@h/db",
    )
    s.save()
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    f = tmp_path / "new" / "settings.json"
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    text = f.read_text()
    assert "Xy-123" not in text and "CatPw-9" not in text and "cat@h" in text
    assert s.service_environment() == {"MOONCAKE_PG_DSN": s.dsn, "MOONCAKE_CATALOG_URI": s.catalog_uri}
    assert scrub("failed: Xy-123 and CatPw-9") == "failed: ******** and ********"

    # an older state dir: 0755, settings.json 0644 with the password in it
    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o755)
    (old / "settings.json").write_text(json.dumps({"dsn": "postgresql://u:Old-Pw-7@h/db"}))
    (old / "settings.json").chmod(0o644)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from mooncake_assets.config import load_settings; s = load_settings({str(old)!r}); print(s.dsn)",
        ],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")},
    )
    assert r.returncode == 0, r.stderr
    assert "open to other users" in r.stderr and f"chmod 700 {old}" in r.stderr, r.stderr
    assert "removed a password" in r.stderr and "Old-Pw-7" not in r.stderr
    assert "Old-Pw-7" in r.stdout  # kept in memory for this process
    assert "Old-Pw-7" not in (old / "settings.json").read_text()
    assert stat.S_IMODE((old / "settings.json").stat().st_mode) == 0o600
    assert split_password("host=h dbname=d") == ("host=h dbname=d", None)
    assert split_uri_password("sqlite:////x/catalog.db") == ("sqlite:////x/catalog.db", None)
