"""Change-feed benchmark: reading what changed in 1 % of a table vs a full union read of it.

In a scratch database, a table of ``Sizes.changes_rows`` rows shaped like ``pgbench_accounts``
(``aid int`` primary key, ``bid int``, ``abalance int``, ``filler char(84)``) is mirrored by a real
service process (``mooncake serve`` in the background, ``maintenance: dagster`` so that nothing
compacts or persists on its own while we measure). Then:

1. a consistent cut (the ``cut`` action: persist + tag ``lsn-X-Y``) gives ``since``;
2. :data:`CHANGE_SHARE` of the rows change, random distinct keys drawn once (seeded): 60 % of them
   updated (``abalance + 1``, one transaction per :data:`BATCH` keys), 20 % deleted (likewise), and
   as many rows as 20 % of them inserted (new keys above the table's, one transaction);
3. a second cut gives ``until`` (the changes persisted: new data files and deletion vectors).

Contenders, timed in ``Sizes.changes_rounds`` rotated rounds (medians; :mod:`.common`):

- ``changes``: ``ServiceClient.changes(table, since, until)`` — the ``changes`` Flight action, the
  service planning the range over its Iceberg snapshots and reading the rows of the files that the
  range touches, then the feed's Arrow rows sent to this process;
- ``changes_keys``: the same with ``deletes="keys"`` (:mod:`..engine.table.change_keys`): inserted
  rows in full, deleted rows as their key only;
- ``changes_full``: ``changes`` of :data:`FULL_TABLE`, a second table of the same rows and the same
  changes (applied in the same transactions' shapes, cut at the same LSNs) whose source has
  ``REPLICA IDENTITY FULL``: every UPDATE and DELETE carries the whole old row, the persists' delete
  logs keep it, and the feed takes the deleted rows from those logs instead of the data files
  (``docs/changes.md``);
- ``full_read``: ``UnionReader.query("SELECT * FROM t")`` — a union read of the whole table
  (ReadState over Flight, the data files with their deletion vectors read by DuckDB in this process)
  into one Arrow table: what a downstream job without the feed reads each run.

Figures: ``ratio_vs_full_read`` = median ``changes`` seconds ÷ median ``full_read`` seconds (target
≤ 0.05), the raw ``seconds`` and ``cpu_seconds`` of each (CPU = this process's CPU time plus the
service process's ``utime + stime`` from ``/proc/<pid>/stat``, proc(5), over the call: the feed is
computed in the service, the full read here), ``cpu_ratio_vs_full_read``, ``per_round``; the same
for ``changes_keys`` as ``keys_ratio_vs_full_read``, ``keys_seconds``, ``keys_cpu_seconds``,
``keys_cpu_ratio_vs_full_read``; for ``changes_full`` the section ``identity_full`` (``ratio_vs_full_read``,
``seconds``, ``cpu_seconds``, ``cpu_ratio_vs_full_read``, the same full read as denominator) with
``sources`` (the service's count of deleted rows taken from the delete logs / read from data files,
and of data file reads, in the last round; ``sources`` at the top level: the same for ``changes``).
Checks:
``feed_rows`` must be ``2 × updated + deleted + inserted`` (an UPDATE is a delete and an insert),
with ``feed_inserts`` / ``feed_deletes`` split accordingly (for ``changes_keys`` too, every delete's
non-key columns null), and the full read must return
``rows − deleted + inserted`` rows; ``check.ok`` says whether all held in every round.
Units: seconds, rows; ratios plain numbers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from .common import BenchDatabase, Sizes, med

TABLE = "accounts"
FULL_TABLE = "accounts_full"  # the same table with REPLICA IDENTITY FULL
CHANGE_SHARE = 0.01  # share of the rows that change between the two cuts
SHARES = {"updated": 0.6, "deleted": 0.2, "inserted": 0.2}  # how those changes split
BATCH = 1000  # keys per UPDATE / DELETE transaction
DDL = "CREATE TABLE {table} (aid int PRIMARY KEY, bid int NOT NULL, abalance int NOT NULL, filler char(84))"
FILL = (
    "INSERT INTO {table} SELECT g, (g - 1) / 100000 + 1, (g::bigint * 7919 % 10001)::int - 5000, '' "
    "FROM generate_series({lo}, {hi}) g"
)
FULL_SQL = f"SELECT * FROM {TABLE}"


def _proc_cpu(pid: int | None) -> float:
    """User + system CPU seconds of ``pid`` (``/proc/<pid>/stat`` fields 14 and 15, proc(5)); 0 without."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def plan_changes_workload(rows: int, seed: int = 18) -> dict[str, Any]:
    """The changed keys of a ``rows``-row table: ``updated`` and ``deleted`` (distinct existing keys,
    numpy arrays) and ``inserted`` (a count of new keys ``rows + 1 …``)."""
    total = max(int(round(rows * CHANGE_SHARE)), 3)
    n_upd = int(round(total * SHARES["updated"]))
    n_del = int(round(total * SHARES["deleted"]))
    n_ins = total - n_upd - n_del
    keys = np.random.default_rng(seed).choice(np.arange(1, rows + 1), size=n_upd + n_del, replace=False)
    return {"updated": np.sort(keys[:n_upd]), "deleted": np.sort(keys[n_upd:]), "inserted": n_ins}


