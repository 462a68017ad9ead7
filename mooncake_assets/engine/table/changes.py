"""The change feed of one mirrored table: the rows that differ between its reads at two LSNs.

``changes(since, until)`` is the **net** difference between the table read at ``since`` and read at
``until`` (a read at L holds the transactions with commit_lsn < L), as multisets of rows:

- ``delete`` rows: in the read at ``since``, not in the read at ``until``;
- ``insert`` rows: in the read at ``until``, not in the read at ``since``.

So applying the feed to the read at ``since`` (remove one equal row per ``delete``, add every
``insert``) gives the read at ``until`` exactly, for tables with and without a primary key. An UPDATE
is the delete of the old row and the insert of the new one (by key: the same key in both; the output
is ordered by key with a key's delete before its insert); an update that changes no value, and a
row both inserted and deleted inside the range, are not in the feed (neither read differs).

Where the changes are found (:func:`plan_changes`):

- **the buffer window** ``[flushed_lsn, applied_lsn]`` of the live table: every LSN in it is a *cut*
  (a feed may start or end there); the MemSlice rows carry the commit LSN that inserted and deleted
  them and the deletes of file rows not yet persisted carry theirs, so ``_commit_lsn`` is exact;
- **persisted history**: each retained Iceberg snapshot on the ``main`` branch records the LSN its
  state is at (summary ``mooncake.flush-lsn``); that LSN is a cut. Between two snapshots the changes
  are the rows of the data files added and the newly deleted positions of older files (their values
  read back from those files); a file rewritten by compaction shows its rows as deleted and inserted,
  and such identical pairs cancel. Rows there carry no commit LSN (``_commit_lsn`` is null): only the
  snapshot's LSN is known, and an LSN strictly between two snapshot LSNs below the buffer window is
  not a cut (:class:`NotACutError` names the nearest ones).

Output: one Arrow table, the table's columns in today's layout (rows of files written under an older
schema are projected by field id) plus ``_change`` (string ``insert``/``delete``) and ``_commit_lsn``
(string ``X/Y``: the commit that inserted or deleted the row; null when only the persisted interval
is known).

Errors (all ``ValueError``, one line): :class:`NotACutError`, :class:`HistoryError` (older than the
oldest retained cut: names it, and says whether the mirror's history starts there because the
table was created or re-created), and ``since`` after ``until`` or ``until`` past what is applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from ..iceberg.cuts import CUT_TAG_PREFIX, parse_cut_tag
from ..iceberg.names import SUMMARY_DELETE_LOG, SUMMARY_DELETE_LOG_ROWS
from ..lsn import Lsn
from .change_rows import cancel_pairs, read_positions
from .delete_log import Logged, logged_keys, read_logs, typed_entries
from .evolution import project
from .memslice import changed_rows

if TYPE_CHECKING:
    from ..iceberg.state import PersistedState
    from .mirror import MirrorTable

__all__ = [
    "CHANGE",
    "COMMIT_LSN",
    "ChangePlan",
    "HistoryError",
    "NotACutError",
    "SnapshotCut",
    "persisted_cut",
    "cancel_pairs",
    "check_deletes_mode",
    "kept",
    "feed_sources",
    "identity_note",
    "plan_changes",
    "read_positions",
    "snapshot_cuts",
]

CHANGE = "_change"
COMMIT_LSN = "_commit_lsn"
SUMMARY_FLUSH_LSN = "mooncake.flush-lsn"


class HistoryError(ValueError):
    """The range starts before the oldest retained cut (``oldest``: that LSN). Permanent."""

    def __init__(self, message: str, oldest: int):
        super().__init__(message)
        self.oldest = oldest


class NotACutError(ValueError):
    """An LSN in persisted history that no snapshot records (``before``/``after``: the nearest cuts,
    None when there is none on that side). Permanent for that LSN; pick a cut."""

    def __init__(self, message: str, before: int | None, after: int | None):
        super().__init__(message)
        self.before, self.after = before, after


@dataclass(frozen=True)
class SnapshotCut:
    """A retained snapshot of the ``main`` branch as a cut: ``lsn`` (its ``mooncake.flush-lsn``),
    ``snapshot_id`` (the newest snapshot with that LSN: a compaction's snapshot keeps its parent's
    LSN and rows), ``first``: it is the table's first snapshot (no parent), where its history starts."""

    lsn: int
    snapshot_id: int
    first: bool


