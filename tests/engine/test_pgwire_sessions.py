"""The SQL endpoint's per-session pieces, in process: freshness settings, the pool of readers (a slow
statement beside a fast one, cancel while waiting), the pg_catalog rewrites and type modifiers, and the
start-up reader that never reads past what it is asked (TLS after SSLRequest)."""

from __future__ import annotations

import socket
import threading

import duckdb
import pyarrow as pa
import pytest

from mooncake_assets.engine.read.pgwire.backend import Backend, Canceled
from mooncake_assets.engine.read.pgwire.catalog import SessionSettings, SqlError, duration_seconds, local_statement
from mooncake_assets.engine.read.pgwire.pgcatalog import CatalogTables, rewrite, typmod
from mooncake_assets.engine.read.pgwire.session import _ExactReader


def test_freshness_settings():
    s = SessionSettings({}, {"mooncake.max_wait": "30s"}, snapshots=True)
    assert s.max_wait() == 30.0
    for text, seconds in (("5s", 5.0), ("500ms", 0.5), ("1min", 60.0), ("2500", 2.5), ("1.5 h", 5400.0)):
        assert duration_seconds(text) == seconds, text
    local_statement("SET mooncake.max_wait = '5s'", s)
    assert local_statement("SHOW mooncake.max_wait", s).rows == [["5s"]] and s.max_wait() == 5.0
    local_statement("RESET mooncake.max_wait", s)
    assert s.max_wait() == 30.0  # the server's default, not the module's
    for stmt, name in (
        ("SET mooncake.read = 'fresh'", "mooncake.read"),
        ("SET mooncake.max_wait = 'soon'", "mooncake.max_wait"),
        ("SET mooncake.as_of_lsn = 'yesterday'", "mooncake.as_of_lsn"),
    ):
        with pytest.raises(SqlError) as e:
            local_statement(stmt, s)
        assert e.value.code == "22023" and name in str(e.value) and "\n" not in str(e.value), stmt
        assert e.value.hint
    local_statement("SET mooncake.read = 'persisted'", s)
    local_statement("SET mooncake.as_of_lsn = '0/5B688D0'", s)
    assert s.cut() == "lsn-0-5B688D0" and local_statement("SHOW mooncake.as_of_lsn", s).rows == [["lsn-0-5B688D0"]]
    local_statement("RESET mooncake.as_of_lsn", s)
    assert s.cut() is None
    plain = SessionSettings({})  # a server without the warehouse's catalog
    for stmt in ("SET mooncake.read = 'persisted'", "SET mooncake.as_of_lsn = 'lsn-0-1'"):
        with pytest.raises(SqlError) as e:
            local_statement(stmt, plain)
        assert e.value.code == "0A000"


class _Reader:
    """A reader whose statements run until released (``gate``) or interrupted, on a real DuckDB cursor."""

    def __init__(self, db: duckdb.DuckDBPyConnection, gates: dict[str, threading.Event]):
        self.con = db.cursor()
        self.client = None
        self.wait_timeout = 30.0
        self.gates = gates
        self.seen_timeouts: list[float] = []

    def query(self, sql: str, lsn: str | None = None, params: list | None = None) -> pa.Table:
        self.seen_timeouts.append(self.wait_timeout)
        gate = self.gates.get(sql)
        if gate is not None:
            gate.wait(60)
        return self.con.execute(sql).to_arrow_table()


