"""STORED generated columns for a pgoutput stream that does not carry them (Postgres before 18).

Postgres 18's pgoutput publishes stored generated columns when the publication says so
(``publish_generated_columns = stored``); older servers never send them (Postgres docs, "Logical
Replication — Generated Column Replication"). A generated column's expression is immutable (Postgres
requires it), so its value is a function of the row's other columns: :class:`GeneratedColumns`
computes it on the source for the rows of each applied batch — **one round trip per batch and table**,
only for tables whose mirror has such columns — and hands the apply path changes shaped as if
Postgres 18 had sent them (a Relation and tuples with the generated columns in attribute order). The
apply path (:class:`~mooncake_assets.engine.table.mirror.MirrorTable`) knows nothing of it.

Which generated columns a change has: those of the mirror's live schema (the caller passes it) that
the source still has as STORED generated columns. The source's catalogs are read once per Relation
message (pgoutput sends a new one after every DDL on the table, :mod:`..table.schema_change`): each
generated column's expression (``pg_get_expr``, in this session: a function outside ``pg_catalog``
comes out schema-qualified), its type, and the columns it reads (``pg_depend``: the column's
``pg_attrdef`` entry depends on each). So after ``DROP COLUMN g`` (or ``DROP COLUMN a CASCADE``,
which drops a ``g`` that reads ``a``) the Relation comes without ``g`` and the mirror drops it at that
LSN (:func:`~..table.schema_change.on_relation`); a renamed column is read under its new name. The
catalogs are those of now, not of the change's LSN: a stream replayed from behind a DDL sees its
effect from the first Relation on (as the defaults of added columns, see ``catalog_columns``).

The query (text in, text out, the session's pinned output settings as for every value: those of the
walsender, ``OUTPUT_SETTINGS``), sending only the columns the expressions read::

    SELECT u.ord, (<expr>)::text, … FROM unnest($1::text[], …) WITH ORDINALITY
           AS u(c0, c1, …, ord), LATERAL (SELECT u.c0::<type of a> AS "a", …) r

evaluates each expression over the row's own values, never over the table (which may have moved on).

Per change: INSERT and UPDATE get the new row's values; the old row of a DELETE/UPDATE under
REPLICA IDENTITY FULL (``'O'``) gets its own (the mirror matches whole rows); a key-only old row
(``'K'``) gets NULL like its other non-key columns. A new row with an unchanged TOAST value (``'u'``)
has no value to compute from: when the old row is whole, its value is used; otherwise a generated
column whose expression reads that column is sent as unchanged too, and the mirror keeps the current
row's value — exact unless the expression reads both such a TOASTed column and another column the
UPDATE changed (a known limit: Postgres does not send the TOASTed value).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import replace
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.abc import Params
from psycopg.rows import TupleRow

from ..pg.schema import TableSchema
from ..pg.session import LazyConnection
from .pgoutput import Relation, RelationColumn, TupleData
from .txn import Change

__all__ = ["GeneratedColumns", "GeneratedColumnError"]

# every live column of a table now; for a STORED generated one its expression and the attnums of the
# columns it reads (pg_depend of its pg_attrdef entry on the table's columns)
_TABLE_SQL = """
SELECT a.attnum, a.attname, a.attgenerated = 's', a.atttypid, a.atttypmod,
       CASE WHEN a.attgenerated = 's' THEN pg_get_expr(d.adbin, d.adrelid) END,
       CASE WHEN a.attgenerated = 's' THEN ARRAY(
         SELECT dep.refobjsubid FROM pg_depend dep
         WHERE dep.classid = 'pg_attrdef'::regclass AND dep.objid = d.oid AND dep.refclassid = 'pg_class'::regclass
           AND dep.refobjid = d.adrelid AND dep.refobjsubid > 0 AND dep.refobjsubid <> d.adnum
         ORDER BY dep.refobjsubid) END
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


