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
  row are kept. Sums do not depend on row order, so memory stays at one COPY batch, and the mirror
  side is one aggregate query over its files.

The result — ``match``, ``mismatch`` (with the ranges and row counts that differ), ``skipped`` (why)
or ``error`` — with its LSN and time is kept per table (``status``, ``list-tables``, the Dagster
sensor's observations) and in the registry (it survives a restart). A mismatch shows the table's
state as ``error``: the rows that differ are what the full comparison, ``mooncake verify TABLE``
(on demand), prints. The check only reads: it takes the service lock only to take the ReadState.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid

import duckdb
import psycopg
import pyarrow as pa

from ..cdc import ReplicationConnection, describe_table, initial_copy
from ..lsn import Lsn
from ..table.read_state import ReadState

log = logging.getLogger("mooncake.verify")

RANGES = 16  # key ranges of the checksum (by the key's hash)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def checksum_sql(relation: str, columns: list[str], key: list[str]) -> str:
    """``SELECT range, count(*), sum(hash(row))`` over ``relation`` (a DuckDB table or view name).
    Grouped by position: DuckDB binds a name in GROUP BY to a column of the table before an alias,
    so a user column named like an alias must not change the grouping."""
    cols = ", ".join(_q(c) for c in columns)
    keys = ", ".join(_q(c) for c in (key or columns))
    return (f"SELECT CAST(hash({keys}) % {RANGES} AS INTEGER), count(*), "
            f"sum(hash({cols})::HUGEINT) FROM {relation} GROUP BY 1")


def _add(acc: dict, rows) -> None:
    for r, n, h in rows:
        c = acc.setdefault(int(r), [0, 0])
        c[0] += int(n)
        c[1] += int(h or 0)


def source_checksums(conn: psycopg.Connection, source: str, snapshot: str, columns: list[str],
                     key: list[str], options: dict | None = None) -> dict | None:
    """``{range: [rows, hash sum]}`` of the source table at ``snapshot`` (None when its columns are not
    ``columns``: a schema change that has not reached the mirror yet). ``conn``: an ordinary, idle
    connection; ``options``: the mirror's create-table column options (``column_types``, ``exclude``)."""
    schema = describe_table(conn, source, **(options or {}))
    conn.rollback()
    if [c.name for c in schema.columns] != columns:
        return None
    con = duckdb.connect()
    acc: dict = {}
    sql = checksum_sql("b", columns, key)
    for batch in initial_copy(conn, schema, snapshot):
        con.register("b", pa.Table.from_batches([batch]))
        _add(acc, con.execute(sql).fetchall())
        con.unregister("b")
    return acc


def mirror_checksums(rs: ReadState, mem: pa.Table, columns: list[str], key: list[str]) -> dict:
    """``{range: [rows, hash sum]}`` of a mirror's ReadState ``rs`` and its in-memory rows ``mem``.

    The rows go through Arrow exactly as ``mooncake verify`` reads them (DuckDB's union view → Arrow),
    then the same aggregate as the source's runs on them, batch by batch."""
    from ..read.union import UnionReader

    reader = UnionReader(client=None)
    reader.register_state(rs, mem, "__mc_verify", columns=columns, mode="lazy")
    con = duckdb.connect()
    acc: dict = {}
    sql = checksum_sql("b", columns, key)
    batches = reader.con.execute(f"SELECT * FROM {_q('__mc_verify')}").fetch_record_batch(100_000)
    for batch in batches:
        con.register("b", pa.Table.from_batches([batch]))
        _add(acc, con.execute(sql).fetchall())
        con.unregister("b")
    return acc


def describe_difference(src: dict, mir: dict) -> tuple[list[int], int, int]:
    """(ranges whose count or checksum differ, source rows, mirror rows)."""
    ranges = sorted(r for r in set(src) | set(mir) if src.get(r, [0, 0]) != mir.get(r, [0, 0]))
    return ranges, sum(v[0] for v in src.values()), sum(v[0] for v in mir.values())


class Verifier:
    """The scheduled check of one service's mirrors (see the module docstring).

    ``service``: the :class:`~.service.ReplicatorService`; ``interval_s``: seconds between rounds (0:
    no thread, :meth:`run_once` still works)."""

    def __init__(self, service, interval_s: float):
        self.service = service
        self.interval_s = float(interval_s or 0)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._round = threading.Lock()

    def start(self) -> None:
        if self.interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mooncake-verify", daemon=True)
            self._thread.start()

    def stop(self) -> None:
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
            except Exception:  # noqa: BLE001 — a check that fails must never stop the service
                log.exception("scheduled verify failed")

    def run_once(self, names: list[str] | None = None) -> dict:
        """Check ``names`` (default: every ready mirror) now; returns ``{table: result}`` (see
        :meth:`check`). One round at a time."""
        with self._round:
            svc = self.service
            with svc.lock:
                names = [n for n in (names or list(svc.tables)) if n in svc.tables]
            out = {}
            for name in names:
                if self._stop.is_set():
                    break
                res = self.check(name)
                svc.record_verify(name, res)
                out[name] = res
            return out

    def check(self, name: str) -> dict:
        """One table's check: ``{"result": "match"|"mismatch"|"skipped"|"error", "lsn", "at",
        "source_rows", "mirror_rows", "ranges", "detail"}`` (``detail``: one line saying what differs,
        or why the check was skipped or failed)."""
        svc = self.service
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        base = {"at": at, "lsn": None, "ranges": RANGES}
        with svc.lock:
            t = svc.tables.get(name)
            if t is None:
                return {**base, "result": "skipped", "detail": "dropped"}
            if t.error:
                return {**base, "result": "skipped", "detail": "the mirror is stopped by an error"}
            source, columns, key = t.source, [f.name for f in t.arrow_schema], list(t.key_names)
            meta = svc.registry["tables"].get(name) or {}
            options = {"column_types": meta.get("column_types"), "exclude": meta.get("exclude")}
        from ..pg.conninfo import with_options

        try:
            rc = ReplicationConnection(with_options(svc.dsn))
        except Exception as e:  # noqa: BLE001
            return {**base, "result": "error", "detail": f"cannot reach the source: {str(e).strip().splitlines()[0]}"}
        try:
            c_lsn, snap = rc.create_slot(f"mooncake_verify_{uuid.uuid4().hex[:8]}", export_snapshot=True, temporary=True)
            base["lsn"] = str(Lsn(c_lsn))
            try:
                svc.wait_lsn(c_lsn, timeout_s=60)
            except Exception as e:  # noqa: BLE001 — not caught up (a long backlog): try again next round
                return {**base, "result": "skipped", "detail": f"the mirror had not reached LSN {Lsn(c_lsn)}: {e}"}
            with svc.lock:
                t = svc.tables.get(name)
                if t is None or t.error:
                    return {**base, "result": "skipped", "detail": "dropped or stopped meanwhile"}
                if [f.name for f in t.arrow_schema] != columns:
                    return {**base, "result": "skipped", "detail": "its columns changed meanwhile"}
                try:
                    rs = t.read_state(c_lsn)
                except Exception as e:  # noqa: BLE001 — e.g. flushed past C meanwhile: next round
                    return {**base, "result": "skipped", "detail": f"cannot read at LSN {Lsn(c_lsn)}: {e}"}
                rs = rs.with_(schema=tuple(columns), storage=svc.storage_hints or None)
                mem = rs.mem
            # the mirror first, while every file of its ReadState is surely there; the snapshot stays
            # valid as long as ``rc`` is open and idle
            mir_sum = mirror_checksums(rs, mem, columns, key)
            with psycopg.connect(with_options(svc.dsn)) as conn:
                src_sum = source_checksums(conn, source, snap, columns, key, options)
            if src_sum is None:
                return {**base, "result": "skipped",
                        "detail": "the source's columns differ from the mirror's (a schema change reaches the "
                                  "mirror with the table's next row change)"}
        except Exception as e:  # noqa: BLE001
            return {**base, "result": "error", "detail": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        finally:
            rc.close()
        ranges, n_src, n_mir = describe_difference(src_sum, mir_sum)
        res = {**base, "source_rows": n_src, "mirror_rows": n_mir}
        if not ranges:
            return {**res, "result": "match", "detail": f"{n_src} rows match at LSN {base['lsn']}"}
        counts = [r for r in ranges if src_sum.get(r, [0, 0])[0] != mir_sum.get(r, [0, 0])[0]]
        what = (f"row counts differ in {len(counts)} of {RANGES} key ranges" if counts else
                f"values differ in {len(ranges)} of {RANGES} key ranges (same row counts)")
        return {**res, "result": "mismatch", "differing_ranges": ranges,
                "detail": (f"table {name}: the scheduled verify at LSN {base['lsn']} found the mirror differs from "
                           f"{source}: source {n_src} rows, mirror {n_mir} rows; {what} (`mooncake verify {name}` "
                           "shows the rows)")}

