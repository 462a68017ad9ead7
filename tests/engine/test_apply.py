"""The apply path in-process, without Postgres: decoded changes in, MemSlice rows, deletes and index out.

A :class:`MirrorTable` without an Iceberg table (``iceberg=None``) applies changes, flushes its
buffer to staged Parquet files with an IndexBlock and serves ReadStates: everything but persist.
Changes are built the way pgoutput decodes them (:class:`Change` with :class:`TupleData` row images:
text values, ``'n'`` NULL, ``'u'`` unchanged TOAST). The table's read is the ReadState's files minus
their deleted positions plus its in-memory rows, compared with what the changes should leave.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mooncake_assets.engine.cdc.pgoutput import TupleData
from mooncake_assets.engine.cdc.txn import Change
from mooncake_assets.engine.pg.schema import ColumnSpec, TableSchema, assign_field_ids
from mooncake_assets.engine.read.plan import deleted_positions
from mooncake_assets.engine.table.mirror import MirrorTable

OID = 16384
COLS = ["id", "v", "n"]
U = object()  # an unchanged TOAST value in a row image


def _schema(keyed: bool = True, identity: str = "d") -> TableSchema:
    cols = [
        ColumnSpec("id", 20, -1, "bigint", pa.int64(), not_null=keyed, is_key=keyed),
        ColumnSpec("v", 25, -1, "text", pa.string()),
        ColumnSpec("n", 23, -1, "integer", pa.int32()),
    ]
    assign_field_ids(cols)
    return TableSchema(
        schema="public",
        name="t",
        oid=OID,
        columns=cols,
        key_columns=["id"] if keyed else [],
        has_primary_key=keyed,
        replica_identity=identity,
    )


def make_table(path, keyed: bool = True, identity: str = "d") -> MirrorTable:
    t = MirrorTable("t", "public.t", _schema(keyed, identity), None, path)
    t.column_map(OID, COLS)  # the Relation message: the source's columns in order
    return t


def tup(*vals) -> TupleData:
    kinds, data = [], []
    for v in vals:
        if v is None:
            kinds.append("n"), data.append(None)
        elif v is U:
            kinds.append("u"), data.append(None)
        else:
            kinds.append("t"), data.append(str(v).encode())
    return TupleData("".join(kinds), data)


def insert(i, v, n=None) -> Change:
    return Change("insert", OID, new=tup(i, v, n))


def update(new: tuple, old: tuple | None = None, old_kind: str | None = None) -> Change:
    return Change("update", OID, new=tup(*new), old=tup(*old) if old is not None else None, old_kind=old_kind)


def delete(old: tuple, old_kind: str = "K") -> Change:
    return Change("delete", OID, old=tup(*old), old_kind=old_kind)


def commit(t: MirrorTable, lsn: int, *changes: Change) -> None:
    """Apply one transaction committed at ``lsn`` as the service's apply loop does; the table has then
    applied everything before lsn+1."""
    for ch in changes:
        t.apply(ch, lsn)
    t.last_change_lsn = max(t.last_change_lsn, lsn)
    t.applied_lsn = max(t.applied_lsn, lsn + 1)


def read(t: MirrorTable, lsn: int | None = None) -> list[tuple]:
    """The table's rows at ``lsn`` (files minus deleted positions, plus in-memory rows), sorted."""
    rs = t.read_state(lsn)
    parts = []
    for f in rs.files:
        data = pq.read_table(f.path)
        keep = np.ones(data.num_rows, bool)
        keep[deleted_positions(f.deleted).astype(np.int64)] = False
        parts.append(data.filter(pa.array(keep)))
    parts.append(rs.mem)
    rows = [tuple(r[c] for c in COLS) for p in parts for r in p.select(COLS).to_pylist()]
    return sorted(rows, key=repr)


def mem_rows(t: MirrorTable) -> list[tuple]:
    return sorted((tuple(r[c] for c in COLS) for r in t.mem.visible(None).to_pylist()), key=repr)


# ---------------------------------------------------------------------------------------- examples


def test_insert_goes_to_the_buffer_and_its_index(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 5), insert(2, None, None))
    assert mem_rows(t) == [(1, "a", 5), (2, None, None)]
    assert t.mem.live_rows == 2 and t.files == {}
    assert len(t.mem.find(t.hasher.hash_one(["1"]))) == 1
    assert t.mem.find(t.hasher.hash_one(["3"])) == []
    assert t.last_change_lsn == 10


