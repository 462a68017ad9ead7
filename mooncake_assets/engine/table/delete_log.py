"""The per-persist delete log: the keys of the rows one Iceberg commit newly deletes from older data files.

The change feed with deletes as keys (:mod:`.change_keys`) needs, for each position a snapshot newly
deletes in a data file an older snapshot already had, the key of the row there. Read from the data
file, that is a read of the key column of nearly every row group (random deletes of 1 % of a table
touch them all). Yet the key is known when the delete is applied: the DELETE (or the old half of an
UPDATE) carries it, and the lookup finds the file position from it. So the mirror keeps it:

- **While applying** (:class:`DeleteLog`): for a table with a primary key, each delete of a data-file
  row records ``(file name, position, key)``, the key as the Postgres text the change carried.
  Deletes of buffered rows are not recorded (a buffered row never reaches an older file). At most
  :data:`MAX_LOG_BYTES` per table between persists (counted in the service's memory budget); past
  that, deletes are not logged and the feed reads their keys from the files.
- **At persist** (:func:`build_log`, :func:`write_log`): the entries for positions the commit newly
  writes into the deletion vectors of files that were already persisted are decoded to the key
  columns' types (the decoder that wrote the rows) and written as ONE Parquet file
  ``<table location>/delete-log/<uuid>.parquet`` *before* the commit; the commit's snapshot names it
  in its summary property ``mooncake.delete-log``. A later snapshot does not carry the property over
  (each log describes its own commit). A crash between the write and the commit leaves an orphan
  file that nothing references (orphan cleanup removes it); the next persist writes a new log. The
  in-memory entries are dropped after every persist.
- **In the feed** (:func:`read_logs`, :func:`logged_keys`): the keys of the positions a range newly
  deleted in a file are taken from the logs of the range's snapshots when those logs hold every one
  of them; otherwise (a snapshot written before the logs existed, one whose log could not be decoded,
  an expired snapshot inside the range) the file's key column is read, as before. Compaction and
  index merges write no log: they delete nothing logically (a compacted file leaves the table and is
  read in full).

**Whole old rows** (REPLICA IDENTITY FULL): a change that carried the whole old row (pgoutput's
``'O'`` old tuple, every value present) also records the other columns' text. At persist they are
decoded like the keys and written in the same log file after ``_mooncake_full`` (true where the entry
holds the whole old row); the snapshot summary ``mooncake.delete-log-rows`` counts them. The full-row
feed (:meth:`.changes.ChangePlan.gather`) takes a file's deleted rows from the logs when they hold the
whole row of every position it needs, else reads the file (:func:`read_logs` with ``full_only``).

Log file columns: ``_mooncake_data_file`` (string: the data file's location as the manifests name
it), ``_mooncake_pos`` (int64: 0-based row position in it), then the key columns by name with their
Arrow types; with whole old rows, ``_mooncake_full`` (bool) and the other columns by name (nullable,
null where the entry holds the key only). Column fields carry their Iceberg field id
(``PARQUET:field_id``). Rows sorted by file and position, one per position.
"""

from __future__ import annotations

import io as _io
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from ..cdc import decode_text_columns

__all__ = [
    "DeleteLog",
    "FILE_COLUMN",
    "FULL_COLUMN",
    "POS_COLUMN",
    "build_log",
    "logged_keys",
    "read_logs",
    "typed_entries",
    "write_log",
]

log = logging.getLogger(__name__)

FILE_COLUMN = "_mooncake_data_file"
POS_COLUMN = "_mooncake_pos"
#: bool column of a log holding whole old rows: true where the entry's other columns are the old row's
FULL_COLUMN = "_mooncake_full"
#: file name -> (positions ascending, int64; the key columns' rows at them, in that order)
Logged = dict[str, tuple[np.ndarray, pa.Table]]


#: bytes one table's log may hold between persists; deletes past it are not logged (their keys are
#: then read from the files, as without a log), so a huge UPDATE costs no more memory than its pending deletes
MAX_LOG_BYTES = 16 << 20
#: estimated bytes of one row-wise entry not yet in a chunk
ROW_ENTRY_BYTES = 100


