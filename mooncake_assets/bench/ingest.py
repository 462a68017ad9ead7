"""Ingest benchmark: rows/s the service applies vs. ``pg_recvlogical`` on the same WAL,
and the initial copy vs. ``COPY … TO STDOUT`` discarded by psql.

For each case — ``narrow`` rows (``pgbench_accounts``' shape: int4 key, int4, int4, char(84)) and
``wide`` rows (20 columns: a bigint key, 10 text and 9 numeric(16,4)), each inserted either in
``small`` transactions (10 rows each, one COMMIT per 10 rows, a server-side loop) or in one ``large``
transaction (streamed to both consumers while it runs); and on narrow rows, ``updates`` (update-heavy:
``UPDATE … SET abalance = abalance + 1`` of 10 seeded rows per transaction, each row once) and
``deletes`` (delete-heavy: ``DELETE`` of 10 seeded rows per transaction) — in a scratch database:

1. a publication for the table and **two logical slots** (pgoutput) are created *before* the workload;
   for ``updates``/``deletes``, ``ingest_seed_rows`` rows are inserted first, applied by our side and
   flushed to a data file (so the changes find their rows through the FileIndex and become deletion
   vectors, as for rows older than the buffer), and both slots are advanced past them
   (``pg_replication_slot_advance``): none of that is timed;
2. the workload runs (``updates``/``deletes`` end with one sentinel insert: once our side has it, every
   change before it is applied); ``end`` = ``pg_current_wal_lsn()`` after it;
3. ``recvlogical``: ``pg_recvlogical --start -o proto_version=2 -o publication_names=P -o streaming=on
   --no-loop -f /dev/null --endpos=end`` on the first slot, timed from launch until it exits;
4. ``ours``: on the second slot, the service's own apply loop (:class:`_OurSide`), timed from connecting
   until every change is applied and the last open batch is decoded.

Rounds: ``ingest_rounds`` rounds, each running every case once in an order rotated by one per round,
and within a case the consumer that goes first alternating per round (the second reads WAL the first
brought into the page cache). Per case: the **median** seconds of each side; ``ratio`` = ours rows/s ÷
recvlogical rows/s of the medians (``ratio_best`` from the best rounds); ``cpu_us_per_row`` = the median
CPU time of this process (``time.process_time``: every thread of the apply loop; pg_recvlogical and the
walsenders are other processes) per row, ``recvlogical_cpu_us_per_row`` pg_recvlogical's (user + system
of the child, ``getrusage(RUSAGE_CHILDREN)``); ``per_round`` keeps the raw rounds.

Both consumers use protocol 2 with ``streaming 'on'`` (what the service asks for) and
``logical_decoding_work_mem=4MB`` on their walsender (so the large transaction really is streamed at
every size). Keys: ``ingest.narrow`` / ``ingest.wide`` carry the small-transaction figures (the common
case), ``ingest.<shape>_large`` the large-transaction ones, ``ingest.updates`` / ``ingest.deletes`` the
update- and delete-heavy ones (``rows`` = changes; their ``rows_applied`` counts MemSlice rows: an
update's new versions plus the sentinel, n + 1, or the sentinel alone for deletes).

Initial copy: a narrow table of ``copy_rows`` rows mirrored by ``ReplicatorService.create_table``
(exported snapshot, ``COPY … TO STDOUT`` decoded into Parquet, key hashes → IndexBlock, persisted to
Iceberg) vs. ``psql -c "COPY t TO STDOUT" > /dev/null`` (client side, the same protocol) and the
server-side ``COPY t TO '/dev/null'`` for information. MB/s use the table's heap size
(``pg_relation_size``).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .common import BenchDatabase, Sizes, med, pg_bin

#: case (``<table shape>_<workload>``) -> its key in the ``ingest`` section
CASES = {
    "narrow_small": "narrow",
    "wide_small": "wide",
    "narrow_large": "narrow_large",
    "wide_large": "wide_large",
    "narrow_updates": "updates",
    "narrow_deletes": "deletes",
}
SEEDED = ("updates", "deletes")  # workloads on rows inserted (and consumed, untimed) before them

DECODING_MEM = "-c logical_decoding_work_mem=4MB"

NARROW_DDL = "CREATE TABLE {t} (aid int PRIMARY KEY, bid int, abalance int, filler char(84))"
NARROW_SELECT = "SELECT g, (g - 1) / 100000 + 1, (g % 1000) - 500, '' FROM generate_series({a}, {b}) g"
WIDE_DDL = (
    "CREATE TABLE {t} (id bigint PRIMARY KEY, "
    + ", ".join(f"t{i} text" for i in range(1, 11))
    + ", "
    + ", ".join(f"n{i} numeric(16,4)" for i in range(1, 10))
    + ")"
)
WIDE_SELECT = (
    "SELECT g, "
    + ", ".join(f"md5((g + {i})::text)" for i in range(1, 11))
    + ", "
    + ", ".join(f"((g * {i}) % 1000000) / 7.0" for i in range(1, 10))
    + " FROM generate_series({a}, {b}) g"
)


def _dsn_with(dsn: str, options: str) -> str:
    d = conninfo_to_dict(dsn)
    d["options"] = (d.get("options", "") + " " + options).strip()
    return make_conninfo(**d)


def _workload(dsn: str, table: str, shape: str, mode: str, rows: int) -> None:
    """The timed workload of one case: ``rows`` inserts (``small``: 10 per transaction, ``large``: one
    transaction), or ``rows`` updates / deletes of seeded rows (10 per transaction) and one sentinel insert."""
    select = NARROW_SELECT if shape == "narrow" else WIDE_SELECT
    per = 10
    with psycopg.connect(dsn, autocommit=True) as c:
        if mode == "large":
            c.execute(f"INSERT INTO {table} " + select.format(a=1, b=rows))
            return
        between = f"aid BETWEEN i * {per} + 1 AND i * {per} + {per}"
        body = {
            "small": f"INSERT INTO {table} " + select.format(a=f"i * {per} + 1", b=f"i * {per} + {per}"),
            "updates": f"UPDATE {table} SET abalance = abalance + 1 WHERE {between}",
            "deletes": f"DELETE FROM {table} WHERE {between}",
        }[mode]
        c.execute(f"DO $$ BEGIN FOR i IN 0..{rows // per - 1} LOOP {body}; COMMIT; END LOOP; END $$")
        if mode in SEEDED:  # the consumers stop once this row is there: every change before it is applied
            c.execute(f"INSERT INTO {table} VALUES (2147483647, 0, 0, 'sentinel')")


def _recvlogical(dsn: str, slot: str, pub: str, end_lsn: str, timeout: float) -> tuple[float, float]:
    """``pg_recvlogical`` on ``slot`` up to ``end_lsn``: (wall seconds, its CPU seconds: user + system)."""
    cmd = [
        pg_bin("pg_recvlogical"),
        "-d",
        _dsn_with(dsn, DECODING_MEM),
        "--slot",
        slot,
        "--start",
        "-o",
        "proto_version=2",
        "-o",
        f"publication_names={pub}",
        "-o",
        "streaming=on",
        "--no-loop",
        "-f",
        "/dev/null",
        f"--endpos={end_lsn}",
    ]
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    secs = time.perf_counter() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return secs, (ru2.ru_utime - ru.ru_utime) + (ru2.ru_stime - ru.ru_stime)


class _OurSide:
    """The service's apply loop, as the stream thread runs it, over one scratch MirrorTable.

    ``$MOONCAKE_DECODER``: ``native`` (the default) reads with ``read_transactions`` + ``NativeDecoder``
    and applies with ``native_batch.apply_native_batch``; ``python``: ``ReplicationConnection`` →
    ``StreamLoop.apply_batch`` (the real method of a scratch service object's stream loop holding the
    MirrorTable: ``parse_message`` → ``TransactionAssembler`` → ``_apply_txn``) → ``MirrorTable.apply``
    (decode, MemSlice, MemIndex). No flush runs while it is timed (maintenance is not ingest)."""

    def __init__(self, dsn: str, table: str, scratch: Path):
        from ..config import Settings
        from ..engine.cdc import describe_table
        from ..engine.pg.conninfo import with_options
        from ..engine.service.service import ReplicatorService
        from ..engine.table.mirror import MirrorTable

        self.dsn = dsn
        self.scratch = scratch
        settings = Settings(
            state_dir=scratch, dsn=dsn, maintenance="dagster", decoder=os.environ.get("MOONCAKE_DECODER")
        )
        self.svc = ReplicatorService(settings.service_config())
        with psycopg.connect(with_options(dsn)) as c:
            schema = describe_table(c, f"public.{table}")
        self.table = MirrorTable(table, f"public.{table}", schema, None, scratch / "tables" / table)
        self.svc.tables[table] = self.table
        self.svc.by_oid[schema.oid] = self.table

    def consume(self, slot: str, pub: str, rows: int, timeout: float) -> tuple[float, float, int]:
        """Apply from ``slot`` until the MemSlice holds ``rows`` rows and no transaction is open; returns
        (wall seconds from connecting, this process's CPU seconds meanwhile, transactions applied)."""
        from ..engine.cdc import ReplicationConnection, TransactionAssembler
        from ..engine.cdc.native import NativeDecoder
        from ..engine.pg.conninfo import with_options
        from ..engine.service import replication as svc_module
        from ..engine.service.native_batch import apply_native_batch, attach_spill, read_native_batch

        tune = getattr(svc_module, "tune_gc", None)
        if tune:
            tune()  # what _stream_once does before it connects
        t = self.table
        cpu0, start = time.process_time(), time.perf_counter()
        repl = ReplicationConnection(_dsn_with(with_options(self.dsn), DECODING_MEM))
        try:
            repl.start(slot, [pub], 0, streaming=True)
            asm = TransactionAssembler()
            dec = NativeDecoder(batch=True) if self.svc.config.decoder == "native" else None  # (native_batch.py)
            if dec is not None:  # (as _stream_once: a large open transaction spills as it grows)
                attach_spill(dec, self.scratch / "spill", self.svc.memory)
            deadline = time.time() + timeout
            txns = 0
            while True:
                if dec is not None:
                    txns += apply_native_batch(self.svc.stream, read_native_batch(repl, dec, 0.05), dec)
                else:
                    msgs = repl.read(timeout=0.05)
                    if msgs:
                        txns += self.svc.stream.apply_batch(msgs, asm)  # what _stream_once runs
                if (dec.idle if dec is not None else asm.idle) and t.mem.num_rows >= rows:
                    break
                if time.time() > deadline:
                    raise TimeoutError(f"applied {t.mem.num_rows} of {rows} rows of {t.name} in {timeout:.0f}s")
            t.mem.seal()
            secs, cpu = time.perf_counter() - start, time.process_time() - cpu0
        finally:
            repl.close()
        if t.error:
            raise RuntimeError(f"the apply loop stopped table {t.name}: {t.error}")
        return secs, cpu, txns

    def info(self, txns: int) -> dict:
        from ..engine.lsn import Lsn

        t = self.table
        return {
            "transactions": txns,
            "rows_applied": t.mem.num_rows,
            "live_rows_applied": t.mem.live_rows,
            "mirror_live_rows": t.stats()["live_rows"],
            "applied_lsn": str(Lsn(self.svc.applied_lsn)),
            "buffer_bytes": t.mem.nbytes,
            "missing_keys": t.missing_keys,
            "table_error": t.error,
        }


def _drop_slots(c: psycopg.Connection, slots) -> None:
    for s in slots:
        for _ in range(50):
            try:
                c.execute("SELECT pg_drop_replication_slot(%s)", (s,))
                break
            except psycopg.Error:
                time.sleep(0.1)


def _advance_slots(c: psycopg.Connection, slots, lsn: str) -> None:
    """Move ``slots`` past the seed (untimed: both consumers then start at the workload); a slot still
    held by a walsender that is ending is retried."""
    for s in slots:
        for attempt in range(50):
            try:
                c.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (s, lsn))
                break
            except psycopg.Error:
                if attempt == 49:
                    raise
                time.sleep(0.1)