def test_update_and_delete_in_the_buffer(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 5), insert(2, "b", 6))
    commit(t, 20, update((1, "a2", 7)), delete((2, None, None)))
    assert read(t) == [(1, "a2", 7)]
    assert t.mem.live_rows == 1 and t.missing_keys == 0
    # reads at an LSN see exactly the transactions committed before it
    assert read(t, 11) == [(1, "a", 5), (2, "b", 6)]
    assert read(t, 20) == [(1, "a", 5), (2, "b", 6)]
    assert read(t, 21) == [(1, "a2", 7)]
    assert read(t, 10) == []


def test_flush_writes_a_file_and_an_index_block_then_deletes_become_position_deletes(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2), insert(3, "c", 3))
    res = t.flush()
    assert res["rows"] == 3 and res["files"] == 1
    assert t.mem.is_empty() and len(t.files) == 1 and len(t.file_index.blocks) == 1
    ((name, f),) = t.files.items()
    assert f.num_rows == 3 and not f.persisted and f.local_path.startswith(str(tmp_path))
    hits = t.file_index.lookup(t.hasher.hash_one(["2"]))
    assert [n for n, _ in hits] == [name]
    row = hits[0][1]
    assert pq.read_table(f.local_path).column("id")[row].as_py() == 2
    commit(t, 20, delete((2, None, None)), update((3, "c2", 30)))
    assert f.pending == {row: 20, next(r for n, r in t.file_index.lookup(t.hasher.hash_one(["3"]))): 20}
    assert read(t) == [(1, "a", 1), (3, "c2", 30)]
    assert mem_rows(t) == [(3, "c2", 30)]
    (fs,) = t.read_state().files
    assert fs.deleted_count == 2 and fs.live_rows == 1
    assert read(t, 20) == [(1, "a", 1), (2, "b", 2), (3, "c", 3)]
    with pytest.raises(ValueError, match="cannot read at LSN 0/A"):
        t.read_state(10)  # below the flush boundary: not servable exactly


def test_a_flush_write_that_fails_half_way_leaves_no_file_and_the_rows_in_the_buffer(tmp_path):
    """An error between the Parquet files and the IndexBlock (here: one key hash too few) removes the
    files written so far; nothing was taken, so the rows stay buffered and a later flush writes them."""
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2), insert(3, "c", 3))
    frozen = t.begin_flush()
    table, hashes = frozen.rows()
    with pytest.raises(ValueError):
        t.disk.prepare(table, hashes[:-1])
    assert sorted(p.name for p in (tmp_path.rglob("*")) if p.is_file() and p.suffix in (".parquet", ".idx")) == []
    assert read(t) == [(1, "a", 1), (2, "b", 2), (3, "c", 3)] and not t.files
    assert t.finish_flush(frozen, t.write_frozen(frozen))["rows"] == 3
    assert read(t) == [(1, "a", 1), (2, "b", 2), (3, "c", 3)] and t.mem.is_empty() and len(t.files) == 1


def test_flushable_leaves_out_the_rows_a_flush_has_taken(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2), insert(3, "c", 3))
    assert t.mem.flushable()[0] == 3
    frozen = t.begin_flush()
    commit(t, 20, insert(4, "d", 4))
    assert t.mem.flushable()[0] == 1 and t.mem.live_rows == 4
    t.mem.unfreeze(frozen)  # (its write failed): the rows count again
    assert t.mem.flushable()[0] == 4
    frozen = t.begin_flush()
    assert t.mem.flushable()[0] == 0
    assert t.finish_flush(frozen, t.write_frozen(frozen))["rows"] == 4
    assert t.mem.frozen is None and t.mem.flushable()[0] == 0 and len(t.files) == 1
    commit(t, 30, insert(5, "e", 5))
    assert t.mem.flushable()[0] == 1


def test_key_change_update(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1))
    t.flush()
    commit(t, 20, update((9, "a", 1), old=(1, None, None), old_kind="K"))
    assert read(t) == [(9, "a", 1)]
    commit(t, 30, update((10, "a", 1), old=(9, None, None), old_kind="K"))
    assert read(t) == [(10, "a", 1)] and t.missing_keys == 0


def test_unchanged_toast_takes_the_old_value_from_the_buffer_and_from_a_file(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "long-1", 1), insert(2, "long-2", 2))
    commit(t, 20, update((1, U, 10)))  # the row is in the buffer
    assert read(t) == [(1, "long-1", 10), (2, "long-2", 2)]
    t.flush()
    commit(t, 30, update((2, U, 20)), update((1, U, 11)))  # the rows are in a staged file
    assert read(t) == [(1, "long-1", 11), (2, "long-2", 20)]
    commit(t, 40, update((2, U, U)))
    assert read(t) == [(1, "long-1", 11), (2, "long-2", 20)]