class DeleteLog:
    """Deletes of data-file rows since the last persist with the keys the changes carried (module
    docstring). ``key_names``: the key columns the keys are of (in order); ``max_bytes``: past it new
    entries are dropped (:data:`MAX_LOG_BYTES`); ``value_names``: the table's other columns (in table
    order), whose old values an entry also holds when its change carried the whole old row
    (REPLICA IDENTITY FULL: ``full_rows`` counts those entries)."""

    def __init__(
        self, key_names: Sequence[str], max_bytes: int = MAX_LOG_BYTES, value_names: Sequence[str] = ()
    ) -> None:
        self.key_names = list(key_names)
        self.value_names = list(value_names)
        self.max_bytes = max_bytes
        self.dropped = 0  # entries not kept since the last persist (over max_bytes)
        self.full_rows = 0  # entries holding the whole old row
        self._bytes = 0
        self._chunks: list[pa.Table] = []
        self._files: list[str] = []  # row-wise deletes, turned into a chunk on the next batch or read
        self._rows: list[int] = []
        self._keys: list[list[Any]] = [[] for _ in self.key_names]
        self._full: list[bool] = []
        self._vals: list[list[Any]] = [[] for _ in self.value_names]

    def restarted(self, key_names: Sequence[str], value_names: Sequence[str]) -> DeleteLog:
        """An empty log of the same byte budget for a table whose columns changed (a schema change: the
        entries held, text of the old columns, cannot be decoded under the new ones)."""
        return DeleteLog(key_names, self.max_bytes, value_names)

    def add(self, fname: str, row: int, key: Sequence[Any], values: Sequence[Any] | None = None) -> None:
        """Position ``row`` of file ``fname`` deleted; ``key``: its key as text values (None: NULL). A key
        with another value (an unchanged TOAST marker) is not recorded (that file's keys are then read
        from the file). ``values``: the old row's other columns (``value_names``) as text values when the
        change carried the whole old row; with any other value (an unchanged TOAST marker) the entry
        holds the key only."""
        if not all(v is None or isinstance(v, str) for v in key):
            return
        if self._bytes >= self.max_bytes:
            self.dropped += 1
            return
        full = (
            values is not None
            and len(values) == len(self.value_names)
            and all(v is None or isinstance(v, str) for v in values)
        )
        self._bytes += ROW_ENTRY_BYTES + (sum(len(v) for v in values if v) if full and values is not None else 0)
        self._files.append(fname)
        self._rows.append(int(row))
        for col, v in zip(self._keys, key):
            col.append(v)
        self._full.append(full)
        for col, v in zip(self._vals, values if full and values is not None else [None] * len(self._vals)):
            col.append(v)
        self.full_rows += int(full)

    def add_many(
        self,
        fnames: Sequence[str],
        rows: Sequence[int],
        keys: Sequence[pa.Array],
        values: Sequence[pa.Array] | None = None,
        full: np.ndarray | None = None,
    ) -> None:
        """Positions ``rows[i]`` of files ``fnames[i]`` deleted; ``keys``: one Arrow string array per key
        column, aligned with them; ``values``/``full``: the old rows' other columns (one string array per
        ``value_names`` column) and a bool mask of the rows whose change carried the whole old row."""
        if not len(rows):
            return
        if self._bytes >= self.max_bytes:
            self.dropped += len(rows)
            return
        self._seal()
        files = pa.array(fnames, pa.string()).dictionary_encode()  # a few files per batch
        if full is None or values is None or not full.any() or len(values) != len(self.value_names):
            self._add_chunk(self._table(files, pa.array(rows, pa.int64()), list(keys)))
            return
        self.full_rows += int(full.sum())
        self._add_chunk(self._table(files, pa.array(rows, pa.int64()), list(keys), list(values), pa.array(full)))

    def _table(
        self,
        files: pa.Array,
        rows: pa.Array,
        keys: list[pa.Array],
        values: list[pa.Array] | None = None,
        full: pa.Array | None = None,
    ) -> pa.Table:
        names = [FILE_COLUMN, POS_COLUMN] + [f"k{i}" for i in range(len(keys))]
        cols = [files, rows, *[k.cast(pa.string()) for k in keys]]
        if values is not None and full is not None:
            names += [FULL_COLUMN] + [f"v{i}" for i in range(len(values))]
            cols += [full, *[v.cast(pa.string()) for v in values]]
        return pa.Table.from_arrays(cols, names=names)

    def _add_chunk(self, chunk: pa.Table) -> None:
        self._chunks.append(chunk)
        self._bytes += int(chunk.nbytes)

    def _seal(self) -> None:
        if self._rows:
            keys = [pa.array(c, pa.string()) for c in self._keys]
            files = pa.array(self._files, pa.string()).dictionary_encode()
            self._bytes -= ROW_ENTRY_BYTES * len(self._rows)
            rows = self._rows
            full, vals = self._full, self._vals
            self._files, self._rows, self._keys = [], [], [[] for _ in self.key_names]
            self._full, self._vals = [], [[] for _ in self.value_names]
            if any(full):
                values = [pa.array(c, pa.string()) for c in vals]
                self._add_chunk(
                    self._table(files, pa.array(rows, pa.int64()), keys, values, pa.array(full, pa.bool_()))
                )
            else:
                self._add_chunk(self._table(files, pa.array(rows, pa.int64()), keys))

    def table(self) -> pa.Table | None:
        """Every entry as one table (``_mooncake_data_file`` = file *name*, ``_mooncake_pos``, ``k0``…: key
        text; when some entry holds a whole old row, ``_mooncake_full`` and ``v0``…: the other columns'
        text, null elsewhere), oldest first; None when empty."""
        self._seal()
        if not self._chunks:
            return None
        plain = [c.set_column(0, FILE_COLUMN, c.column(0).cast(pa.string())) for c in self._chunks]
        if any(FULL_COLUMN in c.column_names for c in plain):
            return pa.concat_tables(plain, promote_options="default").combine_chunks()
        return pa.concat_tables(plain).combine_chunks()

    def clear(self) -> None:
        """Drop every entry (after a persist)."""
        self._chunks = []
        self._files, self._rows, self._keys = [], [], [[] for _ in self.key_names]
        self._full, self._vals = [], [[] for _ in self.value_names]
        self._bytes = self.dropped = self.full_rows = 0

    def __len__(self) -> int:
        return int(sum(c.num_rows for c in self._chunks)) + len(self._rows)

    @property
    def nbytes(self) -> int:
        """Estimated bytes held (Arrow buffers, :data:`ROW_ENTRY_BYTES` per row-wise entry not yet in a chunk)."""
        return self._bytes


