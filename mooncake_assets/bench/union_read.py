"""Union-read benchmark: a mirrored table with deletes vs. a clean Parquet copy of its live rows, and vs.
the same rows stored the way an equality-delete writer (Flink's upsert sink) stores them, read the way
users read such tables.

The table has the shape of ``pgbench_accounts`` (aid int4 key, bid int4, abalance int4, filler
char(84)). It is built directly with the engine's classes, as the service would hold it after an
initial copy of ``rows`` rows and then ``d × rows`` single-row UPDATEs of random keys (``d`` = 1%, 10%,
30%): every UPDATE deletes the key's current version (a position in a data file, or a row of the
in-memory buffer) and appends the new version. Updates are committed in batches of 1% of the rows
(:data:`COMMIT_SHARE`, the cadence of every layout below). The first 60% of the updates were flushed and
persisted (data files + deletion vectors, ``DiskFile.committed``), the next 30% flushed but not
persisted (staged files + pending position deletes), the last 10% are in the MemSlice (BatchDV
applied) — so deletes are spread over persisted files, flushed files and the in-memory buffer.
Copy files hold up to 1M rows, row groups 128 Ki rows; every file carries ``PARQUET:field_id``.

Readers (contenders), measured in rotated rounds (medians, wall and CPU time; see :mod:`.common`), per
delete share:

- ``clean``: DuckDB over one clean Parquet file of exactly the live rows (written from this module's
  own bookkeeping with the mirror's writer, not by any reader);
- ``union``: :class:`~mooncake_assets.engine.read.UnionReader` ``.query(sql)`` — ReadState over Arrow
  Flight from a :class:`~mooncake_assets.engine.service.flight.MooncakeFlightServer` serving the
  tables' real ``MirrorTable.read_state``, in-memory rows by ``do_get``, view registration, query —
  all inside the timed call;
- ``anti_join``: the same with the reader's ``anti`` mode (the first reader: one ANTI JOIN per file);
- ``equality_deletes_model``: an engine-optimal **model** of an equality-delete read, which no real
  reader achieves: the Flink table's files (below) read by DuckDB with one vectorised hash ANTI JOIN on
  key and sequence number (a data row is dropped when an equality delete of its key has a higher
  sequence number, Iceberg spec "Scan Planning");
- ``duckdb_iceberg_v2_equality_deletes``: DuckDB's ``iceberg_scan`` (extension ``iceberg``, loaded
  offline) on a real Iceberg **v2** table written like Flink's upsert sink — the initial copy's files,
  then per commit one data file of the new versions and one equality-delete file of their keys
  (:mod:`.flink_v2`);
- ``duckdb_iceberg_v3``: the same ``iceberg_scan`` on our own v3 table — the mirror's persisted table
  (the same data files, committed by :class:`~mooncake_assets.engine.iceberg.table.IcebergMirrorTable`
  one persist per batch of updates, deletes as deletion vectors; the MemSlice's live rows flushed by
  the last one).

The comparison users would make is ``duckdb_iceberg_v2_equality_deletes`` ÷ ``duckdb_iceberg_v3`` (one
reader, two layouts of the same rows): ``speedup_vs_duckdb_iceberg_equality_deletes``. DuckDB's iceberg
extension (1.5.5) applies every equality-delete row as a predicate, so that read costs rows × deletes
(a scan of 100k rows with 10% deleted: ~35 s on the 2-core bench machine; 30k rows: ~3 s): it is timed
on a second set of the same three tables at ``Sizes.iceberg_rows`` rows (every reader,
``duckdb_iceberg_comparison`` in the JSON), whose v2 ÷ v3 figures the main section repeats; at the main
size (``Sizes.union_rows``, 5M by default) every other reader is timed.

The reader memoizes decoded deletion vectors and per-file read plans by the vectors' bytes
(:mod:`mooncake_assets.engine.read.plan`), so from the second round on it reads like a long-lived
reader of an unchanged table. The Flight server publishes its service lock's epoch on the read board
(:mod:`mooncake_assets.engine.service.board`) as the service does; the tables do not change while
they are read, so from the second query on the client answers ``read_states`` from the board (no
round trip). The timed ``union`` and ``anti_join`` readers are built with ``hold_rows=False``: every
query reads the rows of the files with deletes again and registers its views again (a long-lived
reader would otherwise keep those rows in memory while nothing changed and scan them from there, a
cache the clean side, which decodes its Parquet in every round, does not have). The readers are
built once per run (:func:`make_readers`) and reused by every round.

Fixed cost per query (``fixed_ms_per_query``): the same readers on a tiny table (:data:`TINY_ROWS`
rows, 1% updated) queried ``Sizes.union_fixed_rounds`` times — what a query costs before it reads rows.
The union read's figure is a **warm** long-lived reader's (``union_held``: its connection, views,
caches, held rows and ReadState kept between queries; also ``fixed_ms_per_query_warm``); a **cold** one
(``fixed_ms_per_query_cold``, reader ``union_cold``) connects a new ServiceClient and UnionReader for
every query, as a one-shot ``mooncake query`` does (less its process start). The warm reader and the
clean read are rotated with each other only; the other readers, cold and heavy, in rounds of their own
after them (a few-millisecond query timed right after one of theirs pays for its neighbour: caches,
DuckDB's threads; ``scripts/probe_fixed_cost.py``).

Queries: ``scan`` (an aggregate over the whole table) and ``filter`` (a range of 0.1% of the keys).
Every side's rows are checked: count and checksum (``sum(hash(all columns) % p)``) of what each
query reads, and the query results themselves, must be equal; they are recorded under ``check``.
Units: ``seconds`` / ``cpu_seconds`` seconds, ``*_ms*`` milliseconds, ratios plain numbers.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ..engine.table.disk_files import ROW_GROUP_ROWS, write_parquet
from .common import Sizes, interleaved, med

DELETE_SHARES = {"d1": 0.01, "d10": 0.10, "d30": 0.30}
COMMIT_SHARE = 0.01  # one commit (persist / Flink checkpoint) per 1% of the rows updated
TINY_ROWS = 1000  # the table the fixed cost per query is measured on
ROW_GROUP = ROW_GROUP_ROWS
SCAN_SQL = "SELECT count(*) AS n, sum(abalance) AS s, sum(bid) AS b FROM {t}"
FILTER_SQL = "SELECT count(*) AS n, sum(abalance) AS s FROM {t} WHERE aid BETWEEN {lo} AND {hi}"
CHECK_SQL = "SELECT count(*) AS n, sum(hash(aid, bid, abalance, filler) % 1000000007) AS h FROM {t}{where}"
FILLER = " " * 84

#: every reader measured, in report order, and what it is
READERS = {
    "clean": "DuckDB read_parquet over a clean copy of the live rows",
    "union": "mooncake union read (UnionReader: ReadState over Flight, deletion vectors; rows read again per query)",
    "anti_join": "mooncake union read, one ANTI JOIN per file (mode anti)",
    "equality_deletes_model": "model: the Flink table's files, one hash ANTI JOIN on key and sequence number",
    "duckdb_iceberg_v2_equality_deletes": "DuckDB iceberg_scan, Flink-style v2 table (equality deletes)",
    "duckdb_iceberg_v3": "DuckDB iceberg_scan, the mirror's v3 table (deletion vectors)",
}
ICEBERG_READERS = ("duckdb_iceberg_v2_equality_deletes", "duckdb_iceberg_v3")
#: readers whose cost grows with rows × equality deletes (measured: 100k rows, 10% deleted, ~35 s a scan;
#: 3.3x the rows and deletes of 30k rows cost 11x), so they are timed on the smaller comparison tables
SLOW_READERS = ("duckdb_iceberg_v2_equality_deletes",)


def _schema():
    from ..engine.pg.schema import ColumnSpec, TableSchema

    cols = [
        ColumnSpec("aid", 23, -1, "integer", pa.int32(), not_null=True, is_key=True, field_id=1),
        ColumnSpec("bid", 23, -1, "integer", pa.int32(), field_id=2),
        ColumnSpec("abalance", 23, -1, "integer", pa.int32(), field_id=3),
        ColumnSpec("filler", 1042, 88, "character(84)", pa.string(), field_id=4),
    ]
    return TableSchema("public", "accounts", 1, cols, ["aid"], True, "d")


def _rows(aids: np.ndarray, balance: np.ndarray) -> pa.Table:
    n = len(aids)
    filler = pa.array(np.full(n, FILLER, dtype=object), pa.string()) if n else pa.array([], pa.string())
    t = pa.table(
        {
            "aid": pa.array(aids, pa.int32()),
            "bid": pa.array((aids - 1) // 100_000 + 1, pa.int32()),
            "abalance": pa.array(balance, pa.int32()),
            "filler": filler,
        }
    )
    return t.cast(_schema().arrow_schema())


def _write(t: pa.Table, path: Path) -> int:
    return write_parquet(t, path)


def _uri(path: str | Path) -> str:
    return "file://" + str(Path(path).resolve())


class _Service:
    """The part of ReplicatorService the Flight server calls for reads, over in-process MirrorTables."""

    def __init__(self, tables: dict):
        from ..engine.service.board import EpochLock

        self.tables = tables
        # as the service's: the Flight front publishes its epoch on the read board (engine/service/board.py);
        # the bench's tables do not change while they are read, so the epoch stays
        self.lock = EpochLock()

    def board_applied_lsn(self) -> int:
        """Every LSN is applied (:meth:`wait_lsn`)."""
        return 2**64 - 1

    def read_state(self, name: str, lsn=None, known=None):
        t = self.tables[name]
        return t.read_state(lsn, known)

    def read_states(self, names: list, lsn=None, known=None) -> list:
        """As ``ReplicatorService.read_states``: a held state's rows are not gathered again."""
        with self.lock.reading():
            return [self.read_state(n, lsn, (known or {}).get(n)) for n in names]

    def status(self) -> dict:
        return {"tables": [{"name": n, "state": "ready"} for n in self.tables]}

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        """The Flight ``wait_lsn`` action: the tables are built in-process, every LSN is applied."""
        return lsn

    def stop(self) -> None:
        pass


