"""Union-read benchmark: a mirrored table with deletes vs. a clean Parquet copy of its live
rows, and vs. the same table stored the way an equality-delete writer (Flink CDC) stores it.

The table has the shape of ``pgbench_accounts`` (aid int4 key, bid int4, abalance int4, filler
char(84)). It is built directly with the engine's classes, as the service would hold it after an
initial copy of ``rows`` rows and then ``d × rows`` single-row UPDATEs of random keys (``d`` = 1%, 10%,
30%): every UPDATE deletes the key's current version (a position in a data file, or a row of the
in-memory buffer) and appends the new version. The first 60% of the updates were flushed and
persisted (data files + deletion vectors, ``DiskFile.committed``), the next 30% flushed but not
persisted (staged files + pending position deletes), the last 10% are in the MemSlice (BatchDV
applied) — so deletes are spread over persisted files, flushed files and the in-memory buffer.
Flushed files hold ``rows / 25`` rows each, copy files up to 1M rows, row groups 128 Ki rows.

Measured (interleaved rounds, medians; see :mod:`.common`), per delete share:

- ``clean``: DuckDB over one clean Parquet file of exactly the live rows (written from this module's
  own bookkeeping, not by the reader);
- ``union``: :class:`~mooncake_assets.engine.read.UnionReader` ``.query(sql)`` — ReadState over Arrow
  Flight from a :class:`~mooncake_assets.engine.service.flight.MooncakeFlightServer` serving the
  tables' real ``MirrorTable.read_state``, in-memory rows by ``do_get``, view registration, query —
  all inside the timed call;
- ``anti_join``: the same with the reader's ``anti`` mode (the first reader: one ANTI JOIN per file);
- ``equality_deletes``: the Flink CDC layout — the same base files, then per commit a data file of the
  new versions and an equality-delete file of their keys, both with that commit's data sequence
  number; read as Iceberg specifies: a data row is dropped when an equality delete of its key has a
  higher sequence number (``ANTI JOIN … ON key AND seq``).

The reader memoizes decoded deletion vectors and per-file read plans by the vectors' bytes
(:mod:`mooncake_assets.engine.read.plan`), so from the second round on it reads like a long-lived
reader of an unchanged table; the ReadState itself (Flight round trip, bitmaps serialized by the
service) and the Parquet reads are paid in every round.

Queries: ``scan`` (an aggregate over the whole table) and ``filter`` (a range of 0.1% of the keys).
Every side's rows are checked: count and checksum (``sum(hash(all columns) % p)``) of what each
query reads, and the query results themselves, must be equal; they are recorded under ``check``.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from .common import Sizes, interleaved, med

DELETE_SHARES = {"d1": 0.01, "d10": 0.10, "d30": 0.30}
ROW_GROUP = 128 * 1024
SCAN_SQL = "SELECT count(*) AS n, sum(abalance) AS s, sum(bid) AS b FROM {t}"
FILTER_SQL = "SELECT count(*) AS n, sum(abalance) AS s FROM {t} WHERE aid BETWEEN {lo} AND {hi}"
CHECK_SQL = "SELECT count(*) AS n, sum(hash(aid, bid, abalance, filler) % 1000000007) AS h FROM {t}{where}"
FILLER = " " * 84


def _schema():
    from ..engine.pg.schema import ColumnSpec, TableSchema

    cols = [
        ColumnSpec("aid", 23, -1, "integer", pa.int32(), not_null=True, is_key=True),
        ColumnSpec("bid", 23, -1, "integer", pa.int32()),
        ColumnSpec("abalance", 23, -1, "integer", pa.int32()),
        ColumnSpec("filler", 1042, 88, "character(84)", pa.string()),
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
    pq.write_table(t, path, compression="zstd", row_group_size=ROW_GROUP)
    return path.stat().st_size


class _Service:
    """The part of ReplicatorService the Flight server calls for reads, over in-process MirrorTables."""

    def __init__(self, tables: dict):
        self.tables = tables

    def read_state(self, name: str, lsn=None):
        t = self.tables[name]
        return t.read_state(lsn)

    def status(self) -> dict:
        return {"tables": [{"name": n, "state": "ready"} for n in self.tables]}

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int:
        """The Flight ``wait_lsn`` action: the tables are built in-process, every LSN is applied."""
        return lsn

    def stop(self) -> None:
        pass


class _Built:
    """One table: the MirrorTable (files + DVs + MemSlice), the clean copy and the equality-delete layout."""

    def __init__(self, table, clean_path: str, eq_view_sql: str, live_rows: int, stats: dict):
        self.table = table
        self.clean_path = clean_path
        self.eq_view_sql = eq_view_sql
        self.live_rows = live_rows
        self.stats = stats


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
    table.applied_lsn = lsn + 1


def _clean_copy(files: list[dict], mem_rows: pa.Table, mem_deleted: list[int]) -> pa.Table:
    """The live rows: every file's rows less its deleted positions, then the undeleted in-memory rows."""
    clean_parts = []
    for f in files:
        t = pq.read_table(f["path"])
        keep = np.ones(t.num_rows, dtype=bool)
        keep[np.array(f["committed"] + f["pending"], dtype=np.int64)] = False
        clean_parts.append(t.filter(pa.array(keep)))
    keep = np.ones(mem_rows.num_rows, dtype=bool)
    keep[np.array(mem_deleted, dtype=np.int64)] = False
    clean_parts.append(mem_rows.filter(pa.array(keep)))
    return pa.concat_tables(clean_parts)