def test_unchanged_toast_with_replica_identity_full_takes_the_old_image(tmp_path):
    t = make_table(tmp_path, identity="f")
    commit(t, 10, insert(1, "x", 1))
    commit(t, 20, update((1, U, 2), old=(1, "x", 1), old_kind="O"))
    assert read(t) == [(1, "x", 2)]


def test_missing_key_is_counted_and_skipped(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1))
    commit(t, 20, delete((7, None, None)), update((8, "z", 0)))
    assert t.missing_keys == 2
    assert read(t) == [(1, "a", 1), (8, "z", 0)]  # an update without a row still writes its new row


def test_truncate_deletes_buffer_and_files_as_of_its_lsn(tmp_path):
    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1))
    t.flush()
    commit(t, 20, insert(2, "b", 2))
    commit(t, 30, Change("truncate", OID))
    assert read(t) == []
    assert read(t, 30) == [(1, "a", 1), (2, "b", 2)]
    (f,) = t.files.values()
    assert f.truncated_lsn == 30 and f.deleted_count() == 1
    commit(t, 40, insert(1, "again", 1))
    assert read(t) == [(1, "again", 1)]
    assert t.read_state().files == ()  # a file with every row deleted is not read


def test_keyless_table_with_replica_identity_full_deletes_one_of_equal_rows(tmp_path):
    t = make_table(tmp_path, keyed=False, identity="f")
    assert t.key_names == COLS  # the whole row is the key
    commit(t, 10, insert(1, "a", 1), insert(1, "a", 1), insert(2, "b", None))
    t.flush()
    commit(t, 20, insert(1, "a", 1))
    commit(t, 30, delete((1, "a", 1), old_kind="O"))
    assert read(t) == [(1, "a", 1), (1, "a", 1), (2, "b", None)]
    commit(t, 40, delete((1, "a", 1), old_kind="O"), delete((1, "a", 1), old_kind="O"))
    assert read(t) == [(2, "b", None)]
    commit(t, 50, update((2, "b2", 5), old=(2, "b", None), old_kind="O"))
    assert read(t) == [(2, "b2", 5)] and t.missing_keys == 0


def test_full_row_identity_picks_the_matching_row_among_equal_keys(tmp_path):
    """A DEFERRABLE key may repeat inside a transaction: the whole old row picks the right one."""
    t = make_table(tmp_path, identity="f")
    commit(t, 10, insert(1, "a", 1))
    t.flush()
    commit(t, 20, insert(1, "b", 2), delete((1, "a", 1), old_kind="O"))
    assert read(t) == [(1, "b", 2)]


# ---------------------------------------------------------------------------------------- model test

KEYS = st.integers(min_value=0, max_value=12)
VALS = st.one_of(st.none(), st.text(alphabet="abcxyz", max_size=4))
NUMS = st.one_of(st.none(), st.integers(min_value=-5, max_value=5))