@dataclass
class _History:
    """One delete share's updates and where every version ended up (module docstring).

    ``files``: the data files (base copy first, then one per flushed commit): ``{"path", "rows",
    "committed": [row], "pending": [row], "kind": "persisted" | "flushed"}``; ``commits``: the commits
    as [start, end) ranges of the updates, each with the file it wrote (``file``: index into ``files``,
    -1 for the in-memory one) and the (file index, row) positions it deleted (``deletes``);
    ``mem_deleted``: rows of the in-memory commit deleted by a later update in it.
    """

    keys: np.ndarray
    balances: np.ndarray
    files: list[dict]
    commits: list[dict] = field(default_factory=list)
    mem_deleted: list[int] = field(default_factory=list)

    @property
    def mem_range(self) -> tuple[int, int]:
        c = self.commits[-1]
        return c["start"], c["end"]


@dataclass
class _Built:
    """One table in every layout: the MirrorTable (files + DVs + MemSlice), the clean copy, the
    equality-delete model's SQL and the metadata JSON of the two Iceberg tables."""

    table: Any
    clean_path: str
    eq_model_sql: str
    live_rows: int
    stats: dict
    v2_metadata: str | None = None
    v3_metadata: str | None = None


# ----------------------------------------------------------------------------------- building


def _segments(u: int, n_persist: int, n_flush: int, chunk: int) -> list[tuple[int, int]]:
    """The commits of the ``u`` updates, as [start, end) ranges: ``chunk``-sized up to ``n_persist``
    (persisted), then up to ``n_flush`` (flushed), then the rest (in memory)."""
    bounds = list(range(0, n_persist, chunk)) + list(range(n_persist, n_flush, chunk)) + [n_flush]
    segments = []
    for a in range(len(bounds) - 1):
        if bounds[a] < bounds[a + 1]:
            segments.append((bounds[a], bounds[a + 1]))
    segments.append((n_flush, u))
    return segments


