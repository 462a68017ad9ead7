"""Iceberg v3 row lineage of a mirror, read back from the real files (spec "Row Lineage", "First Row ID
Inheritance", "Sequence Number Inheritance", "Reserved Field IDs").

``table_lineage`` is a small reader of its own, written from the spec and sharing no code with the
engine: manifests through DuckDB's Avro reader, data files through PyArrow, deletion vectors parsed from
the Puffin bytes. For every live row it gives ``(_row_id, _last_updated_sequence_number)``: the stored
column (reserved field ids 2147483540 / 2147483539) where the file has one and the value is not NULL,
else the file's ``first_row_id`` + position and its data sequence number.

After an initial copy, flushes with updates and deletes, and compactions: row ids are unique, a row no
change touched keeps its id and sequence number through compaction, an updated row (a delete and an
insert, as pgoutput sends it) gets a new id, ``next-row-id`` lies past every id and every file's range,
and the snapshots' ``first-row-id``/``added-rows`` chain up. What PyIceberg, DuckDB's iceberg extension
and the union read show of the lineage columns is checked too.
"""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from dataclasses import dataclass

import psycopg
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap64

from mooncake_assets.engine.iceberg import IcebergMirrorTable, connect_with_iceberg, make_catalog
from mooncake_assets.engine.read.union import UnionReader
from mooncake_assets.readers import READERS, ReaderUnavailable, require
from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service

ROW_ID, LAST_SEQ = 2147483540, 2147483539
DV_MAGIC = bytes([0xD1, 0xD3, 0x39, 0x64])


def _local(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


@dataclass
class Lineage:
    """What ``table_lineage`` read: ``rows``: key -> (row id, sequence number) of every live row;
    ``files``: live data file -> (first_row_id, record_count, data sequence number, stores lineage);
    ``metadata``: the table metadata JSON."""

    rows: dict[int, tuple[int, int]]
    files: dict[str, tuple[int | None, int, int, bool]]
    metadata: dict


def _avro(con, path: str, cols: str) -> list[dict]:
    cur = con.execute(f"SELECT {cols} FROM read_avro(?)", [_local(path)])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _dv(path: str, offset: int, size: int) -> BitMap64:
    """A ``deletion-vector-v1`` blob (spec "Deletion Vectors"): length, magic, portable Roaring64, CRC."""
    with open(_local(path), "rb") as f:
        f.seek(offset)
        blob = f.read(size)
    (length,) = struct.unpack(">I", blob[:4])
    assert length + 8 == len(blob) and blob[4:8] == DV_MAGIC
    assert struct.unpack(">I", blob[-4:])[0] == zlib.crc32(blob[4:-4])
    data, out = blob[8:-4], BitMap64()
    (buckets,) = struct.unpack_from("<Q", data, 0)
    pos = 8
    for _ in range(buckets):  # each: a 32-bit key (the high half), then a portable 32-bit Roaring bitmap
        (high,) = struct.unpack_from("<I", data, pos)
        pos += 4
        from pyroaring import BitMap

        bm = BitMap.deserialize(data[pos:])
        pos += len(bm.serialize())
        out.update(BitMap64((high << 32) | int(x) for x in bm))
    return out


def table_lineage(metadata_location: str, key: str = "id") -> Lineage:
    """The lineage of every live row of the current snapshot (see the module docstring)."""
    md = json.loads(open(_local(metadata_location)).read())
    snap = next(s for s in md["snapshots"] if s["snapshot-id"] == md["current-snapshot-id"])
    con = connect_with_iceberg()
    manifests = _avro(con, snap["manifest-list"], "manifest_path, content, sequence_number, first_row_id")
    files: dict[str, tuple[int | None, int, int, bool]] = {}
    deleted: dict[str, BitMap64] = {}
    for m in manifests:
        entries = _avro(
            con,
            m["manifest_path"],
            "status, sequence_number, data_file.content AS content, data_file.file_path AS path, "
            "data_file.record_count AS n, data_file.first_row_id AS first, data_file.referenced_data_file AS ref, "
            "data_file.content_offset AS off, data_file.content_size_in_bytes AS size",
        )
        next_id = m["first_row_id"]  # First Row ID Inheritance: a running count over files without one
        for e in entries:
            first = e["first"]
            if m["content"] == 0 and first is None and next_id is not None:
                first, next_id = next_id, next_id + e["n"]
            if e["status"] == 2:  # DELETED
                continue
            seq = e["sequence_number"] if e["sequence_number"] is not None else m["sequence_number"]
            if e["content"] == 0:
                files[e["path"]] = (first, e["n"], seq, False)
            else:
                assert e["content"] == 1 and e["ref"], e  # mirrors write DVs only
                deleted[e["ref"]] = _dv(e["path"], e["off"], e["size"])
    rows: dict[int, tuple[int, int]] = {}
    for path, (first, n, seq, _) in list(files.items()):
        t = pq.read_table(_local(path))
        by_id = {int(f.metadata[b"PARQUET:field_id"]): f.name for f in t.schema if f.metadata}
        stored_ids = t.column(by_id[ROW_ID]).to_pylist() if ROW_ID in by_id else [None] * n
        stored_seq = t.column(by_id[LAST_SEQ]).to_pylist() if LAST_SEQ in by_id else [None] * n
        files[path] = (first, n, seq, ROW_ID in by_id)
        gone = deleted.get(path, BitMap64())
        for p, k in enumerate(t.column(key).to_pylist()):
            if p in gone:
                continue
            rid = stored_ids[p] if stored_ids[p] is not None else (first + p if first is not None else None)
            assert rid is not None, f"{path} row {p}: no row id"
            assert k not in rows, f"key {k} live twice"
            rows[k] = (rid, stored_seq[p] if stored_seq[p] is not None else seq)
    return Lineage(rows, files, md)


def check_table_invariants(lin: Lineage) -> None:
    """Unique row ids; ``next-row-id`` past every id and every file's range; file ranges disjoint; the
    snapshots' ``first-row-id``/``added-rows`` chained parent to child."""
    md = lin.metadata
    ids = [r for r, _ in lin.rows.values()]
    assert len(set(ids)) == len(ids), "row ids are not unique"
    assert md["next-row-id"] >= max(ids) + 1
    ranges = sorted((f, f + n) for f, n, _, _ in lin.files.values() if f is not None)
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), f"overlapping first_row_id ranges {ranges}"
    assert ranges[-1][1] <= md["next-row-id"]
    snaps = {s["snapshot-id"]: s for s in md["snapshots"]}
    for s in snaps.values():
        assert s["first-row-id"] is not None and s["added-rows"] >= 0
        parent = snaps.get(s.get("parent-snapshot-id"))
        if parent is not None:
            assert s["first-row-id"] == parent["first-row-id"] + parent["added-rows"], (parent, s)
    cur = snaps[md["current-snapshot-id"]]
    assert md["next-row-id"] == cur["first-row-id"] + cur["added-rows"]
    seqs = {s["sequence-number"] for s in snaps.values()}
    assert all(seq in seqs or seq <= max(seqs) for _, seq in lin.rows.values())


