"""``mooncake sql-server`` under a pgbench load: eight clients at once (seven psycopg sessions and psql)
while the real ``pgbench`` (two connections, a custom ``-f`` script) moves amounts between two source
tables and cuts are taken, every answer checked.

The oracles: the total of both tables never changes (each pgbench transaction moves one amount from one
table to the other); a client's own insert is in its next ``latest`` answer, and still there with
``mooncake.read = 'applied'`` (the service has applied at least that LSN once a ``latest`` read
returned); and a cut equals Postgres as it was after one of the load's transactions: the ``ops`` rows
it holds are exactly ``1..k`` and both tables' balances equal the replay of ``ops`` rows ``1..k``
(each transaction takes the next number from a counter row it keeps locked until its commit, so the
numbers are the commit order).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
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
        c.execute("CREATE TABLE ops (seq int PRIMARY KEY, src int, dst int, amount int, dir text NOT NULL)")
        c.execute("CREATE TABLE counter (n int NOT NULL)")  # not mirrored: the load's commit order
        c.execute("INSERT INTO counter VALUES (0)")
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


def _pgbench() -> str:
    found = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    assert found, "pgbench not found"
    return str(found)


# one pgbench transaction: the next number from the counter (its row lock, held to the commit, orders
# the commits), an amount moved from one table to the other, the move recorded in ops
TRANSFER = """\\set src random(1, {accounts})
\\set dst random(1, {accounts})
\\set amount random(1, 50)
BEGIN;
UPDATE counter SET n = n + 1 RETURNING n AS seq \\gset
UPDATE {frm} SET bal = bal - :amount WHERE id = :src;
UPDATE {to} SET bal = bal + :amount WHERE id = :dst;
INSERT INTO ops VALUES (:seq, :src, :dst, :amount, '{frm}{to}');
END;
"""
PER_RUN = 20  # transactions per pgbench client per run (a count, not a duration)


class PgbenchLoad(threading.Thread):
    """Runs of ``pgbench -n -c 2 -t PER_RUN -f ab.sql -f ba.sql`` (a -> b or b -> a, equal weights)
    until ``stop`` is set or 5000 transactions are done; ``error`` says why a run failed (its exit
    code, failed or missing transactions)."""

    def __init__(self, dsn: str, scripts: Path, stop: threading.Event):
        super().__init__(daemon=True)
        self.dsn, self.stop = dsn, stop
        self.files = []
        for frm, to in (("a", "b"), ("b", "a")):
            f = scripts / f"{frm}{to}.sql"
            f.write_text(TRANSFER.format(accounts=ACCOUNTS, frm=frm, to=to))
            self.files += ["-f", f"{f}@1"]
        self.done = 0
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.done < 5000:
                r = subprocess.run(
                    [_pgbench(), "-n", "-c", "2", "-j", "1", "-t", str(PER_RUN), *self.files, self.dsn],
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                processed = re.search(r"number of transactions actually processed: (\d+)/(\d+)", r.stdout)
                failed = re.search(r"number of failed transactions: (\d+)", r.stdout)
                complete = processed and processed.group(1) == processed.group(2)
                if r.returncode != 0 or not complete or not failed or failed.group(1) != "0":
                    self.error = f"pgbench rc {r.returncode}: {r.stdout[-800:]} {r.stderr[-800:]}"
                    return
                self.done += int(processed.group(1))
        except BaseException as e:  # reported by the test
            self.error = f"{type(e).__name__}: {e}"


def _replay(pg_dsn: str) -> list[tuple[dict, dict]]:
    """``states[k]``: the (a, b) balances after the load's transaction ``k`` (``states[0]``: the start),
    replayed from Postgres's ``ops``; asserts its numbers are ``1..n`` (every transaction committed)
    and that the replay ends at Postgres's balances."""
    with psycopg.connect(pg_dsn, autocommit=True) as pg:
        ops = pg.execute("SELECT seq, src, dst, amount, dir FROM ops ORDER BY seq").fetchall()
        (n,) = pg.execute("SELECT n FROM counter").fetchone()
        now = tuple(dict(pg.execute(f"SELECT id, bal FROM {t}").fetchall()) for t in ("a", "b"))
    assert [op[0] for op in ops] == list(range(1, n + 1)), (n, ops[:5])
    bal = {"a": dict.fromkeys(range(1, ACCOUNTS + 1), START), "b": dict.fromkeys(range(1, ACCOUNTS + 1), START)}
    states = [(dict(bal["a"]), dict(bal["b"]))]
    for _seq, src, dst, amount, direction in ops:
        bal[direction[0]][src] -= amount
        bal[direction[1]][dst] += amount
        states.append((dict(bal["a"]), dict(bal["b"])))
    assert states[-1] == now, "the ops log does not replay to Postgres's balances"
    return states


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


def test_eight_clients_under_a_pgbench_load_with_cuts(loaded, pg_dsn, tmp_path):
    s, server = loaded
    stop = threading.Event()
    load = PgbenchLoad(pg_dsn, tmp_path, stop)
    load.start()
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
        for _ in range(2):  # cuts taken while the clients read and the load writes
            cuts.append(json.loads(mooncake(s, "cut", "--json", check=True).stdout)["tag"])
        for t in clients:
            t.join(timeout=600)
            assert not t.is_alive(), "a client hung"
    finally:
        stop.set()
        load.join(timeout=60)
    assert load.error is None, load.error
    assert load.done > 0, "pgbench made no transfer"
    assert errors == [], errors
    states = _replay(pg_dsn)
    assert len(states) - 1 == load.done, (len(states), load.done)

    cuts.append(json.loads(mooncake(s, "cut", "--json", check=True).stdout)["tag"])  # after the last write
    with psycopg.connect(server.dsn(), autocommit=True) as c, psycopg.connect(pg_dsn, autocommit=True) as pg:
        seen = []
        for cut in cuts:
            c.execute(f"SET mooncake.as_of_lsn = '{cut}'")
            seqs = [r[0] for r in c.execute("SELECT seq FROM ops ORDER BY seq").fetchall()]
            k = len(seqs)
            assert seqs == list(range(1, k + 1)), (cut, seqs[:5], k)  # a prefix of the load's commits
            a, b = ({i: bal for i, bal in c.execute(f"SELECT id, bal FROM {t} ORDER BY id").fetchall()} for t in "ab")
            assert (a, b) == states[k], (cut, k)  # Postgres as it was after transfer k
            seen.append(k)
        assert seen == sorted(seen), seen  # later cuts, later LSNs
        assert seen[-1] == len(states) - 1  # the last cut has every transfer
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
