"""``mooncake sql-server``, per session: freshness (read-your-writes, applied, persisted), consistent cuts,
cancel requests and disconnects, a slow statement beside a fast one (the pool of readers), TLS, and
SQLAlchemy's reflection over ``pg_catalog``. Real psql, psycopg and SQLAlchemy; the oracles are
Postgres itself (same statements, same reflection) and the rows recorded when each cut was taken.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.read.pgwire import write_user

from ..helpers import make_settings, mooncake, wait_until
from .test_sql_server import PASSWORD, SqlServer, _psql, _run_psql

SLOW = "SELECT count(*) FROM q, range(1000000000000) t(i) WHERE i % 7 = 3"


@pytest.fixture()
def tls_served(pg_dsn, state_dir):
    """A server with a self-signed certificate and three readers, over mirrors ``q`` and ``owner``;
    maintenance by Dagster, so the Iceberg snapshots change only when the test cuts."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE q (id int PRIMARY KEY, name varchar(20), n numeric(10,2), u uuid, tags text[])")
        c.execute(
            "INSERT INTO q SELECT i, 'n' || i, i * 1.5, gen_random_uuid(), ARRAY['a'] FROM generate_series(1, 5) i"
        )
        c.execute("CREATE TABLE owner (id bigint PRIMARY KEY, q_id int, note text)")
        c.execute("INSERT INTO owner VALUES (1, 1, 'ann'), (2, 3, 'bob')")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    mooncake(s, "create-table", "q", "public.q", check=True)
    mooncake(s, "create-table", "owner", "public.owner", check=True)
    users = Path(state_dir) / "users"
    write_user(users, "ana", PASSWORD)
    cert, key = Path(state_dir) / "cert.pem", Path(state_dir) / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )
    server = SqlServer(s, users, "--tls-cert", str(cert), "--tls-key", str(key), "--readers", "3")
    try:
        yield s, server
    finally:
        server.stop()
        mooncake(s, "stop")


