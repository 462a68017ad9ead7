"""STORED generated columns for a pgoutput stream that does not carry them (Postgres before 18).

Postgres 18's pgoutput publishes stored generated columns when the publication says so
(``publish_generated_columns = stored``); older servers never send them (Postgres docs, "Logical
Replication — Generated Column Replication"). A generated column's expression is immutable (Postgres
requires it), so its value is a function of the row's other columns: :class:`GeneratedColumns`
computes it on the source for the rows of each applied batch — **one round trip per batch and table**,
only for tables that have such columns — and hands the apply path changes shaped as if Postgres 18
had sent them (a Relation and tuples with the generated columns in attribute order). The apply path
(:class:`~mooncake_assets.engine.table.mirror.MirrorTable`) knows nothing of it.

The query (text in, text out, the session's pinned output settings as for every value)::

    SELECT u.ord, (<expr>)::text, … FROM unnest($1::text[], …) WITH ORDINALITY
           AS u("a", "b", …, ord), LATERAL (SELECT u."a"::<type of a> AS "a", …) r

evaluates each expression over the row's own values, never over the table (which may have moved on).

Per change: INSERT and UPDATE get the new row's values; the old row of a DELETE/UPDATE under
REPLICA IDENTITY FULL (``'O'``) gets its own (the mirror matches whole rows); a key-only old row
(``'K'``) gets NULL like its other non-key columns. A new row with an unchanged TOAST value (``'u'``)
has no value to compute from: when the old row is whole, its value is used; otherwise a generated
column whose expression reads that column (``pg_depend``) is sent as unchanged too, and the mirror
keeps the current row's value — exact unless the expression reads both such a TOASTed column and
another column the UPDATE changed (a known limit: Postgres does not send the TOASTed value).
"""
from __future__ import annotations

from dataclasses import replace

import psycopg
from psycopg import sql

from .pgoutput import Relation, RelationColumn, TupleData
from .types import TableSchema


