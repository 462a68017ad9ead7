"""Schema evolution looks the source's catalogs up while the user's DDL runs: those lookups must take
no lock on the user's tables, or an ``ALTER TABLE`` can deadlock with them — and Postgres may pick the
user's statement as the victim (found by the chaos suite with ``pg_partition_tree``, which locks
every partition)."""

from __future__ import annotations

import psycopg

from mooncake_assets.engine.pg.catalog import catalog_columns, describe_table


def test_catalog_lookups_take_no_locks_on_the_table_or_its_partitions(pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS lk_root")
        c.execute("CREATE TABLE lk_root (id int, r text, v int DEFAULT 3, PRIMARY KEY (id, r)) PARTITION BY LIST (r)")
        c.execute("CREATE TABLE lk_a PARTITION OF lk_root FOR VALUES IN ('a')")
        c.execute("CREATE TABLE lk_b PARTITION OF lk_root FOR VALUES IN ('b')")
        c.execute("INSERT INTO lk_root VALUES (1, 'a'), (2, 'b')")
        c.execute("ALTER TABLE lk_root ADD COLUMN w text DEFAULT 'x'")
        oid = c.execute("SELECT 'lk_root'::regclass::oid").fetchone()[0]
    with psycopg.connect(pg_dsn) as c:  # one open transaction: any lock taken stays until its end
        c.execute("SELECT 1")  # (so catalog_columns' own transaction block is a savepoint inside it)
        cols = {x.name: x for x in catalog_columns(c, oid)}
        locked = c.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'lk\\_%'"
        ).fetchall()
        c.rollback()
    assert cols["w"].missing == "x" and cols["v"].missing == "3"  # attmissingval on a leaf; an immutable default
    assert locked == [], f"catalog_columns locked {locked}"
    with psycopg.connect(pg_dsn) as c:
        c.execute("SELECT 1")
        describe_table(c, "public.lk_root")
        locked = c.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'lk\\_%'"
        ).fetchall()
    assert locked == [], f"describe_table locked {locked}"


def test_partition_tree_walks_pg_inherits_without_locks(pg_dsn):
    """The one pg_inherits walk (identity_todo, the publication checks, catalog_columns): the root
    first, then each level of partitions, and no lock on any of them."""
    from mooncake_assets.engine.pg.partitions import partition_tree

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS pt_root")
        c.execute("CREATE TABLE pt_root (id int, r text, s int) PARTITION BY LIST (r)")
        c.execute("CREATE TABLE pt_a PARTITION OF pt_root FOR VALUES IN ('a') PARTITION BY LIST (s)")
        c.execute("CREATE TABLE pt_a1 PARTITION OF pt_a FOR VALUES IN (1)")
        c.execute("CREATE TABLE pt_b PARTITION OF pt_root FOR VALUES IN ('b')")
        c.execute("CREATE TABLE pt_plain (id int)")
        oid = {
            n: c.execute("SELECT %s::regclass::oid", (n,)).fetchone()[0]
            for n in ("pt_root", "pt_a", "pt_a1", "pt_b", "pt_plain")
        }
    with psycopg.connect(pg_dsn) as c:  # one open transaction: any lock taken stays until its end
        tree = partition_tree(c, oid["pt_root"])
        locked = c.execute(
            "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE l.pid = pg_backend_pid() AND c.relname LIKE 'pt\\_%'"
        ).fetchall()
        assert partition_tree(c, oid["pt_plain"]) == [oid["pt_plain"]]
        c.rollback()
    assert tree[0] == oid["pt_root"] and set(tree[1:3]) == {oid["pt_a"], oid["pt_b"]} and tree[3:] == [oid["pt_a1"]]
    assert locked == [], f"partition_tree locked {locked}"