def _rows(dsn: str, sql: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(sql).fetchall()


def test_freshness_modes_and_cuts(tls_served, pg_dsn):
    s, server = tls_served
    pg = psycopg.connect(pg_dsn, autocommit=True)
    c = psycopg.connect(server.dsn(), autocommit=True)
    try:
        assert c.execute("SHOW mooncake.read").fetchone() == ("latest",)
        assert c.execute("SHOW mooncake.max_wait").fetchone() == ("30s",)
        c.execute("SET mooncake.max_wait = '5s'")
        assert c.execute("SHOW mooncake.max_wait").fetchone() == ("5s",)
        # read-your-writes: a commit made just before the statement is in its answer
        pg.execute("INSERT INTO q VALUES (6, 'six', 9, gen_random_uuid(), NULL)")
        assert c.execute("SELECT count(*) FROM q").fetchone() == (6,)
        for setting, value in (("mooncake.read", "fresh"), ("mooncake.max_wait", "soon"), ("mooncake.as_of_lsn", "x")):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
                c.execute(f"SET {setting} = '{value}'")
            assert e.value.sqlstate == "22023" and "\n" not in str(e.value.diag.message_primary), e.value
            assert setting in str(e.value)
        assert c.execute("SHOW mooncake.read").fetchone() == ("latest",)  # a refused value changes nothing

        # persisted: only what is committed to Iceberg (nothing yet: Dagster maintains these mirrors)
        c.execute("SET mooncake.read = 'persisted'")
        assert c.execute("SHOW mooncake.read").fetchone() == ("persisted",)
        before = c.execute("SELECT count(*) FROM q").fetchone()[0]
        first = json.loads(mooncake(s, "cut", "--json", check=True).stdout)  # commits every mirror at one LSN
        at_first = {t: _rows(pg_dsn, f"SELECT * FROM {t} ORDER BY id") for t in ("q", "owner")}
        assert c.execute("SELECT * FROM q ORDER BY id").fetchall() == at_first["q"]
        assert before <= 6
        pg.execute("UPDATE q SET name = 'changed' WHERE id = 1")
        pg.execute("DELETE FROM owner WHERE id = 2")
        pg.execute("INSERT INTO owner VALUES (3, 6, 'cy')")
        assert c.execute("SELECT * FROM q ORDER BY id").fetchall() == at_first["q"]  # still the snapshot
        c.execute("SET mooncake.read = 'applied'")  # what the service applied: no wait, never newer than latest
        assert c.execute("SELECT count(*) FROM owner").fetchone()[0] in (2, 3)
        c.execute("RESET mooncake.read")
        join = "SELECT q.id, q.name, o.note FROM q JOIN owner o ON o.q_id = q.id ORDER BY 1, 3"
        assert c.execute(join).fetchall() == pg.execute(join).fetchall()

        # a second cut, then reads at each: every table at the cut's LSN, by tag or by LSN
        second = json.loads(mooncake(s, "cut", "--json", check=True).stdout)
        at_second = {t: _rows(pg_dsn, f"SELECT * FROM {t} ORDER BY id") for t in ("q", "owner")}
        pg.execute("INSERT INTO owner VALUES (4, 2, 'dan')")
        for cut, rows in ((first["tag"], at_first), (second["lsn"], at_second), (first["lsn"], at_first)):
            c.execute(f"SET mooncake.as_of_lsn = '{cut}'")
            for t in ("q", "owner"):
                assert c.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() == rows[t], (cut, t)
        assert c.execute("SHOW mooncake.as_of_lsn").fetchone() == (first["tag"],)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as e:
            c.execute("SET mooncake.as_of_lsn = 'lsn-0-1'")
        assert "no table has the cut lsn-0-1" in str(e.value)
        assert c.execute("SHOW mooncake.as_of_lsn").fetchone() == (first["tag"],)  # kept
        c.execute("RESET mooncake.as_of_lsn")
        assert (
            c.execute("SELECT * FROM owner ORDER BY id").fetchall()
            == pg.execute("SELECT * FROM owner ORDER BY id").fetchall()
        )
    finally:
        c.close()
        pg.close()


def _psql_interrupted(dsn: str, sql: str) -> subprocess.CompletedProcess:
    """psql running ``sql``, sent SIGINT (its Ctrl-C: a CancelRequest) until it exits, from the moment
    it is connected (a shell it runs says so; its SIGINT handler is in place by then)."""
    env = dict(os.environ, PGCONNECT_TIMEOUT="30")
    p = subprocess.Popen(
        [_psql(), "--no-psqlrc", "-d", dsn, "-c", r"\! echo connected", "-c", sql],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )

    assert p.stdout is not None and p.stdout.readline() == "connected\n"

    def interrupted():
        if p.poll() is None:
            os.kill(p.pid, signal.SIGINT)
        return p.poll() is not None

    wait_until(interrupted, timeout=120, what="psql to be interrupted", step=1.0)
    out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_cancel_disconnect_and_a_slow_statement_beside_fast_ones(tls_served):
    s, server = tls_served
    # psql's Ctrl-C: 57014, and the server goes on
    r = _psql_interrupted(server.dsn(), SLOW)
    assert r.returncode != 0 and "canceling statement due to user request" in r.stderr, r
    ok = _run_psql(server.dsn(), "-At", "-c", "SELECT count(*) FROM q")
    assert ok.returncode == 0 and ok.stdout.strip() == "5", ok

    # a client that goes away in the middle of a long result (about 20 MB: more than the sockets buffer),
    # resetting the connection: a clean close
    gone = psycopg.connect(server.dsn(), autocommit=True)
    sock = socket.socket(fileno=os.dup(gone.pgconn.socket))
    gone.pgconn.send_query(b"SELECT i, repeat('x', 100) FROM range(200000) t(i)")
    sock.settimeout(120)
    assert sock.recv(1, socket.MSG_PEEK)  # the rows are arriving
    gone.pgconn.finish()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()

    # a slow statement over a mirror on one connection; fast ones over mirrors on others meanwhile
    slow = psycopg.connect(server.dsn(), autocommit=True)
    got: dict[str, BaseException] = {}

    def run_slow():
        try:
            slow.execute(SLOW)
        except BaseException as e:
            got["e"] = e

    t = threading.Thread(target=run_slow)
    t.start()
    try:
        for _ in range(3):
            assert _rows(server.dsn(), "SELECT count(*) FROM q JOIN owner ON owner.q_id = q.id") == [(2,)]
        assert t.is_alive()  # the fast ones were answered while the slow one runs

        def canceled():
            slow.cancel()
            return not t.is_alive()

        wait_until(canceled, timeout=120, what="the slow statement to be canceled", step=0.5)
        assert isinstance(got.get("e"), psycopg.errors.QueryCanceled), got
        assert slow.execute("SELECT count(*) FROM owner").fetchone() == (2,)
    finally:
        slow.close()
    log = server.log.read_text()
    assert "Traceback" not in log, log


def test_tls_and_sqlalchemy_reflection(tls_served, pg_dsn):
    s, server = tls_served
    tls = server.dsn().replace("sslmode=prefer", "sslmode=require")
    r = _run_psql(tls, "-At", "-c", r"\conninfo", "-c", "SELECT count(*) FROM q")
    assert r.returncode == 0 and "SSL connection" in r.stdout and r.stdout.strip().endswith("5"), r
    with psycopg.connect(tls, autocommit=True) as c:
        assert c.pgconn.ssl_in_use
        assert c.execute("SELECT name FROM q WHERE id = %s", [2]).fetchone() == ("n2",)
    plain = server.dsn().replace("sslmode=prefer", "sslmode=disable")
    with psycopg.connect(plain, autocommit=True) as c:
        assert not c.pgconn.ssl_in_use
        assert c.execute("SELECT count(*) FROM owner").fetchone() == (2,)

    sqlalchemy = pytest.importorskip("sqlalchemy")
    ours = sqlalchemy.create_engine(f"postgresql+psycopg://ana:{PASSWORD}@127.0.0.1:{server.port}/mooncake")
    theirs = sqlalchemy.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(pg_dsn))
    try:
        a, b = sqlalchemy.inspect(ours), sqlalchemy.inspect(theirs)
        assert sorted(a.get_table_names()) == ["owner", "q"]
        assert a.has_table("q") and not a.has_table("nope")
        for t in ("q", "owner"):
            mine = [(col["name"], str(col["type"])) for col in a.get_columns(t)]
            assert mine == [(col["name"], str(col["type"])) for col in b.get_columns(t)], t
        assert a.get_schema_names() and "public" in a.get_schema_names()
    finally:
        ours.dispose()
        theirs.dispose()
