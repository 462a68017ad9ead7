"""The pgoutput parser on real messages from Postgres (the SQL interface of a logical slot, protocol 1 and 2)."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from mooncake_assets.engine.cdc import (
    Delete,
    TupleData,
    parse_message,
)


def _sql_changes(conn, slot: str, proto: str) -> list:
    rows = conn.execute(
        "SELECT lsn, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
        "'proto_version', %s, 'publication_names', 'pub')",
        (slot, proto),
    ).fetchall()
    return [(lsn, parse_message(data)) for lsn, data in rows]


@pytest.mark.parametrize("proto", ["1", "2"])
def test_real_messages_from_postgres(pg_dsn, proto):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2), note text)")
        c.execute("ALTER TABLE acct ALTER COLUMN note SET STORAGE EXTERNAL")
        c.execute("CREATE TABLE hist (v text)")
        c.execute("ALTER TABLE hist REPLICA IDENTITY FULL")
        c.execute("CREATE PUBLICATION pub FOR TABLE acct, hist")
        c.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        big = "x" * 10_000
        with c.transaction():
            c.execute("INSERT INTO acct VALUES (1, 'ann', 10.50, %s), (2, 'bob', NULL, NULL)", (big,))
            c.execute("INSERT INTO hist VALUES ('a'), (NULL)")
        with c.transaction():
            c.execute("UPDATE acct SET balance = 11 WHERE id = 1")  # note unchanged TOAST -> 'u'
            c.execute("UPDATE acct SET id = 3 WHERE id = 2")  # key change -> old 'K'
            c.execute("UPDATE hist SET v = 'b' WHERE v = 'a'")  # full identity -> old 'O'
            c.execute("DELETE FROM hist WHERE v IS NULL")
            c.execute("DELETE FROM acct WHERE id = 3")
        c.execute("TRUNCATE acct, hist RESTART IDENTITY")
        msgs = _sql_changes(c, "s", proto)
        oid = c.execute("SELECT 'acct'::regclass::oid").fetchone()[0]
        hoid = c.execute("SELECT 'hist'::regclass::oid").fetchone()[0]

    kinds = [type(m).__name__ for _, m in msgs]
    assert kinds == [
        "Begin",
        "Relation",
        "Insert",
        "Insert",
        "Relation",
        "Insert",
        "Insert",
        "Commit",
        "Begin",
        "Update",
        "Update",
        "Update",
        "Delete",
        "Delete",
        "Commit",
        "Begin",
        "Relation",
        "Relation",
        "Truncate",
        "Commit",
    ]  # TRUNCATE re-sends schemas
    m = [m for _, m in msgs]
    rel = m[1]
    assert (rel.oid, rel.namespace, rel.name, rel.replica_identity) == (oid, "public", "acct", "d")
    assert [(col.name, col.type_oid, col.is_key) for col in rel.columns] == [
        ("id", 23, True),
        ("owner", 25, False),
        ("balance", 1700, False),
        ("note", 25, False),
    ]
    assert m[4].replica_identity == "f" and all(col.is_key for col in m[4].columns)
    assert m[2].new == TupleData("tttt", [b"1", b"ann", b"10.50", big.encode()])
    assert m[3].new == TupleData("ttnn", [b"2", b"bob", None, None])
    assert m[6].new == TupleData("n", [None])
    assert m[9].old is None and m[9].new == TupleData("tttu", [b"1", b"ann", b"11.00", None])
    assert m[10].old_kind == "K" and m[10].old == TupleData("tnnn", [b"2", None, None, None])
    assert m[10].new.data[0] == b"3"
    assert m[11].old_kind == "O" and m[11].old == TupleData("t", [b"a"]) and m[11].new == TupleData("t", [b"b"])
    assert m[12] == Delete(None, hoid, "O", TupleData("n", [None]))
    assert m[13].old_kind == "K" and m[13].old.data[0] == b"3"
    assert sorted(m[18].relation_oids) == sorted([oid, hoid]) and m[18].restart_identity and not m[18].cascade
    # Begin's final LSN is the Commit's commit LSN; end LSN follows it; commit order increases
    for b, cm in [(m[0], m[7]), (m[8], m[14]), (m[15], m[19])]:
        assert b.final_lsn == cm.commit_lsn < cm.end_lsn
        assert abs((cm.commit_time - datetime.now(UTC)).total_seconds()) < 60
    assert m[7].end_lsn <= m[14].commit_lsn