def _chunk(n: int) -> int:
    return max(int(n * COMMIT_SHARE), 1)


def _simulate(d: Path, n: int, share: float, base_files: list[tuple[str, int]], seed: int) -> _History:
    """Draw the updates and replay them commit by commit: every update deletes the key's current version
    (a file position, or an in-memory row) and its new version goes to the commit's file; the flushed
    commits' files are written to ``d``."""
    rng = np.random.default_rng(seed)
    u = int(round(n * share))
    h = _History(
        keys=rng.integers(1, n + 1, u).astype(np.int64),
        balances=rng.integers(-5000, 5001, u).astype(np.int64),
        files=[{"path": p, "rows": r, "committed": [], "pending": [], "kind": "persisted"} for p, r in base_files],
    )
    n_persist, n_flush = int(u * 0.6), int(u * 0.9)
    base_rows = base_files[0][1]
    # where each key's current version is: file index (into files) and row; -1 = in memory
    aids = np.arange(1, n + 1)
    loc_file = np.empty(n + 1, dtype=np.int64)
    loc_row = np.empty(n + 1, dtype=np.int64)
    loc_file[1:] = (aids - 1) // base_rows
    loc_row[1:] = (aids - 1) % base_rows
    segments = _segments(u, n_persist, n_flush, _chunk(n))
    for si, (a, b) in enumerate(segments):
        kind = "memory" if si == len(segments) - 1 else ("persisted" if b <= n_persist else "flushed")
        _apply_commit(d, h, si, a, b, kind, loc_file, loc_row)
    return h


def _apply_commit(
    d: Path, h: _History, si: int, a: int, b: int, kind: str, loc_file: np.ndarray, loc_row: np.ndarray
) -> None:
    """Replay updates [a, b) as one commit of ``kind`` (persisted / flushed / memory)."""
    ks, bs = h.keys[a:b], h.balances[a:b]
    fi = -1
    if kind != "memory":
        fi = len(h.files)
        path = str(d / f"upd_{si}.parquet")
        h.files.append({"path": path, "rows": len(ks), "committed": [], "pending": [], "kind": kind})
    deletes: list[tuple[int, int]] = []
    target = "committed" if kind == "persisted" else "pending"
    for r, k in enumerate(ks.tolist()):
        f, row = int(loc_file[k]), int(loc_row[k])
        if f == -1:
            h.mem_deleted.append(row)
        else:
            h.files[f][target].append(row)
            deletes.append((f, row))
        loc_file[k] = fi
        loc_row[k] = r
    if kind != "memory":
        _write(_rows(ks, bs), Path(h.files[fi]["path"]))
    h.commits.append({"start": a, "end": b, "kind": kind, "file": fi, "deletes": deletes})


