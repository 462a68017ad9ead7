"""The service's scheduled check of each mirror against its source (``verify_interval_s``).

A mirror that stops following its source must not stay ``ready``. Every ``verify_interval_s`` seconds
(settings.json; default 600, 0 = never) a worker thread of the service checks every ready mirror at
one LSN, the way ``mooncake verify`` does (``mooncake_assets/verify.py``):

- a *temporary* logical slot exports a snapshot; its consistent point C splits history exactly as the
  mirror's LSNs do, so "source at that snapshot" and "mirror at C" are the same moment;
- the source is read at the snapshot (COPY, decoded by the mirror's own text decoder, one batch at a
  time), the mirror at exactly C (its ReadState: Parquet files minus deletion vectors plus the
  in-memory rows, through DuckDB);
- instead of comparing rows, each side is reduced to a **checksum per key range**: the rows are split
  into :data:`RANGES` ranges by the hash of their key (the whole row for a table without one), and
  per range the row count and the sum (exact, no wrap-around) of DuckDB's 64-bit ``hash()`` of every
  row are kept. Sums do not depend on row order, so memory stays at one batch: the source's COPY
  batches and the mirror's rows (its union view, read as Arrow batches of 100,000 rows) go through the
  same per-batch aggregate.

One round checks every table at one LSN: one temporary slot, one wait for the mirrors to reach it,
one source connection reading at its snapshot.

The result — ``match``, ``mismatch`` (with the ranges and row counts that differ), ``skipped`` (why)
or ``error`` — with its LSN and time is kept per table (``status``, ``list-tables``, the Dagster
sensor's observations) and in the registry (it survives a restart). A mismatch shows the table's
state as ``error``: the rows that differ are what the full comparison, ``mooncake verify TABLE``
(on demand), prints. The check only reads: it takes the service lock only to take the ReadState.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Any

import duckdb
import psycopg
import pyarrow as pa

from ..cdc import ReplicationConnection, describe_table, initial_copy
from ..lsn import Lsn
from ..pg.conninfo import with_options
from ..read.union import UnionReader, _ident
from ..table.read_state import ReadState
from ..timefmt import utc_now
from .parts import VerifierHost

log = logging.getLogger("mooncake.verify")

RANGES = 16  # key ranges of the checksum (by the key's hash)

Checksums = dict[int, list[int]]  # range -> [rows, hash sum]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def checksum_sql(relation: str, columns: list[str], key: list[str]) -> str:
    """``SELECT range, count(*), sum(hash(row))`` over ``relation`` (a DuckDB table or view name): one
    result row per key range present, columns ``INTEGER`` (the range, ``0 .. RANGES-1``), ``BIGINT``
    (rows) and ``HUGEINT`` (the exact sum of the rows' 64-bit ``UBIGINT`` hashes; NULL for no rows).
    Grouped by position: DuckDB binds a name in GROUP BY to a column of the table before an alias,
    so a user column named like an alias must not change the grouping."""
    cols = ", ".join(_ident(c) for c in columns)
    keys = ", ".join(_ident(c) for c in (key or columns))
    return (
        f"SELECT CAST(hash({keys}) % {RANGES} AS INTEGER), count(*), "
        f"sum(hash({cols})::HUGEINT) FROM {relation} GROUP BY 1"
    )


def _add(acc: Checksums, rows: Iterable[tuple[Any, Any, Any]]) -> None:
    for r, n, h in rows:
        c = acc.setdefault(int(r), [0, 0])
        c[0] += int(n)
        c[1] += int(h or 0)


def _sum_batches(batches: Iterable[pa.RecordBatch], columns: list[str], key: list[str]) -> Checksums:
    """``{range: [rows, hash sum]}`` of an iterable of Arrow record batches (columns ``columns``), each
    batch reduced by :func:`checksum_sql` in DuckDB on its own: memory stays at one batch."""
    con = duckdb.connect()
    acc: Checksums = {}
    sql = checksum_sql("b", columns, key)
    for batch in batches:
        con.register("b", pa.Table.from_batches([batch]))
        _add(acc, con.execute(sql).fetchall())
        con.unregister("b")
    return acc


def source_checksums(
    conn: psycopg.Connection[Any],
    source: str,
    snapshot: str,
    columns: list[str],
    key: list[str],
    options: dict[str, Any] | None = None,
) -> Checksums | None:
    """``{range: [rows, hash sum]}`` of the source table at ``snapshot`` (None when its columns are not
    ``columns``: a schema change that has not reached the mirror yet). ``conn``: an ordinary, idle
    connection; ``options``: the mirror's create-table column options (``column_types``, ``exclude``)."""
    schema = describe_table(conn, source, **(options or {}))
    conn.rollback()
    if [c.name for c in schema.columns] != columns:
        return None
    return _sum_batches(initial_copy(conn, schema, snapshot), columns, key)


def mirror_checksums(rs: ReadState, mem: pa.Table, columns: list[str], key: list[str]) -> Checksums:
    """``{range: [rows, hash sum]}`` of a mirror's ReadState ``rs`` and its in-memory rows ``mem``.

    The rows go through Arrow exactly as ``mooncake verify`` reads them (DuckDB's union view → Arrow),
    then the same aggregate as the source's runs on them, batch by batch."""
    reader = UnionReader(client=None)
    reader.register_state(rs, mem, "__mc_verify", columns=columns, mode="lazy")
    return _sum_batches(
        reader.con.execute(f"SELECT * FROM {_ident('__mc_verify')}").fetch_record_batch(100_000), columns, key
    )


def describe_difference(src: Checksums, mir: Checksums) -> tuple[list[int], int, int]:
    """(ranges whose count or checksum differ, source rows, mirror rows)."""
    ranges = sorted(r for r in set(src) | set(mir) if src.get(r, [0, 0]) != mir.get(r, [0, 0]))
    return ranges, sum(v[0] for v in src.values()), sum(v[0] for v in mir.values())


class Verifier:
    """The scheduled check of one service's mirrors (see the module docstring).

    ``service``: the :class:`~.service.ReplicatorService` (a :class:`~.parts.VerifierHost`); ``interval_s``: seconds between rounds (0:
    no thread, :meth:`run_once` still works)."""

    def __init__(self, service: VerifierHost, interval_s: float) -> None:
        self.service = service
        self.interval_s = float(interval_s or 0)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._round = threading.Lock()

    def start(self) -> None:
        """Start the worker thread that runs :meth:`run_once` every ``interval_s`` seconds (none when
        ``interval_s`` is 0; a second call does nothing)."""
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mooncake-verify", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the worker thread: a round in progress stops before its next table; waits up to 10 s."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                log.exception("scheduled verify failed")

    def run_once(self, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Check ``names`` (default: every mirror) now; returns ``{table: result}`` (see :meth:`check`)
        and records each result (:meth:`ReplicatorService.record_verify`). One round at a time.

        Every table of a round is checked at one LSN: one temporary slot (creating it waits for the
        source's next running-transactions record), one wait for the mirrors to reach its consistent
        point, one source connection reading at its snapshot. A source that cannot be reached, or
        mirrors that do not reach the LSN within 60 s, give every table the same ``error`` /
        ``skipped`` result. ``LookupError`` (one line) naming the names that are not mirrored tables."""
        with self._round:
            svc = self.service
            with svc.lock:
                unknown = [n for n in names or [] if n not in svc.tables]
                if unknown:
                    have = ", ".join(sorted(svc.tables)) or "none yet"
                    raise LookupError(f"no mirrored table named {', '.join(unknown)}; mirrors: {have}")
                names = list(names or svc.tables)
            out: dict[str, dict[str, Any]] = {}
            if not names:
                return out
            base: dict[str, Any] = {"at": utc_now(), "lsn": None, "ranges": RANGES}

            def every(
                res: dict[str, Any],
            ) -> dict[str, dict[str, Any]]:  # one result for every table (dropped/stopped ones say so)
                for name in names:
                    out[name] = self._unchecked(name, base) or {**base, **res}
                    svc.record_verify(name, out[name])
                return out

            if all(self._unchecked(name, base) for name in names):  # nothing to check: no slot
                return every({})

            try:
                rc = ReplicationConnection(with_options(svc.dsn))
            except Exception as e:
                return every({"result": "error", "detail": f"cannot reach the source: {_first_line(e)}"})
            try:
                try:
                    c_lsn, snap = rc.create_slot(
                        f"mooncake_verify_{uuid.uuid4().hex[:8]}", export_snapshot=True, temporary=True
                    )
                except Exception as e:
                    return every({"result": "error", "detail": f"{type(e).__name__}: {_first_line(e)}"})
                assert snap is not None  # export_snapshot=True: the slot exported its snapshot
                base["lsn"] = str(Lsn(c_lsn))
                try:
                    svc.wait_lsn(c_lsn, timeout_s=60)
                except Exception as e:
                    return every({"result": "skipped", "detail": f"the mirror had not reached LSN {Lsn(c_lsn)}: {e}"})
                try:
                    conn = psycopg.connect(with_options(svc.dsn))
                except Exception as e:
                    return every({"result": "error", "detail": f"cannot reach the source: {_first_line(e)}"})
                with conn:  # the snapshot stays valid as long as ``rc`` is open and idle
                    for name in names:
                        if self._stop.is_set():
                            break
                        out[name] = self.check(name, c_lsn, snap, conn, at=base["at"])
                        svc.record_verify(name, out[name])
            finally:
                rc.close()
            return out

    def _unchecked(self, name: str, base: dict[str, Any]) -> dict[str, Any] | None:
        """The ``skipped`` result of a table that is gone or stopped by an error, else None."""
        svc = self.service
        with svc.lock:
            t = svc.tables.get(name)
            if t is None:
                return {**base, "result": "skipped", "detail": "dropped"}
            if t.error:
                return {**base, "result": "skipped", "detail": "the mirror is stopped by an error"}
            if name in getattr(svc, "source_dropped", ()):
                return {**base, "result": "skipped", "detail": "its source table was dropped (read-only)"}
        return None

    def check(
        self, name: str, lsn: int, snapshot: str, conn: psycopg.Connection[Any], at: str | None = None
    ) -> dict[str, Any]:
        """One table's check at ``lsn`` (the consistent point of the round's slot, which the service has
        applied up to) against the source at ``snapshot`` (that slot's exported snapshot), read over
        ``conn`` (an idle connection to the source; left idle). Returns ``{"result": "match"|"mismatch"|
        "skipped"|"error", "lsn", "at", "source_rows", "mirror_rows", "ranges", "detail"}`` (``detail``:
        one line saying what differs, or why the check was skipped or failed; ``at``: ISO-8601 UTC,
        default now)."""
        svc = self.service
        base: dict[str, Any] = {"at": at or utc_now(), "lsn": str(Lsn(lsn)), "ranges": RANGES}
        try:
            with svc.lock:
                skip = self._unchecked(name, base)
                if skip:
                    return skip
                t = svc.tables[name]
                source, columns, key = t.source, [f.name for f in t.arrow_schema], list(t.key_names)
                meta = svc.registry["tables"].get(name) or {}
                options = {"column_types": meta.get("column_types"), "exclude": meta.get("exclude")}
                try:
                    rs = svc.read_state(name, lsn)
                except Exception as e:
                    return {**base, "result": "skipped", "detail": f"cannot read at LSN {base['lsn']}: {e}"}
                mem = rs.mem
            # the mirror first, while every file of its ReadState is surely there
            mir_sum = mirror_checksums(rs, mem, columns, key)
            try:
                src_sum = source_checksums(conn, source, snapshot, columns, key, options)
            finally:
                conn.rollback()  # idle again for the next table (a failed read leaves it in a failed transaction)
            if src_sum is None:
                return {
                    **base,
                    "result": "skipped",
                    "detail": "the source's columns differ from the mirror's (a schema change reaches the "
                    "mirror with the table's next row change)",
                }
        except Exception as e:
            return {**base, "result": "error", "detail": f"{type(e).__name__}: {_first_line(e)}"}
        ranges, n_src, n_mir = describe_difference(src_sum, mir_sum)
        res = {**base, "source_rows": n_src, "mirror_rows": n_mir}
        if not ranges:
            return {**res, "result": "match", "detail": f"{n_src} rows match at LSN {base['lsn']}"}
        counts = [r for r in ranges if src_sum.get(r, [0, 0])[0] != mir_sum.get(r, [0, 0])[0]]
        what = (
            f"row counts differ in {len(counts)} of {RANGES} key ranges"
            if counts
            else f"values differ in {len(ranges)} of {RANGES} key ranges (same row counts)"
        )
        return {
            **res,
            "result": "mismatch",
            "differing_ranges": ranges,
            "detail": (
                f"table {name}: the scheduled verify at LSN {base['lsn']} found the mirror differs from "
                f"{source}: source {n_src} rows, mirror {n_mir} rows; {what} (`mooncake verify {name}` "
                "shows the rows)"
            ),
        }