class ApplyModel(RuleBasedStateMachine):
    """Drive apply (+ flush) with random transactions against a dict key → row; after every step the
    table's read equals the dict, and a read at any servable earlier LSN equals the dict as it was then."""

    @initialize(full=st.booleans(), batch_rows=st.sampled_from([2, 3, 16384]))
    def setup(self, full, batch_rows):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.full = full  # replica identity full: deletes and updates carry the whole old row
        self.t = make_table(self.tmp.name, identity="f" if full else "d")
        self.t.mem.batch_rows = batch_rows  # small: several sealed batches, frozen and not
        self.frozen = None  # a flush outside the lock begun (MirrorTable.begin_flush), not finished
        self.model: dict[int, tuple] = {}
        self.lsn = 0
        self.history: list[tuple[int, dict]] = []  # (LSN, rows visible at it)

    def teardown(self):
        if hasattr(self, "tmp"):
            self.tmp.cleanup()

    def _old(self, k):
        return self.model[k] if self.full else (k, None, None)

    def _commit(self, *changes):
        self.lsn += 10
        commit(self.t, self.lsn, *changes)
        self.history.append((self.lsn + 1, dict(self.model)))

    @rule(k=KEYS, v=VALS, n=NUMS)
    def insert(self, k, v, n):
        if k in self.model:
            return
        self.model[k] = (k, v, n)
        self._commit(insert(k, v, n))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), v=VALS, n=NUMS, toast=st.booleans())
    def update(self, data, v, n, toast):
        k = data.draw(st.sampled_from(sorted(self.model)))
        old = self.model[k]
        new_v = U if toast else v
        self.model[k] = (k, old[1] if toast else v, n)
        self._commit(update((k, new_v, n), old=old if self.full else None, old_kind="O" if self.full else None))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), nk=KEYS)
    def update_key(self, data, nk):
        k = data.draw(st.sampled_from(sorted(self.model)))
        if nk in self.model:
            return
        old = self.model.pop(k)
        self.model[nk] = (nk, old[1], old[2])
        self._commit(update((nk, old[1], old[2]), old=self._old_of(old), old_kind="O" if self.full else "K"))

    def _old_of(self, row):
        return row if self.full else (row[0], None, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def delete(self, data):
        k = data.draw(st.sampled_from(sorted(self.model)))
        old = self.model.pop(k)
        self._commit(delete(self._old_of(old), old_kind="O" if self.full else "K"))

    @rule(ks=st.lists(KEYS, min_size=2, max_size=4, unique=True))
    def transaction(self, ks):
        """Several changes in one transaction: insert-or-update each key, then delete the first."""
        changes = []
        for k in ks:
            if k in self.model:
                old = self.model[k]
                self.model[k] = (k, old[1], (old[2] or 0) + 1)
                changes.append(update(self.model[k], old=self._old_of(old), old_kind="O" if self.full else None))
            else:
                self.model[k] = (k, "t", 0)
                changes.append(insert(k, "t", 0))
        changes.append(delete(self._old_of(self.model.pop(ks[0])), old_kind="O" if self.full else "K"))
        self._commit(*changes)

    @rule()
    def truncate(self):
        self.model.clear()
        self._commit(Change("truncate", OID))

    @rule()
    def flush(self):
        self.t.flush()

    @precondition(lambda self: self.frozen is None)
    @rule()
    def begin_flush(self):
        """The first step of the persist's flush outside the lock: the rules that run before
        :meth:`finish_flush` are what the replication thread applies while the Parquet file is written."""
        self.frozen = self.t.begin_flush()

    @precondition(lambda self: self.frozen is not None)
    @rule()
    def finish_flush(self):
        frozen, self.frozen = self.frozen, None
        written = self.t.write_frozen(frozen)
        before = set(self.t.files)
        if self.t.finish_flush(frozen, written) is None:  # drained meanwhile: its files are gone
            assert set(self.t.files) == before
            assert written is None or not any(Path(f.local_path).exists() for f in written.files)
            self.t.flush()
        else:
            assert len(self.t.mem.index) == sum(1 for _ in self._mem_locations())

    def _mem_locations(self):
        """The live MemSlice rows by location, checked against the MemIndex (every live row found under
        its key hash, nothing else held)."""
        m = self.t.mem
        _, dels, hashes = m.row_stamps()
        nb = len(m.batches)
        locs = [(b, r) for b in range(nb) for r in range(m.batches[b].num_rows)]
        locs += [(nb, r) for r in range(m.num_rows - len(locs))]
        for loc, d, h in zip(locs, dels, hashes):
            if d == 0:
                assert loc in m.index.lookup(int(h)), loc
                yield loc

    @invariant()
    def reads_match_the_model(self):
        if not hasattr(self, "t"):
            return
        expect = sorted(self.model.values(), key=repr)
        assert read(self.t) == expect
        assert self.t.missing_keys == 0
        for lsn, rows in self.history[-3:]:
            if lsn >= self.t.flushed_lsn:
                assert read(self.t, lsn) == sorted(rows.values(), key=repr), lsn


ApplyModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_apply_model = ApplyModel.TestCase


# ---------------------------------------------------------------------------------------- persist payload


def test_persist_payload_is_built_without_changing_the_table_then_applied(tmp_path):
    from mooncake_assets.engine.table.persist import apply_persist, build_payload

    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2))
    t.flush()
    commit(t, 20, insert(3, "c", 3))
    t.flush()
    first, second = list(t.files)
    commit(t, 30, delete((1, None, None)), delete((3, None, None)))  # file 2's only row: the file is gone
    copied = []
    p = build_payload(t.disk, t.applied_lsn, "public.t", {}, lambda path: copied.append(path) or f"file://{path}")
    assert [n for n, _ in p.add] == [first] and p.gone == (second,) and p.remove == ()
    assert p.lsn == 31 and p.summary == {"mooncake.flush-lsn": "0/1F", "mooncake.source": "public.t"}
    ((loc, dv),) = p.deletes.items()
    assert loc == f"file://{t.files[first].local_path}" and list(dv) == [0] and p.new_deletes == 1
    assert copied == [t.files[first].local_path]
    assert len(t.files) == 2 and all(not f.persisted for f in t.files.values())  # nothing changed yet
    assert t.files[first].pending == {0: 30}
    floor = apply_persist(t.disk, p)
    assert list(t.files) == [first] and t.files[first].location == loc and t.files[first].local_path is None
    assert t.files[first].pending == {} and list(t.files[first].committed) == [0]
    assert floor == 31  # committed deletes lose their LSN: reads below it are no longer exact
    assert not t.disk.is_dirty()


