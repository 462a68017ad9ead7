"""One long-lived union reader (its DuckDB connection, views, ReadCache and Postgres connection kept
between queries) stays exact across every kind of change of the table it reads: in-memory rows
inserted and deleted, new data files (flush, persist), new deletion vectors of files it has read
before, ADD and DROP COLUMN, and compaction rewriting the files. After each change every query equals
Postgres (read-your-writes: the reader's barrier is at Postgres's current LSN, nothing else writes)."""

from __future__ import annotations

import pytest

from mooncake_assets.engine.read import UnionReader

from .conftest import mirror_fixture

#: a whole-table statement (the arrow way), a filtered one (the lazy way), an aggregate over both
QUERIES = [
    "SELECT * FROM wr ORDER BY id",
    "SELECT * FROM wr WHERE id % 3 <> 1 ORDER BY id",
    "SELECT count(*) AS n, sum(id) AS s FROM wr",
]


@pytest.fixture()
def m(pg_cluster):
    yield from mirror_fixture(pg_cluster)


def _pg(m, sql: str) -> list[dict]:
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(m.dsn, autocommit=True, row_factory=dict_row) as c:
        return [dict(r) for r in c.execute(sql).fetchall()]


def _plain(rows: list[dict]) -> list[dict]:
    return [
        {k: (int(v) if hasattr(v, "as_integer_ratio") and not isinstance(v, float) else v) for k, v in r.items()}
        for r in rows
    ]


def _equal(m, r: UnionReader, step: str) -> None:
    lsn = m.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    for sql in QUERIES:
        got = _plain(r.query(sql).to_pylist())
        want = _plain(_pg(m, sql))
        assert got == want, f"after {step}: {sql}"
    from mooncake_assets.engine.lsn import Lsn

    assert r.states["wr"].lsn >= Lsn.parse(lsn), step  # read at (or after) Postgres's LSN of the check
    held = {f.path for st in r.states.values() for f in st.files}
    assert {k[1] for k in r.cache._entries} <= held, f"after {step}: the cache holds files no longer read"


def _applied(m) -> None:
    m.client.wait_lsn(m.sql("SELECT pg_current_wal_lsn()::text")[0][0])


def test_one_long_lived_reader_equals_postgres_across_every_change(m):
    m.sql(
        "CREATE TABLE wr (id int PRIMARY KEY, a int, b text)",
        "INSERT INTO wr SELECT g, g * 10, 'b' || g FROM generate_series(1, 300) g",
    )
    m.create("wr")
    r = UnionReader(m.client, m.dsn)
    try:
        _equal(m, r, "the initial copy")

        m.sql(
            "INSERT INTO wr SELECT g, g, 'mem' FROM generate_series(301, 340) g", "DELETE FROM wr WHERE id IN (305, 7)"
        )
        _equal(m, r, "in-memory rows inserted and deleted")

        _applied(m)
        m.call("flush", table="wr")
        _equal(m, r, "a flush (a new data file)")

        m.call("persist", table="wr")
        m.sql("UPDATE wr SET a = -a WHERE id % 10 = 0", "DELETE FROM wr WHERE id BETWEEN 20 AND 29")
        _equal(m, r, "new deletes of existing files (pending)")
        _applied(m)
        m.call("persist", table="wr")
        _equal(m, r, "the deletes committed as deletion vectors")
        hits, unchanged = r.cache.hits, m.client.unchanged + m.client.skipped
        _equal(m, r, "nothing")  # nothing changed: footers, vectors and plans come from the cache
        assert r.cache.hits > hits
        # and the service sent only the LSN, not the state again, or was not asked (its read board)
        assert m.client.unchanged + m.client.skipped > unchanged
        m.sql("DELETE FROM wr WHERE id % 7 = 0")
        _applied(m)
        m.call("persist", table="wr")
        _equal(m, r, "a new version of the same files' deletion vectors")

        m.sql("ALTER TABLE wr ADD COLUMN c int DEFAULT 7", "INSERT INTO wr VALUES (400, 4, 'new', 8)")
        _equal(m, r, "ADD COLUMN")
        _applied(m)
        m.call("flush", table="wr")
        m.sql("ALTER TABLE wr DROP COLUMN b", "UPDATE wr SET c = id WHERE id % 5 = 0")
        _equal(m, r, "DROP COLUMN")
        _applied(m)
        m.call("persist", table="wr")
        _equal(m, r, "a persist after the schema changes")

        before = {f.path for f in r.states["wr"].files}
        res = m.call("compact", table="wr", full=True)
        assert res["compacted"], res
        _equal(m, r, "a full compaction")
        assert {f.path for f in r.states["wr"].files}.isdisjoint(before)  # every file rewritten

        m.sql(
            "INSERT INTO wr (id, a, c) SELECT g, g, g FROM generate_series(500, 520) g", "DELETE FROM wr WHERE id < 100"
        )
        _equal(m, r, "deletes of compacted files and new in-memory rows")
    finally:
        r.close()


