"""MemSlice: the in-memory buffer of committed rows not yet flushed (docs/architecture.md#data-path).

Rows arrive as Postgres text values (one list per row, in the table's column order, :meth:`MemSlice.append`)
or as whole decoded Arrow batches (a columnar run of inserts, :meth:`MemSlice.append_batch`) and are
kept in an *open* buffer — parts in row order, each a list of text rows or a decoded RecordBatch;
every ``batch_rows`` rows (or when a reader or a flush needs them) the open buffer is sealed: its text
rows decoded column-wise with vectorized casts and every part concatenated into one Arrow
``RecordBatch``. Each row carries:

- ``ins_lsn`` (uint64): the commit LSN of the transaction that inserted it;
- ``del_lsn`` (uint64): the commit LSN of the transaction that deleted it, 0 while live — this is the
  **BatchDeletionVector**, stamped so that a read at LSN L sees exactly the commits with
  ``commit_lsn < L``;
- ``hash`` (uint64): the key hash (:mod:`..index.key_hash`) the flush's IndexBlock needs. For a table
  with an exact key (one integer column, ``key_column``) it is not kept once the rows are sealed but
  recomputed from the key column when needed (``splitmix64`` of the value, :func:`int_key_hashes`:
  the same hash :meth:`~..index.key_hash.KeyHash.hash_one` gives the value's text); other tables keep
  it, 8 bytes per row, since their hash is defined on Postgres's text of the key.

Held compactly (:class:`Batch`): insert LSNs as runs (one per transaction: rows arrive in commit order),
delete LSNs only for batches with a deleted row, hashes 8 bytes per row or none; an appended batch's columns
that are slices of larger buffers (the native decoder's text columns share one buffer per run) are
copied into buffers of their own, so the slice holds its rows' bytes and not the decoder's.

Locations are ``(batch_id, row)``; the open buffer has ``batch_id == len(batches)``. The **MemIndex**
maps key hash → locations (several for duplicate rows of key-less tables).
"""

from __future__ import annotations

import uuid
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from ..cdc.decode import ewkb_srid_suspect
from ..index import MemIndex
from ..index.key_hash import int_key_hashes
from ..lsn import Lsn

if TYPE_CHECKING:
    from ..pg.schema import ColumnSpec

#: the table's text decoder: column-major value lists -> ``pa.RecordBatch``
Decoder = Callable[[list[list[Any]]], Any]
#: (column index, cheap text test) of :func:`_suspect_checks`
Suspect = tuple[int, Callable[[str], bool]]

LIVE = 0


def batch_hashes(b: Batch, key_column: int | None, mask: np.ndarray | None = None) -> np.ndarray:
    """Key hashes (uint64 (rows,)) of sealed batch ``b``'s rows, or of the rows ``mask`` (bool
    (num_rows,)) keeps: the batch's kept hashes, else recomputed from the exact key column
    ``key_column`` (:func:`int_key_hashes`; a slice without one keeps every batch's hashes)."""
    if b.hashes is not None:
        return b.hashes if mask is None else b.hashes[mask]
    assert key_column is not None, "a batch without hashes in a slice without an exact key column"
    col = b.rb.column(key_column)
    return int_key_hashes(col if mask is None else col.filter(pa.array(mask)))