def _load_engine_view(table: Any, files: list[dict], mem_rows: pa.Table, mem_deleted: list[int], lsn: int) -> None:
    """Give ``table`` the files (with their committed / pending DVs) and the MemSlice rows, at ``lsn``."""
    from ..engine.table.disk_files import DiskFile
    from ..engine.table.memslice import Batch

    for f in files:
        p = Path(f["path"])
        df = DiskFile(name=p.name, num_rows=f["rows"], size_bytes=p.stat().st_size)
        if f["kind"] == "persisted":
            df.location = "file://" + str(p)
        else:
            df.local_path = str(p)
        df.committed = BitMap64(f["committed"])
        df.pending = {pos: lsn for pos in f["pending"]}
        table.files[df.name] = df
    n_mem = mem_rows.num_rows
    dl = np.zeros(n_mem, dtype=np.uint64)
    dl[mem_deleted] = lsn
    for s in range(0, n_mem, table.mem.batch_rows):
        e = min(s + table.mem.batch_rows, n_mem)
        rb = mem_rows.slice(s, e - s).combine_chunks().to_batches()[0] if e > s else None
        if rb is not None:
            table.mem.batches.append(
                Batch(rb, np.full(e - s, lsn - 1, dtype=np.uint64), dl[s:e], np.zeros(e - s, dtype=np.uint64))
            )
    table.mem.bump()
    table.applied_lsn = lsn + 1


def _mem_live(mem_rows: pa.Table, mem_deleted: list[int]) -> pa.Table:
    keep = np.ones(mem_rows.num_rows, dtype=bool)
    keep[np.array(mem_deleted, dtype=np.int64)] = False
    return mem_rows.filter(pa.array(keep))


def _clean_copy(files: list[dict], mem_rows: pa.Table, mem_deleted: list[int]) -> pa.Table:
    """The live rows: every file's rows less its deleted positions, then the undeleted in-memory rows."""
    clean_parts = []
    for f in files:
        t = pq.read_table(f["path"])
        keep = np.ones(t.num_rows, dtype=bool)
        keep[np.array(f["committed"] + f["pending"], dtype=np.int64)] = False
        clean_parts.append(t.filter(pa.array(keep)))
    clean_parts.append(_mem_live(mem_rows, mem_deleted))
    return pa.concat_tables(clean_parts)


def _last_versions(ks: np.ndarray) -> np.ndarray:
    """Indexes of the last update of every key in ``ks``, in update order (an upsert writer's insert map)."""
    _, last = np.unique(ks[::-1], return_index=True)
    return np.sort(len(ks) - 1 - last)