class _CountingFlight:
    """The client's real FlightClient, counting the calls made through it."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def do_action(self, *a, **kw):
        self.calls += 1
        return self.inner.do_action(*a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_read_board_skips_the_round_trip_only_while_nothing_changed(m):
    """The warm reader's fast path (engine/service/board.py): a query after no change makes no Flight
    call at all (the client answers from the read board) and returns the same rows; a query after a
    change committed in Postgres always sees it (read-your-writes), in every round."""
    m.sql("CREATE TABLE rb (id int PRIMARY KEY, a int)", "INSERT INTO rb SELECT g, g FROM generate_series(1, 200) g")
    m.create("rb")
    r = UnionReader(m.client, m.dsn)
    sql = "SELECT count(*) AS n, sum(a) AS s FROM rb"
    try:
        r.query(sql)
        counting = _CountingFlight(m.client._conn())
        m.client._client = counting
        skipped = 0
        for i in range(20):
            calls, before = counting.calls, m.client.skipped
            got = _plain(r.query(sql).to_pylist())  # nothing changed since the last query
            assert got == _plain(_pg(m, sql)), f"round {i}: unchanged"
            if m.client.skipped > before:  # answered from the board: no call at all
                assert counting.calls == calls, f"round {i}: a skipped read made a Flight call"
                skipped += 1
            else:  # the board moved (a keepalive, the idle budget check): one round trip, as before
                assert counting.calls == calls + 1, f"round {i}"
            m.sql(f"UPDATE rb SET a = a + {i + 1} WHERE id = {i + 1}")  # a change right before the query
            calls, before = counting.calls, m.client.skipped
            got = _plain(r.query(sql).to_pylist())
            assert got == _plain(_pg(m, sql)), f"round {i}: the update of id {i + 1} is not seen"
            assert m.client.skipped == before and counting.calls == calls + 1, f"round {i}: a change was skipped"
        assert skipped >= 10, f"the fast path was taken in {skipped} of 20 unchanged rounds"
    finally:
        r.close()


def test_a_reader_that_holds_no_rows_reads_the_files_with_deletes_in_every_query(m, monkeypatch):
    """``hold_rows=False`` (what the benchmark times against a clean Parquet scan): every query of an
    unchanged table reads the live rows of its files with deletes again; a holding reader reads them
    once and scans them from memory while nothing changed. Both equal Postgres."""
    from mooncake_assets.engine.read import union

    reads: list[int] = []
    real = union._read_masked
    monkeypatch.setattr(
        union, "_read_masked", lambda files, cols, cache: reads.append(len(files)) or real(files, cols, cache)
    )
    m.sql("CREATE TABLE hr (id int PRIMARY KEY, a int)", "INSERT INTO hr SELECT g, g FROM generate_series(1, 3000) g")
    m.create("hr")
    m.call("persist", table="hr")
    m.sql("DELETE FROM hr WHERE id % 7 = 0")
    m.call("persist", table="hr")  # the copied file now has a deletion vector
    sql = "SELECT * FROM hr ORDER BY id"  # a whole-table statement: the arrow way, through _read_masked
    want = _plain(_pg(m, sql))
    for hold, expect_reads in ((False, 3), (True, 1)):
        r = UnionReader(m.client, m.dsn, hold_rows=hold)
        try:
            reads.clear()
            for _ in range(3):
                assert _plain(r.query(sql).to_pylist()) == want, hold
            assert len(reads) == expect_reads, (hold, reads)
            assert r._masked == {} or hold  # (a small result is written to its temp table again each time)
        finally:
            r.close()