@dataclass(frozen=True, slots=True)
class FrozenRows:
    """The sealed batches of a :class:`MemSlice` as :meth:`MemSlice.freeze` took them for a flush that
    writes outside the service lock: ``batches`` (the :class:`Batch` objects, in order), ``live`` (per
    batch a bool mask (num_rows,) of the rows live then), ``horizon`` (the largest insert or delete LSN
    among them, 0 when none: a read at an LSN <= horizon can no longer be served from the slice once
    they leave it), ``key_column`` (the slice's then), ``incarnation`` and ``schema`` (the slice's
    then)."""

    batches: list[Batch]
    live: list[np.ndarray]
    horizon: int
    key_column: int | None
    incarnation: str
    schema: pa.Schema

    nbytes: int = field(init=False)  # Arrow bytes of the batches taken (live and deleted rows)
    live_rows: int = field(init=False)  # rows live at the freeze: what the flush writes

    def __post_init__(self) -> None:
        # counted once (the scheduler asks for them twice a second per table while a flush runs)
        object.__setattr__(self, "nbytes", sum(b.rb.nbytes for b in self.batches))
        object.__setattr__(self, "live_rows", sum(int(m.sum()) for m in self.live))

    def rows(self) -> tuple[pa.Table, np.ndarray]:
        """The rows live at the freeze, in order, and their key hashes (uint64 (n,)): what the flush
        writes. Reads only immutable data (the batches' Arrow rows and kept hashes), so it needs no
        lock."""
        parts, hashes = [], []
        for b, mask in zip(self.batches, self.live):
            if not mask.any():
                continue
            whole = bool(mask.all())
            parts.append(b.rb if whole else b.rb.filter(pa.array(mask)))
            hashes.append(batch_hashes(b, self.key_column, None if whole else mask))
        table = pa.Table.from_batches(parts, schema=self.schema) if parts else self.schema.empty_table()
        return table, (np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64))

    def deleted_since(self) -> tuple[np.ndarray, np.ndarray, int]:
        """``(positions int64 (k,), delete LSNs uint64 (k,), gone)``: the rows live at the freeze and
        deleted since, positions counted in :meth:`rows`' order, and how many rows of the batches are
        deleted now (then or since). Call under the service lock (deletes stamp the batches)."""
        pos_parts, lsn_parts = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.uint64)]
        offset = gone = 0
        for b, mask in zip(self.batches, self.live):
            dl = b.del_lsn
            newly = mask & (dl != LIVE)
            if newly.any():
                pos_parts.append((np.cumsum(mask, dtype=np.int64) - 1)[newly] + offset)
                lsn_parts.append(dl[newly].astype(np.uint64))
            offset += int(mask.sum())
            gone += int((dl != LIVE).sum())
        return np.concatenate(pos_parts), np.concatenate(lsn_parts), gone


def _horizon(batches: list[Batch]) -> int:
    """The largest insert or delete LSN of sealed ``batches`` (0 when none)."""
    horizon = 0
    for b in batches:
        if len(b.ins_lsns):
            horizon = max(horizon, int(b.ins_lsns.max()), int(b.del_lsn.max()) if b.any_deleted else 0)
    return horizon


class BadRowError(ValueError):
    """A buffered row whose text cannot be decoded to the table's Arrow types (found when the open
    buffer is sealed). ``lsn``: commit LSN of the transaction that wrote the row. Permanent."""

    def __init__(self, message: str, lsn: int, columns: list[Any] | None = None):
        super().__init__(f"{message} (a row committed at LSN {Lsn(lsn)})")
        self.lsn = lsn
        self.columns = list(columns or [])  # the columns whose values could not be decoded


class Carried:
    """A value carried over from an existing row (unchanged TOAST), already typed: ``scalar`` is the
    Arrow scalar (kept as Arrow so values Python cannot hold, such as timestamp 'infinity', carry over
    exactly); ``value`` is its Python value (raises for such values)."""

    __slots__ = ("scalar",)

    def __init__(self, scalar: pa.Scalar):
        self.scalar = scalar

    @property
    def value(self) -> Any:
        return self.scalar.as_py()

    def __repr__(self) -> str:  # pragma: no cover
        return f"Carried({self.scalar!r})"


class Batch:
    """One sealed batch: ``rb`` rows with their insert LSNs, delete LSNs and key hashes.

    Stored compactly (docs/architecture.md#data-path): insert LSNs run-length encoded
    (``ins_starts``: int64 first row of each run, ``ins_lsns``: uint64 its commit LSN; rows arrive in
    commit order, so a transaction is one run), delete LSNs as a uint64 array only once a row of the
    batch is deleted (``None`` while every row is live), hashes uint64 per row, or ``None`` when the
    slice recomputes them from its exact key column (:meth:`MemSlice.batch_hashes`). The constructor takes
    per-row arrays (same length as ``rb``); :attr:`ins_lsn` and :attr:`del_lsn` give them back per row
    (new arrays; writes go through :meth:`stamp_deleted`)."""

    __slots__ = ("rb", "ins_starts", "ins_lsns", "_del", "hashes")

    def __init__(self, rb: pa.RecordBatch, ins_lsn: np.ndarray, del_lsn: np.ndarray | None, hashes: np.ndarray | None):
        self.rb = rb
        self.ins_starts, self.ins_lsns = _runs(np.asarray(ins_lsn, dtype=np.uint64))
        dl = None if del_lsn is None else np.asarray(del_lsn, dtype=np.uint64)
        self._del: np.ndarray | None = dl if dl is not None and dl.any() else None
        self.hashes = hashes

    @property
    def num_rows(self) -> int:
        """Rows of the batch (live and deleted)."""
        return int(self.rb.num_rows)

    @property
    def ins_lsn(self) -> np.ndarray:
        """Each row's insert (commit) LSN, uint64 (num_rows,)."""
        return _expand(self.ins_starts, self.ins_lsns, self.num_rows)

    @property
    def del_lsn(self) -> np.ndarray:
        """Each row's delete LSN (0 = live), uint64 (num_rows,); read-only when no row is deleted."""
        if self._del is None:
            z = np.zeros(self.num_rows, dtype=np.uint64)
            z.flags.writeable = False
            return z
        return self._del

    @property
    def any_deleted(self) -> bool:
        """True once a row of the batch has a delete LSN (the per-row array exists only then)."""
        return self._del is not None

    def stamp_deleted(self, rows: Any, lsns: Any) -> None:
        """Set the delete LSN of ``rows`` (an index, an index array or a boolean mask) to ``lsns``."""
        if self._del is None:
            self._del = np.zeros(self.num_rows, dtype=np.uint64)
        self._del[rows] = lsns

    def is_live(self, r: int) -> bool:
        """Row ``r`` (0-based) has no delete LSN."""
        return self._del is None or bool(self._del[r] == LIVE)

    def with_rb(self, rb: pa.RecordBatch) -> Batch:
        """The same stamps over ``rb`` (a schema change's conversion of the rows)."""
        out = Batch.__new__(Batch)
        out.rb, out.ins_starts, out.ins_lsns, out._del, out.hashes = (
            rb,
            self.ins_starts,
            self.ins_lsns,
            self._del,
            self.hashes,
        )
        return out