def _flink_table(catalog: Any, name: str, d: Path, base_files: list[tuple[str, int]], h: _History, n: int):
    """The Flink-style v2 table (:mod:`.flink_v2`): the copy's files appended, then one upsert commit per
    1% of the rows updated (a data file of each key's last version, an equality-delete file of the keys)."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.schema import Schema

    from .flink_v2 import FlinkUpsertTable

    fields = pyarrow_to_schema(_schema().arrow_schema()).fields  # the files' field ids (PARQUET:field_id)
    schema = Schema(*fields, identifier_field_ids=[f.field_id for f in fields if f.name == "aid"])
    t = FlinkUpsertTable(catalog, f"bench.{name}_flink_v2", schema, d / "flink")
    t.append([p for p, _ in base_files])
    chunk = _chunk(n)
    for a in range(0, len(h.keys), chunk):
        ks, bs = h.keys[a : a + chunk], h.balances[a : a + chunk]
        idx = _last_versions(ks)
        t.upsert(_rows(ks[idx], bs[idx]))
    return t


def _equality_model_sql(flink: Any) -> str:
    """The model's SQL over the Flink table's files (module docstring): data rows with their commit's
    sequence number, ANTI JOIN the delete keys of later commits."""
    data_parts, del_parts = [], []
    for c in flink.commits:
        for p in c.data:
            data_parts.append(f"SELECT *, {c.sequence_number} AS __seq FROM read_parquet('{p}')")
        for p in c.deletes:
            del_parts.append(f"SELECT aid, {c.sequence_number} AS __seq FROM read_parquet('{p}')")
    if not del_parts:
        del_parts.append("SELECT NULL::INTEGER AS aid, 0 AS __seq WHERE false")
    return (
        f"SELECT d.* EXCLUDE (__seq) FROM ({' UNION ALL '.join(data_parts)}) d "
        f"ANTI JOIN ({' UNION ALL '.join(del_parts)}) e ON d.aid = e.aid AND e.__seq > d.__seq"
    )


def _mirror_v3_table(catalog: Any, name: str, d: Path, h: _History, mem_rows: pa.Table):
    """Our own v3 table, committed as the mirror persists it: the copy's files, then one persist per
    commit of updates (its data file added, the positions it deleted as deletion vectors); the last
    persist flushes the MemSlice's live rows. The data files are the MirrorTable's own."""
    from ..engine.iceberg.table import IcebergMirrorTable

    t = IcebergMirrorTable.create(catalog, f"bench.{name}_mirror_v3", _schema().arrow_schema())
    n_base = len(h.files) - sum(1 for c in h.commits if c["file"] >= 0)
    t.commit(add_files=[_uri(f["path"]) for f in h.files[:n_base]])
    for c in h.commits:
        if c["file"] >= 0:
            add = _uri(h.files[c["file"]]["path"])
        else:
            flushed = d / "mem_flush.parquet"
            _write(_mem_live(mem_rows, h.mem_deleted), flushed)
            add = _uri(flushed)
        deletes: dict[str, list[int]] = {}
        for f, row in c["deletes"]:
            deletes.setdefault(_uri(h.files[f]["path"]), []).append(row)
        t.commit(add_files=[add], deletes=deletes)
    return t


def _stats(h: _History, clean_rows: int, n_base: int, flink: Any, v3: Any) -> dict:
    files = h.files
    a, b = h.mem_range
    st = {
        "updates": len(h.keys),
        "live_rows": clean_rows,
        "deleted_rows": len(h.keys),
        "commits": len(h.commits),
        "data_files": len(files),
        "files_with_deletes": sum(1 for f in files if f["committed"] or f["pending"]),
        "persisted_files": sum(1 for f in files if f["kind"] == "persisted"),
        "flushed_files": sum(1 for f in files if f["kind"] == "flushed"),
        "committed_deletes": sum(len(f["committed"]) for f in files),
        "pending_deletes": sum(len(f["pending"]) for f in files),
        "memory_rows": b - a,
        "memory_deleted": len(h.mem_deleted),
        "base_files": n_base,
    }
    if flink is not None:
        st["flink_v2"] = dict(vars(flink.stats))
        st["equality_delete_files"] = flink.stats.equality_delete_files
        st["equality_data_files"] = flink.stats.data_files
    if v3 is not None:
        snap = v3.table.metadata.current_snapshot()
        summary = snap.summary.additional_properties if snap and snap.summary else {}
        st["mirror_v3"] = {
            "commits": len(v3.table.metadata.snapshots),
            "data_files": int(summary.get("total-data-files", 0)),
            "delete_files": int(summary.get("total-delete-files", 0)),
            "deleted_positions": int(summary.get("total-position-deletes", 0)),
        }
    return st


def _build(
    work: Path, n: int, share: float, base_files: list[tuple[str, int]], seed: int, catalog: Any, name=None
) -> _Built:
    """Build the table for one delete share in every layout (module docstring), in steps: the updates
    replayed, the engine's view loaded, the clean copy, the Flink-style v2 table (and the model over its
    files), the mirror's v3 table. ``base_files``: the copy's files (path, rows), shared by every share;
    ``catalog``: the PyIceberg catalog the two Iceberg tables are created in."""
    from ..engine.table.mirror import MirrorTable

    name = name or f"d{round(share * 100)}"
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    h = _simulate(d, n, share, base_files, seed)
    a, b = h.mem_range
    mem_rows = _rows(h.keys[a:b], h.balances[a:b])
    table = MirrorTable("accounts", "public.accounts", _schema(), None, d / "table")
    _load_engine_view(table, h.files, mem_rows, h.mem_deleted, lsn=100)
    clean = _clean_copy(h.files, mem_rows, h.mem_deleted)
    clean_path = d / "clean.parquet"
    _write(clean, clean_path)
    flink = _flink_table(catalog, name, d, base_files, h, n)
    v3 = _mirror_v3_table(catalog, name, d, h, mem_rows)
    return _Built(
        table,
        str(clean_path),
        _equality_model_sql(flink),
        clean.num_rows,
        _stats(h, clean.num_rows, len(base_files), flink, v3),
        v2_metadata=flink.metadata_location,
        v3_metadata=v3.metadata_location,
    )


def _base_files(work: Path, n: int, prefix: str = "copy") -> list[tuple[str, int]]:
    """The initial copy's files (up to 1M rows each, at least 5 files for large tables): (path, rows)."""
    base_rows = min(1_000_000, max(1, math.ceil(n / 5)))
    rng = np.random.default_rng(0)
    out = []
    for i, s in enumerate(range(0, n, base_rows)):
        aids = np.arange(s + 1, min(s + base_rows, n) + 1)
        p = work / f"{prefix}_{i}.parquet"
        _write(_rows(aids, rng.integers(-5000, 5001, len(aids))), p)
        out.append((str(p), len(aids)))
    return out


# ----------------------------------------------------------------------------------- measuring


def _serve(tables: dict, socket_path: str):
    from ..engine.service.flight import MooncakeFlightServer

    server = MooncakeFlightServer(_Service(tables), socket_path)
    th = threading.Thread(target=server.serve, daemon=True, name="bench-flight")
    th.start()
    return server, th


def make_readers(client: Any) -> dict[str, Any]:
    """The union readers of the run, built once and reused by every round and table: ``union`` (mode
    ``auto``) and ``anti_join`` (mode ``anti``), which read the rows of files with deletes again in
    every query (``hold_rows=False``: the clean side decodes its Parquet every time too, and a query
    after a change must), and ``union_held`` (holds them while nothing changed: the fixed cost per
    query of a long-lived reader)."""
    from ..engine.read import UnionReader

    return {
        "union": UnionReader(client, hold_rows=False),
        "anti_join": UnionReader(client, mode="anti", hold_rows=False),
        "union_held": UnionReader(client),
    }


def close_readers(readers: dict[str, Any]) -> None:
    for r in readers.values():
        r.con.close()


def _sources(b: _Built) -> dict[str, str | None]:
    """The FROM clause of every DuckDB-side reader (None: not available in this run)."""
    return {
        "clean": f"read_parquet('{b.clean_path}')",
        "equality_deletes_model": f"({b.eq_model_sql})",
        "duckdb_iceberg_v2_equality_deletes": f"iceberg_scan('{b.v2_metadata}')" if b.v2_metadata else None,
        "duckdb_iceberg_v3": f"iceberg_scan('{b.v3_metadata}')" if b.v3_metadata else None,
    }