def _case_rows(case: str, sizes: Sizes) -> int:
    shape, mode = case.split("_")
    if mode in SEEDED:
        return min(sizes.ingest_small_rows, sizes.ingest_seed_rows) // 10 * 10
    rows = sizes.ingest_small_rows if mode == "small" else sizes.ingest_large_rows
    if shape == "wide":
        rows = max(int(rows * sizes.wide_factor) // 10 * 10, 10)
    return rows


def _one_round(db: BenchDatabase, case: str, sizes: Sizes, scratch: Path, rl_first: bool) -> dict:
    """One measurement of ``case`` (``<shape>_<mode>``): both consumers on the same WAL; a dict of raw figures."""
    shape, mode = case.split("_")
    rows = _case_rows(case, sizes)
    table, pub = f"b_{case}", f"p_{case}"
    db.execute((NARROW_DDL if shape == "narrow" else WIDE_DDL).format(t=table))
    db.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
    slots = {"rl": f"s_{case}_rl", "ours": f"s_{case}_ours"}
    timeout = 600.0
    with psycopg.connect(db.dsn, autocommit=True) as c:
        for s in slots.values():
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
    ours = _OurSide(db.dsn, table, scratch)
    if mode in SEEDED:  # the rows to update/delete: applied and flushed to a data file on our side, untimed
        seed = sizes.ingest_seed_rows
        db.execute(f"INSERT INTO {table} " + NARROW_SELECT.format(a=1, b=seed))
        ours.consume(slots["ours"], pub, seed, timeout)
        ours.table.flush()
        with psycopg.connect(db.dsn, autocommit=True) as c:
            seed_lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            _advance_slots(c, slots.values(), seed_lsn)
    t0 = time.perf_counter()
    _workload(db.dsn, table, shape, mode, rows)
    work_s = time.perf_counter() - t0
    with psycopg.connect(db.dsn, autocommit=True) as c:
        end = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        wal = c.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM "
            "pg_replication_slots WHERE slot_name = %s",
            (slots["rl"],),
        ).fetchone()[0]
    # the MemSlice rows that mean "all applied": every insert; an update's new version; the sentinel
    expect = {"updates": rows + 1, "deletes": 1}.get(mode, rows)
    fig: dict = {}
    for side in ("rl", "ours") if rl_first else ("ours", "rl"):
        if side == "rl":
            fig["recvlogical_seconds"], fig["recvlogical_cpu_seconds"] = _recvlogical(
                db.dsn, slots["rl"], pub, end, timeout
            )
        else:
            fig["seconds"], fig["cpu_seconds"], txns = ours.consume(slots["ours"], pub, expect, timeout)
    fig.update(ours.info(txns), rows=rows, end_lsn=end, wal_bytes=int(wal), workload_seconds=work_s)
    fig["first"] = "recvlogical" if rl_first else "ours"
    with psycopg.connect(db.dsn, autocommit=True) as c:
        _drop_slots(c, slots.values())
        c.execute(f"DROP PUBLICATION {pub}")
        c.execute(f"DROP TABLE {table}")
    shutil.rmtree(scratch, ignore_errors=True)
    return fig


