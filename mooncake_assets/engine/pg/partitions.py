"""A partitioned table's tree, read from ``pg_inherits`` alone.

The walk is a recursive query over ``pg_inherits`` (PG docs, "System Catalogs: pg_inherits"; "WITH
Queries: Recursive Queries"), not ``pg_partition_tree()``: that function opens and locks each
partition, and a catalog read the service runs while the user alters a table must take no lock on
it (``pg_partition_tree`` deadlocked a user's ``ALTER TABLE``; see tests/cdc/test_catalog_locks.py).
"""

from __future__ import annotations

import psycopg

__all__ = ["TREE_CTE", "partition_tree"]

#: The walk as a ``WITH RECURSIVE`` element for a query of its own: ``tree(relid, depth)``, the root
#: (``{root}``: the SQL placeholder of its oid, e.g. ``%s`` or ``%(oid)s``) at depth 0.
TREE_CTE = (
    "tree(relid, depth) AS (SELECT {root}::oid, 0 UNION ALL "
    "SELECT i.inhrelid, t.depth + 1 FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid)"
)

_TREE_SQL = "WITH RECURSIVE " + TREE_CTE.format(root="%s") + " SELECT relid FROM tree ORDER BY depth, relid"


def partition_tree(conn: psycopg.Connection, oid: int) -> list[int]:
    """The oids of the relation ``oid`` and of every relation below it in ``pg_inherits`` (partitions,
    their partitions, …; inheritance children too), ``oid`` first, then by depth. A table with no
    children gives ``[oid]``. Catalog reads only: no lock on any of the tables."""
    return [int(r[0]) for r in conn.execute(_TREE_SQL, (oid,)).fetchall()]