class GeneratedColumnError(Exception):
    """A table's generated columns cannot be computed for the changes of a batch (permanent for them:
    retrying gives the same answer). The message names the table and the column."""


class _Plan:
    """How the changes sent under one Relation get their generated columns (computed once per Relation
    and mirror schema): ``relation``: the Relation with them at their places; ``exprs``: (name,
    expression) of each one to compute; ``base``: (index in the sent columns, name the expressions read
    it by, its type's ``format_type``) of each column they read; ``reads``: per generated column, the indexes in
    ``base`` it reads; ``order``: the output columns, ``i >= 0`` the sent column ``i``, ``-1 - j`` the
    generated column ``j``; ``error``: why they cannot be computed (None: they can)."""

    __slots__ = ("relation", "exprs", "base", "reads", "order", "error")

    def __init__(
        self,
        relation: Relation,
        exprs: list[tuple[str, str]],
        base: list[tuple[int, str, str]],
        reads: list[list[int]],
        order: list[int],
        error: str | None,
    ):
        self.relation, self.exprs, self.base, self.reads = relation, exprs, base, reads
        self.order, self.error = order, error


class GeneratedColumns:
    """Fills in STORED generated columns. ``connect``: a callable returning a psycopg connection to the
    source with the walsender's output settings (``OUTPUT_SETTINGS``, autocommit); it is opened on first
    use and re-opened after a failure.

    ``fill(changes, schemas)``: mutates the changes of one batch in place (``new``, ``old``,
    ``relation``); ``schemas``: table OID -> the mirror's live :class:`TableSchema` (tables without
    generated columns are passed over). Returns ``{oid: exception}`` for the tables whose columns could
    not be computed (``GeneratedColumnError``, or a ``psycopg.Error`` that is not an
    ``OperationalError``, e.g. an expression failing on a row): their changes are left as they were,
    and the caller stops those tables. Raises ``psycopg.OperationalError`` when the source cannot be
    asked (the batch is then not applied: the stream reconnects and the slot resends it)."""

    def __init__(self, connect: Callable[[], psycopg.Connection[TupleRow]]):
        self._conn = LazyConnection(connect)
        # (id of the sent Relation, id of the mirror's schema) -> (Relation, schema, plan): both are kept
        # alive, so their ids are not reused while cached
        self._plans: dict[tuple[int, int], tuple[Relation, TableSchema, _Plan | None]] = {}
        self._type_names: dict[tuple[int, int], str] = {}  # (type oid, typmod) -> format_type in this session
        self.round_trips = 0

    def close(self) -> None:
        self._conn.close()

    def _query(self, q: str | sql.Composed, params: Params) -> list[tuple[Any, ...]]:
        """``q`` with ``params`` on the session: its rows. A lost connection is re-opened and the query
        tried once more (``psycopg.OperationalError`` when that fails too)."""
        for attempt in range(2):
            try:
                return self._conn.get().execute(q, params).fetchall()
            except psycopg.OperationalError:
                self._conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ one batch
    def fill(self, changes: list[Change], schemas: dict[int, TableSchema]) -> dict[int, Exception]:
        # by table and Relation sent (one, unless a DDL is in the batch): the Relation and its changes
        groups: dict[tuple[int, int], tuple[Relation, list[Change]]] = {}
        for ch in changes:
            if ch.kind != "truncate" and ch.relation is not None and ch.relation_oid in schemas:
                groups.setdefault((ch.relation_oid, id(ch.relation)), (ch.relation, []))[1].append(ch)
        failed: dict[int, Exception] = {}
        for (oid, _), (rel, chs) in groups.items():
            if oid in failed:
                continue
            try:
                plan = self._plan(schemas[oid], rel)
                if plan is None:
                    continue  # nothing to compute (none left, or the server sent them itself: Postgres 18)
                if plan.error:
                    raise GeneratedColumnError(plan.error)
                self._fill_group(plan, chs)
            except psycopg.OperationalError:
                raise
            except (psycopg.Error, GeneratedColumnError) as e:
                failed[oid] = e
        return failed

    def _plan(self, schema: TableSchema, rel: Relation) -> _Plan | None:
        key = (id(rel), id(schema))
        hit = self._plans.get(key)
        if hit is not None and hit[0] is rel and hit[1] is schema:
            return hit[2]
        plan = self._make_plan(schema, rel)
        if len(self._plans) > 1024:
            self._plans.clear()
        self._plans[key] = (rel, schema, plan)
        return plan

    def _make_plan(self, schema: TableSchema, rel: Relation) -> _Plan | None:
        mirror = {c.name: c for c in schema.columns}
        sent = [c.name for c in rel.columns]
        if not any(c.generated and c.name not in sent for c in schema.columns):
            return None  # no generated column, or every one sent (Postgres 18, or no longer generated)
        rows = self._query(_TABLE_SQL, (schema.oid,))
        cat_num = {r[1]: int(r[0]) for r in rows if not r[2]}  # plain column -> attnum
        name_of = {int(r[0]): r[1] for r in rows}  # attnum -> name now
        gens = [r for r in rows if r[2] and r[1] in mirror and mirror[r[1]].generated and r[1] not in sent]
        if not gens:
            return None  # dropped on the source since: the Relation without them drops them from the mirror
        # the attnum of each sent column: the catalogs' by its name now, else the mirror's (renamed since)
        att = [cat_num.get(n) or (mirror[n].attnum if n in mirror else 0) or None for n in sent]
        types = self._types([(c.type_oid, c.typmod) for c in rel.columns])
        base: list[tuple[int, str, str]] = []  # (sent index, name in the expressions, type name)
        base_at: dict[int, int] = {}  # attnum -> index in base
        reads: list[list[int]] = []
        error = None
        for r in gens:
            mine = []
            for ref in r[6] or []:
                if ref not in base_at:
                    if ref not in att:
                        error = error or (
                            f"table {schema.qualified_name}: generated column {r[1]} reads column "
                            f"{name_of.get(ref, f'attnum {ref}')}, which the changes sent under this "
                            f"Relation do not carry (the table was changed on the source since)"
                        )
                        continue
                    base_at[ref] = len(base)
                    base.append((att.index(ref), name_of[ref], types[att.index(ref)]))
                mine.append(base_at[ref])
            reads.append(mine)
        # the output order: the generated columns at their attnums among the sent ones (sent order kept)
        order: list[int] = []
        pending = list(range(len(gens)))
        last = 0
        for i, a in enumerate(att):
            last = a or last
            while pending and int(gens[pending[0]][0]) < last:
                order.append(-1 - pending.pop(0))
            order.append(i)
        order += [-1 - j for j in pending]
        flag = 1 if rel.replica_identity == "f" else 0
        cols = [
            rel.columns[i]
            if i >= 0
            else RelationColumn(flag, gens[-1 - i][1], int(gens[-1 - i][3]), int(gens[-1 - i][4]))
            for i in order
        ]
        return _Plan(replace(rel, columns=cols), [(r[1], r[5]) for r in gens], base, reads, order, error)

    def _types(self, pairs: list[tuple[int, int]]) -> list[str]:
        """``format_type`` of each (type oid, typmod) in this session (asked once per pair)."""
        todo = sorted({p for p in pairs if p not in self._type_names})
        if todo:
            for o, t, name in self._query(
                "SELECT o, t, format_type(o, t) FROM unnest(%s::oid[], %s::int[]) AS x(o, t)",
                ([o for o, _ in todo], [t for _, t in todo]),
            ):
                self._type_names[(int(o), int(t))] = name
        return [self._type_names[p] for p in pairs]

    def _fill_group(self, plan: _Plan, changes: list[Change]) -> None:
        base = plan.base
        rows: list[list[str | None]] = []  # the read columns' values of every row image to compute
        # (change, "new"/"old", its row image, row index, generated columns left unchanged)
        slots: list[tuple[Change, Literal["new", "old"], TupleData, int, Container[int]]] = []
        for ch in changes:
            whole_old = ch.old if ch.old is not None and ch.old_kind == "O" else None
            which: Literal["new", "old"]
            for which in ("new", "old"):
                tup = ch.new if which == "new" else whole_old
                if tup is None:
                    continue
                kinds, data = tup.kinds, tup.data
                row: list[str | None] = []
                toasted: set[int] = set()
                for b, (i, _, _) in enumerate(base):
                    k = kinds[i]
                    if k == "u" and whole_old is not None:  # an unchanged TOAST value: the whole old row has it
                        k, v = whole_old.kinds[i], whole_old.data[i]
                    else:
                        v = data[i]
                    if k == "u":
                        toasted.add(b)
                    # a 't'/'b' value is always sent (bytes, or a buffer of them)
                    row.append(bytes(v).decode() if k in "tb" and v is not None else None)
                unknown: Container[int] = (
                    {j for j, rd in enumerate(plan.reads) if toasted.intersection(rd)} if toasted else ()
                )
                rows.append(row)
                slots.append((ch, which, tup, len(rows) - 1, unknown))
        values = self._evaluate(plan, rows) if rows else []
        for ch, which, tup, i, unknown in slots:
            out = values[i]
            extra = [
                ("u", None) if j in unknown else ("n", None) if v is None else ("t", v.encode())
                for j, v in enumerate(out)
            ]
            if which == "new":
                ch.new = _widen(tup, plan.order, extra)
            else:
                ch.old = _widen(tup, plan.order, extra)
        nulls = [("n", None)] * len(plan.exprs)
        for ch in changes:
            if ch.old is not None and ch.old_kind != "O":  # key-only old row: NULL like its other columns
                ch.old = _widen(ch.old, plan.order, nulls)
            ch.relation = plan.relation

    def _evaluate(self, plan: _Plan, rows: list[list[str | None]]) -> list[tuple[str | None, ...]]:
        """One round trip: the generated columns' text values for ``rows`` (the read columns' text)."""
        n = max(len(plan.base), 1)  # no column read (a constant expression): one array of NULLs for the rows
        raw = [sql.Identifier(f"__mc_{i}") for i in range(n)]
        q = sql.SQL(
            "SELECT u.__mc_ord, {outs} FROM unnest({arrays}) WITH ORDINALITY AS u({raw}, __mc_ord), "
            "LATERAL (SELECT {casts}) r ORDER BY u.__mc_ord"
        ).format(
            # the expressions name columns unqualified: they resolve to r's typed columns
            outs=sql.SQL(", ").join(sql.SQL("(" + expr + ")::text") for _, expr in plan.exprs),
            arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in range(n)),
            raw=sql.SQL(", ").join(raw),
            casts=sql.SQL(", ").join(
                sql.SQL("u.{}::{} AS {}").format(r, sql.SQL(t), sql.Identifier(name))
                for r, (_, name, t) in zip(raw, plan.base)
            ),
        )
        params = [[r[i] for r in rows] for i in range(len(plan.base))] or [[None] * len(rows)]
        res = self._query(q, params)
        self.round_trips += 1
        return [r[1:] for r in res]


def _widen(tup: TupleData, order: list[int], extra: Sequence[tuple[str, bytes | None]]) -> TupleData:
    """``tup`` laid out by ``order`` (``i >= 0``: its column ``i``; ``-1 - j``: ``extra[j]``, a (kind,
    value) pair)."""
    kinds, data = tup.kinds, tup.data
    return TupleData(
        "".join(kinds[i] if i >= 0 else extra[-1 - i][0] for i in order),
        [data[i] if i >= 0 else extra[-1 - i][1] for i in order],
    )