def _apply_changes(dsn: str, rows: int, w: dict[str, Any], table: str = TABLE) -> None:
    """Run the workload's UPDATEs, DELETEs (one transaction per :data:`BATCH` keys) and the INSERT on ``table``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for sql, keys in (
            (f"UPDATE {table} SET abalance = abalance + 1 WHERE aid = ANY(%s)", w["updated"]),
            (f"DELETE FROM {table} WHERE aid = ANY(%s)", w["deleted"]),
        ):
            for s in range(0, len(keys), BATCH):
                c.execute(sql, (keys[s : s + BATCH].tolist(),))
        c.execute(FILL.format(table=table, lo=rows + 1, hi=rows + w["inserted"]))


def _timed(fn, pid: int | None) -> tuple[Any, float, float]:
    """``fn()`` with its wall seconds and CPU seconds (this process + the service process ``pid``)."""
    c0, s0 = time.process_time(), _proc_cpu(pid)
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    return out, wall, (time.process_time() - c0) + (_proc_cpu(pid) - s0)


def _rounds(contenders: dict[str, Any], rounds: int, pid: int | None, check) -> list[dict[str, Any]]:
    """``rounds`` rounds of every contender, order rotated per round; each result goes to ``check``."""
    names = list(contenders)
    out = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        rec: dict[str, Any] = {"first": order[0]}
        for n in order:
            res, wall, cpu = _timed(contenders[n], pid)
            rec[n] = {"seconds": wall, "cpu_seconds": cpu, **check(n, res)}
        out.append(rec)
    return out


def _summary(per_round: list[dict], rows: int, w: dict, expect: dict, extra: dict) -> dict[str, Any]:
    """The ``changes`` section from the rounds (module docstring)."""
    names = ("changes", "changes_keys", "changes_full", "full_read")
    m = {n: med([r[n]["seconds"] for r in per_round]) for n in names}
    mc = {n: med([r[n]["cpu_seconds"] for r in per_round]) for n in names}
    last = per_round[-1]
    ok = all(r[n]["ok"] for r in per_round for n in names)
    return {
        "rows": rows,
        "changed_rows": len(w["updated"]) + len(w["deleted"]) + w["inserted"],
        "updated_rows": len(w["updated"]),
        "deleted_rows": len(w["deleted"]),
        "inserted_rows": w["inserted"],
        "rounds": len(per_round),
        "seconds": m["changes"],
        "full_read_seconds": m["full_read"],
        "cpu_seconds": mc["changes"],
        "full_read_cpu_seconds": mc["full_read"],
        "ratio_vs_full_read": m["changes"] / m["full_read"],
        "ratio_vs_full_read_best": min(r["changes"]["seconds"] for r in per_round)
        / min(r["full_read"]["seconds"] for r in per_round),
        "cpu_ratio_vs_full_read": mc["changes"] / mc["full_read"] if mc["full_read"] else None,
        "keys_seconds": m["changes_keys"],
        "keys_cpu_seconds": mc["changes_keys"],
        "keys_ratio_vs_full_read": m["changes_keys"] / m["full_read"],
        "keys_cpu_ratio_vs_full_read": mc["changes_keys"] / mc["full_read"] if mc["full_read"] else None,
        "sources": last["changes"].get("sources"),
        "identity_full": {
            "table": FULL_TABLE,
            "ratio_vs_full_read": m["changes_full"] / m["full_read"],
            "seconds": m["changes_full"],
            "cpu_seconds": mc["changes_full"],
            "cpu_ratio_vs_full_read": mc["changes_full"] / mc["full_read"] if mc["full_read"] else None,
            "sources": last["changes_full"].get("sources"),
        },
        "feed_rows": last["changes"]["rows"],
        "feed_inserts": last["changes"]["inserts"],
        "feed_deletes": last["changes"]["deletes"],
        "full_read_rows": last["full_read"]["rows"],
        "check": {"ok": ok, **expect},
        "per_round": per_round,
        **extra,
        "method": "changes(since, until) between two consistent cuts around 1% of rows changed, vs a union read "
        "SELECT * of the whole table; rotated rounds, medians; CPU = this process + the service process; "
        "see mooncake_assets/bench/changes.py",
    }


def _keys_only(feed: Any) -> bool:
    """Whether every ``delete`` row of ``feed`` has its non-key columns (``bid``, ``abalance``, ``filler``) null."""
    import pyarrow.compute as pc

    dels = feed.filter(pc.equal(feed.column("_change"), "delete"))
    return all(dels.column(c).null_count == dels.num_rows for c in ("bid", "abalance", "filler"))


def _wait_applied(client: Any, dsn: str) -> None:
    """Wait until the service has applied everything committed at the source so far."""
    with psycopg.connect(dsn, autocommit=True) as c:
        client.wait_lsn(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0], timeout=600)


def _setup(db: BenchDatabase, sizes: Sizes, scratch: Path, log) -> tuple[Any, Any, dict[str, Any]]:
    """Fill and mirror the table, cut, change 1 %, cut; returns (settings, client, facts)."""
    from ..config import Settings
    from ..engine.service import ServiceClient
    from ..engine.service.process import start_service, stop_service

    rows = sizes.changes_rows
    for table in (TABLE, FULL_TABLE):
        db.execute(DDL.format(table=table))
        for lo in range(1, rows + 1, 1_000_000):
            db.execute(FILL.format(table=table, lo=lo, hi=min(lo + 999_999, rows)))
    db.execute(f"ALTER TABLE {FULL_TABLE} REPLICA IDENTITY FULL")
    settings = Settings(state_dir=scratch, dsn=db.dsn, maintenance="dagster")
    settings.save()
    start_service(settings, timeout=120)
    client = ServiceClient(settings.socket_path)
    try:
        return settings, client, _mirror_and_change(db, rows, client, log)
    except BaseException:
        client.close()
        stop_service(settings)
        raise


def _mirror_and_change(db: BenchDatabase, rows: int, client: Any, log) -> dict[str, Any]:
    """Mirror the tables, cut, change 1 % of their rows, cut; returns the facts of the run."""
    t0 = time.perf_counter()
    client.call("create_table", dst=TABLE, src=f"public.{TABLE}", timeout=3600)
    copy_s = time.perf_counter() - t0
    client.call("create_table", dst=FULL_TABLE, src=f"public.{FULL_TABLE}", timeout=3600)
    _wait_applied(client, db.dsn)
    since = client.call("cut", tables=[TABLE, FULL_TABLE], timeout=3600)["lsn"]
    w = plan_changes_workload(rows)
    t0 = time.perf_counter()
    _apply_changes(db.dsn, rows, w)
    _wait_applied(client, db.dsn)
    change_s = time.perf_counter() - t0
    _apply_changes(db.dsn, rows, w, FULL_TABLE)
    _wait_applied(client, db.dsn)
    until = client.call("cut", tables=[TABLE, FULL_TABLE], timeout=3600)["lsn"]
    log(f"  changes: {rows:,} rows mirrored in {copy_s:.1f}s; 1% changed in {change_s:.1f}s; [{since}, {until})")
    return {"since": since, "until": until, "create_table_seconds": copy_s, "change_seconds": change_s, "w": w}


def run_changes_bench(admin_dsn: str, sizes: Sizes, log=print) -> dict[str, Any]:
    """Run the change-feed suite (module docstring); returns the ``changes`` section of the bench JSON:
    ``ratio_vs_full_read`` (plain number), ``seconds`` / ``full_read_seconds`` and their CPU seconds
    (medians), the row counts of the workload and of both reads, ``check``, ``per_round``."""
    from ..engine.read import UnionReader
    from ..engine.service.process import service_pid, stop_service
    from ..engine.table.changes import lsn_stats

    scratch = Path(tempfile.mkdtemp(prefix="mc-bench-changes-", dir="/var/tmp"))
    rows = sizes.changes_rows
    try:
        with BenchDatabase(admin_dsn, prefix="mooncake_bench_ch") as db:
            settings, client, f = _setup(db, sizes, scratch, log)
            reader = None
            try:
                w, since, until = f.pop("w"), f["since"], f["until"]
                n_upd, n_del, n_ins = len(w["updated"]), len(w["deleted"]), w["inserted"]
                expect = {
                    "feed_rows": 2 * n_upd + n_del + n_ins,
                    "feed_inserts": n_upd + n_ins,
                    "feed_deletes": n_upd + n_del,
                    "full_read_rows": rows - n_del + n_ins,
                }
                reader = UnionReader(client)

                def check(name: str, res: Any) -> dict[str, Any]:
                    if name == "full_read":
                        return {"rows": res.num_rows, "ok": res.num_rows == expect["full_read_rows"]}
                    head, feed = res
                    st = lsn_stats(feed)
                    ok = _keys_only(feed) if name == "changes_keys" else True
                    ok = ok and (
                        head["since"] == since
                        and head["until"] == until
                        and (feed.num_rows, st["inserts"], st["deletes"])
                        == (expect["feed_rows"], expect["feed_inserts"], expect["feed_deletes"])
                    )
                    return {
                        "rows": feed.num_rows,
                        "inserts": st["inserts"],
                        "deletes": st["deletes"],
                        "ok": ok,
                        "sources": head.get("sources"),
                    }

                contenders = {
                    "changes": lambda: client.changes(TABLE, since, until, timeout=600),
                    "changes_keys": lambda: client.changes(TABLE, since, until, timeout=600, deletes="keys"),
                    "changes_full": lambda: client.changes(FULL_TABLE, since, until, timeout=600),
                    "full_read": lambda: reader.query(FULL_SQL, tables=[TABLE]),
                }
                for c in contenders.values():  # warm both (page cache, plans) before timing
                    c()
                per_round = _rounds(contenders, sizes.changes_rounds, service_pid(settings), check)
            finally:
                if reader is not None:
                    reader.con.close()
                client.close()
                stop_service(settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = _summary(per_round, rows, w, expect, f)
    full, src = out["identity_full"], out["sources"] or {}
    full_src = full["sources"] or {}
    log(
        f"  changes: feed of {out['feed_rows']:,} rows ({out['changed_rows']:,} rows changed of {rows:,}) in "
        f"{out['seconds'] * 1000:.1f} ms vs full read of {out['full_read_rows']:,} rows in "
        f"{out['full_read_seconds'] * 1000:.1f} ms: ratio {out['ratio_vs_full_read']:.3f} "
        f"(CPU {out['cpu_ratio_vs_full_read'] or 0:.3f}); deletes as keys in {out['keys_seconds'] * 1000:.1f} ms: "
        f"ratio {out['keys_ratio_vs_full_read']:.3f} (CPU {out['keys_cpu_ratio_vs_full_read'] or 0:.3f}); "
        f"REPLICA IDENTITY FULL feed in {full['seconds'] * 1000:.1f} ms: ratio {full['ratio_vs_full_read']:.3f} "
        f"(CPU {full['cpu_ratio_vs_full_read'] or 0:.3f}; deleted rows logged/read {full_src.get('rows_logged')}"
        f"/{full_src.get('rows_read')}, default {src.get('rows_logged')}/{src.get('rows_read')}); "
        f"checks ok: {out['check']['ok']}"
    )
    return out