class GeneratedColumns:
    """Fills in STORED generated columns. ``connect``: a callable returning a psycopg connection to the
    source (with the mirror's output settings); it is opened on first use and re-opened after a failure.

    ``register(schema)``: a mirrored table (nothing is done for tables without generated columns);
    ``unregister(oid)``; ``fill(changes)``: mutates the changes of one batch in place (``new``, ``old``,
    ``relation``). Raises ``psycopg.Error`` when the source cannot be asked (the batch is then not
    applied: the stream reconnects and the slot resends it)."""

    def __init__(self, connect):
        self._connect = connect
        self._conn = None
        self.tables: dict[int, TableSchema] = {}
        self._relations: dict[tuple[int, int], Relation] = {}  # (oid, id of the sent Relation) -> augmented
        self.round_trips = 0

    def register(self, schema: TableSchema) -> None:
        if any(c.generated for c in schema.columns):
            self.tables[schema.oid] = schema
        else:
            self.tables.pop(schema.oid, None)

    def unregister(self, oid: int) -> None:
        self.tables.pop(oid, None)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._conn = None

    # ------------------------------------------------------------------ one batch
    def fill(self, changes: list) -> None:
        if not self.tables:
            return
        by_table: dict[int, list] = {}
        for ch in changes:
            if ch.kind != "truncate" and ch.relation_oid in self.tables and ch.relation is not None:
                if any(c.name == g.name for c in ch.relation.columns for g in self._gen(ch.relation_oid)):
                    continue  # the server sent them itself (Postgres 18, publish_generated_columns)
                by_table.setdefault(ch.relation_oid, []).append(ch)
        for oid, chs in by_table.items():
            groups: dict[int, list] = {}  # by the Relation sent (one, unless a DDL is inside the batch)
            for ch in chs:
                groups.setdefault(id(ch.relation), []).append(ch)
            for group in groups.values():
                self._fill_table(self.tables[oid], group)

    def _gen(self, oid: int):
        return [c for c in self.tables[oid].columns if c.generated]

    def _fill_table(self, schema: TableSchema, changes: list) -> None:
        gen = [c for c in schema.columns if c.generated]
        # every column the source sent, mirrored or not (an expression may read an --exclude-column one)
        base = [_Base(c.name, t) for c, t in zip(changes[0].relation.columns,
                                                 self._type_names(schema, changes[0].relation))]
        refs = self._refs(schema)
        rows: list[list[str | None]] = []   # base values of every row image to compute
        slots: list[tuple] = []             # (change, "new"/"old", sent column names, row, unknown gens)
        for ch in changes:
            sent = [c.name for c in ch.relation.columns]
            for which in ("new", "old"):
                tup = getattr(ch, which)
                if tup is None or (which == "old" and ch.old_kind != "O"):
                    continue
                vals = dict(zip(sent, tup))
                unknown: set[str] = set()
                if which == "new" and "u" in tup.kinds:
                    old = dict(zip(sent, ch.old)) if ch.old is not None and ch.old_kind == "O" else None
                    if old is not None:
                        vals = {k: (old[k] if v[0] == "u" else v) for k, v in vals.items()}
                    else:  # an unchanged TOAST value: a generated column that reads it keeps its value
                        toasted = {k for k, v in vals.items() if v[0] == "u"}
                        unknown = {g.name for g in gen if refs.get(g.name, toasted) & toasted}
                rows.append([None if vals.get(c.name, ("n", None))[0] in "nu" else
                             bytes(vals[c.name][1]).decode() for c in base])
                slots.append((ch, which, sent, len(rows) - 1, unknown))
        values = self._evaluate(schema, base, gen, rows) if rows else []
        for ch, which, sent, i, unknown in slots:
            tup = getattr(ch, which)
            extra = {g.name: ("u", None) if g.name in unknown else ("n", None) if v is None else ("t", v.encode())
                     for g, v in zip(gen, values[i])}
            setattr(ch, which, _widen(tup, sent, schema, extra))
        for ch in changes:
            if ch.old is not None and ch.old_kind != "O":  # key-only old row: NULL like its other columns
                ch.old = _widen(ch.old, [c.name for c in ch.relation.columns], schema,
                                {g.name: ("n", None) for g in gen})
            ch.relation = self._relation(schema, ch.relation)

    def _type_names(self, schema: TableSchema, rel: Relation) -> list[str]:
        """``format_type`` of each column of a Relation (asked once per type and typmod)."""
        cache = self.__dict__.setdefault("_types_cache", {})
        todo = sorted({(c.type_oid, c.typmod) for c in rel.columns if (c.type_oid, c.typmod) not in cache})
        if todo:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = self._connect()
            for o, t, name in self._conn.execute("SELECT o, t, format_type(o, t) FROM unnest(%s::oid[], %s::int[]) "
                                                 "AS x(o, t)", ([o for o, _ in todo], [t for _, t in todo])).fetchall():
                cache[(int(o), int(t))] = name
        return [cache[(c.type_oid, c.typmod)] for c in rel.columns]

    def _refs(self, schema: TableSchema) -> dict[str, set[str]]:
        """Generated column → the columns its expression reads (``pg_depend``: the column's
        ``pg_attrdef`` entry depends on each column it references), asked once per table."""
        cache = self.__dict__.setdefault("_refs_cache", {})
        if schema.oid not in cache:
            q = ("SELECT g.attname, r.attname FROM pg_attrdef ad "
                 "JOIN pg_attribute g ON g.attrelid = ad.adrelid AND g.attnum = ad.adnum "
                 "JOIN pg_depend d ON d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid "
                 "AND d.refclassid = 'pg_class'::regclass AND d.refobjid = ad.adrelid "
                 "AND d.refobjsubid > 0 AND d.refobjsubid <> ad.adnum "
                 "JOIN pg_attribute r ON r.attrelid = ad.adrelid AND r.attnum = d.refobjsubid "
                 "WHERE ad.adrelid = %s AND g.attgenerated = 's'")
            out: dict[str, set[str]] = {}
            for attempt in range(2):
                try:
                    if self._conn is None or self._conn.closed or self._conn.broken:
                        self._conn = self._connect()
                    for g, r in self._conn.execute(q, (schema.oid,)).fetchall():
                        out.setdefault(g, set()).add(r)
                    break
                except psycopg.OperationalError:
                    self.close()
                    if attempt:
                        raise
            cache[schema.oid] = out
        return cache[schema.oid]

    def _relation(self, schema: TableSchema, rel: Relation) -> Relation:
        """The Relation as Postgres 18 would send it: the generated columns at their places."""
        cached = self._relations.get(id(rel))
        if cached is not None and cached[0] is rel:
            return cached[1]
        sent = {c.name: c for c in rel.columns}
        cols = []
        for c in schema.columns:
            if c.generated:
                cols.append(RelationColumn(1 if rel.replica_identity == "f" else 0, c.name, c.decl_oid, c.decl_typmod))
            elif c.name in sent:
                cols.append(sent[c.name])
        known = {c.name for c in cols}
        cols += [c for c in rel.columns if c.name not in known]  # a column the mirror does not have (yet)
        out = replace(rel, columns=cols)
        if len(self._relations) > 1024:
            self._relations.clear()
        self._relations[id(rel)] = (rel, out)  # the Relation is kept alive, so its id() is not reused
        return out

    def _evaluate(self, schema: TableSchema, base, gen, rows: list[list[str | None]]) -> list[list[str | None]]:
        """One round trip: the generated columns' text values for ``rows`` (base columns' text values)."""
        raw = [sql.Identifier(f"__mc_{i}") for i in range(len(base))]
        q = sql.SQL("SELECT u.__mc_ord, {outs} FROM unnest({arrays}) WITH ORDINALITY AS u({raw}, __mc_ord), "
                    "LATERAL (SELECT {casts}) r ORDER BY u.__mc_ord").format(
            # the expressions name columns unqualified: they resolve to r's typed columns
            outs=sql.SQL(", ").join(sql.SQL("(" + g.generated + ")::text") for g in gen),
            arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in base),
            raw=sql.SQL(", ").join(raw),
            casts=sql.SQL(", ").join(sql.SQL("u.{}::{} AS {}").format(r, sql.SQL(c.type_name), sql.Identifier(c.name))
                                     for r, c in zip(raw, base)))
        params = [[r[i] for r in rows] for i in range(len(base))]
        for attempt in range(2):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = self._connect()
                res = self._conn.execute(q, params).fetchall()
                self.round_trips += 1
                return [list(r[1:]) for r in res]
            except psycopg.OperationalError:
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


class _Base:
    __slots__ = ("name", "type_name")

    def __init__(self, name: str, type_name: str):
        self.name, self.type_name = name, type_name


def _widen(tup: TupleData, sent: list[str], schema: TableSchema, extra: dict) -> TupleData:
    """``tup`` (columns ``sent``) with the columns of ``extra`` put at their places in ``schema``'s order;
    sent columns the schema does not know keep their places after those it knows."""
    have = dict(zip(sent, tup))
    kinds, data = [], []
    names = [c.name for c in schema.columns if c.name in have or c.name in extra]
    names += [n for n in sent if n not in set(names)]
    for n in names:
        k, v = extra[n] if n in extra else have[n]
        kinds.append(k)
        data.append(v)
    return TupleData("".join(kinds), data)