def build_log(
    dlog: DeleteLog, targets: dict[str, tuple[str, BitMap64]], specs: Sequence[Any], value_specs: Sequence[Any] = ()
) -> pa.Table | None:
    """The log table of one persist: for each ``targets`` entry (file name -> (its location, the positions
    the persist newly writes into its deletion vector)) the logged keys of those positions (the newest
    entry of a position wins), keys decoded with ``specs`` (the key columns' ``ColumnSpec``). None when
    no entry applies or a key cannot be decoded (then the feed reads those keys from the files).
    ``value_specs``: the other columns' specs (``dlog.value_names``); where entries hold whole old rows
    the table also has ``_mooncake_full`` and those columns (decoded alike, null where not full); when
    they cannot be decoded the log holds the keys only."""
    t = dlog.table()
    if t is None or not targets:
        return None
    t = t.filter(pc.is_in(t.column(FILE_COLUMN), value_set=pa.array(list(targets), pa.string())))
    if not t.num_rows:
        return None
    codes = t.column(FILE_COLUMN).dictionary_encode().combine_chunks()
    names = codes.dictionary.to_pylist()
    idx = np.asarray(codes.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    pos = np.asarray(t.column(POS_COLUMN).to_numpy(), dtype=np.int64)
    take: list[np.ndarray] = []
    where: list[str] = []
    for c, name in enumerate(names):
        rows = np.flatnonzero(idx == c)
        p = pos[rows]
        last = len(p) - 1 - np.unique(p[::-1], return_index=True)[1]  # newest entry per position, by position
        rows, p = rows[last], p[last]
        want = np.fromiter(targets[name][1], dtype=np.int64, count=len(targets[name][1]))
        keep = np.isin(p, want)
        take.append(rows[keep])
        where += [targets[name][0]] * int(keep.sum())
    sel = t.take(pa.array(np.concatenate(take)))
    if not sel.num_rows:
        return None
    try:
        keys = decode_text_columns(list(specs), [sel.column(f"k{i}") for i in range(len(specs))], column_major=True)
    except ValueError as e:
        log.warning("delete log not written (keys not decodable: %s); the change feed reads those keys from files", e)
        return None
    fields = [pa.field(FILE_COLUMN, pa.string()), pa.field(POS_COLUMN, pa.int64())]
    fields += [s.arrow_field().with_nullable(True) for s in specs]
    cols = [pa.array(where, pa.string()), sel.column(POS_COLUMN).combine_chunks(), *keys.columns]
    if value_specs and FULL_COLUMN in sel.column_names:
        full_cols = _full_values(sel, value_specs)
        if full_cols is not None:
            fields += [pa.field(FULL_COLUMN, pa.bool_())] + [s.arrow_field().with_nullable(True) for s in value_specs]
            cols += full_cols
    try:  # the fields carry the Iceberg field ids (the full-row feed checks them)
        out = pa.Table.from_arrays(cols, schema=pa.schema(fields))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        out = pa.Table.from_arrays(cols, names=[f.name for f in fields])
    return out.sort_by([(FILE_COLUMN, "ascending"), (POS_COLUMN, "ascending")])


def _full_values(sel: pa.Table, value_specs: Sequence[Any]) -> list[pa.Array] | None:
    """``[_mooncake_full, value columns…]`` of entries ``sel`` (:meth:`DeleteLog.table` rows): the whole
    old rows' other columns decoded with ``value_specs``, null where an entry holds the key only. None
    when no entry is full or a value cannot be decoded."""
    full = pc.fill_null(sel.column(FULL_COLUMN), False).combine_chunks()
    n_full = int(pc.sum(full).as_py() or 0)
    if not n_full:
        return None
    rows = sel.filter(full)
    try:
        vals = decode_text_columns(
            list(value_specs), [rows.column(f"v{i}") for i in range(len(value_specs))], column_major=True
        )
    except ValueError as e:
        log.warning("delete log holds keys only (old rows not decodable: %s); the full-row feed reads files", e)
        return None
    mask = np.asarray(full.to_numpy(zero_copy_only=False), dtype=bool)
    at = pa.array(np.cumsum(mask) - 1, pa.int64(), mask=~mask)  # row i -> its full row, null where not full
    return [full, *[c.take(at) for c in vals.columns]]


def typed_entries(
    entries: pa.Table, where: dict[str, str], specs: Sequence[Any], value_specs: Sequence[Any] | None = None
) -> pa.Table | None:
    """:meth:`DeleteLog.table` ``entries`` in the log file's layout: file names replaced by ``where``
    (file name -> its location or local path; entries of other files dropped), keys decoded with
    ``specs``. With ``value_specs`` (the other columns' specs) only the entries holding whole old rows,
    with ``_mooncake_full`` and those columns decoded. None when none is left or a value cannot be
    decoded."""
    entries = entries.filter(pc.is_in(entries.column(FILE_COLUMN), value_set=pa.array(list(where), pa.string())))
    if value_specs is not None:
        if FULL_COLUMN not in entries.column_names:
            return None
        entries = entries.filter(pc.fill_null(entries.column(FULL_COLUMN), False))
    if not entries.num_rows:
        return None
    codes = entries.column(FILE_COLUMN).dictionary_encode().combine_chunks()
    paths = pa.array([where[n] for n in codes.dictionary.to_pylist()], pa.string())
    try:
        keys = decode_text_columns(list(specs), [entries.column(f"k{i}") for i in range(len(specs))], column_major=True)
        vals = (
            decode_text_columns(
                list(value_specs), [entries.column(f"v{i}") for i in range(len(value_specs))], column_major=True
            )
            if value_specs is not None
            else None
        )
    except ValueError:
        return None
    cols = [paths.take(codes.indices), entries.column(POS_COLUMN).combine_chunks(), *keys.columns]
    names = [FILE_COLUMN, POS_COLUMN, *[s.name for s in specs]]
    if vals is not None and value_specs is not None:
        cols += [pa.repeat(pa.scalar(True), entries.num_rows), *vals.columns]
        names += [FULL_COLUMN, *[s.name for s in value_specs]]
    return pa.Table.from_arrays(cols, names=names)


def write_log(fileio: Any, table_location: str, log_table: pa.Table) -> str:
    """Write ``log_table`` as ``<table_location>/delete-log/<uuid>.parquet`` through ``fileio``; returns the
    location (for summary ``mooncake.delete-log``). Raises what the FileIO raises."""
    buf = _io.BytesIO()
    pq.write_table(log_table, buf, compression="zstd")
    location = f"{table_location.rstrip('/')}/delete-log/{uuid.uuid4()}.parquet"
    with fileio.new_output(location).create(overwrite=True) as out:
        out.write(buf.getvalue())
    return location


def read_logs(
    fileio: Any,
    locations: Sequence[str],
    key_schema: pa.Schema,
    extra: Sequence[pa.Table] = (),
    full_only: bool = False,
) -> Logged:
    """The logs at ``locations`` and the log tables ``extra`` (:func:`typed_entries`) merged, per data
    file (location or local path): positions (ascending, distinct) and the keys at them in
    ``key_schema``'s layout (columns by name, cast to its types). A log that cannot be read or lacks a
    key column is skipped (the feed then reads those files). ``full_only``: only the entries holding
    whole old rows (``_mooncake_full``), ``key_schema`` then being the table's whole layout; a log whose
    column of a name carries another Iceberg field id than ``key_schema``'s (a column dropped and
    added again) is skipped. Only the columns used are read, the data file names as a dictionary."""
    parts: dict[str, list[tuple[np.ndarray, pa.Table]]] = {}
    cols = [FILE_COLUMN, POS_COLUMN, *([FULL_COLUMN] if full_only else []), *key_schema.names]
    for loc in [*locations, *extra]:
        try:
            if isinstance(loc, pa.Table):
                t = loc
            else:
                with fileio.new_input(loc).open() as stream:  # file names as a dictionary (one per file)
                    t = pq.read_table(stream, columns=cols, read_dictionary=[FILE_COLUMN])
            if full_only:
                full = pc.fill_null(t.column(FULL_COLUMN), False)
                if not pc.all(full).as_py():  # (a filter copies every column: only when some are not full)
                    t = t.filter(full)
                _same_field_ids(t.schema, key_schema)
                if not t.num_rows:
                    continue
            keys = pa.Table.from_arrays(
                [t.column(f.name).cast(f.type) for f in key_schema], schema=key_schema
            ).combine_chunks()
        except (OSError, KeyError, ValueError, pa.ArrowException) as e:
            what = "of the buffer" if isinstance(loc, pa.Table) else loc
            log.warning("delete log %s not used (%s); the change feed reads those keys from files", what, e)
            continue
        files = t.column(FILE_COLUMN).dictionary_encode().combine_chunks()
        idx = np.asarray(files.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        pos = np.asarray(t.column(POS_COLUMN).to_numpy(), dtype=np.int64)
        names = files.dictionary.to_pylist()
        if len(idx) and bool(np.all(idx[1:] >= idx[:-1])):  # grouped by file (a log file is): zero-copy slices
            bounds = np.searchsorted(idx, np.arange(len(names) + 1)).tolist()
            for c, name in enumerate(names):
                lo, hi = bounds[c], bounds[c + 1]
                parts.setdefault(name, []).append((pos[lo:hi], keys.slice(lo, hi - lo)))
            continue
        for c, name in enumerate(names):
            rows = np.flatnonzero(idx == c)
            parts.setdefault(name, []).append((pos[rows], keys.take(pa.array(rows))))
    out: Logged = {}
    for name, ps in parts.items():
        if len(ps) == 1 and bool(np.all(ps[0][0][1:] > ps[0][0][:-1])):  # one log, ascending and distinct
            out[name] = ps[0]
            continue
        p = np.concatenate([x for x, _ in ps])
        k = pa.concat_tables([y for _, y in ps]).combine_chunks()
        p, first = np.unique(p, return_index=True)
        out[name] = (p, k.take(pa.array(first)))
    return out


def _same_field_ids(log_schema: pa.Schema, want: pa.Schema) -> None:
    """``ValueError`` when a column of ``want`` has another Iceberg field id in ``log_schema`` (both known),
    ``KeyError`` when it is missing."""
    for f in want:
        i = log_schema.get_field_index(f.name)
        if i < 0:
            raise KeyError(f.name)
        a, b = _field_id(f), _field_id(log_schema.field(i))
        if a is not None and b is not None and a != b:
            raise ValueError(f"column {f.name} is field {b!r} in the log, field {a!r} in the table")


def _field_id(f: pa.Field) -> bytes | None:
    return (f.metadata or {}).get(b"PARQUET:field_id")


def logged_keys(logged: Logged, location: str, positions: BitMap64) -> pa.Table | None:
    """The keys at ``positions`` (ascending) of the data file ``location`` from ``logged``, in that order;
    None unless the logs hold every one of them."""
    got = logged.get(location)
    if got is None:
        return None
    have, keys = got
    want = np.fromiter(positions, dtype=np.int64, count=len(positions))
    if len(want) == len(have) and np.array_equal(have, want):  # (the usual case: the log holds just these)
        return keys
    at = np.searchsorted(have, want)
    if (at >= len(have)).any() or not np.array_equal(have[np.minimum(at, len(have) - 1)], want):
        return None
    return keys.take(pa.array(at))
