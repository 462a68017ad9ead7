"""Ingest benchmark: rows/s the service applies vs. ``pg_recvlogical`` on the same WAL,
and the initial copy vs. ``COPY … TO STDOUT`` discarded by psql.

For each workload — ``narrow`` rows (``pgbench_accounts``' shape: int4 key, int4, int4, char(84)) and
``wide`` rows (20 columns: a bigint key, 10 text and 9 numeric(16,4)), each inserted either in
``small`` transactions (10 rows each, one COMMIT per 10 rows, a server-side loop) or in one ``large``
transaction (streamed to both consumers while it runs) — in a scratch database:

1. a publication for the table and **two logical slots** (pgoutput) are created *before* the workload;
2. the workload runs; ``end`` = ``pg_current_wal_lsn()`` after it;
3. ``recvlogical``: ``pg_recvlogical --start -o proto_version=2 -o publication_names=P -o streaming=on
   --no-loop -f /dev/null --endpos=end`` on the first slot, timed from launch until it exits;
4. ``ours``: on the second slot, the service's own loop (``$MOONCAKE_DECODER``: ``native``, the default,
   reads with ``read_transactions`` + ``NativeDecoder`` and applies with ``native_batch.apply_native_batch``;
   ``python`` as follows) — ``ReplicationConnection`` →
   ``StreamLoop.apply_batch`` (the real method of a scratch service object's stream loop holding the
   MirrorTable: ``parse_message`` → ``TransactionAssembler`` → ``_apply_txn``) → ``MirrorTable.apply`` (decode, MemSlice,
   MemIndex) — timed from connecting until every row is applied and the last open batch is decoded.
   No flush runs meanwhile (maintenance is not ingest).

Both consumers use protocol 2 with ``streaming 'on'`` (what the service asks for) and
``logical_decoding_work_mem=4MB`` on their walsender (so the large transaction really is streamed at
every size). ``ratio`` = ours rows/s ÷ recvlogical rows/s; ``ingest.narrow`` / ``ingest.wide`` carry
the small-transaction figures (the common case), ``ingest.<shape>_large`` the large-transaction ones.

Initial copy: a narrow table of ``copy_rows`` rows mirrored by ``ReplicatorService.create_table``
(exported snapshot, ``COPY … TO STDOUT`` decoded into Parquet, key hashes → IndexBlock, persisted to
Iceberg) vs. ``psql -c "COPY t TO STDOUT" > /dev/null`` (client side, the same protocol) and the
server-side ``COPY t TO '/dev/null'`` for information. MB/s use the table's heap size
(``pg_relation_size``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .common import BenchDatabase, Sizes, pg_bin

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
    select = NARROW_SELECT if shape == "narrow" else WIDE_SELECT
    with psycopg.connect(dsn, autocommit=True) as c:
        if mode == "large":
            c.execute(f"INSERT INTO {table} " + select.format(a=1, b=rows))
        else:
            per = 10
            body = select.format(a=f"i * {per} + 1", b=f"i * {per} + {per}")
            c.execute(
                f"DO $$ BEGIN FOR i IN 0..{rows // per - 1} LOOP INSERT INTO {table} {body}; COMMIT; END LOOP; END $$"
            )


def _recvlogical(dsn: str, slot: str, pub: str, end_lsn: str, timeout: float) -> float:
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
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    secs = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"pg_recvlogical failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return secs


def _ours(dsn: str, table: str, slot: str, pub: str, rows: int, scratch: Path, timeout: float) -> tuple[float, dict]:
    """The service's apply loop on ``slot`` until ``rows`` rows of ``table`` are applied; (seconds, info)."""
    from ..config import Settings
    from ..engine.cdc import ReplicationConnection, TransactionAssembler, describe_table
    from ..engine.cdc.native import NativeDecoder
    from ..engine.lsn import Lsn
    from ..engine.pg.conninfo import with_options
    from ..engine.service import replication as svc_module
    from ..engine.service.native_batch import apply_native_batch, read_native_batch
    from ..engine.service.service import ReplicatorService
    from ..engine.table.mirror import MirrorTable

    settings = Settings(state_dir=scratch, dsn=dsn, maintenance="dagster", decoder=os.environ.get("MOONCAKE_DECODER"))
    svc = ReplicatorService(settings.service_config())
    with psycopg.connect(with_options(dsn)) as c:
        schema = describe_table(c, f"public.{table}")
    t = MirrorTable(table, f"public.{table}", schema, None, scratch / "tables" / table)
    svc.tables[table] = t
    svc.by_oid[schema.oid] = t
    tune = getattr(svc_module, "tune_gc", None)
    if tune:
        tune()  # what _stream_once does before it connects
    start = time.perf_counter()
    repl = ReplicationConnection(_dsn_with(with_options(dsn), DECODING_MEM))
    try:
        repl.start(slot, [pub], 0, streaming=True)
        asm = TransactionAssembler()
        dec = NativeDecoder() if svc.config.decoder == "native" else None  # (the compiled path, native_batch.py)
        deadline = time.time() + timeout
        txns = 0
        while True:
            if dec is not None:
                txns += apply_native_batch(svc.stream, read_native_batch(repl, dec, 0.05), dec)
            else:
                msgs = repl.read(timeout=0.05)
                if msgs:
                    txns += svc.stream.apply_batch(msgs, asm)  # the service's own apply step (what _stream_once runs)
            if (dec.idle if dec is not None else asm.idle) and t.mem.num_rows >= rows:
                break
            if time.time() > deadline:
                raise TimeoutError(f"applied {t.mem.num_rows} of {rows} rows of {table} in {timeout:.0f}s")
        t.mem.seal()
        secs = time.perf_counter() - start
    finally:
        repl.close()
    info = {
        "transactions": txns,
        "rows_applied": t.mem.num_rows,
        "live_rows_applied": t.mem.live_rows,
        "applied_lsn": str(Lsn(svc.applied_lsn)),
        "buffer_bytes": t.mem.nbytes,
        "missing_keys": t.missing_keys,
        "table_error": t.error,
    }
    if t.error:
        raise RuntimeError(f"the apply loop stopped table {table}: {t.error}")
    return secs, info