def _contenders(con: Any, readers: dict, b: _Built, k: str, sql: str, q: dict, names) -> dict:
    """The timed callables of the readers ``names`` for query ``sql`` on table ``k``."""
    src = _sources(b)
    out: dict = {}
    for name in names:
        if name in readers:
            r = readers[name]
            out[name] = lambda r=r: [tuple(x.values()) for x in r.query(sql.format(**q), tables=[k]).to_pylist()]
        elif src.get(name):
            s = src[name]
            out[name] = lambda s=s: con.execute(sql.format(**dict(q, t=s))).fetchall()
    return out


def _checks(con: Any, readers: dict, b: _Built, k: str, where: str, names) -> dict:
    """Count and checksum of the rows every reader ``names`` reads for the query's range."""
    src = _sources(b)
    out = {}
    for name in names:
        if name in readers:
            row = readers[name].query(CHECK_SQL.format(t=k, where=where), tables=[k]).to_pylist()[0]
            v = tuple(row.values())
        elif src.get(name):
            v = con.execute(CHECK_SQL.format(t=src[name], where=where)).fetchone()
        else:
            continue
        out[name] = {"rows": int(v[0]), "checksum": int(v[1] or 0)}
    return out


def _ratio(a, b):
    return a / b if a is not None and b else None


def _record(sec: dict, k: str, m: dict, mc: dict, best: dict) -> None:
    """The figures of one table and query from the medians ``m`` (wall), ``mc`` (CPU) and best times."""
    put = lambda key, v: sec.setdefault(key, {}).__setitem__(k, v)
    v2, v3 = "duckdb_iceberg_v2_equality_deletes", "duckdb_iceberg_v3"
    put("seconds", m)
    put("cpu_seconds", mc)
    put("ratio_vs_clean", m["union"] / m["clean"])
    put("ratio_vs_clean_best", best["union"] / best["clean"])
    put("cpu_ratio_vs_clean", _ratio(mc["union"], mc["clean"]))
    put("anti_join_ratio_vs_clean", m["anti_join"] / m["clean"])
    put("speedup_vs_anti_join", m["anti_join"] / m["union"])
    put("speedup_vs_equality_deletes_model", m["equality_deletes_model"] / m["union"])
    put("cpu_speedup_vs_equality_deletes_model", _ratio(mc["equality_deletes_model"], mc["union"]))
    put("equality_deletes_model_ratio_vs_clean", m["equality_deletes_model"] / m["clean"])
    if v2 in m and v3 in m:
        # the comparison users make: one reader (DuckDB iceberg_scan), two layouts of the same rows
        put("speedup_vs_duckdb_iceberg_equality_deletes", m[v2] / m[v3])
        put("cpu_speedup_vs_duckdb_iceberg_equality_deletes", _ratio(mc[v2], mc[v3]))
        put("union_speedup_vs_duckdb_iceberg_equality_deletes", m[v2] / m["union"])
    for r in (v2, v3):
        if r in m:
            put(f"{r.replace('_equality_deletes', '')}_ratio_vs_clean", m[r] / m["clean"])
            put(f"{r.replace('_equality_deletes', '')}_cpu_ratio_vs_clean", _ratio(mc[r], mc["clean"]))


def _measure(
    con: Any,
    readers: dict,
    b: _Built,
    table: str,
    k: str,
    qname: str,
    bounds: tuple[int, int],
    rounds: int,
    out: dict,
    log,
) -> None:
    """Time query ``qname`` on the served table ``table`` for every reader (:data:`READERS`) available
    for ``b`` in ``rounds`` rotated rounds; record medians, ratios and checks in ``out`` under key ``k``
    (``out[qname]``, ``out["check"]``). ``bounds``: the filter's key range."""
    sec = out.setdefault(qname, {})
    lo, hi = bounds
    where = "" if qname == "scan" else f" WHERE aid BETWEEN {lo} AND {hi}"
    sql = SCAN_SQL if qname == "scan" else FILTER_SQL
    contenders = _contenders(con, readers, b, table, sql, dict(t=table, lo=lo, hi=hi), READERS)
    # the checks read every column through every reader: the first, warming read of each; the fast
    # readers run the query once more (the slow equality-delete read is not repeated for it)
    checks = _checks(con, readers, b, table, where, READERS)
    for name, c in contenders.items():
        if name not in SLOW_READERS:
            c()
    cpu: dict = {}
    times, results = interleaved(contenders, rounds, cpu=cpu)
    norm = {c: [tuple(_plain(x) for x in row) for row in v] for c, v in results.items()}
    m = {c: med(ts) for c, ts in times.items()}
    _record(sec, k, m, {c: med(ts) for c, ts in cpu.items()}, {c: min(ts) for c, ts in times.items()})
    out["check"].setdefault(k, {})[qname] = {
        **checks,
        "results_equal": len({repr(v) for v in norm.values()}) == 1,
        "results": {c: [list(r) for r in v] for c, v in norm.items()},
    }
    v2 = m.get("duckdb_iceberg_v2_equality_deletes")
    v3 = m.get("duckdb_iceberg_v3")
    log(
        f"  union_read {qname} {k} ({b.live_rows:,} rows): clean {m['clean'] * 1000:.1f} ms, union "
        f"{m['union'] * 1000:.1f} ms ({m['union'] / m['clean']:.2f}x; CPU {sec['cpu_ratio_vs_clean'][k] or 0:.2f}x), "
        f"anti join {m['anti_join'] * 1000:.1f} ms, equality-delete model {m['equality_deletes_model'] * 1000:.1f} ms"
        + (f", DuckDB iceberg_scan v3 {v3 * 1000:.1f} ms" if v3 else "")
        + (f", v2 equality deletes {v2 * 1000:.1f} ms ({v2 / v3:.1f}x v3)" if v2 and v3 else "")
    )


