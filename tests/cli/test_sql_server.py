"""``mooncake sql-server``: real psql and psycopg against the endpoint, compared with Postgres itself.

The server runs as a subprocess (its own session, stopped by pid) over a real service mirroring
tables of the test database; the oracle for every answer is the same statement run on the source.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.pg.embedded import reset_signals
from mooncake_assets.engine.read.pgwire import write_user

from ..helpers import make_settings, mooncake, run_sql, wait_until

PASSWORD = "s3cret-pw"
SETUP = [
    "CREATE TABLE q (id int PRIMARY KEY, ts timestamp, tsz timestamptz, d date, b boolean, arr int[], tags text[], "
    "note text, n numeric(10,2), f float8, bin bytea, big bigint)",
    "INSERT INTO q VALUES "
    "(1, 'infinity', 'infinity', 'infinity', true, '{1,2,NULL}', '{\"a b\",NULL,x,\"\"}', 'one', 1.50, 0.1, '\\x00ff', 10),"
    "(2, '-infinity', '-infinity', '-infinity', false, NULL, NULL, NULL, NULL, 'NaN', NULL, NULL),"
    "(3, '2024-01-31 12:00:00.5', '2024-01-31 12:00:00.25+00', '2024-01-31', NULL, '{}', '{}', '', 0, '-Infinity', '', 30),"
    "(4, '2020-02-29 00:00:00', '2020-02-29 23:59:59+00', '2020-02-29', true, '{-7}', '{\"q\\\"uote\",\"c,d\"}',"
    " 'a,b \"c\"', -12.3, 1e300, '\\x', 40)",
    "CREATE TABLE owner (id int PRIMARY KEY, q_id int, name text)",
    "INSERT INTO owner VALUES (1, 1, 'ann'), (2, 3, 'bob'), (3, 3, 'cy'), (4, 9, 'dan')",
]
COLS = "id, ts, tsz, d, b, arr, tags, note, n, f, bin, big"


def _psql() -> str:
    found = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    assert found, "psql not found"
    return str(found)


class SqlServer:
    """A running ``mooncake sql-server`` subprocess."""

    def __init__(self, settings, users: Path | None, *extra: str, env: dict | None = None):
        self.log = Path(settings.state_dir) / f"sql-server-{time.time_ns()}.log"
        cmd = [
            sys.executable,
            "-m",
            "mooncake_assets.cli",
            "--state-dir",
            str(settings.state_dir),
            "--dsn",
            settings.dsn,
        ]
        cmd += ["sql-server", "--port", "0", *(["--users", str(users)] if users else []), *extra]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
            start_new_session=True,
            env=env,
            preexec_fn=reset_signals,  # SIGTERM stops it (a background parent may have it ignored)
        )
        m = wait_until(lambda: self._port(), timeout=120, what="sql-server to listen")
        self.port = int(m)

    def _port(self):
        assert self.proc.poll() is None, self.log.read_text()
        m = re.search(r"listening on [\d.]+:(\d+)", self.log.read_text())
        return m and m.group(1)

    def dsn(self, user: str = "ana", password: str = PASSWORD) -> str:
        return f"host=127.0.0.1 port={self.port} user={user} password={password} dbname=mooncake sslmode=prefer"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def served(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for st in SETUP:
            c.execute(st)
    s = make_settings(state_dir, pg_dsn)
    mooncake(s, "create-table", "q", "public.q", check=True)
    mooncake(s, "create-table", "owner", "public.owner", check=True)
    users = Path(state_dir) / "users"
    write_user(users, "ana", PASSWORD)
    server = SqlServer(s, users)
    try:
        yield s, server
    finally:
        server.stop()
        mooncake(s, "stop")


def _run_psql(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PGTZ="UTC", PGDATESTYLE="ISO", PGCONNECT_TIMEOUT="30")
    return subprocess.run(
        [_psql(), "--no-psqlrc", "-d", dsn, *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_psql_select_join_and_dt_equal_postgres(served, pg_dsn):
    s, server = served
    # a write to each mirror just before: the endpoint's latest read is of Postgres at the same LSN
    run_sql(pg_dsn, "UPDATE owner SET q_id = 4 WHERE id = 4", "UPDATE q SET big = 41, note = 'four' WHERE id = 4")
    for sql in (
        f"SELECT {COLS} FROM q ORDER BY id",
        "SELECT q.id, o.name, q.n FROM q JOIN owner o ON o.q_id = q.id ORDER BY o.id",
        "SELECT count(*) AS n, sum(big) AS total FROM q",
    ):
        ours = _run_psql(server.dsn(), "--csv", "-c", sql)
        assert ours.returncode == 0, ours.stderr
        assert ours.stdout == _run_psql(pg_dsn, "--csv", "-c", sql).stdout, (sql, ours.stdout)
    dt = _run_psql(server.dsn(), "-c", r"\dt")
    assert dt.returncode == 0, dt.stderr
    assert re.search(r"public\s*\|\s*owner\s*\|\s*table", dt.stdout) and re.search(
        r"public\s*\|\s*q\s*\|\s*table", dt.stdout
    ), dt.stdout
    d = _run_psql(server.dsn(), "-c", r"\d q")
    assert d.returncode == 0, d.stderr
    assert re.search(r"tsz\s*\|\s*timestamp with time zone", d.stdout) and re.search(
        r"arr\s*\|\s*integer\[\]", d.stdout
    ), d.stdout
    # several statements in one Query message, SET/SHOW, version(), an empty statement
    multi_sql = "SET DateStyle = ISO; SHOW DateStyle; SELECT 1 AS one; ;"
    multi = _run_psql(server.dsn(), "--csv", "-c", multi_sql)
    assert multi.returncode == 0 and multi.stdout == _run_psql(pg_dsn, "--csv", "-c", multi_sql).stdout, multi
    v = _run_psql(server.dsn(), "-At", "-c", "SELECT version(), current_setting('server_version')")
    assert v.stdout.startswith("PostgreSQL 16.0") and v.stdout.strip().endswith("|16.0"), v


def test_psycopg_server_side_parameters_equal_postgres(served, pg_dsn):
    s, server = served
    queries = [
        ("SELECT id, tsz, d, b, arr, tags, note, n, f, bin, big FROM q WHERE id > %s AND id <> %s ORDER BY id", (2, 9)),
        ("SELECT id, note FROM q WHERE note = %s OR n = %s ORDER BY id", ('a,b "c"', 1.5)),
        ("SELECT q.id, o.name FROM q JOIN owner o ON o.q_id = q.id WHERE o.name LIKE %s ORDER BY 1, 2", ("%n%",)),
        ("SELECT id FROM q WHERE d = %s AND b = %s", ("2024-01-31", None)),
        ("SELECT %s::text AS s, %s AS i", ("x'); DROP TABLE q; --", 7)),
    ]
    run_sql(pg_dsn, "UPDATE q SET n = 2.5 WHERE id = 1")  # the note-or-n answer holds it: same LSN both sides
    with psycopg.connect(server.dsn(), autocommit=True) as ours, psycopg.connect(pg_dsn, autocommit=True) as src:
        for sql, params in queries:
            got = ours.execute(sql, params).fetchall()
            assert got == src.execute(sql, params).fetchall(), (sql, got)
        # a transaction block, as psycopg opens one without autocommit
    with psycopg.connect(server.dsn()) as tx:
        assert tx.execute("SELECT count(*) FROM q WHERE id >= %s", (1,)).fetchone() == (4,)
        tx.rollback()
        assert tx.execute("SHOW mooncake.read").fetchone() == ("latest",)
        tx.execute("SET TimeZone = 'Europe/Paris'")  # announced; timestamptz stays the same instant
        assert tx.info.parameter_status("TimeZone") == "Europe/Paris"
        with psycopg.connect(pg_dsn) as src:
            src.execute("SET TimeZone = 'Europe/Paris'")
            sql = "SELECT tsz FROM q WHERE id IN (3, 4) ORDER BY id"
            assert tx.execute(sql).fetchall() == src.execute(sql).fetchall()
        tx.execute("SET mooncake.read = 'applied'")
        assert tx.execute("SELECT count(*) FROM owner").fetchone() == (4,)
    # read-your-writes: a row committed in Postgres is visible to the next statement
    with psycopg.connect(pg_dsn, autocommit=True) as src:
        src.execute("INSERT INTO owner VALUES (5, 4, 'eve')")
    with psycopg.connect(server.dsn(), autocommit=True) as ours:
        assert ours.execute("SELECT name FROM owner WHERE id = %s", (5,)).fetchone() == ("eve",)


def test_errors_get_their_sqlstate_and_the_server_keeps_serving(served):
    s, server = served
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        for sql, state in (
            ("DELETE FROM q", "25006"),
            ("INSERT INTO q (id) VALUES (99)", "25006"),
            ("SELECT * FROM no_such_table", "42P01"),
            ("SELEC 1", "42601"),
        ):
            with pytest.raises(psycopg.Error) as e:
                c.execute(sql)
            assert e.value.sqlstate == state, (sql, e.value.sqlstate, str(e.value))
            assert c.execute("SELECT count(*) FROM q").fetchone() == (4,)  # the session goes on
            with pytest.raises(psycopg.Error) as e:
                c.execute(sql.replace("99", "%s"), (99,) if "99" in sql else None)  # extended query: skip to Sync
            assert e.value.sqlstate == state
            assert c.execute("SELECT id FROM q WHERE id = %s", (3,)).fetchone() == (3,)
    with pytest.raises(psycopg.OperationalError) as e:
        psycopg.connect(server.dsn(password="wrong"))
    assert "password authentication failed" in str(e.value)
    bad = _run_psql(server.dsn(password="wrong"), "-c", "SELECT 1")
    assert bad.returncode != 0 and "password authentication failed" in bad.stderr, bad.stderr
    with psycopg.connect(server.dsn()) as c:  # still serving
        assert c.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError) as e:  # psycopg does not expose the FATAL's SQLSTATE: raw
        psycopg.connect(server.dsn(user="nobody"))
    assert "password authentication failed" in str(e.value)
    for user in ("ana", "nobody"):  # a wrong SCRAM proof over the raw protocol: 28P01, then the close
        fields, closed = _wrong_scram_proof(server.port, user)
        assert fields.get("C") == "28P01" and fields.get("S") == "FATAL", fields
        assert closed, "the connection stays open after the FATAL"
    with psycopg.connect(server.dsn(), autocommit=True) as c:  # still serving
        assert c.execute("SELECT count(*) FROM q").fetchone() == (4,)


def _wrong_scram_proof(port: int, user: str) -> tuple[dict, bool]:
    """A StartupMessage for ``user``, SCRAM-SHA-256 with a client proof of 32 zero bytes (RFC 5802
    §7; the PostgreSQL protocol's SASL flow, "Message Flow" / "SASL Authentication"): the
    ErrorResponse's fields (code letter -> value) and whether the server then closed the connection."""
    import base64
    import socket
    import struct

    def recv_exact(sock, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, f"the server closed the connection after {out!r}"
            out += chunk
        return out

    def message(sock) -> tuple[bytes, bytes]:
        kind, length = struct.unpack("!cI", recv_exact(sock, 5))
        return kind, recv_exact(sock, length - 4)

    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        body = struct.pack("!I", 196608) + f"user\0{user}\0database\0mooncake\0\0".encode()
        sock.sendall(struct.pack("!I", len(body) + 4) + body)
        kind, payload = message(sock)
        assert kind == b"R" and struct.unpack("!I", payload[:4])[0] == 10 and b"SCRAM-SHA-256" in payload
        first = b"n,,n=,r=abcdefghijklmnopqrstuvwx"
        init = b"SCRAM-SHA-256\0" + struct.pack("!I", len(first)) + first
        sock.sendall(b"p" + struct.pack("!I", len(init) + 4) + init)
        kind, payload = message(sock)
        assert kind == b"R" and struct.unpack("!I", payload[:4])[0] == 11, (kind, payload)
        server_first = dict(kv.split("=", 1) for kv in payload[4:].decode().split(","))
        final = f"c=biws,r={server_first['r']},p={base64.b64encode(bytes(32)).decode()}".encode()
        sock.sendall(b"p" + struct.pack("!I", len(final) + 4) + final)
        kind, payload = message(sock)
        assert kind == b"E", (kind, payload)
        fields = {f[:1]: f[1:] for f in payload.decode().split("\0") if f}
        closed = sock.recv(1) == b""
    return fields, closed


def test_two_clients_at_once(served):
    s, server = served
    a = psycopg.connect(server.dsn(), autocommit=True)
    b = psycopg.connect(server.dsn(), autocommit=True)
    try:
        a.execute("BEGIN")  # a session inside a transaction block holds nothing
        assert b.execute("SELECT count(*) FROM owner").fetchone() == (4,)
        assert a.execute("SELECT count(*) FROM q").fetchone() == (4,)
        out: dict[str, object] = {}

        def worker(name, conn, sql):
            out[name] = [conn.execute(sql).fetchall() for _ in range(5)]

        ts = [
            threading.Thread(target=worker, args=("a", a, "SELECT id FROM q ORDER BY id")),
            threading.Thread(target=worker, args=("b", b, "SELECT name FROM owner ORDER BY id")),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert out["a"] == [[(1,), (2,), (3,), (4,)]] * 5
        assert out["b"] == [[("ann",), ("bob",), ("cy",), ("dan",)]] * 5
    finally:
        a.close()
        b.close()


def test_cancel_tls_refusal_trust_loopback_and_env_password(served, state_dir):
    s, server = served
    # CancelRequest: the running statement is interrupted (57014) and the session goes on
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        got: dict[str, BaseException] = {}

        def slow():
            try:
                c.execute("SELECT count(*) FROM range(1000000000000) t(i) WHERE i % 7 = 3")
            except BaseException as e:
                got["e"] = e

        t = threading.Thread(target=slow)
        t.start()
        # meanwhile another client connects, authenticates, sets and shows settings and lists the mirrors
        with psycopg.connect(server.dsn(), autocommit=True) as other:
            other.execute("SET application_name = 'second'")
            assert other.execute("SHOW application_name").fetchone() == ("second",)
        dt = _run_psql(server.dsn(), "-c", r"\dt")
        assert dt.returncode == 0 and "owner" in dt.stdout, dt
        assert t.is_alive()  # the slow statement runs until canceled

        def canceled():
            c.cancel()
            return not t.is_alive()

        wait_until(canceled, timeout=120, what="the slow statement to be canceled", step=0.5)
        assert isinstance(got.get("e"), psycopg.errors.QueryCanceled), got
        assert c.execute("SELECT count(*) FROM q").fetchone() == (4,)
    # no TLS yet: a client requiring it is refused cleanly; one preferring it goes on in plain text
    tls = _run_psql(server.dsn().replace("sslmode=prefer", "sslmode=require"), "-c", "SELECT 1")
    assert tls.returncode != 0 and "SSL" in tls.stderr, tls.stderr
    # a users file readable by others is refused at start
    loose = Path(state_dir) / "loose-users"
    write_user(loose, "ana", PASSWORD)
    os.chmod(loose, 0o644)
    r = mooncake(s, "sql-server", "--port", "0", "--users", str(loose))
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr
    # MOONCAKE_SQL_PASSWORD for one user; --trust-loopback lets loopback clients in without one
    env = dict(os.environ, MOONCAKE_SQL_PASSWORD="env-pw", MOONCAKE_SQL_USER="envuser")
    other = SqlServer(s, None, env=env)
    trusting = SqlServer(s, None, "--trust-loopback", env=dict(os.environ, MOONCAKE_SQL_PASSWORD=""))
    try:
        with psycopg.connect(other.dsn(user="envuser", password="env-pw")) as c:
            assert c.execute("SELECT count(*) FROM owner").fetchone() == (4,)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(other.dsn(user="envuser", password="nope"))
        ok = _run_psql(
            f"host=127.0.0.1 port={trusting.port} user=anyone dbname=x", "-At", "-c", "SELECT count(*) FROM q"
        )
        assert ok.returncode == 0 and ok.stdout.strip() == "4", ok
    finally:
        other.stop()
        trusting.stop()


def test_sql_users_cannot_read_files_outside_the_mirrors(served):
    """The statements run on DuckDB, whose table functions read any path the process can: the endpoint
    confines them to the mirrors' data files (engine/read/sandbox.py). A SQL user's read_csv of
    /etc/passwd, read_text of the server's users file, a glob, a path in FROM — on the readers, on the
    catalog connection and on the snapshot reads — fail with an error that shows nothing of the file,
    and the session goes on reading the mirrors. The same for ``mooncake query``."""
    s, server = served
    users = Path(s.state_dir) / "users"
    stolen = ("root:", "SCRAM-SHA-256", users.read_text().strip()[:12])
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        for sql in (
            "SELECT * FROM read_csv('/etc/passwd')",
            f"SELECT content FROM read_text('{users}')",
            "SELECT count(*) FROM glob('/etc/*')",
            "SELECT * FROM '/etc/passwd'",
            "SELECT q.id, f.content FROM q, read_text('/etc/passwd') f",
            "SELECT t.table_name, f.content FROM information_schema.tables t, read_text('/etc/passwd') f",
        ):
            with pytest.raises(psycopg.Error) as e:
                c.execute(sql).fetchall()
            assert not any(x in str(e.value) for x in stolen), (sql, str(e.value))
            assert c.execute("SELECT count(*) FROM q").fetchone() == (4,)  # the mirrors still read
        c.execute("SET mooncake.read = 'persisted'")
        with pytest.raises(psycopg.Error) as e:
            c.execute("SELECT content FROM read_text('/etc/passwd')").fetchall()
        assert not any(x in str(e.value) for x in stolen), str(e.value)
    got = mooncake(s, "query", "SELECT content FROM read_text('/etc/passwd')")
    assert got.returncode != 0 and "root:" not in got.stdout + got.stderr, (got.stdout, got.stderr)
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert mooncake(s, "query", "SELECT count(*) AS n FROM q", "--format", "csv", check=True).stdout == "n\n4\n"
