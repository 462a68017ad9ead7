"""``mooncake sql-server`` under a write load: eight clients at once (seven psycopg sessions and psql)
while a writer moves amounts between two source tables and cuts are taken, every answer checked.

The oracles: the total of both tables never changes (each transfer is one Postgres transaction over
both tables); a client's own insert is in its next ``latest`` answer, and still there with
``mooncake.read = 'applied'`` (the service has applied at least that LSN once a ``latest`` read
returned); and a cut equals Postgres as it was after one of the writer's transactions: the ``ops`` rows
it holds are exactly ``1..k`` and both tables' balances equal the writer's own record after transfer
``k``.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.read.pgwire import write_user

from ..helpers import make_settings, mooncake
from .test_sql_server import PASSWORD, SqlServer, _run_psql

ACCOUNTS = 10
START = 1000
TOTAL = 2 * ACCOUNTS * START
SUM_SQL = "SELECT (SELECT sum(bal) FROM a) + (SELECT sum(bal) FROM b) AS total"
ROUNDS = 6  # statements rounds per client (a count, not a duration)


@pytest.fixture()
def loaded(pg_dsn, state_dir):
    """Mirrors ``a``, ``b`` (balances) and ``ops`` (one row per transfer) and ``notes`` (the clients'
    own inserts), maintained by Dagster so Iceberg snapshots change only at cuts; a server with 4 readers."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("a", "b"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, bal bigint NOT NULL)")
            c.execute(f"INSERT INTO {t} SELECT i, {START} FROM generate_series(1, {ACCOUNTS}) i")
        c.execute("CREATE TABLE ops (seq int PRIMARY KEY, src int, dst int, amount int)")
        c.execute("CREATE TABLE notes (client int, seq int, PRIMARY KEY (client, seq))")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    for t in ("a", "b", "ops", "notes"):
        mooncake(s, "create-table", t, f"public.{t}", check=True)
    users = Path(state_dir) / "users"
    write_user(users, "ana", PASSWORD)
    server = SqlServer(s, users, "--readers", "4")
    try:
        yield s, server
    finally:
        server.stop()
        mooncake(s, "stop")


