"""The long-lived reader's pieces without Postgres: the ReadCache (keys by the deletion vector's value,
byte budget, files no longer read dropped) and the Flight ``read_states`` action (one round trip: the
same ReadStates and in-memory rows as ``read_state`` + ``do_get``, over the real Flight server)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64, FrozenBitMap64

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.read import UnionReader
from mooncake_assets.engine.read.cache import ReadCache
from mooncake_assets.engine.service.client import ServiceClient
from mooncake_assets.engine.service.flight import MooncakeFlightServer
from mooncake_assets.engine.table.read_state import FileState, ReadState


def _file(tmp_path, name: str, n: int) -> str:
    p = tmp_path / name
    pq.write_table(pa.table({"id": pa.array(np.arange(n), pa.int64())}), p, row_group_size=100)
    return str(p)


def test_cache_keys_by_vector_value_and_stays_in_budget(tmp_path):
    path = _file(tmp_path, "a.parquet", 1000)
    c = ReadCache(budget_bytes=1 << 20)
    v1 = FrozenBitMap64([1, 2, 3])
    assert c.positions(path, v1).tolist() == [1, 2, 3]
    assert c.positions(path, FrozenBitMap64([1, 2, 3])).tolist() == [1, 2, 3] and c.hits == 1  # equal value
    assert c.positions(path, FrozenBitMap64([1, 2, 3, 999])).tolist() == [1, 2, 3, 999]  # a new vector
    p = c.plan(path, 1000, v1)
    assert [(s.start, s.stop, s.has_deletes) for s in p.segments] == [(0, 100, True), (100, 1000, False)]
    assert c.row_groups(path) == (100,) * 10
    live, mask = c.keep(path, 1000, FrozenBitMap64(range(100, 1000)))
    assert live == (0,) and len(mask) == 100
    assert c.bytes <= c.budget_bytes
    small = ReadCache(budget_bytes=600)
    for k in range(20):  # each entry ~ its array + 64 bytes: old ones are evicted
        small.positions(path, FrozenBitMap64(range(k, k + 50)))
        assert small.bytes <= 600
    assert len(small) < 20


def test_cache_drops_files_no_longer_read(tmp_path):
    a, b = _file(tmp_path, "a.parquet", 300), _file(tmp_path, "b.parquet", 300)
    c = ReadCache()
    for p in (a, b):
        c.plan(p, 300, FrozenBitMap64([5]))
    assert c.retain([b]) > 0
    assert {k[1] for k in c._entries} == {b}
    assert c.retain([]) > 0 and len(c) == 0 and c.bytes == 0


class _Service:
    """The part of ReplicatorService the Flight server calls for reads, over in-process ReadStates."""

    def __init__(self, states: dict[str, ReadState]):
        self.states = states
        self.waited: list[int] = []

    def readable_tables(self) -> list[str]:
        return list(self.states)

    def read_state(self, name: str, lsn=None) -> ReadState:
        return self.states[name]

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        self.waited.append(lsn)
        return lsn

    def status(self) -> dict:
        return {"tables": [{"name": n, "state": "ready"} for n in self.states]}

    def stop(self) -> None:
        pass


def test_read_states_is_one_round_trip_with_the_rows(tmp_path):
    path = _file(tmp_path, "a.parquet", 500)
    mem = pa.table({"id": pa.array([1000, 1001], pa.int64())})
    rs = ReadState(
        "t", Lsn.parse("0/20"), (FileState("a.parquet", path, 500, FrozenBitMap64(BitMap64([0, 7]))),), ("id",), mem=mem
    )
    other = ReadState("Other", Lsn.parse("0/20"), (), ("id",), mem=mem.slice(0, 1))
    svc = _Service({"t": rs, "Other": other})
    sock = str(tmp_path / "f.sock")
    server = MooncakeFlightServer(svc, sock)
    threading.Thread(target=server.serve, daemon=True).start()
    client = ServiceClient(sock)
    try:
        (got,) = client.read_states(match=["t"], wait_lsn="0/20")
        assert svc.waited == [Lsn.parse("0/20")]
        assert got.with_(mem=None) == rs.with_(mem_rows=2, mem=None) and got.mem.equals(mem)
        assert [s.table for s in client.read_states(match=["other"])] == ["Other"]  # names match lower-cased
        assert [s.table for s in client.read_states()] == ["t", "Other"]
        one = client.read_state("t")
        assert one.with_(ticket=None) == got.with_(mem=None) and client.fetch(one.ticket).equals(mem)
        r = UnionReader(client)
        assert r.query("SELECT count(*) AS n FROM t")["n"][0].as_py() == 500 - 2 + 2
        r.register("t", view="t2", wait_lsn="0/21")  # the wait rides along with the ReadState
        assert svc.waited[-1] == Lsn.parse("0/21") and r.states["t2"].lsn == Lsn.parse("0/20")
        r.close()
    finally:
        client.close()
        server.shutdown()


def test_read_states_sends_only_the_lsn_of_an_unchanged_state(tmp_path):
    path = _file(tmp_path, "a.parquet", 500)
    mem = pa.table({"id": pa.array([1000, 1001], pa.int64())})
    f = FileState("a.parquet", path, 500, FrozenBitMap64(BitMap64([0, 7])))
    svc = _Service({"t": ReadState("t", Lsn.parse("0/20"), (f,), ("id",), mem=mem)})
    sock = str(tmp_path / "f.sock")
    server = MooncakeFlightServer(svc, sock)
    threading.Thread(target=server.serve, daemon=True).start()
    client = ServiceClient(sock)
    try:
        (first,) = client.read_states(tables=["t"])
        svc.states["t"] = svc.states["t"].with_(lsn=Lsn.parse("0/30"))  # other tables' commits moved the LSN
        (again,) = client.read_states(tables=["t"])
        assert client.unchanged == 1 and again.mem is first.mem and again.lsn == Lsn.parse("0/30")
        assert again.with_(lsn=first.lsn) == first
        # every kind of change is a new state: rows, a vector, a file, the schema
        changes = [
            dict(mem=pa.table({"id": pa.array([1000, 1002], pa.int64())})),
            dict(files=(FileState("a.parquet", path, 500, FrozenBitMap64(BitMap64([0, 8]))),)),
            dict(files=(FileState("b.parquet", path, 500, None),)),
            dict(schema=("id", "x")),
        ]
        for k, change in enumerate(changes):
            want = svc.states["t"].with_(lsn=Lsn.parse(f"0/{40 + k}"), **change)
            svc.states["t"] = want
            (got,) = client.read_states(tables=["t"])
            assert client.unchanged == 1, change
            assert got.with_(mem=None) == want.with_(mem_rows=want.mem.num_rows, mem=None)
            assert got.mem.equals(want.mem)
        (last,) = client.read_states(match=["T"])  # held by the name asked for: a match asks by registry name
        assert last.mem.equals(svc.states["t"].mem)
    finally:
        client.close()
        server.shutdown()


def test_the_client_holds_states_within_its_budget(tmp_path, monkeypatch):
    from mooncake_assets.engine.service import client as client_mod

    monkeypatch.setattr(client_mod, "HOLD_TABLES", 2)
    c = ServiceClient(tmp_path / "none.sock")
    rows = pa.table({"id": pa.array(range(100), pa.int64())})
    for name in ("a", "b", "c"):
        c._hold(name, "tok-" + name, ReadState(name, Lsn.parse("0/1"), mem=rows))
    assert list(c._held) == ["b", "c"]  # the least recently read dropped
    c._touch("b", "tok-b", c._held["b"][1])
    c._hold("d", "tok-d", ReadState("d", Lsn.parse("0/1"), mem=rows))
    assert list(c._held) == ["b", "d"]
    monkeypatch.setattr(client_mod, "HOLD_BYTES", rows.nbytes)
    c._hold("e", "tok-e", ReadState("e", Lsn.parse("0/1"), mem=rows))
    assert list(c._held) == ["e"]  # two tables' rows exceed the byte budget
    c._hold("e", None, ReadState("e", Lsn.parse("0/2"), mem=rows))  # a service without tokens: nothing held
    assert c._held == {}


def test_the_service_token_names_a_tables_rows_without_hashing_them(tmp_path):
    """MirrorTable.read_state's token (the MemSlice's version, the file list's content): equal while
    nothing changes, new after every kind of change, even one that leaves the same rows (a flush);
    a read at an LSN below a buffered change has its own; a held token gets the state without rows."""
    from mooncake_assets.engine.pg.schema import ColumnSpec
    from mooncake_assets.engine.table.evolution import SchemaChange

    from .test_apply import commit, delete, insert, make_table, read, update

    t = make_table(tmp_path / "t")
    commit(t, 10, *[insert(i, f"v{i}", i) for i in range(5)])
    first = t.read_state()
    assert t.read_state().token == first.token and t.read_state(11).token == first.token  # past every stamp
    assert t.read_state(10).token != first.token and t.read_state(10).mem.num_rows == 0  # before the commit
    held = t.read_state(known=first.token)
    assert held.mem is None and held.with_(mem=first.mem) == first
    tokens = {first.token}

    def changed(step: str) -> None:
        rs = t.read_state()
        assert rs.token not in tokens and rs.mem is not None, step
        tokens.add(rs.token)

    commit(t, 20, update((1, "x", 1)))
    changed("an update in memory")
    rows = read(t)
    t.flush()
    assert read(t) == rows
    changed("a flush: the same rows, now in a file")
    commit(t, 30, delete((2, None, None)))
    changed("a delete of a file's row (pending)")
    commit(t, 40, insert(9, "v9", 9))
    changed("a new in-memory row")
    cols = t.schema.columns + [ColumnSpec("c", 23, -1, "integer", pa.int32(), field_id=t.next_field_id)]
    t.evolve(SchemaChange(cols, ["id"], 45, t.next_field_id + 1, added=["c"]))
    changed("ADD COLUMN (the buffered rows converted)")
    t.truncate(50)
    t.applied_lsn = 51
    changed("a TRUNCATE")
    again = make_table(tmp_path / "t2")  # dropped and created again: nothing in common with the old one
    assert again.read_state().token != make_table(tmp_path / "t3").read_state().token
