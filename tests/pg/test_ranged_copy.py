"""The initial copy in CTID ranges on parallel connections at one snapshot, against a real Postgres.

Oracle: the single ``COPY`` of the whole table (``initial_copy`` with ``parallel=1``) at the same
snapshot; rows compared by key, every value by its ``repr`` (NaN included)."""

from __future__ import annotations

import time

import psycopg
import pyarrow as pa
import pytest

from mooncake_assets.engine.cdc import (
    CtidRange,
    begin_copy_transaction,
    copy_plan,
    copy_range,
    copy_statement,
    describe_table,
    initial_copy,
)
from mooncake_assets.engine.cdc.copyread import block_reader_available, copy_blocks

from .all_types import ALL_TYPES_DDL, ALL_TYPES_ROWS

ALL_COLS = "id, b, i2, i4, i8, f4, f8, n12_2, n38, n_free, n_big, t, vc, c5, nm, d, ts, tstz, tm, u, j, jb, by"


def _rows(batches, key="id") -> list[str]:
    tbl = pa.Table.from_batches(list(batches)) if batches else None
    if tbl is None:
        return []
    return [repr(r) for r in sorted(tbl.to_pylist(), key=lambda r: r[key])]


def _backends(dsn: str, settle_to: int | None = None) -> int:
    """Other backends connected to the test's database; with ``settle_to``, waits (up to 10 s) for
    the count to fall to it (a closed connection's backend exits shortly after the client goes)."""
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as c:
        while True:
            n = c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchone()[0]
            if settle_to is None or n <= settle_to or time.monotonic() > deadline:
                return n
            time.sleep(0.05)