class Writer(threading.Thread):
    """Transfers between ``a`` and ``b``, one Postgres transaction each, until ``stop`` is set;
    ``states[k]`` is (a, b) balances after transfer ``k`` (``states[0]``: the start)."""

    def __init__(self, dsn: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.dsn, self.stop = dsn, stop
        self.a = dict.fromkeys(range(1, ACCOUNTS + 1), START)
        self.b = dict(self.a)
        self.states = [(dict(self.a), dict(self.b))]
        self.error: BaseException | None = None

    def run(self) -> None:
        rnd = random.Random(16)
        try:
            with psycopg.connect(self.dsn) as c:
                seq = 0
                while not self.stop.is_set() and seq < 5000:
                    seq += 1
                    src, dst, amount = rnd.randint(1, ACCOUNTS), rnd.randint(1, ACCOUNTS), rnd.randint(1, 50)
                    forward = seq % 2 == 0  # a -> b, or b -> a
                    frm, to = ("a", "b") if forward else ("b", "a")
                    with c.transaction():
                        c.execute(f"UPDATE {frm} SET bal = bal - %s WHERE id = %s", (amount, src))
                        c.execute(f"UPDATE {to} SET bal = bal + %s WHERE id = %s", (amount, dst))
                        c.execute("INSERT INTO ops VALUES (%s, %s, %s, %s)", (seq, src, dst, amount))
                    mf, mt = (self.a, self.b) if forward else (self.b, self.a)
                    mf[src] -= amount
                    mt[dst] += amount
                    self.states.append((dict(self.a), dict(self.b)))
        except BaseException as e:  # reported by the test
            self.error = e


def _client(k: int, dsn: str, pg_dsn: str, cuts: list[str], errors: list[str], torn: list[str]) -> None:
    """Rounds of: the total over both tables; an own insert read back (latest, then applied); a read
    of both tables at the newest cut made so far (its total)."""
    try:
        with psycopg.connect(dsn, autocommit=True) as c, psycopg.connect(pg_dsn, autocommit=True) as pg:
            for i in range(1, ROUNDS + 1):
                total = c.execute(SUM_SQL).fetchone()[0]
                if total != TOTAL:  # one statement over two mirrors in 'latest' mode
                    torn.append(f"client {k} round {i}: total {total}")
                pg.execute("INSERT INTO notes VALUES (%s, %s)", (k, i))
                q = f"SELECT count(*), max(seq) FROM notes WHERE client = {k}"
                if (got := c.execute(q).fetchone()) != (i, i):
                    errors.append(f"client {k} round {i}: latest read of own insert {got}")
                c.execute("SET mooncake.read = 'applied'")
                if (got := c.execute(q).fetchone()) != (i, i):
                    errors.append(f"client {k} round {i}: applied read after latest {got}")
                c.execute("RESET mooncake.read")
                if cuts:
                    c.execute(f"SET mooncake.as_of_lsn = '{cuts[-1]}'")
                    if (total := c.execute(SUM_SQL).fetchone()[0]) != TOTAL:
                        errors.append(f"client {k} round {i}: total {total} at cut {cuts[-1]}")
                    c.execute("RESET mooncake.as_of_lsn")
    except BaseException as e:
        errors.append(f"client {k}: {type(e).__name__}: {e}")


def _psql_client(dsn: str, errors: list[str], torn: list[str]) -> None:
    for i in range(ROUNDS):
        r = _run_psql(dsn, "--csv", "-t", "-c", SUM_SQL)
        if r.returncode == 0 and r.stdout.strip() != str(TOTAL):
            torn.append(f"psql round {i}: total {r.stdout.strip()}")
        elif r.returncode != 0:
            errors.append(f"psql round {i}: rc {r.returncode} out {r.stdout!r} err {r.stderr!r}")


def test_eight_clients_under_writes_with_cuts(loaded, pg_dsn):
    s, server = loaded
    stop = threading.Event()
    writer = Writer(pg_dsn, stop)
    writer.start()
    cuts: list[str] = []
    errors: list[str] = []
    torn: list[str] = []  # latest-mode totals over both mirrors that were not TOTAL
    try:
        cuts.append(json.loads(mooncake(s, "cut", "--json", check=True).stdout)["tag"])
        clients = [
            threading.Thread(target=_client, args=(k, server.dsn(), pg_dsn, cuts, errors, torn), daemon=True)
            for k in range(1, 8)
        ]
        clients.append(threading.Thread(target=_psql_client, args=(server.dsn(), errors, torn), daemon=True))
        for t in clients:
            t.start()
        for _ in range(2):  # cuts taken while the clients read and the writer writes
            cuts.append(json.loads(mooncake(s, "cut", "--json", check=True).stdout)["tag"])
        for t in clients:
            t.join(timeout=600)
            assert not t.is_alive(), "a client hung"
    finally:
        stop.set()
        writer.join(timeout=60)
    assert writer.error is None, writer.error
    assert len(writer.states) > 1, "the writer made no transfer"
    assert errors == [], errors

    cuts.append(json.loads(mooncake(s, "cut", "--json", check=True).stdout)["tag"])  # after the last write
    with psycopg.connect(server.dsn(), autocommit=True) as c, psycopg.connect(pg_dsn, autocommit=True) as pg:
        seen = []
        for cut in cuts:
            c.execute(f"SET mooncake.as_of_lsn = '{cut}'")
            seqs = [r[0] for r in c.execute("SELECT seq FROM ops ORDER BY seq").fetchall()]
            k = len(seqs)
            assert seqs == list(range(1, k + 1)), (cut, seqs[:5], k)  # a prefix of the writer's commits
            a, b = ({i: bal for i, bal in c.execute(f"SELECT id, bal FROM {t} ORDER BY id").fetchall()} for t in "ab")
            assert (a, b) == writer.states[k], (cut, k)  # Postgres as it was after transfer k
            seen.append(k)
        assert seen == sorted(seen), seen  # later cuts, later LSNs
        assert seen[-1] == len(writer.states) - 1  # the last cut has every transfer
        for t in ("a", "b", "ops", "notes"):  # and equals Postgres now (no writes since)
            sql = f"SELECT * FROM {t} ORDER BY 1, 2"
            assert c.execute(sql).fetchall() == pg.execute(sql).fetchall(), t
        c.execute("RESET mooncake.as_of_lsn")
        for t in ("a", "b", "ops", "notes"):
            sql = f"SELECT * FROM {t} ORDER BY 1, 2"
            assert c.execute(sql).fetchall() == pg.execute(sql).fetchall(), t
    # one statement over two mirrors sees each transfer in both tables or in neither (the service takes
    # every table's ReadState under one hold of its lock, as the stream applies a transaction)
    assert torn == [], torn
