"""Row-level helpers of the change feed (:mod:`.changes`): the rows at some positions of a Parquet
data file (:func:`read_positions`) and the multiset difference of inserted and deleted rows
(:func:`cancel_pairs`)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from .evolution import field_id_of

__all__ = ["cancel_pairs", "read_positions"]


def read_positions(source: Any, positions: BitMap64, only: pa.Schema | None = None) -> pa.Table:
    """The rows at ``positions`` (0-based, ascending) of the Parquet file ``source`` (a path or a
    seekable binary stream, as ``pyarrow.parquet.ParquetFile`` takes; a ``ParquetFile`` is read as
    it is opened), in that order. Only the row groups holding one of them are read, and each is taken
    from on its own (a take over the whole file's chunked columns would first concatenate them).
    Their top-level string and binary columns are read as dictionaries (Parquet's dictionary
    encoding, PARQUET-format "Encodings") and only the taken values decoded: a low-cardinality
    column (a status, a padded ``char(n)``) is then not materialized for every row of the row group
    (5 pgbench-shaped files, 1 in 125 rows: 0.11 s instead of 0.38 s); the result has the file's
    types. Every row of the file: read as it is. ``only``: read just the file's columns that match
    these fields (by field id, else by name)."""
    pf = source if isinstance(source, pq.ParquetFile) else pq.ParquetFile(source)
    md = pf.metadata
    cols = None if only is None else _file_columns(pf.schema_arrow, only)
    if len(positions) == md.num_rows:
        return pf.read(columns=cols)
    types = pf.schema_arrow
    byte_cols = [
        f.name
        for f in types
        if (cols is None or f.name in cols)
        and (pa.types.is_string(f.type) or pa.types.is_binary(f.type) or pa.types.is_large_string(f.type))
    ]
    if byte_cols and not isinstance(source, pq.ParquetFile):
        pf = pq.ParquetFile(source, metadata=md, read_dictionary=byte_cols)
    pos = np.fromiter(positions, dtype=np.int64, count=len(positions))
    parts, start = [], 0
    for rg in range(md.num_row_groups):
        n = md.row_group(rg).num_rows
        lo, hi = np.searchsorted(pos, [start, start + n])
        if hi > lo:
            parts.append(_decoded(pf.read_row_group(rg, columns=cols).take(pa.array(pos[lo:hi] - start)), types))
        start += n
    if parts:
        return pa.concat_tables(parts)
    empty = types.empty_table()
    return empty if cols is None else empty.select(cols)


def _decoded(rows: pa.Table, types: pa.Schema) -> pa.Table:
    """``rows`` with its dictionary columns decoded to the file's type of the column (``types``)."""
    if not any(pa.types.is_dictionary(f.type) for f in rows.schema):
        return rows
    return rows.cast(pa.schema([types.field(f.name) for f in rows.schema]))


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


def cancel_pairs(ins: pa.Table, dels: pa.Table, key: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Boolean keep masks (one per row of ``ins``, of ``dels``) after removing pairs of equal rows, one
    insert with one delete each (multiset difference; same schema). Two rows are equal when their
    Python values' ``repr`` are (NaN equals NaN, NULL equals NULL, ``-0.0`` differs from ``0.0``).

    ``key``: the table's key columns. Equal rows have equal keys, so where no key value is null and
    every key value occurs at most once on each side (a keyed table's reads), the rows are paired by
    key (Arrow ``index_in`` of one key column, a hash join of several) and each pair compared column by column in Arrow
    (:func:`_same_values`; columns of other types by ``repr``, pair by pair), without hashing the rows.
    Otherwise (no key, a null or repeated key, a floating-point key, a key type Arrow cannot join on) rows are matched by a
    64-bit hash of all their values (DuckDB ``hash``) and then compared value by value, so a hash
    collision never cancels two different rows."""
    keep_i = np.ones(ins.num_rows, dtype=bool)
    keep_d = np.ones(dels.num_rows, dtype=bool)
    if not ins.num_rows or not dels.num_rows:
        return keep_i, keep_d
    pairs = _key_pairs(ins, dels, key) if key else None
    if pairs is not None:
        pi, pd = pairs
        if len(pi):
            same = _same_values(ins, dels, pi, pd)
            keep_i[pi[same]] = False
            keep_d[pd[same]] = False
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


_I, _D = "__mc_i", "__mc_d"


def _key_pairs(ins: pa.Table, dels: pa.Table, key: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Row numbers ``(in ins, in dels)`` of the rows with equal keys, when no key value is null and no
    row meets more than one on the other side; None otherwise (the caller hashes whole rows). One key
    column: ``index_in`` of the deleted keys among the inserted ones (distinct); several: a hash join."""
    if any(ins.column(k).null_count or dels.column(k).null_count for k in key):
        return None
    if any(pa.types.is_floating(ins.schema.field(k).type) for k in key):
        return None  # NaN keys: a hash lookup need not pair them, while their rows can be equal
    try:
        if len(key) == 1:
            a, b = ins.column(key[0]).combine_chunks(), dels.column(key[0]).combine_chunks()
            if not _distinct(a):
                return None
            at = pc.index_in(b, value_set=a)
            pd = np.flatnonzero(np.asarray(at.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
            pi = np.asarray(at.drop_null().to_numpy(zero_copy_only=False), dtype=np.int64)
        else:
            ta = ins.select(key).append_column(_I, pa.array(np.arange(ins.num_rows, dtype=np.int64)))
            tb = dels.select(key).append_column(_D, pa.array(np.arange(dels.num_rows, dtype=np.int64)))
            j = ta.join(tb, keys=key, join_type="inner", use_threads=False)
            pi = np.asarray(j.column(_I).to_numpy(), dtype=np.int64)
            pd = np.asarray(j.column(_D).to_numpy(), dtype=np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
        return None
    if not (_distinct_ints(pi) and _distinct_ints(pd)):
        return None  # a key met twice: not a keyed read, pair by whole-row hashes
    return pi, pd


def _distinct_ints(x: np.ndarray) -> bool:
    s = np.sort(x)
    return not bool((s[1:] == s[:-1]).any())


def _distinct(x: pa.Array) -> bool:
    """Whether the non-null values of ``x`` are all different."""
    if pa.types.is_integer(x.type):
        return _distinct_ints(np.asarray(x.to_numpy(zero_copy_only=False)))
    return len(pc.unique(x)) == len(x)


def _same_values(ins: pa.Table, dels: pa.Table, pi: np.ndarray, pd: np.ndarray) -> np.ndarray:
    """Pair by pair (row ``pi[n]`` of ``ins``, row ``pd[n]`` of ``dels``; same schema), whether the two
    rows hold equal values in the sense of :func:`cancel_pairs`. Columns are compared one at a time,
    fixed-width types first, each for the pairs still equal on the ones before (an UPDATE's pair
    usually differs on a narrow column, so wide ones are rarely taken): integer, boolean, string,
    binary, decimal, temporal types and floats in Arrow/NumPy, any other type (nested) by the
    ``repr`` of its values."""
    same = np.ones(len(pi), dtype=bool)
    names = sorted(ins.column_names, key=lambda c: not pa.types.is_primitive(ins.schema.field(c).type))
    for name in names:
        at = np.flatnonzero(same)
        if not len(at):
            break
        x = ins.column(name).take(pa.array(pi[at])).combine_chunks()
        y = dels.column(name).take(pa.array(pd[at])).combine_chunks()
        eq = _column_equal(x, y)
        if eq is None:  # a type compared by repr
            eq = np.array([repr(u) == repr(v) for u, v in zip(x.to_pylist(), y.to_pylist())], dtype=bool)
        same[at] = eq
    return same


def _column_equal(x: pa.Array, y: pa.Array) -> np.ndarray | None:
    """Equal values of ``x`` and ``y`` pairwise (both NULL: equal; floats: NaN equals NaN, ``-0.0``
    differs from ``0.0``, as their ``repr``); None for a type compared here by ``repr`` only."""
    t = x.type
    both_null = np.asarray(pc.and_(x.is_null(), y.is_null()).to_numpy(zero_copy_only=False), dtype=bool)
    valid = np.asarray(pc.and_(x.is_valid(), y.is_valid()).to_numpy(zero_copy_only=False), dtype=bool)
    try:
        if pa.types.is_floating(t):
            xv = np.asarray(x.fill_null(0).to_numpy(zero_copy_only=False))
            yv = np.asarray(y.fill_null(0).to_numpy(zero_copy_only=False))
            with np.errstate(invalid="ignore"):
                eq = ((xv == yv) & (np.signbit(xv) == np.signbit(yv))) | (np.isnan(xv) & np.isnan(yv))
        elif (
            pa.types.is_integer(t)
            or pa.types.is_boolean(t)
            or pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or pa.types.is_decimal(t)
            or pa.types.is_temporal(t)
        ):
            eq = np.asarray(pc.fill_null(pc.equal(x, y), False).to_numpy(zero_copy_only=False), dtype=bool)
        else:
            return None
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    return np.asarray((valid & eq) | both_null, dtype=bool)


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
