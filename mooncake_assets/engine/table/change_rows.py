"""Row-level helpers of the change feed (:mod:`.changes`): the rows at some positions of a Parquet
data file (:func:`read_positions`) and the multiset difference of inserted and deleted rows
(:func:`cancel_pairs`)."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from .evolution import field_id_of

__all__ = ["cancel_pairs", "read_positions"]


def read_positions(pf: pq.ParquetFile, positions: BitMap64, only: pa.Schema | None = None) -> pa.Table:
    """The rows at ``positions`` (0-based, ascending) of the Parquet file ``pf``, in that order. Only the
    row groups holding one of them are read, and each is taken from on its own (a take over the whole
    file's chunked columns would first concatenate them); every row of the file: read as it is.
    ``only``: read just the file's columns that match these fields (by field id, else by name)."""
    md = pf.metadata
    cols = None if only is None else _file_columns(pf.schema_arrow, only)
    if len(positions) == md.num_rows:
        return pf.read(columns=cols)
    pos = np.fromiter(positions, dtype=np.int64, count=len(positions))
    parts, start = [], 0
    for rg in range(md.num_row_groups):
        n = md.row_group(rg).num_rows
        lo, hi = np.searchsorted(pos, [start, start + n])
        if hi > lo:
            parts.append(pf.read_row_group(rg, columns=cols).take(pa.array(pos[lo:hi] - start)))
        start += n
    if parts:
        return pa.concat_tables(parts)
    empty = pf.schema_arrow.empty_table()
    return empty if cols is None else empty.select(cols)


def _file_columns(have: pa.Schema, want: pa.Schema) -> list[str]:
    """Names in the file schema ``have`` of the fields of ``want``, matched by field id (by name when the
    file carries no ids); a field the file lacks is left out (:func:`.evolution.project` fills it)."""
    by_id = {field_id_of(f): f.name for f in have if field_id_of(f) is not None}
    names = set(have.names)
    out = []
    for f in want:
        fid = field_id_of(f)
        name = by_id.get(fid) if (by_id and fid is not None) else (f.name if f.name in names else None)
        if name is not None:
            out.append(name)
    return out


def cancel_pairs(ins: pa.Table, dels: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Boolean keep masks (one per row of ``ins``, of ``dels``) after removing pairs of equal rows, one
    insert with one delete each (multiset difference; same schema). Rows are matched by a 64-bit hash
    of all their values (DuckDB ``hash``) and then compared value by value, so a hash collision never
    cancels two different rows."""
    keep_i = np.ones(ins.num_rows, dtype=bool)
    keep_d = np.ones(dels.num_rows, dtype=bool)
    if not ins.num_rows or not dels.num_rows:
        return keep_i, keep_d
    hi, hd = _row_hashes(ins), _row_hashes(dels)
    common = np.intersect1d(hi, hd)
    if not len(common):
        return keep_i, keep_d
    by_hash: dict[int, list[int]] = {}
    for dj in np.nonzero(np.isin(hd, common))[0]:
        by_hash.setdefault(int(hd[dj]), []).append(int(dj))
    cand_i = np.nonzero(np.isin(hi, common))[0]
    i_rows = ins.take(pa.array(cand_i)).to_pylist()
    d_idx = sorted({j for js in by_hash.values() for j in js})
    d_rows = dict(zip(d_idx, dels.take(pa.array(d_idx, type=pa.int64())).to_pylist()))
    for i, row in zip(cand_i, i_rows):
        js = by_hash.get(int(hi[i]), [])
        for n, j in enumerate(js):
            if repr(d_rows[j]) == repr(row):  # repr: NaN equals NaN, as in the rows' multiset
                keep_i[i] = keep_d[j] = False
                del js[n]
                break
    return keep_i, keep_d


_local = threading.local()


def _row_hashes(t: pa.Table) -> np.ndarray:
    """DuckDB ``hash`` over all columns of every row of ``t`` (uint64). One in-memory DuckDB connection
    per thread is kept for it (opening one costs more than hashing a feed of thousands of rows)."""
    import duckdb

    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect()
    try:
        con.register("_feed_rows", t)
        cols = ", ".join('"' + c.replace('"', '""') + '"' for c in t.column_names)
        out = con.execute(f"SELECT hash({cols}) AS h FROM _feed_rows").arrow()
        h = out.column("h") if isinstance(out, pa.Table) else out.read_all().column("h")
        return np.asarray(h.to_numpy(zero_copy_only=False), dtype=np.uint64)
    finally:
        con.unregister("_feed_rows")