def _cold_query(socket_path: Any, sql: str, table: str) -> list[tuple]:
    """One query by a new ServiceClient and UnionReader, both closed after (the cold reader)."""
    from ..engine.read import UnionReader
    from ..engine.service.client import ServiceClient

    client = ServiceClient(socket_path)
    r = UnionReader(client)
    try:
        return [tuple(x.values()) for x in r.query(sql, tables=[table]).to_pylist()]
    finally:
        r.close()
        client.close()


#: the readers whose fixed cost is timed in rounds of their own (:func:`_measure_fixed`)
WARM_READERS = ("clean", "union")


def _measure_fixed(con: Any, readers: dict, b: _Built, k: str, rounds: int, out: dict, log: Any) -> None:
    """The fixed cost per query: every reader but the model on the tiny table ``k``, ``rounds`` rounds,
    and the union read by a cold reader (``union_cold``, module docstring). :data:`WARM_READERS` are
    rotated with each other only, the others in rounds of their own after them."""
    names = [r for r in READERS if r != "equality_deletes_model"]
    readers = {**readers, "union": readers["union_held"]}  # a warm reader holds what did not change
    fixed: dict = {"rows": b.live_rows, "rounds": rounds, "check": {}}
    for qname, sql in (("scan", SCAN_SQL), ("filter", FILTER_SQL)):
        lo, hi = b.live_rows // 2, b.live_rows // 2 + 9
        contenders = _contenders(con, readers, b, k, sql, dict(t=k, lo=lo, hi=hi), names)
        text = sql.format(t=k, lo=lo, hi=hi)
        contenders["union_cold"] = lambda text=text: _cold_query(readers["union"].client.socket_path, text, k)
        where = "" if qname == "scan" else f" WHERE aid BETWEEN {lo} AND {hi}"
        fixed["check"][qname] = _checks(con, readers, b, k, where, names)
        for c in contenders.values():
            c()
        # the warm readers are rotated among themselves, the heavy and cold ones apart: a query of a few
        # milliseconds timed right after a cold reader's (a new DuckDB instance, ~100 ms) or an
        # iceberg_scan cost 2-4x its time back to back (scripts/probe_fixed_cost.py), which is the
        # neighbour's cost, not the warm reader's
        cpu: dict = {}
        warm = {c: f for c, f in contenders.items() if c in WARM_READERS}
        times, results = interleaved(warm, rounds, cpu=cpu)
        rest = {c: f for c, f in contenders.items() if c not in WARM_READERS}
        t2, r2 = interleaved(rest, rounds, cpu=cpu)
        times.update(t2)
        results.update(r2)
        fixed.setdefault("cold_equals_warm", {})[qname] = results["union_cold"] == results["union"]
        ms = {c: 1000 * med(ts) for c, ts in times.items()}
        cpu_ms = {c: 1000 * med(ts) for c, ts in cpu.items()}
        out[qname]["fixed_ms_per_query"] = ms["union"]
        out[qname]["fixed_ms_per_query_warm"] = ms["union"]
        out[qname]["fixed_cpu_ms_per_query_warm"] = cpu_ms["union"]
        out[qname]["fixed_ms_per_query_cold"] = ms["union_cold"]
        out[qname]["fixed_cpu_ms_per_query_cold"] = cpu_ms["union_cold"]
        out[qname]["fixed_ms_per_query_by_reader"] = ms
        out[qname]["fixed_cpu_ms_per_query_by_reader"] = cpu_ms
        log(
            f"  union_read fixed cost per {qname} ({b.live_rows} rows): "
            + ", ".join(f"{c} {v:.2f} ms" for c, v in ms.items())
        )
    out["fixed"] = fixed


def _iceberg_connection(log: Any) -> tuple[Any, str | None]:
    """A DuckDB connection with the iceberg extension (offline), or a plain one and why not."""
    from ..engine.storage.duckdb_ext import connect_with_iceberg

    try:
        return connect_with_iceberg(), None
    except RuntimeError as e:
        log(f"  union_read: DuckDB iceberg readers skipped: {e}")
        return duckdb.connect(), str(e)


def _wait_ready(client: Any) -> None:
    for _ in range(100):
        try:
            client.status()
            return
        except Exception:
            time.sleep(0.05)