def _equality_layout(
    d: Path, base_files: list[tuple[str, int]], eq_chunks: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[str, int, int]:
    """Write the equality-delete layout (base files at seq 1, then per commit one data file + one delete
    file); returns (the SQL reading it, number of data parts, number of delete files)."""
    data_parts = [f"SELECT *, 1 AS __seq FROM read_parquet([{', '.join(repr(p) for p, _ in base_files)}])"]
    del_parts = []
    eq_bytes = 0
    for c, (ks, bs) in enumerate(eq_chunks):
        seq = c + 2
        # the writer keeps one version per key within a commit (the last), like Flink's insert map
        _, last = np.unique(ks[::-1], return_index=True)
        idx = np.sort(len(ks) - 1 - last)
        dp, ep = d / f"eq_data_{c}.parquet", d / f"eq_del_{c}.parquet"
        eq_bytes += _write(_rows(ks[idx], bs[idx]), dp)
        pq.write_table(pa.table({"aid": pa.array(np.unique(ks), pa.int32())}), ep, compression="zstd")
        eq_bytes += ep.stat().st_size
        data_parts.append(f"SELECT *, {seq} AS __seq FROM read_parquet('{dp}')")
        del_parts.append(f"SELECT aid, {seq} AS __seq FROM read_parquet('{ep}')")
    eq_sql = (
        f"SELECT d.* EXCLUDE (__seq) FROM ({' UNION ALL '.join(data_parts)}) d "
        f"ANTI JOIN ({' UNION ALL '.join(del_parts)}) e ON d.aid = e.aid AND e.__seq > d.__seq"
    )
    return eq_sql, len(data_parts), len(del_parts)


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


def _build(work: Path, n: int, share: float, base_files: list[tuple[str, int]], seed: int) -> _Built:
    """Build the table for one delete share (module docstring). ``base_files``: the copy's files
    (path, rows), shared by every share."""
    from ..engine.table.mirror import MirrorTable

    rng = np.random.default_rng(seed)
    d = work / f"d{round(share * 100)}"
    d.mkdir(parents=True, exist_ok=True)
    table = MirrorTable("accounts", "public.accounts", _schema(), None, d / "table")
    u = int(round(n * share))
    keys = rng.integers(1, n + 1, u).astype(np.int64)
    balances = rng.integers(-5000, 5001, u).astype(np.int64)
    chunk = max(n // 25, 1000)
    n_persist, n_flush = int(u * 0.6), int(u * 0.9)
    # where each key's current version is: file index (into files) and row; -1 = in memory
    files: list[dict] = []  # {"path", "rows", "committed": list, "pending": list, "kind"}
    base_rows = base_files[0][1]
    for path, rows in base_files:
        files.append({"path": path, "rows": rows, "committed": [], "pending": [], "kind": "persisted"})
    loc_file = np.empty(n + 1, dtype=np.int64)
    loc_row = np.empty(n + 1, dtype=np.int64)
    aids_all = np.arange(1, n + 1)
    loc_file[1:] = (aids_all - 1) // base_rows
    loc_row[1:] = (aids_all - 1) % base_rows
    mem_deleted: list[int] = []
    eq_chunks: list[tuple[np.ndarray, np.ndarray]] = []  # (keys, balances) per commit, in order
    segments = _segments(u, n_persist, n_flush, chunk)
    for si, (a, b) in enumerate(segments):
        ks, bs = keys[a:b], balances[a:b]
        in_mem = si == len(segments) - 1
        persisted_phase = b <= n_persist
        fi = -1 if in_mem else len(files)
        if not in_mem:
            files.append(
                {
                    "path": str(d / f"upd_{si}.parquet"),
                    "rows": len(ks),
                    "committed": [],
                    "pending": [],
                    "kind": "persisted" if persisted_phase else "flushed",
                }
            )
        lf, lr = loc_file, loc_row
        for r, k in enumerate(ks.tolist()):
            f = lf[k]
            if f == -1:
                mem_deleted.append(int(lr[k]))
            else:
                files[f]["committed" if persisted_phase else "pending"].append(int(lr[k]))
            lf[k] = fi
            lr[k] = r
        if not in_mem:
            _write(_rows(ks, bs), Path(files[fi]["path"]))
        eq_chunks.append((ks, bs))
    # the engine's view of it
    lsn = 100
    mks, mbs = keys[n_flush:], balances[n_flush:]
    mem_rows = _rows(mks, mbs)
    _load_engine_view(table, files, mem_rows, mem_deleted, lsn)
    # the clean copy: live rows from this module's bookkeeping
    clean = _clean_copy(files, mem_rows, mem_deleted)
    clean_path = d / "clean.parquet"
    _write(clean, clean_path)
    # the equality-delete layout: base files (seq 1), then per commit one data file + one delete file
    eq_sql, n_eq_data, n_eq_del = _equality_layout(d, base_files, eq_chunks)
    stats = {
        "updates": u,
        "live_rows": clean.num_rows,
        "deleted_rows": u,
        "data_files": len(files),
        "files_with_deletes": sum(1 for f in files if f["committed"] or f["pending"]),
        "persisted_files": sum(1 for f in files if f["kind"] == "persisted"),
        "flushed_files": sum(1 for f in files if f["kind"] == "flushed"),
        "committed_deletes": sum(len(f["committed"]) for f in files),
        "pending_deletes": sum(len(f["pending"]) for f in files),
        "memory_rows": len(mks),
        "memory_deleted": len(mem_deleted),
        "equality_delete_files": n_eq_del,
        "equality_data_files": n_eq_data - 1 + len(base_files),
    }
    return _Built(table, str(clean_path), eq_sql, clean.num_rows, stats)


def _serve(tables: dict, socket_path: str):
    from ..engine.service.flight import MooncakeFlightServer

    server = MooncakeFlightServer(_Service(tables), socket_path)
    th = threading.Thread(target=server.serve, daemon=True, name="bench-flight")
    th.start()
    return server, th


def _measure(
    con: Any, client: Any, b: _Built, k: str, qname: str, lo: int, hi: int, sizes: Sizes, out: dict, log: Any
) -> None:
    """Time query ``qname`` on table ``k`` for every contender (clean copy, union read, anti join,
    equality deletes), interleaved; record times, ratios and checks in ``out`` (``out[qname]``, ``out["check"]``)."""
    from ..engine.read import UnionReader

    sec = out[qname]
    where = "" if qname == "scan" else f" WHERE aid BETWEEN {lo} AND {hi}"
    sql = SCAN_SQL if qname == "scan" else FILTER_SQL
    clean_src = f"read_parquet('{b.clean_path}')"
    eq_src = f"({b.eq_view_sql})"
    reader = UnionReader(client)
    anti = UnionReader(client, mode="anti")
    q = dict(t=k, lo=lo, hi=hi)
    contenders = {
        "clean": lambda: con.execute(sql.format(**dict(q, t=clean_src))).fetchall(),
        "union": lambda: [tuple(r.values()) for r in reader.query(sql.format(**q), tables=[k]).to_pylist()],
        "anti_join": lambda: [tuple(r.values()) for r in anti.query(sql.format(**q), tables=[k]).to_pylist()],
        "equality_deletes": lambda: con.execute(sql.format(**dict(q, t=eq_src))).fetchall(),
    }
    contenders["clean"]()  # warm the OS cache and DuckDB's metadata for every side alike
    cpu: dict = {}
    times, results = interleaved(contenders, sizes.union_rounds, cpu=cpu)
    norm = {c: [tuple(_plain(x) for x in row) for row in v] for c, v in results.items()}
    same = len({repr(v) for v in norm.values()}) == 1
    m = {c: med(ts) for c, ts in times.items()}
    best = {c: min(ts) for c, ts in times.items()}
    sec.setdefault("seconds", {})[k] = m
    sec.setdefault("ratio_vs_clean", {})[k] = m["union"] / m["clean"]
    sec.setdefault("ratio_vs_clean_best", {})[k] = best["union"] / best["clean"]
    mc = {c: med(ts) for c, ts in cpu.items()}
    sec.setdefault("cpu_seconds", {})[k] = mc
    sec.setdefault("cpu_ratio_vs_clean", {})[k] = mc["union"] / mc["clean"] if mc["clean"] else None
    sec.setdefault("cpu_speedup_vs_equality_deletes", {})[k] = (
        mc["equality_deletes"] / mc["union"] if mc["union"] else None
    )
    sec.setdefault("anti_join_ratio_vs_clean", {})[k] = m["anti_join"] / m["clean"]
    sec.setdefault("speedup_vs_anti_join", {})[k] = m["anti_join"] / m["union"]
    sec.setdefault("speedup_vs_equality_deletes", {})[k] = m["equality_deletes"] / m["union"]
    sec.setdefault("equality_deletes_ratio_vs_clean", {})[k] = m["equality_deletes"] / m["clean"]
    # what each side read: count + checksum of the rows the query ranges over
    ck = {
        "clean": con.execute(CHECK_SQL.format(t=clean_src, where=where)).fetchone(),
        "union": tuple(reader.query(CHECK_SQL.format(t=k, where=where), tables=[k]).to_pylist()[0].values()),
        "anti_join": tuple(anti.query(CHECK_SQL.format(t=k, where=where), tables=[k]).to_pylist()[0].values()),
        "equality_deletes": con.execute(CHECK_SQL.format(t=eq_src, where=where)).fetchone(),
    }
    out["check"].setdefault(k, {})[qname] = {
        **{c: {"rows": int(v[0]), "checksum": int(v[1] or 0)} for c, v in ck.items()},
        "results_equal": same,
        "results": {c: [list(r) for r in v] for c, v in norm.items()},
    }
    reader.con.close()
    anti.con.close()
    log(
        f"  union_read {qname} {k}: clean {m['clean'] * 1000:.1f} ms, union {m['union'] * 1000:.1f} ms "
        f"({m['union'] / m['clean']:.2f}x; CPU {sec['cpu_ratio_vs_clean'][k] or 0:.2f}x), "
        f"anti join {m['anti_join'] * 1000:.1f} ms, "
        f"equality deletes {m['equality_deletes'] * 1000:.1f} ms"
    )


def run_union_read_bench(sizes: Sizes, workdir: str | None = None, log=print) -> dict:
    """Run the union-read suite; returns the ``union_read`` section of the bench JSON."""
    from ..engine.service.client import ServiceClient

    n = sizes.union_rows
    work = Path(tempfile.mkdtemp(prefix="mooncake-bench-union-", dir=workdir))
    server = None
    try:
        t0 = time.time()
        base_rows = min(1_000_000, max(1, math.ceil(n / 5)))
        rng = np.random.default_rng(0)
        base_files = []
        for i, s in enumerate(range(0, n, base_rows)):
            aids = np.arange(s + 1, min(s + base_rows, n) + 1)
            p = work / f"copy_{i}.parquet"
            _write(_rows(aids, rng.integers(-5000, 5001, len(aids))), p)
            base_files.append((str(p), len(aids)))
        built = {}
        for k, share in DELETE_SHARES.items():
            built[k] = _build(work, n, share, base_files, seed=int(share * 1000))
            log(
                f"  union_read: built {k} ({built[k].stats['data_files']} files, "
                f"{built[k].stats['memory_rows']:,} rows in memory) at {time.time() - t0:.1f}s"
            )
        sock = str(work / "flight.sock")
        server, _ = _serve({k: b.table for k, b in built.items()}, sock)
        client = ServiceClient(sock)
        for _ in range(100):
            try:
                client.status()
                break
            except Exception:
                time.sleep(0.05)
        lo = n // 2
        hi = lo + max(n // 1000, 10) - 1
        out: dict = {
            "rows": n,
            "row_group_rows": ROW_GROUP,
            "rounds": sizes.union_rounds,
            "queries": {"scan": SCAN_SQL.format(t="t"), "filter": FILTER_SQL.format(t="t", lo=lo, hi=hi)},
            "tables": {k: b.stats for k, b in built.items()},
            "check": {},
        }
        con = duckdb.connect()
        for qname in ("scan", "filter"):
            out.setdefault(qname, {})
            for k, b in built.items():
                _measure(con, client, b, k, qname, lo, hi, sizes, out, log)
        client.close()
        return out
    finally:
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