def test_reader_pool_runs_a_fast_statement_beside_a_slow_one_and_cancels_a_waiting_one():
    db = duckdb.connect()
    gates = {"SELECT 1 AS slow": threading.Event()}
    made: list[_Reader] = []

    def make():
        made.append(_Reader(db, gates))
        return made[-1]

    first = make()
    backend = Backend(first, make, size=2, max_wait=7.0)  # type: ignore[arg-type]
    slow_owner, fast_owner, third_owner = object(), object(), object()
    out: dict[str, object] = {}

    def run(name: str, sql: str, owner: object) -> None:
        try:
            out[name] = backend.run(sql, owner=owner).to_pylist()
        except BaseException as e:
            out[name] = e

    slow = threading.Thread(target=run, args=("slow", "SELECT 1 AS slow", slow_owner))
    slow.start()
    assert backend.run("SELECT 2 AS fast", owner=fast_owner, max_wait=1.5).to_pylist() == [{"fast": 2}]
    assert slow.is_alive() and backend.readers() == 2
    fast = next(r for r in made if 1.5 in r.seen_timeouts)  # the session's max_wait, for its statement
    assert fast.wait_timeout == 30.0  # and the reader's own after it
    assert next(r for r in made if r is not fast).seen_timeouts == [7.0]  # the slow one: the server's
    # both readers busy: a third statement waits, and a cancel ends its wait
    gates["SELECT 3 AS blocked"] = threading.Event()
    blocker = threading.Thread(target=run, args=("blocker", "SELECT 3 AS blocked", fast_owner))
    blocker.start()
    third = threading.Thread(target=run, args=("third", "SELECT 4", third_owner))
    third.start()

    def cancel_until_done() -> bool:
        backend.interrupt(third_owner)
        third.join(0.2)
        return not third.is_alive()

    for _ in range(300):
        if cancel_until_done():
            break
    assert isinstance(out["third"], Canceled), out
    gates["SELECT 1 AS slow"].set()
    gates["SELECT 3 AS blocked"].set()
    slow.join(60)
    blocker.join(60)
    assert out["slow"] == [{"slow": 1}] and out["blocker"] == [{"blocked": 3}]
    assert backend.readers() == 2  # never more than size


def test_pg_catalog_rewrites_and_type_modifiers():
    sql = (
        "SELECT a.attname AS name, CAST(CAST(a.attrelid AS REGCLASS) AS TEXT), x::oid, y :: name, "
        "pg_catalog.format_type(a.atttypid, a.atttypmod), json_build_object('a', 1) "
        "FROM pg_catalog.pg_attribute a WHERE a.attname = 'pg_catalog.x AS oid)'"
    )
    assert rewrite(sql) == (
        "SELECT a.attname AS name, CAST(CAST(a.attrelid AS BIGINT) AS TEXT), x::BIGINT, y :: VARCHAR, "
        "__mc_pg.format_type(a.atttypid, a.atttypmod), json_object('a', 1) "
        "FROM __mc_pg.pg_attribute a WHERE a.attname = 'pg_catalog.x AS oid)'"
    )
    # atttypmod as Postgres stores it (format_type's inverse)
    assert typmod("character varying(20)") == 24 and typmod("character(5)") == 9
    assert typmod("numeric(10,2)") == (10 << 16 | 2) + 4 and typmod("timestamp(3) without time zone") == 3
    assert typmod("integer") == -1 and typmod(None) == -1
    schemas = {"t": pa.schema([("id", pa.int32()), ("v", pa.string()), ("e", pa.string())])}
    source = {"t": {"id": "integer", "v": "character varying(20)", "e": "mood"}}
    cat = CatalogTables(lambda: ["t"], schemas.__getitem__, lambda n: source[n])
    con = duckdb.connect()
    cat.install(con)
    cat.refresh(con, columns=True)
    rows = con.execute(
        "SELECT a.attname, __mc_pg.format_type(a.atttypid, a.atttypmod) FROM __mc_pg.pg_attribute a "
        "JOIN __mc_pg.pg_class c ON c.oid = a.attrelid WHERE c.relname = $1 ORDER BY a.attnum",
        ["t"],
    ).fetchall()
    assert rows == [("id", "integer"), ("v", "character varying(20)"), ("e", "mood")]


def test_start_up_reader_reads_no_more_than_asked():
    a, b = socket.socketpair()
    try:
        b.sendall(b"12345678-then-the-tls-handshake")
        r = _ExactReader(a)
        assert r.read(8) == b"12345678"
        assert a.recv(100) == b"-then-the-tls-handshake"  # nothing was buffered away from the socket
        b.close()
        assert r.read(4) == b""
    finally:
        a.close()