def _lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _ice(s, name: str) -> IcebergMirrorTable:
    from mooncake_assets.engine.storage import catalog_properties

    return IcebergMirrorTable.load(
        make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s)), f"mooncake.{name}"
    )


def _sql(dsn: str, *stmts: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for st in stmts:
            c.execute(st)


def read_both(s) -> Lineage:
    """The lineage by this module's reader, checked equal to what DuckDB's iceberg extension shows."""
    loc = _ice(s, "lin").metadata_location
    lin = table_lineage(loc)
    assert duckdb_lineage(loc) == lin.rows
    return lin


@pytest.fixture
def lineage_mirror(pg_dsn, state_dir):
    _sql(
        pg_dsn,
        "CREATE TABLE lin (id int PRIMARY KEY, v text NOT NULL)",
        "INSERT INTO lin SELECT g, 'v' || g FROM generate_series(1, 500) g",
    )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="lin", src="public.lin")

        def step(*stmts: str) -> Lineage:
            _sql(pg_dsn, *stmts)
            client.wait_lsn(_lsn(pg_dsn))
            client.call("persist", table="lin")
            return read_both(s)

        yield s, client, step


def test_lineage_through_copy_flushes_and_compactions(pg_dsn, lineage_mirror):
    s, client, step = lineage_mirror
    copied = step()  # the initial copy, persisted
    assert sorted(copied.rows) == list(range(1, 501))
    check_table_invariants(copied)
    assert not any(stores for *_, stores in copied.files.values())  # new rows only: nothing stored, all inherited

    flushed = step("INSERT INTO lin SELECT g, 'v' || g FROM generate_series(501, 700) g")
    updated = step("UPDATE lin SET v = v || '!' WHERE id <= 50")
    deleted = step("DELETE FROM lin WHERE id BETWEEN 600 AND 650")
    for lin in (flushed, updated, deleted):
        check_table_invariants(lin)
    assert {k: flushed.rows[k] for k in copied.rows} == copied.rows  # a flush changes no existing row's lineage
    old_ids = {r for r, _ in flushed.rows.values()}
    for k in range(1, 51):  # UPDATE = delete + insert: a new row id, the update's sequence number
        assert updated.rows[k][0] not in old_ids and updated.rows[k][1] > flushed.rows[k][1]
    assert {k: updated.rows[k] for k in range(51, 701)} == {k: flushed.rows[k] for k in range(51, 701)}
    assert sorted(deleted.rows) == [k for k in range(1, 701) if not 600 <= k <= 650]

    before = deleted.rows
    full = client.call("compact", table="lin", full=True)
    assert full["compacted"] and full["files_in"] >= 3
    compacted = read_both(s)
    check_table_invariants(compacted)
    assert all(stores for *_, stores in compacted.files.values())  # the rewritten files store both columns
    assert compacted.rows == before  # every row moved, none changed: same row ids, same sequence numbers

    # more changes, then a compaction of compacted files (stored lineage) and a new flush (inherited)
    after = step("UPDATE lin SET v = 'w' WHERE id BETWEEN 100 AND 120", "INSERT INTO lin VALUES (1000, 'new')")
    check_table_invariants(after)
    assert {stores for *_, stores in after.files.values()} == {True, False}
    _readers_show_table_columns(s, client, pg_dsn, len(after.rows))  # files with and without lineage columns
    again = client.call("compact", table="lin", full=True)
    assert again["compacted"]
    final = read_both(s)
    check_table_invariants(final)
    untouched = [k for k in before if not 100 <= k <= 120]
    assert {k: final.rows[k] for k in untouched} == {k: before[k] for k in untouched}
    assert {k: final.rows[k] for k in after.rows} == after.rows
    earlier = {r for r, _ in before.values()}
    assert all(final.rows[k][0] not in earlier for k in [*range(100, 121), 1000])

    _readers_show_table_columns(s, client, pg_dsn, len(final.rows))


