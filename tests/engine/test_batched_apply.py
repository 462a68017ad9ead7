"""The batched apply of columnar runs against the row-wise apply, in-process without Postgres.

Two :class:`MirrorTable` (no Iceberg table) of one schema take the same random transactions: one
change by change (:meth:`MirrorTable.apply`), the other run by run (``columnar_transaction(txn).runs``
and :meth:`MirrorTable.apply_run`). After every step both must hold the same rows with the same
per-row insert/delete LSNs and key hashes, the same MemIndex entries (in row order), the same file
deletes and the same ``missing_keys``; a change that cannot be applied must fail the same way
(``BadRowError`` with the same LSN, message and columns). Only the MemSlice's batch boundaries may
differ, so locations are compared as row ordinals.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_assets.engine.cdc.columnar import (
    ChangeRun,
    ColumnarBatch,
    changes_from_run,
    columnar_transaction,
    merge_runs,
    runs_from_changes,
)
from mooncake_assets.engine.cdc.native import NativeDecoder
from mooncake_assets.engine.cdc.pgoutput import Relation, RelationColumn, TupleData
from mooncake_assets.engine.cdc.txn import Change, Transaction, TransactionAssembler
from mooncake_assets.engine.pg.schema import ColumnSpec, TableSchema, assign_field_ids
from mooncake_assets.engine.table.memslice import BadRowError, changed_rows
from mooncake_assets.engine.table.mirror import MirrorTable

from .test_native_decoder import m_begin, m_commit, m_delete, m_insert, m_relation, m_update

OID = 16384
U = object()  # an unchanged TOAST value in a row image
T0 = datetime(2026, 1, 1, tzinfo=UTC)

# table kinds: (key columns, replica identity)
KINDS = {
    "int": (["id"], "d"),
    "int_full": (["id"], "f"),
    "text": (["k"], "d"),
    "composite": (["k", "id"], "d"),
    "keyless": ([], "f"),
}


def _specs(key: list[str]) -> list[ColumnSpec]:
    cols = [
        ColumnSpec("id", 20, -1, "bigint", pa.int64(), not_null="id" in key, is_key="id" in key),
        ColumnSpec("k", 25, -1, "text", pa.string(), not_null="k" in key, is_key="k" in key),
        ColumnSpec("v", 25, -1, "text", pa.string()),
        ColumnSpec("n", 23, -1, "integer", pa.int32()),
        ColumnSpec("d", 1700, (10 << 16 | 2) + 4, "numeric(10,2)", pa.decimal128(10, 2)),
    ]
    for c in cols:  # as the Relation message declares them (on_relation compares)
        c.decl_oid, c.decl_typmod = c.type_oid, c.typmod
    assign_field_ids(cols)
    return cols


OUR = ["id", "k", "v", "n", "d"]
TYPES = {"id": (20, -1), "k": (25, -1), "v": (25, -1), "n": (23, -1), "d": (1700, (10 << 16 | 2) + 4)}


def make_table(path: Path, kind: str, rel_cols: list[str], batch_rows: int) -> MirrorTable:
    key, identity = KINDS[kind]
    schema = TableSchema(
        schema="public",
        name="t",
        oid=OID,
        columns=_specs(key),
        key_columns=key,
        has_primary_key=bool(key),
        replica_identity=identity,
    )
    t = MirrorTable("t", "public.t", schema, None, path)
    t.column_map(OID, rel_cols)
    t.mem.batch_rows = batch_rows
    return t


# ---------------------------------------------------------------------------------------- changes

IDS = st.sampled_from(["1", "2", "3", "-4", "5"])
KS = st.sampled_from(["a", "b", "", "é", "a long key that takes more than eight bytes"])
VS = st.sampled_from([None, "x", "y", "", U])
NS = st.sampled_from([None, "1", "2"])
DS = st.sampled_from([None, "1.50", "-2.00"])
#: change kinds drawn (an insert of a value that cannot be decoded: rare, it stops the table)
WHAT = ["insert"] * 12 + ["update"] * 12 + ["delete"] * 8 + ["truncate"] + ["bad"]
BAD_D = "NaN"  # numeric NaN: Postgres takes it, a decimal column cannot hold it


class Gen:
    """Random row images of one table kind and Relation column list."""

    def __init__(self, kind: str, rel_cols: list[str]):
        self.kind = kind
        self.key, self.identity = KINDS[kind]
        self.rel_cols = rel_cols
        self.relation = Relation(
            None,
            OID,
            "public",
            "t",
            self.identity,
            [
                RelationColumn(1 if c in self.key or self.identity == "f" else 0, c, *TYPES.get(c, (25, -1)))
                for c in rel_cols
            ],
        )

    def row(self, data: st.DataObject, bad: bool = False, toast: bool = False) -> dict[str, object]:
        r: dict[str, object] = {
            "id": data.draw(IDS),
            "k": data.draw(KS),
            "v": data.draw(VS if toast else VS.filter(lambda x: x is not U)),
            "n": data.draw(NS),
            "d": BAD_D if bad else data.draw(DS),
            "x": data.draw(st.sampled_from(["p", "q"])),
        }
        if self.kind == "keyless" and data.draw(st.booleans()):
            r["k"] = None
        return r

    def tup(self, row: dict[str, object], only: list[str] | None = None) -> TupleData:
        kinds, vals = [], []
        for c in self.rel_cols:
            v = row.get(c) if only is None or c in only else None
            if v is None:
                kinds.append("n")
                vals.append(None)
            elif v is U:
                kinds.append("u")
                vals.append(None)
            else:
                kinds.append("t")
                vals.append(str(v).encode())
        return TupleData("".join(kinds), vals)

    def change(self, data: st.DataObject, what: str | None = None) -> Change:
        what = what or data.draw(st.sampled_from(WHAT))
        rel = self.relation
        if what == "truncate":
            return Change("truncate", OID, truncate_oids=[OID])
        if what in ("insert", "bad"):
            return Change("insert", OID, new=self.tup(self.row(data, bad=what == "bad")), relation=rel)
        old = self.row(data)
        if what == "delete":
            if self.identity == "f":
                return Change("delete", OID, old=self.tup(old), old_kind="O", relation=rel)
            return Change("delete", OID, old=self.tup(old, self.key), old_kind="K", relation=rel)
        new = self.row(data, toast=True, bad=data.draw(st.integers(0, 59)) == 0)
        keep_key = data.draw(st.booleans())
        if keep_key:
            for c in self.key:
                new[c] = old[c]
        if self.identity == "f":
            return Change("update", OID, new=self.tup(new), old=self.tup(old), old_kind="O", relation=rel)
        if keep_key and data.draw(st.booleans()):  # key unchanged: no old tuple
            return Change("update", OID, new=self.tup(new), relation=rel)
        return Change("update", OID, new=self.tup(new), old=self.tup(old, self.key), old_kind="K", relation=rel)


# ---------------------------------------------------------------------------------------- comparison


def _ordinals(t: MirrorTable) -> dict[tuple[int, int], int]:
    out, base = {}, 0
    sizes = [b.rb.num_rows for b in t.mem.batches] + [t.mem.num_rows - sum(b.rb.num_rows for b in t.mem.batches)]
    for b, n in enumerate(sizes):
        for r in range(n):
            out[(b, r)] = base + r
        base += n
    return out


def state(t: MirrorTable) -> dict[str, object]:
    """What both apply paths must leave alike (locations as row ordinals)."""
    ins, dl, hs = t.mem.row_stamps()
    ords = _ordinals(t)
    index = {h: [ords[loc] for loc in t.mem.index.lookup(h)] for h in sorted(set(hs.tolist()))}
    files = [(f.num_rows, sorted(f.pending.items()), f.truncated_lsn, sorted(f.committed)) for f in t.files.values()]
    return {
        "ins": ins.tolist(),
        "del": dl.tolist(),
        "hash": hs.tolist(),
        "index": index,
        "index_len": len(t.mem.index),
        "files": files,
        "missing": t.missing_keys,
        "deleted_rows": t.mem.deleted_rows,
        "num_rows": t.mem.num_rows,
    }


def visible(t: MirrorTable) -> list[dict[str, object]]:
    return t.mem.visible().to_pylist()


def _err(e: BaseException | None) -> object:
    if e is None:
        return None
    return (type(e).__name__, str(e), getattr(e, "lsn", None), getattr(e, "columns", None))


def apply_both(a: MirrorTable, b: MirrorTable, txn: Transaction) -> tuple[object, object]:
    ea = eb = None
    try:
        for ch in txn.changes:
            a.apply(ch, txn.commit_lsn)
    except (BadRowError, ValueError) as e:
        ea = e
    try:
        for run in columnar_transaction(txn).runs:
            b.apply_run(run, txn.commit_lsn)
    except (BadRowError, ValueError) as e:
        eb = e
    return _err(ea), _err(eb)


# ---------------------------------------------------------------------------------------- the test

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@SETTINGS
@given(
    kind=st.sampled_from(sorted(KINDS)),
    order=st.permutations(OUR),
    extra=st.booleans(),
    absent=st.sampled_from([None, "n", "v"]),
    batch_rows=st.sampled_from([3, 5, 16384]),
    data=st.data(),
)
def test_runs_apply_like_changes(kind, order, extra, absent, batch_rows, data):
    rel_cols = [c for c in order if c != absent] + (["x"] if extra else [])
    gen = Gen(kind, rel_cols)
    with tempfile.TemporaryDirectory() as d:
        a = make_table(Path(d) / "a", kind, rel_cols, batch_rows)
        b = make_table(Path(d) / "b", kind, rel_cols, batch_rows)
        lsn = 100
        for _ in range(data.draw(st.integers(1, 8))):
            step = data.draw(st.sampled_from(["txn", "txn", "txn", "flush", "seal", "read"]))
            if step == "flush":
                a.flush(), b.flush()
            elif step == "seal":
                a.mem.seal(), b.mem.seal()
            elif step == "read":
                assert visible(a) == visible(b)
            else:
                lsn += 16
                changes = [gen.change(data) for _ in range(data.draw(st.integers(1, 12)))]
                txn = Transaction(lsn, lsn, lsn + 8, T0, changes)
                ea, eb = apply_both(a, b, txn)
                assert ea == eb
                if ea is not None:
                    return  # the table stops here (both paths raised alike)
            assert state(a) == state(b)
        assert visible(a) == visible(b)
        assert state(a) == state(b)


# ---------------------------------------------------------------------------------------- examples


def _txn(lsn: int, changes: list[Change]) -> Transaction:
    return Transaction(lsn, lsn, lsn + 8, T0, changes)


def _both(tmp_path: Path, kind: str = "int", batch_rows: int = 16384) -> tuple[MirrorTable, MirrorTable, Gen]:
    gen = Gen(kind, list(OUR))
    return (
        make_table(tmp_path / "a", kind, list(OUR), batch_rows),
        make_table(tmp_path / "b", kind, list(OUR), batch_rows),
        gen,
    )


def _ins(gen: Gen, i: int, **kw: object) -> Change:
    row = {"id": str(i), "k": f"k{i}", "v": f"v{i}", "n": str(i), "d": "1.00", **kw}
    return Change("insert", OID, new=gen.tup(row), relation=gen.relation)


def test_an_insert_run_is_one_arrow_part_and_one_index_batch(tmp_path):
    a, b, gen = _both(tmp_path)
    txn = _txn(100, [_ins(gen, i) for i in range(50)])
    (run,) = columnar_transaction(txn).runs
    assert isinstance(run, ChangeRun) and run.rows == 50
    apply_both(a, b, txn)
    assert state(a) == state(b)
    assert len(b.mem._parts) == 1 and isinstance(b.mem._parts[0], pa.RecordBatch)  # not sealed yet
    assert b.mem.find(b.hasher.hash_one(["7"])) == [(0, 7)]
    assert visible(a) == visible(b)


def test_a_bad_value_fails_the_run_with_its_commit_and_column_and_applies_nothing(tmp_path):
    a, b, gen = _both(tmp_path)
    txn = _txn(200, [_ins(gen, 1), _ins(gen, 2, d="NaN"), _ins(gen, 3, d="NaN")])
    ea, eb = apply_both(a, b, txn)
    assert ea == eb and ea[0] == "BadRowError" and ea[2] == 200 and ea[3] == ["d"]
    assert b.mem.num_rows == 0 and len(b.mem.index) == 0  # all or nothing per run


def test_updates_and_deletes_of_a_large_run_hit_memory_and_files(tmp_path):
    a, b, gen = _both(tmp_path, batch_rows=64)
    apply_both(a, b, _txn(100, [_ins(gen, i) for i in range(300)]))
    a.flush(), b.flush()
    apply_both(a, b, _txn(200, [_ins(gen, i) for i in range(300, 400)]))
    ups = [
        Change(
            "update",
            OID,
            new=gen.tup({"id": str(i), "k": "z", "v": U if i % 7 == 0 else "w", "n": "9"}),
            relation=gen.relation,
        )
        for i in range(0, 400, 3)
    ]
    dels = [
        Change("delete", OID, old=gen.tup({"id": str(i)}, ["id"]), old_kind="K", relation=gen.relation)
        for i in range(1, 420, 5)
    ]
    ea, eb = apply_both(a, b, _txn(300, ups + dels))
    assert ea is None and eb is None
    assert state(a) == state(b) and visible(a) == visible(b)
    assert a.missing_keys == 4  # deletes of 400..419 found nothing


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_key_repeated_inside_a_run(tmp_path, kind):
    a, b, gen = _both(tmp_path, kind)
    rows = [{"id": "1", "k": "a", "v": "x", "n": "1", "d": None}, {"id": "1", "k": "a", "v": "x", "n": "1", "d": None}]
    apply_both(a, b, _txn(100, [Change("insert", OID, new=gen.tup(r), relation=gen.relation) for r in rows]))
    full = gen.identity == "f"
    old = rows[0]
    dels = [
        Change(
            "delete",
            OID,
            old=gen.tup(old, None if full else gen.key),
            old_kind="O" if full else "K",
            relation=gen.relation,
        )
        for _ in range(3)
    ]
    ea, eb = apply_both(a, b, _txn(200, dels))
    assert ea == eb
    assert state(a) == state(b) and visible(a) == visible(b)
    assert np.count_nonzero(b.mem.row_stamps()[1]) == 2 and b.missing_keys == 1


def test_the_open_buffer_takes_text_rows_and_arrow_parts_in_row_order(tmp_path):
    a, _, gen = _both(tmp_path)
    m = a.mem
    m.append(["1", "a", None, "1", None], a.hasher.hash_one(["1"]), 10)
    rb = a._decode(
        [
            pa.array(["2", "3"]),
            pa.array(["b", "c"]),
            pa.nulls(2, pa.string()),
            pa.array(["2", "3"]),
            pa.nulls(2, pa.string()),
        ]
    )
    assert m.append_batch(rb, a.hasher.hash_columns([pa.array(["2", "3"])]), 20) == 1
    m.append(["4", "d", None, "4", None], a.hasher.hash_one(["4"]), 30)
    assert m.num_rows == 4 and [r for r, _ in enumerate(m._parts)] == [0, 1]
    assert m.row_values((0, 0))[:2] == ["1", "a"]
    assert [c.value for c in m.row_values((0, 2))[:2]] == [3, "c"]  # an Arrow part: typed values
    assert m.row_values((0, 3))[:2] == ["4", "d"]
    m.delete((0, 2), a.hasher.hash_one(["3"]), 40)
    ins, dl, _ = m.row_stamps()
    assert ins.tolist() == [10, 20, 20, 30] and dl.tolist() == [0, 0, 40, 0]
    assert [(r["id"], r["k"]) for r in m.visible().to_pylist()] == [(1, "a"), (2, "b"), (4, "d")]
    assert len(m.batches) == 1 and m.batches[0].ins_lsn.tolist() == [10, 20, 20, 30]
    assert m.find(a.hasher.hash_one(["4"])) == [(0, 3)] and m.find(a.hasher.hash_one(["3"])) == []


def test_a_sealed_batch_holds_its_rows_bytes_one_insert_lsn_per_transaction_and_delete_lsns_once_deleted(tmp_path):
    a, _, _ = _both(tmp_path, batch_rows=4)
    m = a.mem
    n = 600
    # the native decoder's shape: every column of the run a slice of one binary array of text values
    text = [str(i) for i in range(n)] + ["k" * 20] * n + ["v"] * n + ["123456789"] * n + ["12345678.90"] * n
    cols = [pa.array(text).slice(c * n, n) for c in range(5)]
    rb = a._decode(cols)  # k and v stay slices of the shared buffer, which holds the other columns' text too
    assert rb.get_total_buffer_size() > rb.nbytes + 20_000
    lsns = np.array([10, 10, 10, 20, 20] + [30] * (n - 5), dtype=np.uint64)
    m.append_batch(rb, a.hasher.hash_columns([cols[0]]), lsns)
    (b,) = m.batches
    assert b.rb.get_total_buffer_size() <= b.rb.nbytes + 64  # copied out: only this batch's bytes
    assert b.ins_starts.tolist() == [0, 3, 5] and b.ins_lsns.tolist() == [10, 20, 30]
    assert b.ins_lsn.tolist() == lsns.tolist() and not b.any_deleted
    assert b.rb.column("k").to_pylist() == ["k" * 20] * n and b.rb.column("v").to_pylist() == ["v"] * n
    assert m.visible(20).num_rows == 3 and m.visible(21).num_rows == 5 and m.read_token(31) == m.read_token()
    m.delete((0, 4), a.hasher.hash_one(["4"]), 40)
    assert b.any_deleted and b.del_lsn.tolist() == [0, 0, 0, 0, 40] + [0] * (n - 5)
    assert m.visible(40).num_rows == n and 4 not in [r["id"] for r in m.visible(41).to_pylist()]
    assert m.visible(41).num_rows == n - 1
    assert m.read_token(40) != m.read_token() and m.read_token(41) == m.read_token()
    _, ins_lsns, _, _ = changed_rows(m, 20, 41)
    assert ins_lsns.tolist() == [20] + [30] * (n - 5)  # row 4 (LSN 20) is deleted inside the range: in neither
    _, ins_lsns, deleted, del_lsns = changed_rows(m, 21, 41)
    assert ins_lsns.tolist() == [30] * (n - 5)
    assert del_lsns.tolist() == [40] and deleted.column("id").to_pylist() == [4]
    table, hashes, horizon = m.drain()
    assert table.num_rows == n - 1 and len(hashes) == n - 1 and horizon == 40


EXTREME_IDS = [0, -1, 1, 2**63 - 1, -(2**63), 12_345_678_901, -42, 7, 8, 9, 2**31, -(2**31) - 1]


def test_an_exact_key_slice_keeps_no_hashes_and_recomputes_the_ones_apply_gave(tmp_path):
    """An integer key's hashes are not kept per sealed row but recomputed from the key column: they must
    equal what the apply paths hashed (``hash_one`` of the key's text), row-wise and run-wise, before and
    after deletes, in :meth:`MemSlice.drain` (what the flush's IndexBlock is built from)."""
    a, b, gen = _both(tmp_path, batch_rows=4)
    assert apply_both(a, b, _txn(100, [_ins(gen, i, n="1") for i in EXTREME_IDS])) == (None, None)
    for t in (a, b):
        t.mem.seal()
        assert t.mem.key_column == 0 and len(t.mem.batches) >= 1
        assert all(bt.hashes is None for bt in t.mem.batches)  # 8 bytes per row not held
        assert t.mem.row_stamps()[2].tolist() == [t.hasher.hash_one([str(i)]) for i in EXTREME_IDS]
    dels = [_del(gen, i) for i in (EXTREME_IDS[1], EXTREME_IDS[3], EXTREME_IDS[4])]
    assert apply_both(a, b, _txn(200, dels)) == (None, None)
    assert state(a) == state(b)
    for t in (a, b):
        table, hashes, horizon = t.mem.drain()
        ids = table.column("id").to_pylist()
        assert len(ids) == len(EXTREME_IDS) - 3 and horizon == 200
        assert hashes.tolist() == [t.hasher.hash_one([str(i)]) for i in ids]
    c, _, gen_t = _both(tmp_path / "text", kind="text", batch_rows=4)
    for i in range(6):
        c.apply(_ins(gen_t, i), 100)
    c.mem.seal()
    assert c.mem.key_column is None and all(bt.hashes is not None for bt in c.mem.batches)  # text keys keep them


def test_a_schema_change_keeps_the_exact_key_hashes_computed_before_it(tmp_path):
    """:meth:`MemSlice.evolve` computes the hashes from the rows before conversion and keeps them: after a
    change that moves the key column (here to the end) the column the slice knew is another one."""
    a, _, gen = _both(tmp_path, batch_rows=4)
    for i in EXTREME_IDS:
        a.apply(_ins(gen, i, n="1"), 100)
    a.mem.delete(a.mem.find(a.hasher.hash_one(["7"]))[0], a.hasher.hash_one(["7"]), 150)
    m = a.mem
    before = m.row_stamps()[2].tolist()
    order = ["k", "v", "n", "d", "id"]
    new_schema = pa.schema([m.schema.field(n) for n in order])
    m.evolve(
        new_schema, a._decode, lambda rb: pa.RecordBatch.from_arrays([rb.column(n) for n in order], schema=new_schema)
    )
    assert m.key_column is None and all(bt.hashes is not None for bt in m.batches)
    assert m.row_stamps()[2].tolist() == before
    table, hashes, _ = m.drain()
    assert hashes.tolist() == [a.hasher.hash_one([str(i)]) for i in table.column("id").to_pylist()]
    assert table.num_rows == len(EXTREME_IDS) - 1


def _del(gen: Gen, i: int) -> Change:
    return Change("delete", OID, old=gen.tup({"id": str(i)}, ["id"]), old_kind="K", relation=gen.relation)


def test_the_batched_lookup_answers_as_the_scalar_one(tmp_path):
    a, _, gen = _both(tmp_path, batch_rows=8)
    for lsn, ids in ((100, range(0, 20)), (200, range(20, 40))):
        for i in ids:
            a.apply(_ins(gen, i), lsn)
        if lsn == 100:
            a.flush()
    for i in (3, 25, 27):
        a.apply(Change("delete", OID, old=gen.tup({"id": str(i)}, ["id"]), old_kind="K", relation=gen.relation), 300)
    keys = [str(i) for i in range(45)]
    hs = a.hasher.hash_columns([pa.array(keys)])
    assert a.find_exact_batch(hs) == [a._find([k]) for k in keys]
    with pytest.raises(ValueError, match="exact"):
        make_table(tmp_path / "t", "text", list(OUR), 8).find_exact_batch(hs)


def test_auto_mode_takes_runs_only_for_long_runs():
    from mooncake_assets.engine.service.replication import long_runs

    gen = Gen("int", list(OUR))
    ins = [_ins(gen, i) for i in range(600)]
    dele = Change("delete", OID, old=gen.tup({"id": "1"}, ["id"]), old_kind="K", relation=gen.relation)
    assert long_runs(ins, 512) and not long_runs(ins[:10], 512)
    assert not long_runs([c for i in ins for c in (i, dele)], 512)  # 1200 changes in runs of one


def test_service_apply_mode_is_checked():
    from mooncake_assets.engine.service.config import ServiceConfig

    kw = dict(
        state_dir="/tmp/x",
        dsn="dbname=x",
        socket_path="/tmp/x.sock",
        catalog_uri="sqlite://",
        warehouse_uri="file:///tmp/w",
    )
    assert ServiceConfig(**kw).apply_mode == "auto"
    assert ServiceConfig(**kw, apply_mode="run").apply_mode == "run"
    with pytest.raises(ValueError, match="apply_mode"):
        ServiceConfig(**kw, apply_mode="fast")


def test_apply_item_routes_runs_and_changes_alike(tmp_path):
    from mooncake_assets.engine.service.replication import apply_item

    a, b, gen = _both(tmp_path)
    txn = _txn(100, [_ins(gen, i) for i in range(5)] + [Change("truncate", OID, truncate_oids=[OID])] + [_ins(gen, 9)])
    for ch in txn.changes:
        apply_item(a, OID, ch, gen.relation, 100, 1, None)
    for run in columnar_transaction(txn).runs:
        apply_item(b, OID, run, gen.relation, 100, 1, None)
    assert state(a) == state(b) and visible(a) == visible(b) == [
        {"id": 9, "k": "k9", "v": "v9", "n": 9, "d": Decimal("1.00")}
    ]


@SETTINGS
@given(kind=st.sampled_from(sorted(KINDS)), data=st.data())
def test_runs_of_the_compiled_decoder_apply_like_the_reference_changes(kind, data):
    """The compiled decoder's runs (their columns slices of one binary array) through ``apply_run``
    leave the table as the reference assembler's changes through ``apply``."""
    gen = Gen(kind, list(OUR))
    cols = [(c.flags, c.name, c.type_oid, c.typmod) for c in gen.relation.columns]

    def cells(t: TupleData | None) -> list[tuple[str, bytes | None]]:
        assert t is not None
        return [(k, None if v is None else bytes(v)) for k, v in zip(t.kinds, t.data)]

    msgs: list[tuple[int, bytes]] = []
    lsn = 1000
    for x in range(data.draw(st.integers(1, 4))):
        changes = [gen.change(data) for _ in range(data.draw(st.integers(1, 30)))]
        changes = [c for c in changes if c.kind != "truncate" and not (c.new and "NaN" in str(c.new.data))]
        lsn += 1000
        msgs.append((lsn, m_begin(lsn + 900, 0, 700 + x)))
        if x == 0:
            msgs.append((lsn + 1, m_relation(None, OID, "public", "t", gen.identity, cols)))
        for i, c in enumerate(changes):
            if c.kind == "insert":
                payload = m_insert(None, OID, cells(c.new))
            elif c.kind == "update":
                payload = m_update(None, OID, c.old_kind, cells(c.old) if c.old else None, cells(c.new))
            else:
                payload = m_delete(None, OID, c.old_kind, cells(c.old))
            msgs.append((lsn + 2 + i, payload))
        msgs.append((lsn + 900, m_commit(lsn + 900, lsn + 950, 0)))
    asm, dec = TransactionAssembler(), NativeDecoder()
    ref = [t for lsn_, p in msgs for t in asm.feed_payload(p, lsn_)]
    nat = [t for lsn_, p in msgs for t in dec.feed(p, lsn_)]
    assert len(ref) == len(nat)
    with tempfile.TemporaryDirectory() as d:
        a = make_table(Path(d) / "a", kind, list(OUR), 7)
        b = make_table(Path(d) / "b", kind, list(OUR), 7)
        for rt, nt in zip(ref, nat):
            for ch in rt.changes:
                a.apply(ch, rt.commit_lsn)
            for run in nt.runs:
                b.apply_run(run, nt.commit_lsn)
            assert state(a) == state(b)
        assert visible(a) == visible(b)


# ------------------------------------------------------------------ batch runs of several transactions


def apply_batch_both(a: MirrorTable, b: MirrorTable, txns: list[Transaction]) -> tuple[object, object]:
    """``txns`` change by change on ``a``; as batch runs (:func:`merge_runs`) on ``b``."""
    ea = eb = None
    try:
        for txn in txns:
            for ch in txn.changes:
                a.apply(ch, txn.commit_lsn)
    except (BadRowError, ValueError) as e:
        ea = e
    try:
        for run in merge_runs([columnar_transaction(t) for t in txns]):
            b.apply_run(run, 0)  # (unused: every batch run has its rows' commit LSNs)
    except (BadRowError, ValueError) as e:
        eb = e
    return _err(ea), _err(eb)


@SETTINGS
@given(
    kind=st.sampled_from(sorted(KINDS)),
    batch_rows=st.sampled_from([3, 5, 16384]),
    data=st.data(),
)
def test_batch_runs_of_several_transactions_apply_like_changes(kind, batch_rows, data):
    """Runs of consecutive transactions joined (``merge_runs``, each row at its own commit LSN) apply as
    their changes one by one, transaction by transaction: same per-row LSNs, index, files, rows."""
    gen = Gen(kind, list(OUR))
    with tempfile.TemporaryDirectory() as d:
        a = make_table(Path(d) / "a", kind, list(OUR), batch_rows)
        b = make_table(Path(d) / "b", kind, list(OUR), batch_rows)
        lsn = 100
        for _ in range(data.draw(st.integers(1, 6))):
            step = data.draw(st.sampled_from(["batch", "batch", "batch", "flush", "seal"]))
            if step == "flush":
                a.flush(), b.flush()
            elif step == "seal":
                a.mem.seal(), b.mem.seal()
            else:
                only = data.draw(st.sampled_from([None, "insert", "update", "delete", None]))
                txns = []
                for _ in range(data.draw(st.integers(1, 6))):
                    lsn += 16
                    n = data.draw(st.integers(1, 4))
                    txns.append(Transaction(lsn, lsn, lsn + 8, T0, [gen.change(data, only) for _ in range(n)]))
                runs = merge_runs([columnar_transaction(t) for t in txns])
                assert sum(r.rows for r in runs) == sum(len(t.changes) for t in txns)
                ea, eb = apply_batch_both(a, b, txns)
                assert ea == eb
                if ea is not None:
                    return
            assert state(a) == state(b)
            assert visible(a) == visible(b)


def test_merge_runs_joins_transactions_and_keeps_each_rows_commit_lsn():
    gen = Gen("int", list(OUR))
    t1 = _txn(100, [_ins(gen, 1), _ins(gen, 2)])
    t2 = _txn(200, [_ins(gen, 3)])
    t3 = _txn(300, [Change("delete", OID, old=gen.tup({"id": "1"}, ["id"]), old_kind="K", relation=gen.relation)])
    t4 = _txn(400, [Change("truncate", OID, truncate_oids=[OID]), _ins(gen, 4)])
    runs = merge_runs([columnar_transaction(t) for t in (t1, t2, t3, t4)])
    assert [(r.kind, r.rows, r.commit_lsns.tolist()) for r in runs] == [
        ("insert", 3, [100, 100, 200]),
        ("delete", 1, [300]),
        ("truncate", 1, [400]),
        ("insert", 1, [400]),
    ]
    # the values are those of the transactions' own runs, in order
    ref = runs_from_changes(t1.changes + t2.changes)[0]
    assert all(x.equals(y) for x, y in zip(runs[0].new, ref.new))
    assert not runs[0].equals(ref)  # (ref has no commit_lsns)


def test_changes_from_run_is_the_inverse_of_runs_from_changes():
    gen = Gen("int", list(OUR))
    changes = [
        _ins(gen, 1),
        Change("update", OID, new=gen.tup({"id": "1", "v": U}), relation=gen.relation),
        Change(
            "update",
            OID,
            new=gen.tup({"id": "2"}),
            old=gen.tup({"id": "1"}, ["id"]),
            old_kind="K",
            relation=gen.relation,
        ),
        Change("delete", OID, old=gen.tup({"id": "2"}, ["id"]), old_kind="K", relation=gen.relation),
        Change("truncate", OID, truncate_oids=[OID], truncate_cascade=True),
    ]
    for i, c in enumerate(changes):
        c.lsn = 1000 + i
    back = [ch for run in runs_from_changes(changes) for ch in changes_from_run(run)]
    assert [
        (
            c.kind,
            c.relation_oid,
            c.old_kind,
            c.lsn,
            c.relation is gen.relation or c.kind == "truncate",
            c.truncate_oids,
            c.truncate_cascade,
        )
        for c in back
    ] == [(c.kind, c.relation_oid, c.old_kind, c.lsn, True, c.truncate_oids, c.truncate_cascade) for c in changes]
    for x, y in zip(back, changes):
        for tx, ty in ((x.new, y.new), (x.old, y.old)):
            assert (tx is None) == (ty is None)
            if tx is not None:
                assert (tx.kinds, [None if v is None else bytes(v) for v in tx.data]) == (
                    ty.kinds,
                    [None if v is None else bytes(v) for v in ty.data],
                )


@SETTINGS
@given(kind=st.sampled_from(sorted(KINDS)), data=st.data())
def test_batch_runs_of_the_compiled_decoder_apply_like_the_reference_changes(kind, data):
    """The compiled decoder's transactions joined as batch runs (``merge_runs``: its layout takes the one
    concatenation + gather path) equal the reference's joined runs, and apply like its changes."""
    gen = Gen(kind, list(OUR))
    cols = [(c.flags, c.name, c.type_oid, c.typmod) for c in gen.relation.columns]

    def cells(t: TupleData | None) -> list[tuple[str, bytes | None]]:
        assert t is not None
        return [(k, None if v is None else bytes(v)) for k, v in zip(t.kinds, t.data)]

    msgs: list[tuple[int, bytes]] = []
    lsn = 1000
    only = data.draw(st.sampled_from([None, "insert", "update", "delete"]))
    for x in range(data.draw(st.integers(1, 8))):
        changes = [gen.change(data, only) for _ in range(data.draw(st.integers(1, 6)))]
        changes = [c for c in changes if c.kind != "truncate" and not (c.new and "NaN" in str(c.new.data))]
        lsn += 1000
        msgs.append((lsn, m_begin(lsn + 900, 0, 700 + x)))
        if x == 0:
            msgs.append((lsn + 1, m_relation(None, OID, "public", "t", gen.identity, cols)))
        for i, c in enumerate(changes):
            if c.kind == "insert":
                payload = m_insert(None, OID, cells(c.new))
            elif c.kind == "update":
                payload = m_update(None, OID, c.old_kind, cells(c.old) if c.old else None, cells(c.new))
            else:
                payload = m_delete(None, OID, c.old_kind, cells(c.old))
            msgs.append((lsn + 2 + i, payload))
        msgs.append((lsn + 900, m_commit(lsn + 900, lsn + 950, 0)))
    asm, dec, bdec = TransactionAssembler(), NativeDecoder(), NativeDecoder(batch=True)
    ref = [t for lsn_, p in msgs for t in asm.feed_payload(p, lsn_)]
    nat = [t for lsn_, p in msgs for t in dec.feed(p, lsn_)]
    # the batch decoder: its batch runs cut straight from its buffer, taken every few messages
    cut = data.draw(st.integers(1, len(msgs)))
    batches = [
        b for i, (lsn_, p) in enumerate(msgs) for b in bdec.feed(p, lsn_) + (bdec.take() if i % cut == 0 else [])
    ]
    batches += bdec.take()
    assert all(isinstance(b, ColumnarBatch) for b in batches)
    assert sum(len(b) for b in batches) == len(ref)
    ref_runs = merge_runs([columnar_transaction(t) for t in ref])
    nat_runs = merge_runs(nat)
    assert len(ref_runs) == len(nat_runs)
    assert all(x.equals(y) for x, y in zip(ref_runs, nat_runs))
    if len(batches) == 1:  # one batch, run limits not reached: the same batch runs as merge_runs
        assert len(batches[0].runs) == len(ref_runs)
        assert all(x.equals(y) for x, y in zip(ref_runs, batches[0].runs))
    with tempfile.TemporaryDirectory() as d:
        a = make_table(Path(d) / "a", kind, list(OUR), 7)
        b = make_table(Path(d) / "b", kind, list(OUR), 7)
        c = make_table(Path(d) / "c", kind, list(OUR), 7)
        for rt in ref:
            for ch in rt.changes:
                a.apply(ch, rt.commit_lsn)
        for run in nat_runs:
            b.apply_run(run, 0)
        for bt in batches:
            for run in bt.runs:
                c.apply_run(run, 0)
        assert state(a) == state(b) == state(c)
        assert visible(a) == visible(b) == visible(c)


def test_service_decoder_is_checked_and_read_from_the_environment(tmp_path, monkeypatch):
    from mooncake_assets.config import load_settings
    from mooncake_assets.engine.service.config import ServiceConfig

    kw = dict(
        state_dir="/tmp/x",
        dsn="dbname=x",
        socket_path="/tmp/x.sock",
        catalog_uri="sqlite://",
        warehouse_uri="file:///tmp/w",
    )
    assert ServiceConfig(**kw).decoder == "native"
    assert ServiceConfig(**kw, decoder="python").decoder == "python"
    with pytest.raises(ValueError, match="decoder"):
        ServiceConfig(**kw, decoder="fast")
    monkeypatch.setenv("MOONCAKE_DECODER", "python")
    assert load_settings(tmp_path, dsn="dbname=x").service_config().decoder == "python"


def test_split_by_commit_gives_back_each_transactions_run():
    from mooncake_assets.engine.cdc.columnar import slice_run, split_by_commit

    gen = Gen("int", list(OUR))
    txns = [_txn(100, [_ins(gen, 1), _ins(gen, 2)]), _txn(200, [_ins(gen, 3)]), _txn(300, [_ins(gen, 4)])]
    (run,) = merge_runs([columnar_transaction(t) for t in txns])
    parts = split_by_commit(run)
    assert [c for c, _ in parts] == [100, 200, 300]
    for (_c, part), t in zip(parts, txns):
        (ref,) = columnar_transaction(t).runs
        assert part.commit_lsns is None and part.equals(ref)
    tail = slice_run(run, 1, 4)
    assert tail.rows == 3 and tail.commit_lsns.tolist() == [100, 200, 300]
    assert tail.new[0].values.to_pylist() == [b"2", b"3", b"4"]


# ------------------------------------------------------------------ hot keys: one key updated again and again


def _hot_update(gen: Gen, data: st.DataObject, only_plain: bool) -> Change:
    """An UPDATE that keeps its key and sends no old tuple (a default-identity UPDATE of a non-key column):
    always when ``only_plain`` (and no unchanged TOAST value then), else most of the time, else any
    UPDATE the generator makes."""
    if gen.identity == "f" or (not only_plain and data.draw(st.integers(0, 3)) == 0):
        return gen.change(data, "update")
    row = gen.row(data, toast=not only_plain and data.draw(st.integers(0, 7)) == 0)
    return Change("update", OID, new=gen.tup(row), relation=gen.relation)


@SETTINGS
@given(
    kind=st.sampled_from(sorted(KINDS)),
    batch_rows=st.sampled_from([3, 5, 16384]),
    merged=st.booleans(),
    data=st.data(),
)
def test_update_runs_of_hot_keys_apply_like_changes(kind, batch_rows, merged, data):
    """UPDATE runs that hit a few keys again and again (sysbench's hot rows): a row that updates the key
    an earlier row of its run wrote replaces that row's new version without a new lookup segment — the
    same rows, LSNs, MemIndex and file deletes as the row-wise apply, whether the key's live row is in a
    file, in the MemSlice, missing, or held twice."""
    gen = Gen(kind, list(OUR))
    with tempfile.TemporaryDirectory() as d:
        a = make_table(Path(d) / "a", kind, list(OUR), batch_rows)
        b = make_table(Path(d) / "b", kind, list(OUR), batch_rows)
        lsn = 100
        for _ in range(data.draw(st.integers(1, 3))):  # rows to update: in files, in memory, some twice
            lsn += 16
            ins = [gen.change(data, "insert") for _ in range(data.draw(st.integers(1, 8)))]
            ea, eb = apply_both(a, b, Transaction(lsn, lsn, lsn + 8, T0, ins))
            assert ea == eb
            if ea is not None:
                return
            if data.draw(st.booleans()):
                a.flush(), b.flush()
        txns = []
        only_plain = data.draw(st.booleans())
        for _ in range(data.draw(st.integers(1, 4)) if merged else 1):
            lsn += 16
            ups = [_hot_update(gen, data, only_plain) for _ in range(data.draw(st.integers(2, 30)))]
            txns.append(Transaction(lsn, lsn, lsn + 8, T0, ups))
        if merged:
            ea, eb = apply_batch_both(a, b, txns)
        else:
            ea, eb = apply_both(a, b, txns[0])
        assert ea == eb
        if ea is None:
            assert state(a) == state(b)
            assert visible(a) == visible(b)


def test_a_hot_key_run_is_one_segment(tmp_path, monkeypatch):
    """1,000 UPDATEs of 20 keys (10 in a file, 10 in memory) (no key change, no old tuple) are looked up and appended as one segment,
    not one segment per repeat, and leave what the row-wise apply leaves."""
    a, b, gen = _both(tmp_path, "int", batch_rows=64)
    apply_both(a, b, _txn(100, [_ins(gen, i) for i in range(10)]))
    a.flush(), b.flush()
    apply_both(a, b, _txn(116, [_ins(gen, i) for i in range(10, 20)]))
    ups = []
    for j in range(1000):
        row = {"id": str(j % 20), "k": f"k{j}", "v": f"v{j}", "n": str(j), "d": "2.00"}
        ups.append(Change("update", OID, new=gen.tup(row), relation=gen.relation))
    segments = []
    inner = b._apply_segment

    def counted(run, seg, *args, **kw):
        if seg:
            segments.append(len(seg))
        return inner(run, seg, *args, **kw)

    monkeypatch.setattr(b, "_apply_segment", counted)
    assert apply_both(a, b, _txn(132, ups)) == (None, None)
    assert segments == [1000]
    assert state(a) == state(b) and visible(a) == visible(b)
    assert len(b.mem.visible()) == 20 and b.mem.deleted_rows == 10 + 1000 - 20