def _build_set(work: Path, catalog: Any, n: int, prefix: str, log, t0: float) -> dict[str, _Built]:
    """The three delete shares' tables at ``n`` rows (names ``<prefix>d1`` …), sharing one initial copy."""
    base_files = _base_files(work, n, f"{prefix}copy")
    built = {}
    for k, share in DELETE_SHARES.items():
        b = _build(work, n, share, base_files, seed=int(share * 1000), catalog=catalog, name=f"{prefix}{k}")
        built[k] = b
        log(
            f"  union_read: built {prefix}{k} ({n:,} rows, {b.stats['data_files']} files, {b.stats['commits']} commits, "
            f"{b.stats['memory_rows']:,} rows in memory) at {time.time() - t0:.1f}s"
        )
    return built


def _measure_set(con, readers, built: dict, prefix: str, rounds: int, out: dict, log) -> None:
    n = next(iter(built.values())).live_rows
    lo = n // 2
    bounds = (lo, lo + max(n // 1000, 10) - 1)
    for qname in ("scan", "filter"):
        for k, b in built.items():
            _measure(con, readers, b, f"{prefix}{k}", k, qname, bounds, rounds, out, log)


def _set_header(n: int, rounds: int, built: dict) -> dict:
    lo = n // 2
    return {
        "rows": n,
        "rounds": rounds,
        "commit_rows": _chunk(n),
        "queries": {
            "scan": SCAN_SQL.format(t="t"),
            "filter": FILTER_SQL.format(t="t", lo=lo, hi=lo + max(n // 1000, 10) - 1),
        },
        "tables": {k: b.stats for k, b in built.items()},
        "check": {},
    }


#: the figures of the comparison tables that the main section reports under the same names
_FROM_COMPARISON = (
    "speedup_vs_duckdb_iceberg_equality_deletes",
    "cpu_speedup_vs_duckdb_iceberg_equality_deletes",
    "union_speedup_vs_duckdb_iceberg_equality_deletes",
)


def run_union_read_bench(sizes: Sizes, workdir: str | None = None, log=print) -> dict:
    """Run the union-read suite; returns the ``union_read`` section of the bench JSON (module
    docstring): ``rows``, ``rounds``, ``readers``, ``queries``, ``tables`` (per share its layout), per
    query ``seconds``/``cpu_seconds`` per share and reader and the ratios, ``fixed``, ``check``, and
    ``duckdb_iceberg_comparison``: the same at ``Sizes.iceberg_rows`` rows with the Flink-style v2
    table read too (:data:`SLOW_READERS`), whose v2 ÷ v3 figures the main section repeats."""
    from ..engine.iceberg.catalog import make_catalog
    from ..engine.service.client import ServiceClient

    n, n_ice = sizes.union_rows, sizes.iceberg_rows
    work = Path(tempfile.mkdtemp(prefix="mooncake-bench-union-", dir=workdir))
    server = readers = None
    con, no_iceberg = _iceberg_connection(log)
    try:
        t0 = time.time()
        catalog = make_catalog(f"sqlite:///{work / 'catalog.db'}", _uri(work / "warehouse"))
        built = _build_set(work, catalog, n, "", log, t0)
        ice = _build_set(work, catalog, n_ice, "ice_", log, t0)
        tiny = _build(work, TINY_ROWS, 0.01, _base_files(work, TINY_ROWS, "tiny"), seed=7, catalog=catalog, name="tiny")
        for b in built.values():  # at the main size the v2 read would take hours: not timed there
            b.v2_metadata = None
        if no_iceberg:
            for b in (*built.values(), *ice.values(), tiny):
                b.v2_metadata = b.v3_metadata = None
        tables = {k: b.table for k, b in built.items()} | {f"ice_{k}": b.table for k, b in ice.items()}
        sock = str(work / "flight.sock")
        server, _ = _serve({**tables, "tiny": tiny.table}, sock)
        client = ServiceClient(sock)
        _wait_ready(client)
        readers = make_readers(client)
        out: dict = {
            **_set_header(n, sizes.union_rounds, built),
            "row_group_rows": ROW_GROUP,
            "readers": READERS,
            "duckdb_iceberg": {"unavailable": no_iceberg} if no_iceberg else {"extension": "iceberg (offline)"},
        }
        _measure_set(con, readers, built, "", sizes.union_rounds, out, log)
        comp = _set_header(n_ice, sizes.iceberg_rounds, ice)
        _measure_set(con, readers, ice, "ice_", sizes.iceberg_rounds, comp, log)
        out["duckdb_iceberg_comparison"] = comp
        for q in ("scan", "filter"):
            for key in _FROM_COMPARISON:
                if key in comp.get(q, {}):
                    out[q][key] = comp[q][key]
        _measure_fixed(con, readers, tiny, "tiny", sizes.union_fixed_rounds, out, log)
        client.close()
        return out
    finally:
        if readers is not None:
            close_readers(readers)
        con.close()
        if server is not None:
            try:
                server.shutdown()
            except Exception:
                pass
        shutil.rmtree(work, ignore_errors=True)


def _plain(v):
    """A query result value as a plain int (integral numbers of any type) or float."""
    if v is None or isinstance(v, int):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return int(v) if f.is_integer() else f