def _median_figure(case: str, rounds: list[dict]) -> dict:
    """One case's figures from its rounds: median seconds of each side (ratios of medians), median CPU
    µs per row of each side, the last round's apply facts (``missing_keys`` summed over the rounds)."""
    shape, mode = case.split("_")
    rows = rounds[0]["rows"]
    ours_s, rl_s = med([r["seconds"] for r in rounds]), med([r["recvlogical_seconds"] for r in rounds])
    last = dict(rounds[-1])
    for k in ("seconds", "recvlogical_seconds", "cpu_seconds", "recvlogical_cpu_seconds", "first"):
        last.pop(k, None)
    per_txn = rows if mode == "large" else 10
    fig = {
        **last,
        "shape": {"small": "inserts", "large": "inserts", "updates": "updates", "deletes": "deletes"}[mode],
        "transactions": 1 if mode == "large" else rows // 10,
        "rows_per_transaction": per_txn,
        "rounds": len(rounds),
        "seconds": ours_s,
        "recvlogical_seconds": rl_s,
        "rows_per_s": rows / ours_s,
        "recvlogical_rows_per_s": rows / rl_s,
        "ratio": rl_s / ours_s,
        "ratio_best": min(r["recvlogical_seconds"] for r in rounds) / min(r["seconds"] for r in rounds),
        "cpu_us_per_row": med([r["cpu_seconds"] for r in rounds]) / rows * 1e6,
        "recvlogical_cpu_us_per_row": med([r["recvlogical_cpu_seconds"] for r in rounds]) / rows * 1e6,
        "missing_keys": sum(r["missing_keys"] for r in rounds),
        "rows_applied": min(r["rows_applied"] for r in rounds),
        "per_round": [
            {k: r[k] for k in ("seconds", "recvlogical_seconds", "cpu_seconds", "recvlogical_cpu_seconds", "first")}
            for r in rounds
        ],
    }
    if mode in SEEDED:
        fig["seed_rows"] = rounds[-1].get("seed_rows")
    return fig