def duckdb_lineage(metadata_location: str) -> dict[int, tuple[int, int]]:
    """key -> (``_row_id``, ``_last_updated_sequence_number``) as DuckDB's iceberg extension computes them
    (its virtual columns: the stored value, else inherited)."""
    con = connect_with_iceberg()
    try:
        got = con.execute(
            "SELECT id, _row_id, _last_updated_sequence_number FROM iceberg_scan(?)", [metadata_location]
        ).fetchall()
    finally:
        con.close()
    out = {k: (r, q) for k, r, q in got}
    assert len(out) == len(got)
    return out


def _readers_show_table_columns(s, client, dsn: str, rows: int) -> None:
    """PyIceberg, DuckDB's ``iceberg_scan`` and the union read (both ways: lazy with a filter, arrow for a
    whole-table scan, and ``read_table``) show the table's columns only, and every live row."""
    ice = _ice(s, "lin")
    scanned = ice.table.scan().to_arrow()
    assert scanned.column_names == ["id", "v"] and scanned.num_rows == rows
    with pytest.raises(ValueError, match="_row_id"):  # PyIceberg 0.12 has no row lineage read
        ice.table.scan(selected_fields=("id", "_row_id")).to_arrow()
    con = connect_with_iceberg()
    cur = con.execute("SELECT * FROM iceberg_scan(?)", [ice.metadata_location])
    assert [d[0] for d in cur.description] == ["id", "v"] and len(cur.fetchall()) == rows
    reader = UnionReader(client, dsn, wait_timeout=60)
    try:
        lazy = reader.query("SELECT * FROM lin WHERE id > 0")
        assert lazy.column_names == ["id", "v"] and lazy.num_rows == rows
        whole = reader.query("SELECT * FROM lin")
        assert whole.column_names == ["id", "v"] and whole.num_rows == rows
        assert reader.read_table("lin").column_names == ["id", "v"]
    finally:
        reader.close()


