"""The batched apply of a mirrored table: one columnar run of changes at a time.

:meth:`RunApplyRole.apply_run` takes a :class:`~..cdc.columnar.ChangeRun` (consecutive changes of one
kind on one relation, tuples column by column) and leaves the table exactly as applying the run's
changes one by one with :meth:`~.apply.ChangeApplyRole.apply` would (the same visible rows, per-row
insert and delete LSNs, file deletes, MemIndex entries in the same row order, ``missing_keys``); only
the MemSlice's batch boundaries may differ (its open buffer takes whole Arrow parts, and is sealed
when it reaches ``batch_rows`` after a part).

- INSERT runs: the relation's columns are mapped to ours (columns the Relation does not send are
  NULL), the values cast to Arrow strings, decoded column-major by the table's decoder, the key
  columns hashed vectorised (:meth:`~..index.KeyHash.hash_columns`, equal to ``hash_one`` per row)
  and the whole run appended as one Arrow part (:meth:`~.memslice.MemSlice.append_batch`). All or
  nothing: a value that cannot be decoded raises :class:`~.memslice.BadRowError` with the commit LSN
  and the columns of the first row that fails (as the row-wise apply raises it for the change that
  brought it) before anything of the run is applied. Unlike the row-wise apply, which decodes at
  once only values its suspect checks flag, every value of the run is decoded here, so a bad value
  is always reported by its own change.
- UPDATE and DELETE runs: the lookup keys (old key, or the new row's key when no old tuple was
  sent) and the new rows' keys are hashed vectorised; rows are then taken in commit order in
  segments with no key hash repeated (a row whose lookup hash an earlier row of the segment looked
  up or wrote starts a new segment, so every lookup sees the state the row-wise apply would) — but
  for hot rows: an UPDATE that keeps its key and sends no old tuple, of a key an earlier such UPDATE
  of the segment wrote, stays in the segment, chained to that row. The row-wise lookup would find
  that row's new version (the MemSlice comes first, and the key held at most one live MemSlice row
  when the segment began), so the chained row is not looked up: the version it replaces, appended
  with the segment's part, is deleted at its commit LSN right after (sysbench's hot keys cut a
  2,000-row run into ~60 segments before). A segment is located in one batch
  (:meth:`~.lookup.KeyLookup.find_exact_batch` for an exact key; per row with the precomputed hash
  and the re-check otherwise), its new rows decoded before any of
  its deletes, then deleted and appended as one Arrow part. Rows the row-wise path must take —
  unchanged TOAST values (``'u'``), a NULL in an exact key, a whole old row (``'O'``) of a table that
  matches full rows when several live rows hold its key — are applied one by one with
  :meth:`~.apply.ChangeApplyRole.apply`, in their place in the order.
- TRUNCATE runs: as :meth:`~.apply.ChangeApplyRole.truncate`.

A run that raises stops the table as the row-wise apply does (the service's ``stop_table``); rows of
earlier segments of an UPDATE/DELETE run may have been applied, as earlier changes are row-wise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..cdc.columnar import KIND_UNCHANGED, CellColumn, ChangeRun
from ..cdc.pgoutput import TupleData
from ..cdc.txn import Change
from .apply import ChangeApplyRole
from .memslice import BadRowError

if TYPE_CHECKING:
    from .lookup import Found

__all__ = ["RunApplyRole"]


class RunApplyRole(ChangeApplyRole):
    """The batched apply of columnar runs (module docstring), over the row-wise apply rules."""

    # the table's text decoder (:class:`~.schema_state.TableSchemaRole`; declared for the type checker)
    _decode: Callable[[list[Any]], pa.RecordBatch]

    def apply_run(self, run: ChangeRun, commit_lsn: int) -> None:
        """Apply one run of a committed transaction at ``commit_lsn`` — or, for a batch run spanning
        several transactions (``run.commit_lsns``, :func:`~..cdc.columnar.merge_runs`), each row at its
        own commit LSN, ``commit_lsn`` then unused: the same results as applying its changes one by one
        with :meth:`apply` (module docstring). The Relation of the run must have
        been mapped (:meth:`column_map`, done by the service's schema check). Raises what the row-wise
        apply raises (:class:`~.memslice.BadRowError` for a value that cannot be decoded, ``ValueError``
        for a NULL exact key); the caller keeps ``last_change_lsn``."""
        if run.kind == "truncate":
            self.truncate(run.commit_lsn_at(0, commit_lsn))
        elif run.rows == 0:
            return
        elif run.kind == "insert":
            assert run.new is not None
            cols = self._run_text(run.new, run.relation_oid, run.rows)
            lsns = commit_lsn if run.commit_lsns is None else run.commit_lsns
            rb = self._decode_run(cols, lsns)
            hashes = self.hasher.hash_columns([cols[i] for i in self._key_idx])
            self.mem.append_batch(rb, hashes, lsns)
        else:
            self._apply_keyed_run(run, commit_lsn)

    # ------------------------------------------------------------------ columns of a run
    def _run_text(self, cells: tuple[CellColumn, ...], rel_oid: int, n: int) -> list[pa.Array]:
        """Our columns of a run's tuples as Arrow strings (NULL where not sent, NULL or unchanged)."""
        m = self._relmap[rel_oid]
        return [_text(cells[i].values) if i >= 0 else pa.nulls(n, pa.string()) for i in m]

    def _decode_run(self, cols: list[pa.Array], lsn: int | np.ndarray) -> pa.RecordBatch:
        """Decode a run's columns; a value that cannot be decoded raises :class:`BadRowError` as the
        row-wise apply raises it for the first change that brings one (its row decoded alone), naming
        ``lsn`` (the commit LSN, or one per row of ``cols``: that row's)."""
        try:
            return self._decode(cols)
        except ValueError:
            pass
        lo, hi = 0, len(cols[0])  # the shortest failing prefix: decoding a prefix fails from the bad row on
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                self._decode([c.slice(0, mid) for c in cols])
                lo = mid
            except ValueError:
                hi = mid
        try:
            self._decode([c.slice(hi - 1, 1) for c in cols])
        except ValueError as e:
            at = lsn if isinstance(lsn, int) else int(lsn[hi - 1])
            raise BadRowError(str(e), at, getattr(e, "columns", None)) from None
        at = lsn if isinstance(lsn, int) else int(lsn[hi - 1])
        raise BadRowError("a run of rows cannot be decoded", at)  # pragma: no cover (no single bad row)

    def _row_change(self, run: ChangeRun, i: int) -> Change:
        """Row ``i`` of a run as the reference's :class:`Change` (for the row-wise fallback)."""

        def tup(cells: tuple[CellColumn, ...] | None) -> TupleData | None:
            if cells is None:
                return None
            kinds = "".join(chr(int(c.kinds[i])) for c in cells)
            return TupleData(kinds, [c.values[i].as_py() for c in cells])

        ok = int(run.old_kinds[i]) if run.old_kinds is not None else 0
        return Change(
            run.kind,
            run.relation_oid,
            new=tup(run.new),
            old=tup(run.old) if ok else None,
            old_kind=chr(ok) if ok else None,
            relation=run.relation,
        )

    # ------------------------------------------------------------------ updates and deletes
    def _apply_keyed_run(self, run: ChangeRun, lsn: int) -> None:
        """An UPDATE or DELETE run (module docstring)."""
        n, update = run.rows, run.kind == "update"
        assert run.old is not None and run.old_kinds is not None
        has_old = run.old_kinds != 0
        m = self._relmap[run.relation_oid]
        old_keys = [_text(run.old[m[i]].values) if m[i] >= 0 else pa.nulls(n, pa.string()) for i in self._key_idx]
        new_cols = self._run_text(run.new, run.relation_oid, n) if update and run.new is not None else None
        if new_cols is None or has_old.all():
            key_cols = old_keys
        elif not has_old.any():
            key_cols = [new_cols[i] for i in self._key_idx]
        else:
            mask = pa.array(has_old)
            key_cols = [pc.if_else(mask, o, new_cols[i]) for o, i in zip(old_keys, self._key_idx)]
        rowwise = np.zeros(n, dtype=bool)  # rows the row-wise apply takes
        for cells in (run.new or ()) + run.old:
            rowwise |= cells.kinds == KIND_UNCHANGED
        hk = self._run_hashes(key_cols, rowwise)
        hn = self._run_hashes([new_cols[i] for i in self._key_idx], rowwise) if new_cols is not None else None
        full = (run.old_kinds == ord("O")) & self._match_full_row
        key_py = None if self.hasher.exact else [c.to_pylist() for c in key_cols]
        if not rowwise.any() and not full.any() and len(np.unique(hk)) == n and (hn is None or np.array_equal(hn, hk)):
            # the common case (distinct keys, none changed): the whole run is one segment
            self._apply_segment(run, list(range(n)), hk, hn, new_cols, key_cols, key_py, lsn)
            return
        plain = ~has_old & ~rowwise & ~full  # rows that may chain: an UPDATE of an unchanged key, no old tuple
        if hn is None:
            plain[:] = False
        multi = self._held_twice(hk) if plain.any() else set()  # hashes the MemIndex holds more than once
        if key_py is None and hn is not None and plain.all() and np.array_equal(hn, hk) and not multi:
            # UPDATEs of unchanged exact keys, some keys again and again (hot rows): one segment in which
            # every repeat replaces the version its key's previous row appended
            self._apply_segment(run, list(range(n)), hk, hn, new_cols, key_cols, key_py, lsn, _previous(hk))
            return
        self._apply_segments(run, hk, hn, new_cols, key_cols, key_py, lsn, rowwise, full, plain, multi)

    def _held_twice(self, hk: np.ndarray) -> set[int]:
        """The hashes of ``hk`` (uint64) under which the MemIndex holds more than one entry now."""
        u = np.unique(hk)
        qi, _, _ = self.mem.index.lookup_batch(u)
        counts = np.bincount(qi.astype(np.int64), minlength=len(u))
        return set(u[counts > 1].tolist())

    def _apply_segments(
        self,
        run: ChangeRun,
        hk: np.ndarray,
        hn: np.ndarray | None,
        new_cols: list[pa.Array] | None,
        key_cols: list[pa.Array],
        key_py: list[list[Any]] | None,
        lsn: int,
        rowwise: np.ndarray,
        full: np.ndarray,
        plain: np.ndarray,
        multi: set[int],
    ) -> None:
        """An UPDATE or DELETE run in segments, in commit order (module docstring). ``multi`` (hashes the
        MemIndex held twice when the run began) spares a MemSlice lookup per chain's first row until a
        segment is applied."""
        n = run.rows
        seg: list[int] = []
        prev: list[int] = []  # per row of seg: the position in seg of the row whose new version it replaces, or -1
        seen: set[int] = set()
        writer: dict[int, int] = {}  # key hash -> position in seg of its last writer that a repeat may replace
        hkl, hnl = hk.tolist(), (hn.tolist() if hn is not None else None)
        plainl = plain.tolist()
        fresh = True  # no segment applied yet: ``multi`` still holds

        def flush() -> None:
            nonlocal seg, prev, seen, writer, fresh
            if seg:
                self._apply_segment(run, seg, hk, hn, new_cols, key_cols, key_py, lsn, np.asarray(prev, np.int64))
                fresh = False
            seg, prev, seen, writer = [], [], set(), {}

        for i in range(n):
            h = hkl[i]
            p = writer.get(h) if plainl[i] else None
            if p is not None and hnl is not None and hnl[i] == h and (key_py is None or _same_key(key_py, i, seg[p])):
                writer[h] = len(seg)  # row i finds the version row seg[p] appended, as the row-wise lookup would
                seg.append(i)
                prev.append(p)
                continue
            if rowwise[i] or h in seen:
                flush()
            if rowwise[i] or (full[i] and len(self._candidates(h)) > 1):
                flush()
                self.apply(self._row_change(run, i), run.commit_lsn_at(i, lsn))
                fresh = False
                continue
            seg.append(i)
            prev.append(-1)
            seen.add(h)
            if hnl is not None:
                hn_i = hnl[i]
                seen.add(hn_i)
                if plainl[i] and hn_i == h and ((fresh and h not in multi) or len(self.mem.find(h)) <= 1):
                    writer[h] = len(seg) - 1  # its key's one live MemSlice row (if any) is the one it replaces
                else:
                    writer.pop(hn_i, None)  # a second row under that hash: the next lookup is the row-wise one
        flush()

    def _run_hashes(self, key_cols: list[pa.Array], rowwise: np.ndarray) -> np.ndarray:
        """Key hashes of a run's rows (uint64 (n,)); for an exact key, rows with a NULL key are marked in
        ``rowwise`` (the row-wise apply raises for them, in their place) and hashed as 0."""
        if self.hasher.exact and key_cols[0].null_count:
            rowwise |= ~key_cols[0].is_valid().to_numpy(zero_copy_only=False)
            key_cols = [pc.fill_null(key_cols[0], "0")]
        return self.hasher.hash_columns(key_cols)

    def _apply_segment(
        self,
        run: ChangeRun,
        seg: list[int],
        hk: np.ndarray,
        hn: np.ndarray | None,
        new_cols: list[pa.Array] | None,
        key_cols: list[pa.Array],
        key_py: list[list[Any]] | None,
        lsn: int,
        prev: np.ndarray | None = None,
    ) -> None:
        """Rows ``seg`` of a run (no lookup hash repeated among them but the chained rows'): located in one
        batch, their new rows decoded first, then their deletes and one Arrow part of new rows. ``prev``
        (int64, one per row of ``seg``): the position in ``seg`` of the earlier row whose new version the
        row replaces (an UPDATE of the key that row wrote, found there by the row-wise lookup), or -1. A
        chained row is not looked up; the version it replaces, appended with the part, is deleted at the
        row's commit LSN after it."""
        if not seg:
            return
        idx = np.asarray(seg, dtype=np.int64)
        chained = prev is not None and bool((prev >= 0).any())
        looked = idx[prev < 0].tolist() if chained and prev is not None else seg
        hs = hk[np.asarray(looked, dtype=np.int64)] if chained else hk[idx]
        founds: list[Found | None]
        if key_py is None:
            founds = self.find_exact_batch(hs)
        else:
            founds = [self._find([c[i] for c in key_py], h) for i, h in zip(looked, hs.tolist())]
        rb = None
        ls: int | np.ndarray = lsn if run.commit_lsns is None else run.commit_lsns[idx]
        if new_cols is not None:
            take = pa.array(idx)
            rb = self._decode_run([c if len(seg) == len(c) else c.take(take) for c in new_cols], ls)
        what = "UPDATE" if run.kind == "update" else "DELETE"
        mem_locs: list[tuple[int, int]] = []
        mem_hashes: list[int] = []
        mem_lsns: list[int] = []
        disk_files: list[str] = []
        disk_rows: list[int] = []
        disk_lsns: list[int] = []
        disk_idx: list[int] = []
        if isinstance(ls, int):
            row_lsns = [lsn] * len(looked)
        else:
            row_lsns = ls[prev < 0].tolist() if chained and prev is not None else ls.tolist()
        for i, f, at in zip(looked, founds, row_lsns):
            if f is None:
                key = [c[i] for c in key_py] if key_py is not None else [c[i].as_py() for c in key_cols]
                self._report_missing(what, key, at)
            elif f[0] == "mem":
                mem_locs.append(f[1])
                mem_hashes.append(f[2])
                mem_lsns.append(at)
            else:
                disk_files.append(f[1][0])
                disk_rows.append(f[1][1])
                disk_lsns.append(at)
                disk_idx.append(i)
        self.disk.delete_many(disk_files, disk_rows, disk_lsns)
        if disk_idx and self._delete_log_on():
            take = pa.array(disk_idx, pa.int64())
            values, full = self._old_rows(run, disk_idx)
            self.delete_log.add_many(disk_files, disk_rows, [c.take(take) for c in key_cols], values, full)
        self.mem.delete_many(mem_locs, mem_hashes, lsn if isinstance(ls, int) else mem_lsns)
        if rb is not None and hn is not None:
            b = len(self.mem.batches)  # the open buffer's batch number (kept when append_batch seals it)
            hs_new = hn[idx]
            start = self.mem.append_batch(rb, hs_new, ls)
            if chained and prev is not None:
                later = np.flatnonzero(prev >= 0)
                replaced = prev[later]
                self.mem.delete_many(
                    [(b, r) for r in (replaced + start).tolist()],
                    hs_new[replaced].tolist(),
                    lsn if isinstance(ls, int) else ls[later].tolist(),
                )

    def _old_rows(self, run: ChangeRun, rows: list[int]) -> tuple[list[pa.Array] | None, np.ndarray | None]:
        """For the delete log: the old rows' non-key columns (text) at ``rows`` of a run, and which of
        those rows carried the whole old row (``'O'``, no unchanged TOAST value); ``(None, None)`` when none did."""
        if run.old is None or run.old_kinds is None:
            return None, None
        idx = np.asarray(rows, dtype=np.int64)
        full = run.old_kinds[idx] == ord("O")
        if not full.any():
            return None, None
        for cells in run.old:
            full &= cells.kinds[idx] != KIND_UNCHANGED
        if not full.any():
            return None, None
        m = self._relmap[run.relation_oid]
        take = pa.array(idx)
        n = len(rows)
        values = [
            _text(run.old[m[i]].values.take(take)) if m[i] >= 0 else pa.nulls(n, pa.string()) for i in self._value_idx
        ]
        return values, full


def _text(values: pa.Array) -> pa.Array:
    """A run's ``pa.binary()`` values as ``pa.string()`` (the same buffers), checked to be UTF-8 as the
    row-wise apply's ``bytes.decode`` checks them (``pa.ArrowInvalid``, a ``ValueError``, otherwise)."""
    out = values.view(pa.string())
    out.validate(full=True)
    return out


def _previous(hk: np.ndarray) -> np.ndarray:
    """For each row (uint64 key hashes in commit order): the row before it with the same hash, or -1."""
    order = np.argsort(hk, kind="stable")
    prev = np.full(len(hk), -1, dtype=np.int64)
    same = hk[order[1:]] == hk[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _same_key(key_py: list[list[Any]], i: int, j: int) -> bool:
    """Do rows ``i`` and ``j`` of a run hold the same lookup key (its text values)?"""
    return all(c[i] == c[j] for c in key_py)