def run_ingest_bench(admin_dsn: str, sizes: Sizes, log=print, cases: list[str] | None = None) -> dict:
    """Run the ingest suite against the cluster of ``admin_dsn``; returns the ``ingest`` section (one key
    per case: :data:`CASES`' key; plus ``initial_copy``). ``sizes.ingest_rounds`` rounds, the cases in an
    order rotated by one each round, and which consumer goes first alternating per round."""
    out: dict = {
        "method": "same WAL, two slots created before the workload; rotated rounds, medians; "
        "see mooncake_assets/bench/ingest.py",
        "logical_decoding_work_mem": "4MB",
        "protocol": "pgoutput proto_version 2, streaming on",
    }
    cases = cases or list(CASES)
    rounds: dict[str, list[dict]] = {c: [] for c in cases}
    scratch_root = Path(tempfile.mkdtemp(prefix="mooncake-bench-ingest-", dir="/var/tmp"))
    try:
        with BenchDatabase(admin_dsn) as db:
            for r in range(sizes.ingest_rounds):
                order = cases[r % len(cases) :] + cases[: r % len(cases)]
                for case in order:
                    fig = _one_round(db, case, sizes, scratch_root / case, rl_first=r % 2 == 0)
                    if case.split("_")[1] in SEEDED:
                        fig["seed_rows"] = sizes.ingest_seed_rows
                    rounds[case].append(fig)
            for case in cases:
                fig = out[CASES[case]] = _median_figure(case, rounds[case])
                log(
                    f"  ingest {CASES[case]}: {fig['rows']:,} rows × {fig['rounds']} rounds, ours "
                    f"{fig['rows_per_s']:,.0f} rows/s ({fig['cpu_us_per_row']:.1f} µs CPU/row), pg_recvlogical "
                    f"{fig['recvlogical_rows_per_s']:,.0f} rows/s, ratio {fig['ratio']:.2f}"
                )
            out["initial_copy"] = _initial_copy(db, sizes, scratch_root, log)
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return out