def _runs(lsns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run-length form of per-row LSNs: (int64 first row of each run, uint64 LSN of each run)."""
    if len(lsns) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64)
    starts = np.flatnonzero(lsns[1:] != lsns[:-1]) + 1
    starts = np.concatenate([np.zeros(1, dtype=np.int64), starts.astype(np.int64)])
    return starts, lsns[starts].copy()


def _expand(starts: np.ndarray, lsns: np.ndarray, n: int) -> np.ndarray:
    """Per-row LSNs (uint64 (n,)) from :func:`_runs`' form."""
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    lens = np.diff(np.append(starts, n))
    return np.repeat(lsns, lens)


def _compact(rb: pa.RecordBatch) -> pa.RecordBatch:
    """``rb`` with every column that references more buffer bytes than its own values (a slice of a
    larger buffer: the native decoder's text columns are slices of one buffer holding every column
    of the run) copied into buffers of its own, so a MemSlice holds only its rows' bytes."""
    if rb.get_total_buffer_size() <= rb.nbytes + 4096:
        return rb
    cols = list(rb.columns)
    changed = False
    for i, c in enumerate(cols):
        if c.get_total_buffer_size() > c.nbytes + 1024:
            try:
                cols[i] = pa.concat_arrays([c])
                changed = True
            except (pa.ArrowException, TypeError):  # pragma: no cover (a type Concatenate does not take)
                pass
    return pa.RecordBatch.from_arrays(cols, schema=rb.schema) if changed else rb


class MemSlice:
    """Committed, unflushed rows of one table plus their MemIndex.

    ``decode``: callable(list of column value lists) -> pa.RecordBatch (the table's text decoder);
    values that are :class:`Carried` are patched in after the vectorized decode. ``specs``: the
    table's ColumnSpecs, one per ``schema`` field (what :func:`_suspect_checks` needs beyond Arrow
    types: a PostGIS column's SRID). ``key_column``: index in ``schema`` of the table's exact key (one
    integer column, :attr:`~..index.key_hash.KeyHash.exact`), or None: with it, sealed batches keep no
    key hashes (8 bytes per row) and :meth:`batch_hashes` recomputes them from that column — the caller
    guarantees the hashes it passes are ``int_key_hashes`` of the values it decodes to; without it (and
    after :meth:`evolve`) the hashes passed in are kept.

    ``version``: bumped by every change of what :meth:`visible` may return (append, delete, TRUNCATE,
    schema change, drain); with ``incarnation`` (random, unique per slice) it names the rows
    a read sees (:meth:`read_token`). Code that changes ``batches`` directly calls :meth:`bump`.
    """

    def __init__(
        self,
        schema: pa.Schema,
        decode: Decoder,
        batch_rows: int = 16384,
        specs: list[ColumnSpec] | None = None,
        key_column: int | None = None,
    ) -> None:
        self.schema = schema
        self.key_column = key_column
        self._decode = decode
        self.batch_rows = batch_rows
        self.batches: list[Batch] = []
        self.index = MemIndex()
        self._rows: list[list[Any]] = []  # the open buffer's tail: rows appended one by one
        self._reset_open()
        self.deleted_rows = 0
        self._bytes = 0
        self.frozen: FrozenRows | None = None  # the batches a flush in progress took (freeze..release)
        self._suspects = _suspect_checks(schema, specs)
        self.incarnation = uuid.uuid4().hex
        self.version = 0
        self._max_stamp: tuple[int, int] = (-1, 0)  # (version, largest insert/delete LSN held then)

    def bump(self) -> None:
        """Record a change of the rows (a new :attr:`version`)."""
        self.version += 1

    def read_token(self, lsn: int | None = None) -> str:
        """Names the rows :meth:`visible` returns for ``lsn`` until the next change: equal tokens, equal
        rows. ``"<incarnation>.<version>"``, plus ``@<lsn>`` when ``lsn`` falls at or below a stamp held
        (a read at a larger LSN, or None, sees every row held)."""
        base = f"{self.incarnation}.{self.version}"
        if lsn is None:
            return base
        if self._max_stamp[0] != self.version:
            self._max_stamp = (self.version, self._top_stamp())
        return base if lsn > self._max_stamp[1] else f"{base}@{lsn}"

    def _top_stamp(self) -> int:
        """The largest insert or delete LSN held (0 when none)."""
        tops = [0]
        for b in self.batches:
            if len(b.ins_lsns):
                tops.append(int(b.ins_lsns.max()))
            if b.any_deleted:
                tops.append(int(b.del_lsn.max()))
        tops.extend(self._ins_lsns)
        tops.extend(self._open_del.values())
        return max(tops)

    def _reset_open(self) -> None:
        # the open buffer: ``_parts`` (text-row lists and decoded RecordBatches, in row order, starting at
        # ``_part_starts``) then the tail ``_rows`` from row ``_rows_start``; insert LSNs as runs
        # (``_ins_starts``: open-buffer row offset where a run starts, ``_ins_lsns``: its LSN), key hashes
        # as uint64 arrays (``_hash_parts``) then a list of the tail's (``_hash_tail``), ``_open_del``
        # the deleted rows (open-buffer row offsets)
        self._parts: list[list[list[Any]] | pa.RecordBatch] = []
        self._part_starts: list[int] = []
        self._rows = []
        self._rows_start = 0
        self._ins_starts: list[int] = []
        self._ins_lsns: list[int] = []
        self._hash_parts: list[np.ndarray] = []
        self._hash_tail: list[int] = []
        self._open_del: dict[int, int] = {}
        self._open_arrow_bytes = 0

    # -- writes -------------------------------------------------------------------------------
    def append(self, values: list[Any], h: int, lsn: int) -> tuple[int, int]:
        """Append one row (text values / None / Carried) with key hash ``h`` at commit LSN ``lsn``.

        A value that may not decode (``numeric`` NaN for a decimal column, ``time`` 24:00, …; see
        :func:`_suspect_checks`) has its row decoded at once, so :class:`BadRowError` is raised by the
        change that brought it rather than by a later read or flush."""
        for i, suspect in self._suspects:
            v = values[i]
            if v.__class__ is str and suspect(v):
                try:
                    self._decode([[None if isinstance(x, Carried) else x] for x in values])
                except ValueError as e:
                    raise BadRowError(str(e), lsn, getattr(e, "columns", None)) from None
                except Exception:
                    pass
                break
        loc = (len(self.batches), self._rows_start + len(self._rows))
        self.version += 1
        self._rows.append(values)
        if not self._ins_lsns or self._ins_lsns[-1] != lsn:
            self._ins_starts.append(loc[1])
            self._ins_lsns.append(lsn)
        self._hash_tail.append(h)
        self.index.insert_one(h, loc[0], loc[1])
        if loc[1] + 1 >= self.batch_rows:
            self.seal()
        return loc

    def append_batch(self, rb: pa.RecordBatch, hashes: np.ndarray, lsn: int | np.ndarray) -> int:
        """Append decoded rows (``rb``: the table's decoder's output, ``schema``'s columns) with their key
        hashes (uint64, one per row) inserted at commit LSN ``lsn`` (or one per row, uint64, for rows of
        several transactions): they become one part of the open
        buffer after every row appended before them (locations ``(len(batches), start + i)``), and
        the MemIndex takes them in one batch insert. Returns ``start`` (the first row's open-buffer
        offset). Raises ``ValueError`` when ``hashes`` and ``rb`` differ in length."""
        n = rb.num_rows
        if len(hashes) != n:
            raise ValueError(f"{n} rows and {len(hashes)} key hashes")
        if self._rows:  # the tail of text rows becomes a part of its own (decoded when sealed)
            self._parts.append(self._rows)
            self._part_starts.append(self._rows_start)
            self._rows_start += len(self._rows)
            self._rows = []
        start = self._rows_start
        if n == 0:
            return start
        self.version += 1
        self._parts.append(rb)
        self._part_starts.append(start)
        self._rows_start = start + n
        if isinstance(lsn, int):
            run_starts, run_lsns = [start], [lsn]
        else:
            st, ls = _runs(np.asarray(lsn, dtype=np.uint64))
            run_starts, run_lsns = (st + start).tolist(), ls.tolist()
        if self._ins_lsns and self._ins_lsns[-1] == run_lsns[0]:  # the open run goes on
            run_starts, run_lsns = run_starts[1:], run_lsns[1:]
        self._ins_starts.extend(run_starts)
        self._ins_lsns.extend(run_lsns)
        if self._hash_tail:
            self._hash_parts.append(np.array(self._hash_tail, dtype=np.uint64))
            self._hash_tail = []
        self._hash_parts.append(np.array(hashes, dtype=np.uint64))  # a copy: never a view of the caller's
        rb = _compact(rb)
        self._parts[-1] = rb
        self._open_arrow_bytes += rb.nbytes
        self.index.insert(hashes, len(self.batches), np.arange(start, start + n, dtype=np.uint64))
        if self._rows_start >= self.batch_rows:
            self.seal()
        return start

    def is_live(self, loc: tuple[int, int]) -> bool:
        b, r = loc
        if b == len(self.batches):
            return r not in self._open_del
        return self.batches[b].is_live(r)

    def delete(self, loc: tuple[int, int], h: int, lsn: int) -> None:
        """Mark the row at ``loc`` deleted by the commit at ``lsn`` and drop it from the MemIndex."""
        b, r = loc
        self.version += 1
        if b == len(self.batches):
            self._open_del[r] = lsn
        else:
            self.batches[b].stamp_deleted(r, lsn)
        self.index.remove(h, loc)
        self.deleted_rows += 1

    def delete_many(self, locs: list[tuple[int, int]], hashes: list[int], lsn: int | list[int]) -> None:
        """:meth:`delete` of many rows (distinct live locations, their key hashes) by the commit at ``lsn``
        (or one commit LSN per row, for rows of several transactions)."""
        nb = len(self.batches)
        self.version += 1
        lsns = [lsn] * len(locs) if isinstance(lsn, int) else lsn
        for (b, r), at in zip(locs, lsns):
            if b == nb:
                self._open_del[r] = at
            else:
                self.batches[b].stamp_deleted(r, at)
        self.index.remove_many(hashes, locs)
        self.deleted_rows += len(locs)

    def find(self, h: int) -> list[tuple[int, int]]:
        """Live locations whose key hash is ``h``."""
        return [loc for loc in self.index.lookup(h) if self.is_live(loc)]

    def row_values(self, loc: tuple[int, int]) -> list[Any]:
        """The row's values: text/None/Carried for the open buffer, Carried for sealed batches."""
        b, r = loc
        if b == len(self.batches):
            if r >= self._rows_start:
                return list(self._rows[r - self._rows_start])
            p = bisect_right(self._part_starts, r) - 1
            part, r = self._parts[p], r - self._part_starts[p]
            if isinstance(part, list):
                return list(part[r])
            rb = part
        else:
            rb = self.batches[b].rb
        return [Carried(rb.column(i)[r]) for i in range(rb.num_columns)]

    def row_stamps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's ``(ins_lsn, del_lsn, hash)`` (uint64 (num_rows,) each) in location order —
        sealed batches, then the open buffer — without sealing."""
        n_open = self._rows_start + len(self._rows)
        dl = np.zeros(n_open, dtype=np.uint64)
        for r, lsn in self._open_del.items():
            dl[r] = lsn
        ins = [b.ins_lsn for b in self.batches] + [self._open_ins(n_open)]
        dels = [b.del_lsn for b in self.batches] + [dl]
        hs = [self.batch_hashes(b) for b in self.batches] + [self._open_hashes()]
        return np.concatenate(ins), np.concatenate(dels), np.concatenate(hs)

    def _open_ins(self, n: int) -> np.ndarray:
        """The open buffer's insert LSNs, uint64 (n,) (n: its rows)."""
        return _expand(np.array(self._ins_starts, dtype=np.int64), np.array(self._ins_lsns, dtype=np.uint64), n)

    def _open_ins_at(self, r: int) -> int:
        """The insert LSN of open-buffer row ``r``."""
        return self._ins_lsns[bisect_right(self._ins_starts, r) - 1]

    def batch_hashes(self, b: Batch, mask: np.ndarray | None = None) -> np.ndarray:
        """:func:`batch_hashes` of sealed batch ``b`` with this slice's :attr:`key_column`."""
        return batch_hashes(b, self.key_column, mask)

    def _open_hashes(self) -> np.ndarray:
        parts = self._hash_parts + ([np.array(self._hash_tail, dtype=np.uint64)] if self._hash_tail else [])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    # -- sealing ------------------------------------------------------------------------------
    def seal(self) -> None:
        """Decode the open buffer into one sealed Arrow batch (no-op when it is empty). Raises
        :class:`BadRowError` naming the commit of the first row that cannot be decoded (the open
        buffer then stays as it was)."""
        parts = self._parts + ([self._rows] if self._rows else [])
        if not parts:
            return
        starts = self._part_starts + ([self._rows_start] if self._rows else [])
        rbs = [p if isinstance(p, pa.RecordBatch) else self._decode_rows(p, s) for p, s in zip(parts, starts)]
        if len(rbs) == 1:
            rb = rbs[0]
        else:
            rb = pa.Table.from_batches(rbs, schema=rbs[0].schema).combine_chunks().to_batches()[0]
        n = rb.num_rows
        dl = np.zeros(n, dtype=np.uint64)
        for r, lsn in self._open_del.items():
            dl[r] = lsn
        rb = _compact(rb)
        hashes = None if self.key_column is not None else self._open_hashes()
        self.batches.append(Batch(rb, self._open_ins(n), dl, hashes))
        self._bytes += rb.nbytes
        self._reset_open()

    def _decode_rows(self, rows: list[list[Any]], start: int) -> pa.RecordBatch:
        """Text rows (open-buffer offsets from ``start``) decoded into one batch, Carried values spliced in."""
        cols = [list(c) for c in zip(*rows)]
        patches = []
        for ci, col in enumerate(cols):
            idx = [i for i, v in enumerate(col) if isinstance(v, Carried)]
            if idx:
                patches.append((ci, idx, [col[i].scalar for i in idx]))
                for i in idx:
                    col[i] = None
        try:
            rb = self._decode(cols)
        except ValueError as e:  # name the commit that brought the value (the open buffer stays as it was)
            bad = next((i for i in range(len(rows)) if not self._decodes([[c[i]] for c in cols])), 0)
            raise BadRowError(str(e), self._open_ins_at(start + bad), getattr(e, "columns", None)) from None
        if patches:
            arrays = list(rb.columns)
            for ci, idx, scalars in patches:  # splice the carried values in, in Arrow (no Python round trip)
                base = arrays[ci]
                carried = _scalars_to_array(scalars, base.type)
                pick = np.arange(len(base), dtype=np.int64)
                pick[idx] = len(base) + np.arange(len(idx), dtype=np.int64)
                arrays[ci] = pa.concat_arrays([base, carried]).take(pa.array(pick))
            rb = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return rb

    def evolve(
        self,
        schema: pa.Schema,
        decode: Decoder,
        convert: Callable[[pa.RecordBatch], pa.RecordBatch],
        specs: list[ColumnSpec] | None = None,
    ) -> None:
        """Switch to a new table schema (a source schema change): the open buffer is sealed with the old
        decoder, every sealed batch is converted with ``convert(RecordBatch) -> RecordBatch`` (see
        :func:`.evolution.project`), then rows decode with ``decode`` into ``schema``. LSN stamps,
        hashes and the MemIndex are unchanged (locations stay valid): hashes recomputed from an exact key
        column are computed once here, from the rows before conversion, and kept from then on (a change
        may move, retype or replace the key column). Raises :class:`BadRowError` from sealing (the
        slice is then unchanged)."""
        self.seal()
        self.version += 1
        if self.key_column is not None:
            for b in self.batches:
                b.hashes = self.batch_hashes(b)
            self.key_column = None
        self.batches = [b.with_rb(convert(b.rb)) for b in self.batches]
        self._bytes = sum(b.rb.nbytes for b in self.batches)
        self.schema = schema
        self._decode = decode
        self._suspects = _suspect_checks(schema, specs)

    def _decodes(self, cols: list[list[Any]]) -> bool:
        try:
            self._decode(cols)
            return True
        except ValueError:
            return False

    # -- reads --------------------------------------------------------------------------------
    def visible(self, lsn: int | None = None) -> pa.Table:
        """Rows visible at ``lsn`` (commits with commit_lsn < lsn; None = all applied) as one Arrow table."""
        self.seal()
        parts = []
        for b in self.batches:
            if lsn is None:
                if not b.any_deleted:
                    parts.append(b.rb)
                    continue
                mask = b.del_lsn == LIVE
            else:
                L = np.uint64(lsn)
                if not b.any_deleted and (len(b.ins_lsns) == 0 or b.ins_lsns.max() < L):
                    parts.append(b.rb)
                    continue
                mask = (b.ins_lsn < L) & ((b.del_lsn == LIVE) | (b.del_lsn >= L))
            if mask.all():
                parts.append(b.rb)
            elif mask.any():
                parts.append(b.rb.filter(pa.array(mask)))
        if not parts:
            return self.schema.empty_table()
        return pa.Table.from_batches(parts, schema=self.schema)

    def drain(self) -> tuple[pa.Table, np.ndarray, int]:
        """Take every live row out (for a flush under the lock) and empty the slice: :meth:`freeze`,
        :meth:`FrozenRows.rows`, :meth:`release` in one step.

        Returns (live rows, their key hashes, ``horizon``): :attr:`FrozenRows.horizon`.
        """
        frozen = self.freeze()
        table, hashes = frozen.rows()
        released = self.release(frozen)
        assert released is not None and not len(released[0]), "the slice changed under its own drain"
        return table, hashes, frozen.horizon

    def freeze(self) -> FrozenRows:
        """Seal, then take the sealed batches as they are for a flush outside the service lock (call it
        under the lock); the rows stay here, visible and deletable, until :meth:`release`. Raises
        :class:`BadRowError` from sealing."""
        self.seal()
        live = [b.del_lsn == LIVE for b in self.batches]  # new arrays: later deletes do not change them
        self.frozen = FrozenRows(
            list(self.batches), live, _horizon(self.batches), self.key_column, self.incarnation, self.schema
        )
        return self.frozen

    def unfreeze(self, frozen: FrozenRows) -> None:
        """Forget a :meth:`freeze` whose flush will not :meth:`release` (its write failed): the rows stay
        here as they are, and :meth:`flushable` counts them again."""
        if self.frozen is frozen:
            self.frozen = None

    def flushable(self) -> tuple[int, int]:
        """(live rows, Arrow bytes) not taken by a flush in progress (:meth:`freeze` until
        :meth:`release`): what the next flush would take beyond it; approximate (rows of the taken
        batches deleted since still count as taken)."""
        rows, nbytes = self.live_rows, self.nbytes
        if self.frozen is not None:
            rows, nbytes = max(0, rows - self.frozen.live_rows), max(0, nbytes - self.frozen.nbytes)
        return rows, nbytes

    def release(self, frozen: FrozenRows) -> tuple[np.ndarray, np.ndarray] | None:
        """Remove the batches ``frozen`` took (their live rows are now in a data file, in
        :meth:`FrozenRows.rows`' order); rows appended since stay, their MemIndex locations moved down.
        Call under the service lock. Returns that file's rows deleted since the freeze (positions,
        delete LSNs: :meth:`FrozenRows.deleted_since`), or None, changing nothing, when the slice is no
        longer the one frozen (drained, its schema changed): the caller discards the file."""
        k = len(frozen.batches)
        self.unfreeze(frozen)
        if (
            self.incarnation != frozen.incarnation
            or self.schema is not frozen.schema
            or len(self.batches) < k
            or any(a is not b for a, b in zip(self.batches, frozen.batches))
        ):
            return None
        pos, lsns, gone = frozen.deleted_since()
        self.index.drop_first(k)  # rows appended since keep their locations, batch ids lowered by k
        self._bytes -= frozen.nbytes
        self.batches = self.batches[k:]
        self.deleted_rows -= gone
        self.version += 1
        return pos, lsns

    def truncate(self, lsn: int) -> None:
        """TRUNCATE committed at ``lsn``: every live row deleted as of that LSN; the MemIndex emptied."""
        self.seal()
        self.version += 1
        for b in self.batches:
            live = b.del_lsn == LIVE
            b.stamp_deleted(live, lsn)
            self.deleted_rows += int(live.sum())
        self.index = MemIndex()

    def clear(self) -> None:
        """Empty the slice (every row gone)."""
        self.version += 1
        self.batches = []
        self.frozen = None
        self.index = MemIndex()
        self._reset_open()
        self.deleted_rows = 0
        self._bytes = 0

    @property
    def num_rows(self) -> int:
        """Rows held (live and deleted), sealed and open."""
        return sum(b.num_rows for b in self.batches) + self._rows_start + len(self._rows)

    @property
    def live_rows(self) -> int:
        return self.num_rows - self.deleted_rows

    @property
    def nbytes(self) -> int:
        """Approximate bytes held: Arrow buffers (sealed and open) plus ~64 bytes per text value in the open
        buffer."""
        ncols = len(self.schema)
        text_rows = len(self._rows) + sum(len(p) for p in self._parts if isinstance(p, list))
        return self._bytes + self._open_arrow_bytes + text_rows * ncols * 64

    def is_empty(self) -> bool:
        return self.num_rows == 0


def _scalars_to_array(scalars: list[Any], t: pa.DataType) -> pa.Array:
    """Arrow scalars (of type ``t``) as one array, in Arrow (values Python cannot hold carry over).
    ``pa.array`` refuses a NULL map scalar among others, so nested types go one scalar at a time."""
    try:
        return pa.array(scalars, type=t)
    except (TypeError, pa.ArrowException):
        return pa.concat_arrays([pa.array([sc], type=t) if sc.is_valid else pa.nulls(1, t) for sc in scalars])


def _suspect_checks(schema: pa.Schema, specs: list[ColumnSpec] | None = None) -> list[Suspect]:
    """(column index, cheap text test) for columns whose decoder can reject a value Postgres accepts:
    PostGIS columns (a value with another SRID than the column's, ``ColumnSpec.kind == "wkb"`` and
    ``srid``: :func:`~..cdc.decode.ewkb_srid_suspect`; only with ``specs``, the table's ColumnSpecs in
    ``schema``'s order), decimals (NaN), times (24:00:00), dates/timestamps (years past 9999 may exceed
    the range), arrays (explicit lower bounds, other dimensions, such elements). A hit only costs a
    one-row decode."""
    out: list[Suspect] = []
    for i, f in enumerate(schema):
        t = f.type
        spec = specs[i] if specs is not None else None
        if spec is not None and spec.kind == "wkb":  # PostGIS: a value with another SRID
            out.append((i, ewkb_srid_suspect(spec.srid or 0)))
        elif pa.types.is_decimal(t):
            out.append((i, lambda v: v == "NaN"))
        elif pa.types.is_time(t):
            out.append((i, lambda v: v.startswith("24")))
        elif pa.types.is_timestamp(t) or pa.types.is_date(t):
            out.append((i, lambda v: len(v) > 4 and v[4] != "-" and not v.endswith("infinity")))
        elif pa.types.is_list(t):
            nd = 0
            while pa.types.is_list(t):
                nd, t = nd + 1, t.value_type
            out.append(
                (
                    i,
                    cast(  # the default binds this column's nd; mypy cannot infer such a lambda
                        Callable[[str], bool],
                        lambda v, nd=nd: (
                            v.startswith("[")
                            or "NaN" in v
                            or "24:" in v
                            or (v != "{}" and len(v) - len(v.lstrip("{")) != nd)
                        ),
                    ),
                )
            )
    return out


def changed_rows(mem: MemSlice, since: int, until: int) -> tuple[pa.Table, np.ndarray, pa.Table, np.ndarray]:
    """The rows of ``mem`` (sealed first) that differ between the reads at ``since`` and at ``until`` (LSNs,
    ``since <= until``; a read at L sees the commits with commit_lsn < L).

    Returns ``(inserted, insert_lsns, deleted, delete_lsns)``: ``inserted``: rows committed in
    ``[since, until)`` and still live at ``until``, with their commit LSNs (uint64, one per row);
    ``deleted``: rows live at ``since`` whose deleting commit is in ``[since, until)``, with that
    commit's LSN. A row inserted and deleted inside the range is in neither (it is in no read)."""
    mem.seal()
    lo, hi = np.uint64(since), np.uint64(until)
    ins_parts: list[pa.RecordBatch] = []
    del_parts: list[pa.RecordBatch] = []
    ins_lsns: list[np.ndarray] = []
    del_lsns: list[np.ndarray] = []
    for b in mem.batches:
        live_at_hi = (b.del_lsn == LIVE) | (b.del_lsn >= hi)
        m_ins = (b.ins_lsn >= lo) & (b.ins_lsn < hi) & live_at_hi
        m_del = (b.ins_lsn < lo) & (b.del_lsn != LIVE) & (b.del_lsn >= lo) & (b.del_lsn < hi)
        for mask, parts, lsns, stamp in (
            (m_ins, ins_parts, ins_lsns, b.ins_lsn),
            (m_del, del_parts, del_lsns, b.del_lsn),
        ):
            if mask.any():
                parts.append(b.rb.filter(pa.array(mask)))
                lsns.append(stamp[mask])

    def table(parts: list[pa.RecordBatch]) -> pa.Table:
        return pa.Table.from_batches(parts, schema=mem.schema) if parts else mem.schema.empty_table()

    def stamps(lsns: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(lsns) if lsns else np.zeros(0, dtype=np.uint64)

    return table(ins_parts), stamps(ins_lsns), table(del_parts), stamps(del_lsns)