def snapshot_cuts(table: MirrorTable) -> list[SnapshotCut]:
    """The cuts of ``table``'s persisted history, oldest first (empty without an Iceberg table): every
    retained snapshot with a ``mooncake.flush-lsn``, and the LSN of every consistent cut's tag
    ``lsn-X-Y`` (``engine/iceberg/cuts.py``: its snapshot holds the table's state at that LSN). The mirror is the table's only writer and commits
    to ``main`` alone, so its snapshots form one line; they are taken from the metadata's snapshot
    list rather than by walking parents, so a retained (tagged) snapshot behind an expired one counts."""
    if table.iceberg is None:
        return []
    md = table.iceberg.refresh().table.metadata
    by_lsn: dict[int, SnapshotCut] = {}
    for s in sorted(md.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        text = s.summary.additional_properties.get(SUMMARY_FLUSH_LSN) if s.summary else None
        if not text:
            continue
        lsn = int(Lsn.parse(text))
        first = s.parent_snapshot_id is None or (lsn in by_lsn and by_lsn[lsn].first)
        by_lsn[lsn] = SnapshotCut(lsn, s.snapshot_id, first)  # the newest snapshot with that LSN wins
    retained = {s.snapshot_id for s in md.snapshots}
    for name, ref in md.refs.items():  # a consistent cut's tag lsn-X-Y: its snapshot holds the state at X/Y
        at = parse_cut_tag(name) if name.startswith(CUT_TAG_PREFIX) else None
        if at is not None and ref.snapshot_id in retained and int(at) not in by_lsn:
            by_lsn[int(at)] = SnapshotCut(int(at), ref.snapshot_id, False)
    return sorted(by_lsn.values(), key=lambda c: c.lsn)


def persisted_cut(table: MirrorTable) -> int:
    """The LSN of ``table``'s newest snapshot cut (a feed's ``until`` that stays a cut while that
    snapshot is retained, unlike an LSN of the buffer window once a flush passes it). ``ValueError``
    when the table has no snapshot yet."""
    cuts = snapshot_cuts(table)
    if not cuts:
        raise ValueError(f"table {table.name} has no persisted snapshot yet (run `mooncake persist {table.name}`)")
    return cuts[-1].lsn


@dataclass
class _FileRows:
    """Rows of one data file that changed: ``where`` (warehouse location or local path), ``positions``
    (0-based rows), ``change`` (``insert``/``delete``), ``lsns``: position -> commit LSN where known."""

    where: str
    location: bool
    positions: BitMap64
    change: str
    lsns: dict[int, int] = field(default_factory=dict)
    whole: bool = False  # a delete of every live row of a file that leaves the table (compaction, all deleted)

    def lsn_array(self) -> np.ndarray:
        """The commit LSN of each of ``positions`` in order (uint64; 0 where unknown)."""
        if not self.lsns:  # persisted history: none known
            return np.zeros(len(self.positions), dtype=np.uint64)
        return np.array([self.lsns.get(p, 0) for p in self.positions], dtype=np.uint64)


@dataclass
class ChangePlan:
    """What :func:`plan_changes` captured (under the service lock); :meth:`execute` reads the file rows
    (no lock needed: data files are immutable) and returns the feed.

    ``since``/``until``: the cuts; ``exact``: every ``_commit_lsn`` is known (both in the buffer window);
    ``deletes``: ``rows`` (deleted rows in full) or ``keys`` (deleted rows as their key only:
    :mod:`.change_keys`)."""

    since: Lsn
    until: Lsn
    exact: bool
    schema: pa.Schema
    defaults: dict[int, Any]
    key: list[str]
    io: Any
    files: list[_FileRows] = field(default_factory=list)
    mem: tuple[pa.Table, np.ndarray, pa.Table, np.ndarray] | None = None
    deletes: str = "rows"
    #: delete logs (:mod:`.delete_log`) of the snapshots the range covers: for ``deletes="keys"`` every
    #: one; for ``deletes="rows"`` those holding whole old rows (REPLICA IDENTITY FULL)
    logs: list[str] = field(default_factory=list)
    #: the live table's delete log (:meth:`.delete_log.DeleteLog.table`, file names), each file's
    #: location or local path by name, the key columns' specs and the other columns' specs: the keys
    #: (and whole old rows) of pending deletes
    mem_log: tuple[pa.Table, dict[str, str], list[Any], list[Any]] | None = None
    #: what the last :meth:`gather` did with deleted positions read as keys: ``logged`` (taken from
    #: the delete logs) and ``read`` (read from data files), in positions
    key_sources: dict[str, int] = field(default_factory=dict)
    #: the same for deleted positions read as whole rows (``deletes="rows"``, files that stay): ``logged``
    #: (whole old rows from the delete logs) and ``read`` (read from the data files)
    row_sources: dict[str, int] = field(default_factory=dict)
    #: the data files (location or local path) the last :meth:`gather` read, in the order it read them
    files_read: list[str] = field(default_factory=list)

    def gather(
        self, key_schema: pa.Schema | None = None
    ) -> tuple[list[pa.Table], list[np.ndarray], list[pa.Table], list[np.ndarray], list[pa.Table], list[np.ndarray]]:
        """Read the plan's rows once: ``(inserts, their LSNs, deletes in full, their LSNs, deletes as
        keys, their LSNs)``, each a list of Arrow tables and matching uint64 LSN arrays. ``key_schema``
        None: every deleted row is read in full (the key lists stay empty); given: deleted positions of
        files that stay in the table are read as those key columns only (by field id), while the
        buffer's deletes and the rows of files leaving the table (``whole``) are read in full; the keys
        of a file's deleted positions come from the range's delete logs (``logs``) when those hold
        every one of them, else from the file."""
        ins: list[pa.Table] = []
        ins_l: list[np.ndarray] = []
        dels: list[pa.Table] = []
        del_l: list[np.ndarray] = []
        keys: list[pa.Table] = []
        key_l: list[np.ndarray] = []
        logged: Logged | None = None
        self.key_sources = {"logged": 0, "read": 0}
        self.row_sources = {"logged": 0, "read": 0}
        self.files_read = []
        if self.mem is not None:
            mi, mil, md, mdl = self.mem
            ins.append(mi)
            ins_l.append(mil)
            dels.append(md)
            del_l.append(mdl)
        for fr in self.files:
            if not len(fr.positions):
                continue
            if fr.change == "insert":
                ins.append(self.read_rows(fr))
                ins_l.append(fr.lsn_array())
            elif key_schema is None and not fr.whole and (self.logs or self.mem_log is not None):
                if logged is None:  # whole old rows (REPLICA IDENTITY FULL) from the delete logs
                    logged = self._logged(self.schema, full_only=True)
                got = logged_keys(logged, fr.where, fr.positions)
                self.row_sources["logged" if got is not None else "read"] += len(fr.positions)
                dels.append(got if got is not None else self.read_rows(fr))
                del_l.append(fr.lsn_array())
            elif key_schema is None or fr.whole:
                if key_schema is None and not fr.whole:
                    self.row_sources["read"] += len(fr.positions)
                dels.append(self.read_rows(fr))
                del_l.append(fr.lsn_array())
            else:
                if logged is None:
                    logged = self._logged(key_schema)
                got = logged_keys(logged, fr.where, fr.positions)
                self.key_sources["logged" if got is not None else "read"] += len(fr.positions)
                keys.append(got if got is not None else self.read_rows(fr, key_schema))
                key_l.append(fr.lsn_array())
        return ins, ins_l, dels, del_l, keys, key_l

    def _logged(self, key_schema: pa.Schema, full_only: bool = False) -> Logged:
        """The keys the range's delete logs hold (snapshots' and the live table's), by file; with
        ``full_only`` the whole old rows they hold (``key_schema``: the table's layout)."""
        extra = []
        if self.mem_log is not None:
            entries, where, specs, value_specs = self.mem_log
            t = typed_entries(entries, where, specs, value_specs if full_only else None)
            extra = [t] if t is not None else []
        if not self.logs and not extra:
            return {}
        return read_logs(self.io, self.logs, key_schema, extra, full_only=full_only)

    def execute(self) -> pa.Table:
        """The feed (module docstring): the table's columns + ``_change`` + ``_commit_lsn``; deleted rows
        in full whatever ``deletes`` says (:func:`.change_keys.run_plan` honours it)."""
        ins, ins_l, dels, del_l, _, _ = self.gather()
        i_tab, i_lsn = self.concat_rows(ins, ins_l)
        d_tab, d_lsn = self.concat_rows(dels, del_l)
        keep_i, keep_d = cancel_pairs(i_tab, d_tab, self.key)
        return self.output(*kept(i_tab, i_lsn, keep_i), *kept(d_tab, d_lsn, keep_d))

    def read_rows(self, fr: _FileRows, schema: pa.Schema | None = None) -> pa.Table:
        """The rows at ``fr.positions`` in the layout ``schema`` (default: the table's); with a
        ``schema`` of some of the table's columns only those columns are read from the file."""
        target = self.schema if schema is None else schema
        self.files_read.append(fr.where)
        only = None if schema is None else target
        if fr.location:
            with self.io.new_input(fr.where).open() as stream:
                rows = read_positions(stream, fr.positions, only)
        else:
            rows = read_positions(fr.where, fr.positions, only)
        return project(rows, target, self.defaults)

    def concat_rows(self, tabs: list[pa.Table], lsns: list[np.ndarray]) -> tuple[pa.Table, np.ndarray]:
        """``tabs`` (cast to the table's layout) as one table, with their commit LSNs (uint64, 0: unknown)."""
        tabs = [t.cast(self.schema) if not t.schema.equals(self.schema) else t for t in tabs]
        tab = pa.concat_tables(tabs) if tabs else self.schema.empty_table()
        return tab.combine_chunks(), (np.concatenate(lsns) if lsns else np.zeros(0, dtype=np.uint64))

    def output(self, i_tab: pa.Table, i_lsn: np.ndarray, d_tab: pa.Table, d_lsn: np.ndarray) -> pa.Table:
        """Inserted and deleted rows (same schema) with their LSNs as the feed: ``_change`` and
        ``_commit_lsn`` appended, ordered by key with a key's delete before its insert."""

        def tagged(t: pa.Table, lsns: np.ndarray, kind: str) -> pa.Table:
            text = lsn_texts(lsns)
            return t.append_column(CHANGE, pa.repeat(pa.scalar(kind), t.num_rows).cast(pa.string())).append_column(
                COMMIT_LSN, text
            )

        out = pa.concat_tables([tagged(d_tab, d_lsn, "delete"), tagged(i_tab, i_lsn, "insert")])
        order = [(k, "ascending") for k in self.key] + [(CHANGE, "ascending")]
        try:  # pairs of an UPDATE side by side: by key, a key's delete before its insert
            return out.sort_by(order) if self.key else out
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            return out  # a key type Arrow cannot sort: rows stay deletes first, then inserts


def kept(tab: pa.Table, lsns: np.ndarray, keep: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """The rows of ``tab`` and ``lsns`` where ``keep`` is True; as they are when it is True everywhere
    (the usual case: no equal pair cancelled; a filter would copy every column)."""
    if keep.all():
        return tab, lsns
    return tab.filter(keep), lsns[keep]


# ---------------------------------------------------------------------------------------------- planning
DELETE_MODES = ("rows", "keys")


def lsn_texts(lsns: np.ndarray) -> pa.Array:
    """``X/Y`` text of each LSN of ``lsns`` (uint64), null for 0 (unknown); each distinct LSN formatted once."""
    if not len(lsns) or not lsns.any():
        return pa.nulls(len(lsns), pa.string())
    uniq, inverse = np.unique(lsns, return_inverse=True)
    texts = pa.array([str(Lsn(int(x))) if x else None for x in uniq], type=pa.string())
    return texts.take(pa.array(inverse.astype(np.int64)))


def check_deletes_mode(name: str, key: list[str], deletes: str) -> None:
    """``ValueError`` (one line naming table ``name``) unless ``deletes`` is one of :data:`DELETE_MODES`
    and, for ``keys``, the table has a primary key (``key``: its columns)."""
    if deletes not in DELETE_MODES:
        raise ValueError(f"table {name}: deletes must be one of {', '.join(DELETE_MODES)}, not {deletes!r}")
    if deletes == "keys" and not key:
        raise ValueError(f"table {name} has no primary key: deletes as keys need one (ask for deletes as rows instead)")


def plan_changes(table: MirrorTable, since: int, until: int, deletes: str = "rows") -> ChangePlan:
    """Validate ``[since, until)`` for ``table`` and capture what the feed needs (call under the
    service lock; :meth:`ChangePlan.execute` then runs without it). ``deletes``: ``rows`` or ``keys``
    (:mod:`.change_keys`; ``ValueError`` for another value or ``keys`` on a table without a key).

    Raises ``ValueError`` when ``since > until`` or ``until`` is past ``applied_lsn`` (the caller waits
    for it first), :class:`HistoryError` when ``since`` is older than the oldest retained cut,
    :class:`NotACutError` for an LSN of persisted history no snapshot records."""
    name = table.name
    check_deletes_mode(name, list(table.schema.key_columns or []), deletes)
    if since > until:
        raise ValueError(f"table {name}: --since {Lsn(since)} is after --until {Lsn(until)}")
    if until > table.applied_lsn:
        raise ValueError(f"table {name}: LSN {Lsn(until)} is not applied yet (applied up to {Lsn(table.applied_lsn)})")
    cuts = snapshot_cuts(table)
    live_lo = table.flushed_lsn
    oldest = min([c.lsn for c in cuts] + [live_lo])
    if since < oldest:
        first = cuts[0].first if cuts and cuts[0].lsn == oldest else False
        why = (
            "where its history starts: the mirror was created (or dropped and re-created) there"
            if first or not cuts
            else "older snapshots have expired"
        )
        raise HistoryError(
            f"table {name}: no changes before LSN {Lsn(oldest)} are kept ({why}); "
            f"the oldest available LSN is {Lsn(oldest)}",
            oldest,
        )
    plan = ChangePlan(
        since=Lsn(since),
        until=Lsn(until),
        exact=since >= live_lo,
        schema=table.arrow_schema,
        defaults=table.defaults,
        key=list(table.schema.key_columns or []),
        io=table.iceberg.io if table.iceberg is not None else None,
        deletes=deletes,
    )
    if since == until:
        return plan
    # full rows from the logs: a keyed table whose changes carried whole old rows (REPLICA IDENTITY FULL)
    full_rows = deletes == "rows" and bool(plan.key)
    if until > live_lo and len(table.delete_log) and (deletes == "keys" or (full_rows and table.delete_log.full_rows)):
        where = {f.name: _where(f)[0] for f in table.files.values()}
        entries = table.delete_log.table()
        if entries is not None:
            specs = [table.schema.columns[i] for i in table._key_idx]
            plan.mem_log = (entries, where, specs, [table.schema.columns[i] for i in table._value_idx])
    if since >= live_lo:  # both in the buffer window: exact
        plan.mem = changed_rows(table.mem, since, until)
        plan.files = _live_deletes(table, since, until)
        return plan
    a_id = _snapshot_at(table, cuts, since, live_lo)
    a = _persisted(table, a_id)
    if until >= live_lo:
        plan.mem = changed_rows(table.mem, since, until)
        plan.files = _diff_to_live(table, a, since, until)
        b_id = None
    else:
        b_id = _snapshot_at(table, cuts, until, live_lo)
        plan.files = _diff_snapshots(a, _persisted(table, b_id))
    if deletes == "keys" or full_rows:
        plan.logs = _delete_logs(table, a_id, b_id, rows=full_rows)
    return plan


def _delete_logs(table: MirrorTable, after: int, upto: int | None, rows: bool = False) -> list[str]:
    """Locations of the delete logs of the retained snapshots after snapshot ``after`` up to and
    including ``upto`` (None: the newest), by sequence number (the mirror commits one line on ``main``);
    ``rows``: only logs holding whole old rows (summary ``mooncake.delete-log-rows``)."""
    assert table.iceberg is not None
    snaps = table.iceberg.table.metadata.snapshots
    seq = {s.snapshot_id: s.sequence_number or 0 for s in snaps}
    lo = seq.get(after, 0)
    hi = seq[upto] if upto is not None and upto in seq else max(seq.values(), default=0)
    out = []
    for s in snaps:
        props = s.summary.additional_properties if s.summary else {}
        loc = props.get(SUMMARY_DELETE_LOG)
        if rows and not int(props.get(SUMMARY_DELETE_LOG_ROWS) or 0):
            continue
        if loc and lo < (s.sequence_number or 0) <= hi:
            out.append(loc)
    return out


def _snapshot_at(table: MirrorTable, cuts: list[SnapshotCut], lsn: int, live_lo: int) -> int:
    for c in cuts:
        if c.lsn == lsn:
            return c.snapshot_id
    before = max((c.lsn for c in cuts if c.lsn < lsn), default=None)
    after = min([c.lsn for c in cuts if c.lsn > lsn] + [live_lo])
    near = (f"{Lsn(before)} before it, " if before is not None else "") + f"{Lsn(after)} after it"
    raise NotACutError(
        f"table {table.name}: LSN {Lsn(lsn)} is not a cut of its persisted history (changes below LSN "
        f"{Lsn(live_lo)} start and end only at a snapshot's LSN; nearest: {near}; "
        "a reader that keeps a cursor stays on cuts with --until persisted)",
        before,
        after,
    )


def _persisted(table: MirrorTable, snapshot_id: int) -> PersistedState:
    """Snapshot ``snapshot_id``'s state without its index (the feed needs none), from the metadata that
    :func:`snapshot_cuts` reloaded for this plan (no second catalog round trip)."""
    assert table.iceberg is not None  # a snapshot cut exists only with an Iceberg table
    return cast("PersistedState", table.iceberg.state(snapshot_id, index=False, refresh=False))


def _all_but(rows: int, deleted: BitMap64) -> BitMap64:
    return BitMap64(range(rows)) - deleted


def _delete_lsns(f: Any, positions: BitMap64, lo: int, hi: int) -> dict[int, int]:
    """Commit LSN of each of ``positions`` deleted in ``[lo, hi)`` as DiskFile ``f`` still knows it."""
    out: dict[int, int] = {}
    if f.truncated_lsn and lo <= f.truncated_lsn < hi:
        out = dict.fromkeys(positions, f.truncated_lsn)
    if f.pending:
        pos, at = f.pending.arrays()  # positions ascending
        want = np.fromiter(positions, dtype=np.uint64, count=len(positions))
        keep = np.isin(pos, want) & (at >= lo) & (at < hi)
        hit = dict(zip(pos[keep].tolist(), at[keep].tolist()))
        out = {**out, **hit} if out else hit  # both in ascending position order, as ``positions`` iterates
    return out


def _live_deletes(table: MirrorTable, since: int, until: int) -> list[_FileRows]:
    """Both cuts in the buffer window: every current file's rows predate ``since`` (a flush raises
    ``flushed_lsn`` past the rows it writes), so only deletes between the cuts differ."""
    out = []
    for f in table.files.values():
        newly = f.deleted_at(until) - f.deleted_at(since)
        if len(newly):
            out.append(_FileRows(*_where(f), newly, "delete", _delete_lsns(f, newly, since, until)))
    return out


def _where(f: Any) -> tuple[str, bool]:
    return (f.location, True) if f.location else (f.local_path, False)


def _diff_to_live(table: MirrorTable, a: PersistedState, since: int, until: int) -> list[_FileRows]:
    """Snapshot ``a`` (at ``since``) to the live files at ``until``."""
    out = []
    old = {loc.rsplit("/", 1)[-1]: (loc, df) for loc, df in a.data_files.items()}
    for f in table.files.values():
        now = f.deleted_at(until)
        if f.name in old:
            newly = now - old[f.name][1].deleted
            if len(newly):
                out.append(_FileRows(*_where(f), newly, "delete", _delete_lsns(f, newly, since, until)))
        else:
            out.append(_FileRows(*_where(f), _all_but(f.num_rows, now), "insert"))
    for name, (loc, df) in old.items():
        if name not in table.files:
            out.append(_FileRows(loc, True, _all_but(df.record_count, df.deleted), "delete", whole=True))
    return out


def _diff_snapshots(a: PersistedState, b: PersistedState) -> list[_FileRows]:
    """Snapshot ``a`` to snapshot ``b``: files added, files gone, positions newly deleted."""
    out = []
    for loc, df in b.data_files.items():
        old = a.data_files.get(loc)
        if old is None:
            out.append(_FileRows(loc, True, _all_but(df.record_count, df.deleted), "insert"))
        else:
            newly = df.deleted - old.deleted
            if len(newly):
                out.append(_FileRows(loc, True, newly, "delete"))
    for loc, df in a.data_files.items():
        if loc not in b.data_files:
            out.append(_FileRows(loc, True, _all_but(df.record_count, df.deleted), "delete", whole=True))
    return out


def feed_sources(plan: ChangePlan) -> dict[str, int]:
    """Where an executed ``plan``'s deleted rows came from: ``rows_logged`` / ``rows_read`` (whole
    deleted rows of files that stay, from the delete logs / read from the data files), ``keys_logged`` /
    ``keys_read`` (the same for deleted keys, ``deletes="keys"``), ``files_read`` (data file reads)."""
    return {
        "rows_logged": plan.row_sources.get("logged", 0),
        "rows_read": plan.row_sources.get("read", 0),
        "keys_logged": plan.key_sources.get("logged", 0),
        "keys_read": plan.key_sources.get("read", 0),
        "files_read": len(plan.files_read),
    }


def identity_note(sources: Mapping[str, Any], table: str, keys_option: str) -> str | None:
    """One line saying why a full-row feed of ``table`` read whole deleted rows back from its data
    files — the source's replica identity sends only the key of an updated or deleted row — with the
    statement that changes that (``ALTER TABLE … REPLICA IDENTITY FULL``, PostgreSQL docs "ALTER
    TABLE") and ``keys_option`` (how the caller asks for deleted keys instead). ``sources``: what
    ``ReplicatorService.changes`` fills (:func:`feed_sources` plus ``source`` and
    ``replica_identity``). None when no row was read back (a feed of deleted keys counts none) or the
    identity is FULL (rows a compaction rewrote are read back under any identity)."""
    read = int(sources.get("rows_read") or 0)
    if read == 0 or sources.get("replica_identity") in (None, "f"):
        return None
    src = sources.get("source") or table
    return (
        f"note: {read} deleted rows of {table} were read back from its data files: the replica identity "
        f"of {src} sends only the key of an updated or deleted row. On a table whose changes are read "
        f"often, ALTER TABLE {src} REPLICA IDENTITY FULL makes the feed take them from the mirror's "
        f"delete logs (about the cost of deleted keys; more WAL per UPDATE and DELETE: docs/changes.md); "
        f"or read {keys_option}"
    )


def lsn_stats(feed: pa.Table) -> dict[str, int]:
    """Counts of a feed: ``inserts``, ``deletes``, ``exact`` (rows with a ``_commit_lsn``)."""
    if feed.num_rows == 0:
        return {"inserts": 0, "deletes": 0, "exact": 0}
    ch = feed.column(CHANGE)
    ins = int(pc.sum(pc.equal(ch, "insert")).as_py() or 0)
    return {"inserts": ins, "deletes": feed.num_rows - ins, "exact": feed.num_rows - feed.column(COMMIT_LSN).null_count}