# ---------------------------------------------------------------------------------------- compaction swap


def test_compaction_takes_a_frozen_input_and_the_table_applies_its_result(tmp_path):
    """The table hands out a snapshot, the work rewrites it without touching the table, deletes keep
    arriving meanwhile, and the table re-maps them when it applies the result: the read is unchanged."""
    from pyroaring import BitMap64

    from mooncake_assets.engine.compaction.rewriter import RewriteInput, rewrite_files
    from mooncake_assets.engine.index import FileIndex
    from mooncake_assets.engine.table.maintenance import CompactionResult

    t = make_table(tmp_path)
    commit(t, 10, *[insert(i, f"v{i}", i) for i in range(0, 6)])
    t.flush()
    commit(t, 20, *[insert(i, f"v{i}", i) for i in range(6, 12)])
    t.flush()
    commit(t, 30, delete((1, None, None)), delete((7, None, None)))
    for f in t.files.values():  # as a persist would leave them: in the warehouse, deletes committed
        f.location = "file://" + f.local_path
        f.committed.update(f.pending.keys())
        f.pending = {}
    names = list(t.files)
    before = read(t)
    inp = t.compaction_input(names)
    assert {s.name for s in inp.files} == set(names) and len(inp.blocks) == 2 and inp.live == frozenset(names)
    # the work (no lock): rewrite the live rows, rebuild the index of the input's blocks
    rw = rewrite_files(
        [RewriteInput(s.name, s.path, s.rows, BitMap64(s.committed), s.size_bytes) for s in inp.files],
        tmp_path / "out",
        inp.schema,
        1 << 30,
        defaults=inp.defaults,
    )
    block = FileIndex.build_from_compaction(list(inp.blocks), rw.position_map, t.dir / "index" / "new.idx")
    res = CompactionResult(
        outputs=tuple((o.name, o.rows, o.size_bytes, "file://" + o.path) for o in rw.outputs),
        position_map=rw.position_map,
        new_block=block,
    )
    assert sorted(t.files) == sorted(names) and len(t.file_index.blocks) == 2  # the table is untouched
    commit(t, 40, delete((2, None, None)), update((8, "new", 80)))  # deletes that arrive during the work
    expect = read(t)
    prep = t.prepare_compaction(inp, res)
    assert prep.remapped == 2 and prep.dropped == 0 and prep.vanished == 0 and len(prep.remove) == 2
    assert sorted(t.files) == sorted(names)  # prepared, not applied: a failed commit changes nothing
    t.apply_compaction(inp, res, prep)
    assert list(t.files) == [o.name for o in rw.outputs] and list(t.file_index.blocks) == [block]
    assert read(t) == expect and read(t) != before
    (f,) = t.files.values()
    assert f.num_rows == 10 and len(f.committed) == 0 and sorted(f.pending.values()) == [40, 40]
    # the key lookup goes through the new index: the rows are found at their new positions
    commit(t, 50, delete((3, None, None)), update((9, "z", 0)))
    assert t.missing_keys == 0
    assert read(t) == sorted([r for r in expect if r[0] not in (3, 9)] + [(9, "z", 0)], key=repr)


def test_an_index_that_cannot_be_rebuilt_stops_the_mirror(tmp_path, monkeypatch):
    """Restoring a blob saved under the old key hash rebuilds the index from the data files; when a key
    column's text cannot be reproduced (hstore, geometry), the table shows an error instead of following
    with an index that misses its persisted rows."""
    from mooncake_assets.engine.table import key_text

    t = make_table(tmp_path)
    commit(t, 10, insert(1, "a", 1), insert(2, "b", 2))
    t.flush()
    assert len(key_text.rebuild_file_index(t).blocks) == 1 and t.error is None

    def refuse(*_a, **_k):
        raise ValueError("column id: its text cannot be reproduced")

    monkeypatch.setattr(key_text, "key_text_columns", refuse)
    assert len(key_text.rebuild_file_index(t).blocks) == 0
    assert t.error is not None and "cannot rebuild its index" in t.error and "drop-table" in t.error, t.error