def _initial_copy(db: BenchDatabase, sizes: Sizes, scratch_root: Path, log) -> dict:
    from ..config import Settings
    from ..engine.service.service import ReplicatorService

    rows = sizes.copy_rows
    table = "b_copy"
    db.execute(NARROW_DDL.format(t=table))
    db.execute(f"INSERT INTO {table} " + NARROW_SELECT.format(a=1, b=rows))
    db.execute(f"VACUUM ANALYZE {table}")
    with psycopg.connect(db.dsn, autocommit=True) as c:
        heap = c.execute("SELECT pg_relation_size(%s)", (table,)).fetchone()[0]

    def psql_copy() -> float:
        t = time.perf_counter()
        subprocess.run(
            [pg_bin("psql"), "-X", "-q", "-d", db.dsn, "-c", f"COPY {table} TO STDOUT"],
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=600,
        )
        return time.perf_counter() - t

    def server_copy() -> float:
        with psycopg.connect(db.dsn, autocommit=True) as c:
            t = time.perf_counter()
            c.execute(f"COPY {table} TO '/dev/null'")
            return time.perf_counter() - t

    ref = [psql_copy()]
    server = server_copy()
    scratch = scratch_root / "copy"
    svc = ReplicatorService(Settings(state_dir=scratch, dsn=db.dsn, maintenance="dagster").service_config())
    try:
        t = time.perf_counter()
        res = svc.create_table("copy", f"public.{table}")
        ours = time.perf_counter() - t
    finally:
        try:
            svc.drop_table("copy")
        except Exception:
            pass
        svc.stop()
    ref.append(psql_copy())
    psql_s = sum(ref) / len(ref)
    with psycopg.connect(db.dsn, autocommit=True) as c:
        source_rows = c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    fig = {
        "rows": rows,
        "source_rows": source_rows,
        "heap_bytes": heap,
        "seconds": ours,
        "rows_per_s": rows / ours,
        "mb_per_s": heap / ours / 1e6,
        "copied_rows": res.get("rows"),
        "reference": "psql -c 'COPY t TO STDOUT' > /dev/null (client side, mean of a run before and after ours)",
        "psql_seconds": psql_s,
        "psql_rows_per_s": rows / psql_s,
        "psql_mb_per_s": heap / psql_s / 1e6,
        "server_dev_null_seconds": server,
        "server_dev_null_rows_per_s": rows / server,
        "ratio": psql_s / ours,
        "copy_parallel": svc.config.copy_parallel,
        "what_ours_includes": "create_table: exported snapshot, COPY TO STDOUT decoded into Parquet, key "
        "hashes and IndexBlock, persist (Iceberg commit)",
    }
    log(
        f"  initial copy ({fig['copy_parallel']} connections): {rows:,} rows, ours {fig['rows_per_s']:,.0f} rows/s "
        f"({fig['mb_per_s']:.1f} MB/s), "
        f"psql COPY TO STDOUT {fig['psql_rows_per_s']:,.0f} rows/s, ratio {fig['ratio']:.2f}"
    )
    return fig