def run_ingest_bench(admin_dsn: str, sizes: Sizes, log=print, cases: list[str] | None = None) -> dict:
    """Run the ingest suite against the cluster of ``admin_dsn``; returns the ``ingest`` section."""
    out: dict = {
        "method": "same WAL, two slots created before the workload; see mooncake_assets/bench/ingest.py",
        "logical_decoding_work_mem": "4MB",
        "protocol": "pgoutput proto_version 2, streaming on",
    }
    cases = cases or ["narrow_small", "wide_small", "narrow_large", "wide_large"]
    scratch_root = Path(tempfile.mkdtemp(prefix="mooncake-bench-ingest-", dir="/var/tmp"))
    try:
        with BenchDatabase(admin_dsn) as db:
            for case in cases:
                shape, mode = case.split("_")
                rows = sizes.ingest_small_rows if mode == "small" else sizes.ingest_large_rows
                if shape == "wide":
                    rows = max(int(rows * sizes.wide_factor) // 10 * 10, 10)
                table, pub = f"b_{case}", f"p_{case}"
                db.execute((NARROW_DDL if shape == "narrow" else WIDE_DDL).format(t=table))
                db.execute(f"CREATE PUBLICATION {pub} FOR TABLE {table}")
                slots = {"rl": f"s_{case}_rl", "ours": f"s_{case}_ours"}
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    for s in slots.values():
                        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))
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
                timeout = 600.0
                rl_s = _recvlogical(db.dsn, slots["rl"], pub, end, timeout)
                scratch = scratch_root / case
                ours_s, info = _ours(db.dsn, table, slots["ours"], pub, rows, scratch, timeout)
                shutil.rmtree(scratch, ignore_errors=True)
                with psycopg.connect(db.dsn, autocommit=True) as c:
                    for s in slots.values():
                        for _ in range(50):
                            try:
                                c.execute("SELECT pg_drop_replication_slot(%s)", (s,))
                                break
                            except psycopg.Error:
                                time.sleep(0.1)
                    c.execute(f"DROP PUBLICATION {pub}")
                    c.execute(f"DROP TABLE {table}")
                key = shape if mode == "small" else f"{shape}_large"
                fig = {
                    "rows": rows,
                    "transactions": rows // 10 if mode == "small" else 1,
                    "rows_per_transaction": 10 if mode == "small" else rows,
                    "end_lsn": end,
                    "wal_bytes": int(wal),
                    "workload_seconds": work_s,
                    "seconds": ours_s,
                    "recvlogical_seconds": rl_s,
                    "rows_per_s": rows / ours_s,
                    "recvlogical_rows_per_s": rows / rl_s,
                    "ratio": (rows / ours_s) / (rows / rl_s),
                    **info,
                }
                out[key] = fig
                log(
                    f"  ingest {case}: {rows:,} rows, ours {fig['rows_per_s']:,.0f} rows/s, pg_recvlogical "
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
        "what_ours_includes": "create_table: exported snapshot, COPY TO STDOUT decoded into Parquet, key "
        "hashes and IndexBlock, persist (Iceberg commit)",
    }
    log(
        f"  initial copy: {rows:,} rows, ours {fig['rows_per_s']:,.0f} rows/s ({fig['mb_per_s']:.1f} MB/s), "
        f"psql COPY TO STDOUT {fig['psql_rows_per_s']:,.0f} rows/s, ratio {fig['ratio']:.2f}"
    )
    return fig