def test_changes_to_compacted_rows_read_the_table_columns(pg_dsn, state_dir):
    """Rows living in compacted files (with lineage columns) are found and re-read by the mirror itself:
    a keyless table's UPDATE/DELETE re-check the whole stored row, and a keyed UPDATE that leaves a TOASTed
    column out carries its value over from the file. The union read then equals Postgres, and a restart
    (files, DVs and index back from Iceberg) too."""
    _sql(
        pg_dsn,
        "CREATE TABLE nk (a int, b text)",
        "ALTER TABLE nk REPLICA IDENTITY FULL",
        "INSERT INTO nk SELECT g % 50, 'b' || g FROM generate_series(1, 300) g",
        "CREATE TABLE tst (id int PRIMARY KEY, n int, big text)",
        "ALTER TABLE tst ALTER COLUMN big SET STORAGE EXTERNAL",
        "INSERT INTO tst SELECT g, 0, repeat(md5(g::text), 200) FROM generate_series(1, 200) g",
    )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")

    def matches(client) -> None:
        results, lsn = verify(s, ["nk", "tst"], "union", client)
        assert all(r.match for r in results), [r.line() for r in results if not r.match]

    with running_service(s) as client:
        for t in ("nk", "tst"):
            client.call("create_table", dst=t, src=f"public.{t}")
        _sql(pg_dsn, "INSERT INTO nk VALUES (7, 'late')", "UPDATE tst SET n = 1 WHERE id <= 10")
        client.wait_lsn(_lsn(pg_dsn))
        for t in ("nk", "tst"):
            client.call("persist", table=t)
            assert client.call("compact", table=t, full=True)["compacted"]
            assert all(stores for *_, stores in table_lineage(_ice(s, t).metadata_location, key=_key(t)).files.values())
        _sql(
            pg_dsn,
            "UPDATE nk SET b = b || '!' WHERE a = 3",
            "DELETE FROM nk WHERE a = 4",
            "UPDATE tst SET n = n + 5 WHERE id BETWEEN 5 AND 60",  # big unchanged: not in the WAL (TOAST)
        )
        client.wait_lsn(_lsn(pg_dsn))
        matches(client)
        for t in ("nk", "tst"):
            client.call("persist", table=t)
    with running_service(s) as client:
        _sql(pg_dsn, "UPDATE tst SET n = -n WHERE id % 3 = 0", "DELETE FROM nk WHERE a = 5")
        client.wait_lsn(_lsn(pg_dsn))
        matches(client)


def _key(table: str) -> str:
    return {"nk": "b", "tst": "id"}[table]


@pytest.fixture(scope="module")
def compacted(pg_cluster, tmp_path_factory):
    """A v3 mirror whose live files are a compaction's outputs (lineage columns, some with DVs) and a
    later flush's file (none), all persisted."""
    name = f"lin_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    dsn = pg_cluster.dsn(name)
    _sql(
        dsn,
        "CREATE TABLE lr (id int PRIMARY KEY, name text, qty int, at timestamptz)",
        "INSERT INTO lr SELECT g, 'n' || g, g % 13, '2026-01-01 00:00+00'::timestamptz + g * interval '1 hour' "
        "FROM generate_series(1, 400) g",
    )
    s = make_settings(tmp_path_factory.mktemp("state"), dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="lr", src="public.lr")
        _sql(dsn, "UPDATE lr SET qty = qty + 100 WHERE id % 7 = 0", "DELETE FROM lr WHERE id % 11 = 0")
        client.wait_lsn(_lsn(dsn))
        client.call("persist", table="lr")
        assert client.call("compact", table="lr", full=True)["compacted"]
        _sql(dsn, "UPDATE lr SET name = 'u' WHERE id % 5 = 0", "INSERT INTO lr VALUES (1000, 'late', 1, now())")
        client.wait_lsn(_lsn(dsn))
        client.call("persist", table="lr")
    lin = table_lineage(_ice(s, "lr").metadata_location)
    assert {stores for *_, stores in lin.files.values()} == {True, False}
    yield s
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        for (slot,) in c.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)).fetchall():
            c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_reads_compacted_files(compacted, reader):
    """Each engine of README's reader table reads a mirror whose files store lineage columns as the table's
    columns and equals Postgres (``verify``, as ``mooncake verify --reader R`` runs it)."""
    try:
        require(reader)
    except ReaderUnavailable as e:
        pytest.skip(str(e))
    results, lsn = verify(compacted, ["lr"], reader)
    assert [r.match for r in results] == [True], f"at LSN {lsn}: {[r.line() for r in results]}"