@pytest.fixture
def wide(pg_dsn):
    """all_types grown over many pages: the edge rows repeated, TOAST-sized text and bytea, NULLs,
    and holes (every third row deleted, no VACUUM)."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(ALL_TYPES_DDL)
        c.execute("ALTER TABLE all_types SET (autovacuum_enabled = false)")
        c.execute("SET TimeZone = 'Asia/Kolkata'")
        c.execute(ALL_TYPES_ROWS)
        c.execute(
            f"INSERT INTO all_types ({ALL_COLS}) SELECT id + 100 * g, "
            + ALL_COLS.split(", ", 1)[1]
            + " FROM all_types, generate_series(1, 400) g"
        )
        c.execute(
            "INSERT INTO all_types (id, t, by) SELECT 100000 + g, repeat(md5(g::text), 4000), "
            "decode(repeat(md5((g * 7)::text), 20000), 'hex') FROM generate_series(1, 6) g"
        )
        c.execute("DELETE FROM all_types WHERE id % 3 = 0")
    return pg_dsn


def test_block_reader_is_compiled(pg_dsn):
    """The compiled COPY reader runs with this psycopg (fails, naming the assumption, when a release
    changes what engine/cdc/copyread.py leans on: pgconn_ptr and the libpq that owns it)."""
    with psycopg.connect(pg_dsn) as c:
        assert block_reader_available(c), "the compiled COPY reader cannot run: see engine/cdc/copyread.py"


def test_copy_blocks_are_psycopgs_rows(wide):
    with psycopg.connect(wide) as c:
        ts = describe_table(c, "all_types")
        c.rollback()
        stmt = copy_statement(ts)
        with c.cursor() as cur, cur.copy(stmt) as cp:
            want = b"".join(bytes(r) for r in cp)
        c.rollback()
        blocks = list(copy_blocks(c, stmt, max_bytes=1 << 16, max_rows=100, prefix=b"P"))
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # the COPY's result collected
        assert len(blocks) > 3 and all(b.startswith(b"P") for b, _ in blocks)
        assert all(n <= 100 for _, n in blocks)
        assert b"".join(b[1:] for b, _ in blocks) == want
        assert sum(n for _, n in blocks) == c.execute("SELECT count(*) FROM all_types").fetchone()[0]


def test_copy_blocks_raise_the_servers_error(pg_dsn):
    with psycopg.connect(pg_dsn) as c:
        stmt = psycopg.sql.SQL("COPY (SELECT 1 / (g - 5000) FROM generate_series(1, 10000) g) TO STDOUT")
        with pytest.raises(psycopg.errors.DivisionByZero):
            list(copy_blocks(c, stmt, max_bytes=1 << 20, max_rows=10))
        c.rollback()
        assert c.execute("SELECT 1").fetchone()[0] == 1  # the connection is still usable


def test_ranged_copy_equals_the_single_copy(wide):
    with psycopg.connect(wide) as c:
        ts = describe_table(c, "all_types")
        c.rollback()
        c.autocommit = True
        begin_copy_transaction(c, None)
        plan = copy_plan(c, ts, 3, min_range_pages=1)
        c.execute("ROLLBACK")
        assert len(plan) == 12 and plan[-1].end is None
        single = list(initial_copy(c, ts, None))
        before = _backends(wide)
        ranged = list(initial_copy(c, ts, None, parallel=3, connect=lambda: psycopg.connect(wide), min_range_pages=1))
        assert _backends(wide, before) == before  # the extra connections are closed
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and c.autocommit is True
        expected = c.execute("SELECT count(*) FROM all_types").fetchone()[0]
    assert len(ranged) >= len(plan)  # at least one batch per range that has rows
    assert sum(b.num_rows for b in ranged) == expected
    assert _rows(ranged) == _rows(single)
    toasted = [r for b in ranged for r in b.to_pylist() if r["id"] > 100000]
    assert len(toasted) == 4 and all(len(r["t"]) == 128000 and len(r["by"]) == 320000 for r in toasted)


def test_copy_range_by_range_at_an_exported_snapshot(wide):
    """copy_range, one range at a time on separate connections, at the snapshot of a third."""
    with psycopg.connect(wide, autocommit=True) as exporter, psycopg.connect(wide, autocommit=True) as a:
        exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        snap = exporter.execute("SELECT pg_export_snapshot()").fetchone()[0]
        ts = describe_table(a, "all_types")
        a.execute("INSERT INTO all_types (id, t) VALUES (999999, 'after the snapshot')")
        begin_copy_transaction(a, snap)
        plan = copy_plan(a, ts, 2, min_range_pages=1)
        with psycopg.connect(wide, autocommit=True) as b:
            begin_copy_transaction(b, snap)
            got = []
            for i, rng in enumerate(plan):
                got += list(copy_range(a if i % 2 else b, ts, rng, batch_rows=50))
            b.execute("COMMIT")
        a.execute("COMMIT")
        want = list(initial_copy(a, ts, snap))
        exporter.execute("COMMIT")
    assert all(b.num_rows <= 50 for b in got)
    assert 999999 not in {r for b in got for r in b.column("id").to_pylist()}
    assert _rows(got) == _rows(want)


def test_rows_committed_after_the_snapshot_are_not_copied(pg_dsn):
    """Rows inserted (new pages past the size the planner read) and deleted after the snapshot, and
    rows written while the copy runs, are not seen; every row the snapshot saw is."""
    with psycopg.connect(pg_dsn, autocommit=True) as w:
        w.execute("CREATE TABLE grow (id bigint PRIMARY KEY, v text)")
        w.execute("INSERT INTO grow SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
        with psycopg.connect(pg_dsn, autocommit=True) as exporter, psycopg.connect(pg_dsn) as c:
            exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            snap = exporter.execute("SELECT pg_export_snapshot()").fetchone()[0]
            w.execute("INSERT INTO grow SELECT g, md5(g::text) FROM generate_series(20001, 40000) g")
            w.execute("DELETE FROM grow WHERE id <= 1000")
            ts = describe_table(c, "grow")
            c.rollback()
            it = initial_copy(
                c, ts, snap, batch_rows=2000, parallel=2, connect=lambda: psycopg.connect(pg_dsn), min_range_pages=4
            )
            got = [next(it)]
            exporter.execute("COMMIT")  # the snapshot is imported by then: the exporter may go
            w.execute("INSERT INTO grow SELECT g, 'during' FROM generate_series(40001, 45000) g")
            w.execute("UPDATE grow SET v = 'changed' WHERE id % 10 = 0")
            got += list(it)
    ids = [i for b in got for i in b.column("id").to_pylist()]
    assert sorted(ids) == list(range(1, 20001))
    assert not any(v in ("changed", "during") for b in got for v in b.column("v").to_pylist())


def test_empty_table_and_zero_pages(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE nothing (id int PRIMARY KEY, v text)")
        ts = describe_table(c, "nothing")
        begin_copy_transaction(c, None)
        assert copy_plan(c, ts, 4, min_range_pages=1) == [CtidRange(0, None)]
        c.execute("COMMIT")
        assert list(initial_copy(c, ts, None, parallel=4, connect=lambda: psycopg.connect(pg_dsn))) == []


def test_partitioned_and_inheritance_parents(pg_dsn):
    """A partitioned parent (no heap) is copied in one range with its partitions' rows; an inheritance
    parent's ranged copy keeps ONLY (its children's rows are published under the children)."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        c.execute("CREATE TABLE part_a PARTITION OF part FOR VALUES FROM (0) TO (5000)")
        c.execute("CREATE TABLE part_b PARTITION OF part FOR VALUES FROM (5000) TO (10000)")
        c.execute("INSERT INTO part SELECT g, md5(g::text) FROM generate_series(0, 9999) g")
        c.execute("CREATE TABLE par (id int PRIMARY KEY, v text)")
        c.execute("CREATE TABLE kid () INHERITS (par)")
        c.execute("INSERT INTO par SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
        c.execute("INSERT INTO kid SELECT g, 'kid' FROM generate_series(100001, 103000) g")
        connect = lambda: psycopg.connect(pg_dsn)
        pt = describe_table(c, "part")
        assert pt.relkind == "p"
        begin_copy_transaction(c, None)
        assert copy_plan(c, pt, 4, min_range_pages=1) == [CtidRange(0, None)]
        c.execute("COMMIT")
        got = list(initial_copy(c, pt, None, parallel=4, connect=connect, min_range_pages=1))
        assert sorted(i for b in got for i in b.column("id").to_pylist()) == list(range(10000))
        it = describe_table(c, "par")
        begin_copy_transaction(c, None)
        assert len(copy_plan(c, it, 2, min_range_pages=1)) > 1
        c.execute("COMMIT")
        got = list(initial_copy(c, it, None, parallel=2, connect=connect, min_range_pages=1))
        assert sorted(i for b in got for i in b.column("id").to_pylist()) == list(range(1, 5001))


def test_parallel_copy_early_close_and_errors(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE big (id bigint PRIMARY KEY, v text)")
        c.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 60000) g")
        ts = describe_table(c, "big")
        before = _backends(pg_dsn)
        connect = lambda: psycopg.connect(pg_dsn)
        it = initial_copy(c, ts, None, batch_rows=1000, parallel=3, connect=connect, min_range_pages=1)
        assert next(it).num_rows <= 1000
        it.close()  # stops the readers, cancels their COPYs, rolls back, closes the extra connections
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _backends(pg_dsn, before) == before
        assert c.execute("SELECT count(*) FROM big").fetchone()[0] == 60000
        with pytest.raises(psycopg.Error):  # a snapshot that does not exist
            next(initial_copy(c, ts, "00000003-0000001B-1", parallel=3, connect=connect, min_range_pages=1))
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert _backends(pg_dsn, before) == before
        seen = []
        total = sum(
            b.num_rows
            for b in initial_copy(
                c,
                ts,
                None,
                batch_rows=5000,
                progress=lambda r, n: seen.append((r, n)),
                parallel=3,
                connect=connect,
                min_range_pages=1,
            )
        )
    assert total == 60000 and seen[-1][0] == 60000 and seen[-1][1] > 60000 * 32
    assert [r for r, _ in seen] == sorted(r for r, _ in seen)


def test_text_as_arrow_holds_the_same_texts(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE k (a text, b numeric(6,2), c int, PRIMARY KEY (c, a))")
        c.execute(
            "INSERT INTO k SELECT 'x' || g, CASE WHEN g % 3 = 0 THEN NULL ELSE g / 4.0 END, g "
            "FROM generate_series(1, 3000) g"
        )
        ts = describe_table(c, "k")
        lists = list(initial_copy(c, ts, None, text_columns=["c", "b"], batch_rows=700))
        arrows = list(initial_copy(c, ts, None, text_columns=["c", "b"], batch_rows=700, text_as_arrow=True))
    assert len(lists) == len(arrows) == 5
    for (b1, t1), (b2, t2) in zip(lists, arrows):
        assert b1.equals(b2) and all(isinstance(a, pa.StringArray) for a in t2)
        assert [a.to_pylist() for a in t2] == t1


def test_the_fallback_blocks_are_the_same(wide):
    """Where the compiled reader cannot run, the blocks come from psycopg's row iteration: same bytes."""
    from mooncake_assets.engine.cdc.copyread import _psycopg_blocks

    with psycopg.connect(wide) as c:
        ts = describe_table(c, "all_types")
        c.rollback()
        stmt = copy_statement(ts)
        fast = list(copy_blocks(c, stmt, max_bytes=1 << 16, max_rows=100, prefix=b"P"))
        c.rollback()
        with c.cursor() as cur, cur.copy(stmt) as cp:
            slow = list(_psycopg_blocks(cp, 1 << 16, 100, b"P", None))
    assert [n for _, n in slow] == [n for _, n in fast]
    assert b"".join(b[1:] for b, _ in slow) == b"".join(b[1:] for b, _ in fast)
