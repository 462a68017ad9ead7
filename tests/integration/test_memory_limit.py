"""The service's memory budget against a real Postgres and the real service process: a single-transaction
UPDATE of a large table spills to disk and is applied in chunks (peak RSS bounded relative to the
budget), also as a streamed transaction whose savepoints are rolled back inside it (Stream Abort of a
subtransaction, pgoutput protocol version 2; 3M rows under 512 MiB for both), a top-level abort of a large streamed transaction leaves
no spill file, and afterwards the mirror equals Postgres in the union read and, once persisted, in
PyIceberg's and DuckDB's (``iceberg_scan``) reads of the Iceberg table (:func:`_matches`)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.iceberg import make_catalog
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import kill_service, service_pid, start_service, stop_service
from mooncake_assets.engine.storage.duckdb_ext import connect_with_iceberg
from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake, running_service, wait_until

MiB = 1 << 20


def _proc_kb(pid: int, field: str) -> int:
    """``field`` (``VmHWM``, ``VmRSS``) of ``/proc/<pid>/status`` in bytes (proc(5))."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _reset_hwm(pid: int) -> None:
    """Reset the peak RSS (VmHWM) to the current RSS (``clear_refs`` value 5, proc(5))."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


#: count, sum(n) and a checksum of ``big``'s rows (md5 of every row's text, in id order)
_PG_SUMMARY = (
    "SELECT count(*), coalesce(sum(n), 0), md5(coalesce(string_agg(id::text || ':' || n::text || ':' || v, ','"
    " ORDER BY id), '')) FROM big"
)
_DUCK_SUMMARY = (
    "SELECT count(*), coalesce(sum(n), 0), md5(coalesce(string_agg(CAST(id AS VARCHAR) || ':' || CAST(n AS VARCHAR)"
    " || ':' || v, ',' ORDER BY id), '')) FROM {src}"
)


def _summaries(settings, dsn: str, name: str) -> dict[str, tuple]:
    """(count, sum(n), checksum) of ``big`` in Postgres and of the persisted mirror ``name`` as PyIceberg
    and DuckDB's ``iceberg_scan`` read it."""
    with psycopg.connect(dsn) as c:
        pg = c.execute(_PG_SUMMARY).fetchone()
    tbl = make_catalog(settings.catalog, settings.warehouse_uri).load_table(f"mooncake.{name}")
    duck = connect_with_iceberg()
    try:
        duck.register("scanned", tbl.scan().to_arrow())
        py = duck.execute(_DUCK_SUMMARY.format(src="scanned")).fetchone()
        loc = tbl.metadata_location.replace("'", "''")
        ice = duck.execute(_DUCK_SUMMARY.format(src=f"iceberg_scan('{loc}')")).fetchone()
    finally:
        duck.close()
    return {"postgres": tuple(pg), "pyiceberg": tuple(py), "duckdb-iceberg": tuple(ice)}


def _matches(settings, client, name: str, dsn: str | None = None) -> None:
    """The mirror ``name`` equals its source: the union read at one LSN (``verify``, row for row); then,
    persisted, PyIceberg's and DuckDB's (``iceberg_scan``) reads of the Iceberg table against Postgres
    (nothing writes meanwhile, so Postgres now is Postgres at that LSN). With ``dsn`` (a mirror of
    ``big``, up to 3M rows) those two compare count, sum(n) and the md5 of every row's text in id order
    (equal only when every row is); without, ``verify`` compares them row for row."""
    results, lsn = verify(settings, [name], "union", client)
    bad = [r.line() for r in results if not r.match]
    assert not bad, f"union read at LSN {lsn}: {bad}"
    client.call("persist", table=name)
    if dsn is not None:
        sums = _summaries(settings, dsn, name)
        print(f"{name}: (count, sum(n), checksum) {sums}")
        assert sums["pyiceberg"] == sums["postgres"] and sums["duckdb-iceberg"] == sums["postgres"], sums
        return
    for reader in ("pyiceberg", "duckdb-iceberg"):
        results, lsn = verify(settings, [name], reader, client)
        bad = [r.line() for r in results if not r.match]
        assert not bad, f"{reader} after persist at LSN {lsn}: {bad}"


def _spilled_bytes(spill: Path) -> int:
    """Bytes in the spill directory's files (0: none)."""
    n = 0
    for p in spill.glob("*.arrow"):
        try:
            n += p.stat().st_size
        except FileNotFoundError:  # (deleted meanwhile)
            pass
    return n


def _big_table(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE big (id bigint PRIMARY KEY, n int NOT NULL, v text NOT NULL)")
        c.execute(
            "INSERT INTO big SELECT g, g %% 1000, md5(g::text) || lpad(g::text, 8, '0') FROM generate_series(1, %s) g",
            (rows,),
        )
        # the walsender streams a transaction past 1 MB of decoded changes (protocol v2, Stream Start…)
        c.execute(f"ALTER DATABASE {c.info.dbname} SET logical_decoding_work_mem = '1MB'")


def _update_all(settings, dsn: str, rows: int, limit: int) -> dict:
    """Mirror ``big`` (``rows`` rows), UPDATE every row in one transaction, wait until the mirror equals
    Postgres; returns the status' memory block plus ``hwm``/``base`` (peak RSS during the UPDATE's
    apply, RSS before it; bytes), ``spill_files`` and ``seconds`` (wall time of each phase: ``copy``,
    ``update`` (the UPDATE in Postgres), ``apply`` (until the mirror has applied it), ``check``)."""
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    _big_table(dsn, rows)
    with running_service(settings) as client:
        client.call("create_table", dst="big", src="public.big")
        client.call("persist", table="big")  # the copied rows durable: what the UPDATE's deletes hit
        seconds["copy"] = time.monotonic() - t0
        pid = service_pid(settings)
        assert pid
        _reset_hwm(pid)
        base = _proc_kb(pid, "VmRSS")
        t0 = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("UPDATE big SET n = n + 1")
            lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        seconds["update"] = time.monotonic() - t0
        client.wait_lsn(lsn, timeout=max(1200, rows / 2000))
        seconds["apply"] = time.monotonic() - t0 - seconds["update"]
        hwm = _proc_kb(pid, "VmHWM")  # (before the verify: its reads are not the apply's)
        t0 = time.monotonic()
        _matches(settings, client, "big", dsn)
        seconds["check"] = time.monotonic() - t0
        mem = client.status()["memory"]
        spill_files = list((settings.state_dir / "spill").glob("*.arrow"))
        with psycopg.connect(dsn) as c:
            assert c.execute("SELECT count(*), sum(n) FROM big").fetchone() == (
                rows,
                sum(g % 1000 + 1 for g in range(1, rows + 1)),
            )
    return {**mem, "hwm": hwm, "base": base, "spill_files": spill_files, "seconds": seconds}


@pytest.mark.timeout(1500)  # (a hang guard: 17-22 s when the machine is idle, its load shared by others)
def test_large_update_spills_and_stays_in_budget(pg_dsn, state_dir):
    """300k rows updated in one transaction under a 128 MiB budget: the transaction spills, is applied
    from its file, nothing is left in the spill directory, the mirror equals Postgres, and the RSS the
    apply adds stays within the budget. Prints each phase's wall time (a slow run names its phase)."""
    limit = 128 * MiB
    s = make_settings(state_dir, pg_dsn, memory_limit=limit, maintenance="auto")
    m = _update_all(s, pg_dsn, 300_000, limit)
    print(f"memory: base RSS {m['base'] / MiB:.0f} MiB, peak {m['hwm'] / MiB:.0f} MiB, status {m}")
    assert m["limit_bytes"] == limit
    assert m["spilled"] >= 1
    assert m["spill_files"] == []
    assert m["hwm"] - m["base"] <= 1.5 * limit  # what the UPDATE adds (apply, flushes, persist)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # (a hang guard: the 3M-row copy, UPDATE and four reads of 3M rows)
def test_three_million_row_update_under_512mib(pg_dsn, state_dir):
    """The target: 3M rows updated in one transaction under ``--memory-limit 512MiB``; peak RSS at most
    1.5x the budget."""
    limit = 512 * MiB
    s = make_settings(state_dir, pg_dsn, memory_limit=limit, maintenance="auto")
    m = _update_all(s, pg_dsn, 3_000_000, limit)
    print(f"memory: base RSS {m['base'] / MiB:.0f} MiB, peak {m['hwm'] / MiB:.0f} MiB, status {m}")
    assert m["spilled"] >= 1 and m["spill_files"] == []
    assert m["hwm"] <= 1.5 * limit


def _abort_large_update(dsn: str, state_dir: Path, rows: int) -> None:
    """Mirror ``big`` (``rows`` rows), UPDATE every row twice in one transaction that Postgres streams
    while open and the service spills, roll it back: the spill file goes with the Stream Abort, nothing
    counts as spilled, and the mirror still equals Postgres in every reader."""
    s = make_settings(state_dir, dsn, memory_limit=128 * MiB, maintenance="auto")
    _big_table(dsn, rows)
    spill = state_dir / "spill"
    with running_service(s) as client:
        client.call("create_table", dst="big", src="public.big")
        with psycopg.connect(dsn) as c:
            c.execute("UPDATE big SET n = n + 1, v = v || 'x'")
            c.execute("UPDATE big SET n = n + 1")
            wait_until(lambda: list(spill.glob("*.arrow")), timeout=120, what="a spill file of the open transaction")
            c.rollback()
        wait_until(lambda: not list(spill.glob("*.arrow")), timeout=max(120, rows / 2000), what="the spill file to go")
        _matches(s, client, "big", dsn)
        assert client.status()["memory"]["spilled"] == 0
        assert not list(spill.glob("*.arrow"))


def test_aborted_large_transaction_leaves_no_spill(pg_dsn, state_dir):
    """A large UPDATE streamed by Postgres while open, spilled by the service, then rolled back: the
    spill file goes with the Stream Abort and the mirror still equals Postgres."""
    _abort_large_update(pg_dsn, state_dir, 200_000)


@pytest.mark.slow
def test_aborted_million_row_transaction_leaves_no_spill(pg_dsn, state_dir):
    """The same with 1M rows (two UPDATEs of every row: 2M changes, several spill writes) rolled back."""
    _abort_large_update(pg_dsn, state_dir, 1_000_000)


def _streamed_with_savepoints(dsn: str, state_dir: Path, rows: int, limit: int) -> dict:
    """Mirror ``big`` (``rows`` rows), then one transaction of several large chunks, some inside
    ``SAVEPOINT … ROLLBACK TO SAVEPOINT`` (one with a released savepoint nested inside it), streamed by
    Postgres while open (protocol version 2: each rolled-back savepoint is a Stream Abort naming its
    subtransaction; the slot's ``stream_txns`` counts it) and spilled by the service under ``limit``:
    at commit the rows of the aborted subtransactions are left out — those already in the spill file
    and those still in memory — the mirror equals Postgres in every reader and nothing is left in the
    spill directory. Returns the status' memory block plus ``hwm``/``base`` (peak RSS from the
    transaction's start to its apply, RSS before it; bytes)."""
    s = make_settings(state_dir, dsn, memory_limit=limit, maintenance="auto")
    _big_table(dsn, rows)
    spill = state_dir / "spill"
    a, b = rows + 1, rows + 1_000_001  # (ids of the inserted rows: past the table's)
    with running_service(s) as client:
        client.call("create_table", dst="big", src="public.big")
        client.call("persist", table="big")
        pid = service_pid(s)
        assert pid
        _reset_hwm(pid)
        base = _proc_kb(pid, "VmRSS")
        with psycopg.connect(dsn) as c:
            c.execute("UPDATE big SET n = n + 1")  # top level: kept (more than one spill write)
            first = wait_until(lambda: _spilled_bytes(spill), timeout=300, what="a spill file of the open transaction")
            c.execute("SAVEPOINT a")
            c.execute("UPDATE big SET n = n + 100, v = v || 'a'")  # every row again, then rolled back
            c.execute("INSERT INTO big SELECT g, 7, 'a' FROM generate_series(%s, %s) g", (a, a + 49_999))
            # the next spill write holds rows of subtransaction a (and more of a stays in memory)
            wait_until(lambda: _spilled_bytes(spill) > first, timeout=300, what="savepoint a's rows spilled")
            c.execute("ROLLBACK TO SAVEPOINT a")
            c.execute("SAVEPOINT b")
            c.execute("UPDATE big SET n = n + 2 WHERE id % 3 = 0")  # released: kept
            c.execute("INSERT INTO big SELECT g, g %% 7, 'b' || g FROM generate_series(%s, %s) g", (b, b + 29_999))
            c.execute("RELEASE SAVEPOINT b")
            c.execute("SAVEPOINT c")
            c.execute("DELETE FROM big WHERE id % 5 = 0")
            c.execute("SAVEPOINT d")
            c.execute("UPDATE big SET n = n + 1000, v = 'd' WHERE id % 2 = 0")
            c.execute("RELEASE SAVEPOINT d")  # d's rows belong to c now: rolled back with it
            c.execute("ROLLBACK TO SAVEPOINT c")
            c.execute("DELETE FROM big WHERE id % 11 = 0")  # top level: kept
            c.execute("SAVEPOINT e")
            c.execute("UPDATE big SET n = -n")  # the last chunk rolled back, right before the commit
            c.execute("ROLLBACK TO SAVEPOINT e")
            c.commit()
            lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(lsn, timeout=max(600, rows / 2000))
        hwm = _proc_kb(pid, "VmHWM")  # (before the verify: its reads are not the apply's)
        mem = client.status()["memory"]
        slot = client.status()["slot"]
        _matches(s, client, "big", dsn)
        print(f"memory: base RSS {base / MiB:.0f} MiB, peak {hwm / MiB:.0f} MiB, status {mem}")
        with psycopg.connect(dsn) as c:  # what the kept chunks alone make
            expect_rows = sum(1 for g in range(1, rows + 1) if g % 11) + sum(1 for g in range(b, b + 30_000) if g % 11)
            assert c.execute("SELECT count(*) FROM big").fetchone() == (expect_rows,)
            assert c.execute("SELECT count(*) FROM big WHERE v LIKE '%a' OR v = 'd' OR n < 0").fetchone() == (0,)
            (streamed,) = c.execute(
                "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
        assert streamed >= 1, "Postgres did not stream the transaction"
        assert mem["spilled"] >= 1
        assert not list(spill.glob("*.arrow"))
    return {**mem, "hwm": hwm, "base": base}


def test_streamed_transaction_with_savepoint_rollbacks_spills_and_stays_in_budget(pg_dsn, state_dir):
    """200k rows, 128 MiB (:func:`_streamed_with_savepoints`): the RSS the apply adds stays within 1.5x
    the budget."""
    limit = 128 * MiB
    m = _streamed_with_savepoints(pg_dsn, state_dir, 200_000, limit)
    assert m["hwm"] - m["base"] <= 1.5 * limit


@pytest.mark.slow
@pytest.mark.timeout(2400)  # (a hang guard: the 3M-row copy, the transaction's ~12M changes, four reads)
def test_three_million_row_streamed_update_with_savepoint_rollbacks_under_512mib(pg_dsn, state_dir):
    """The target as a streamed transaction: 3M rows updated (and every row updated again inside a
    savepoint rolled back, and the rest of :func:`_streamed_with_savepoints`) in one transaction under
    ``--memory-limit 512MiB``; peak RSS (VmHWM, the Python baseline included) at most 1.5x the budget."""
    limit = 512 * MiB
    m = _streamed_with_savepoints(pg_dsn, state_dir, 3_000_000, limit)
    assert m["hwm"] <= 1.5 * limit


def test_reference_decoder_says_it_does_not_spill(pg_dsn, state_dir, monkeypatch):
    """``decoder: python`` (the reference decoder) does not spill: a stream started with it logs one
    warning saying so, naming the budget, and the mirror is still right; the compiled decoder logs none."""
    monkeypatch.delenv("MOONCAKE_DECODER", raising=False)
    s = make_settings(state_dir, pg_dsn, memory_limit=128 * MiB, decoder="python")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE small (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO small SELECT g, 'v' || g FROM generate_series(1, 100) g")
    log = state_dir / "service.log"
    warning = "the reference decoder does not spill: an open transaction is held in memory whole, outside the memory budget of 128.0 MiB"
    with running_service(s) as client:
        client.call("create_table", dst="small", src="public.small")
        wait_until(lambda: "replication stream started (reference decoder)" in log.read_text(), what="the stream")
        assert warning in log.read_text()
        _matches(s, client, "small")
    s = make_settings(state_dir, pg_dsn, memory_limit=128 * MiB, decoder="native")
    log.write_text("")
    with running_service(s) as client:
        wait_until(lambda: "replication stream started (compiled decoder)" in log.read_text(), what="the stream")
        assert "does not spill" not in log.read_text()


def test_memory_limit_on_the_command_line(pg_dsn, state_dir):
    """``start --memory-limit`` is kept in settings.json and shown by ``status``; below the minimum it
    is refused in one line naming the minimum."""
    s = make_settings(state_dir, pg_dsn)
    r = mooncake(s, "start", "--memory-limit", "64MiB")
    assert r.returncode != 0
    msg = r.stderr.strip()
    assert len(msg.splitlines()) == 1 and "minimum of 128.0 MiB" in msg, msg
    r = mooncake(s, "start", "--memory-limit", "lots")
    assert r.returncode != 0 and "not a size" in r.stderr
    try:
        mooncake(s, "start", "--memory-limit", "768MiB", check=True)
        import json

        assert json.loads((state_dir / "settings.json").read_text())["memory_limit"] == 768 * MiB
        out = mooncake(s, "status", check=True).stdout
        assert "memory: limit 768.0 MiB" in out and "backpressure: false" in out, out
    finally:
        mooncake(s, "stop")


def test_memory_limit_of_a_running_service_is_not_silently_ignored(pg_dsn, state_dir):
    """``start --memory-limit`` while the service runs with another budget is refused in one line naming
    the running budget and ``mooncake stop`` (it used to print "running" and exit 0, the budget unchanged
    and unsaved); the same budget again, or none, is the usual no-op."""
    import json

    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "start", "--memory-limit", "768MiB", check=True)
        r = mooncake(s, "start", "--memory-limit", "256MiB")
        msg = r.stderr.strip()
        assert r.returncode == 1 and len(msg.splitlines()) == 1, (r.stdout, r.stderr)
        assert "memory limit 768.0 MiB" in msg and "mooncake stop" in msg and "256.0 MiB" in msg, msg
        assert json.loads((state_dir / "settings.json").read_text())["memory_limit"] == 768 * MiB
        assert "memory: limit 768.0 MiB" in mooncake(s, "status", check=True).stdout
        mooncake(s, "start", "--memory-limit", "768MiB", check=True)
        mooncake(s, "start", check=True)
    finally:
        mooncake(s, "stop")


def test_sigkill_while_spilled_converges(pg_dsn, state_dir):
    """SIGKILL the service while a committed large transaction is spilled (being decoded or applied
    from its file), start it again: the leftover spill file is removed, the slot resends the
    transaction, and the mirror equals Postgres."""
    s = make_settings(state_dir, pg_dsn, memory_limit=128 * MiB, maintenance="auto")
    _big_table(pg_dsn, 300_000)
    spill = state_dir / "spill"
    with running_service(s) as client:
        client.call("create_table", dst="big", src="public.big")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE big SET n = n + 7")
        wait_until(lambda: list(spill.glob("*.arrow")), timeout=120, what="a spill file", step=0.02)
        kill_service(s)
        start_service(s)
        client.close()
        _matches(s, client, "big", pg_dsn)
        assert not list(spill.glob("*.arrow"))


def _reaped(pid: int) -> bool:
    """Has our child ``pid`` exited (reaped here)?"""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def test_sigkill_during_a_spilled_transactions_apply_converges(pg_dsn, state_dir, monkeypatch):
    """SIGKILL at the fault point ``spill:apply``: a committed spilled transaction half applied from its
    file, part of it already flushed early to local staging by the memory budget. Started again, the
    service removes the spill file, the slot resends the transaction, and the mirror equals Postgres in
    every reader: no row lost or doubled (count, sum and the checksum of every row)."""
    monkeypatch.setenv("MOONCAKE_FAULT", "spill:apply")
    s = make_settings(state_dir, pg_dsn, memory_limit=128 * MiB, maintenance="auto")
    _big_table(pg_dsn, 300_000)
    spill = state_dir / "spill"
    pid = start_service(s)
    client = ServiceClient(s.socket_path)
    try:
        client.call("create_table", dst="big", src="public.big")
        client.call("persist", table="big")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE big SET n = n + 7, v = v || 'k'")
        wait_until(lambda: _reaped(pid), timeout=600, what="the SIGKILL at spill:apply")
        assert "fault injection: SIGKILL at spill:apply" in (state_dir / "service.log").read_text()
        assert list(spill.glob("*.arrow")), "the killed apply left its spill file"
        client.close()
        monkeypatch.delenv("MOONCAKE_FAULT")
        start_service(s)
        _matches(s, client, "big", pg_dsn)
        assert not list(spill.glob("*.arrow"))
    finally:
        client.close()
        stop_service(s)


def test_full_disk_while_spilling_stops_only_that_table(pg_dsn, state_dir, monkeypatch):
    """ENOSPC while writing a spill file (injected at the fault point ``spill:write``): the table the
    large transaction changed stops with one line naming the spill file and the LSN, the slot is not
    confirmed past that table's flush LSN, the stream does not reconnect, and another table goes on."""
    monkeypatch.setenv("MOONCAKE_FAULT", "spill:write=errno:ENOSPC")
    s = make_settings(state_dir, pg_dsn, memory_limit=128 * MiB, maintenance="auto")
    _big_table(pg_dsn, 300_000)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE small (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO small VALUES (1, 'a')")
    with running_service(s) as client:
        client.call("create_table", dst="big", src="public.big")
        client.call("create_table", dst="small", src="public.small")
        client.call("persist", table="big")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            before = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
            c.execute("UPDATE big SET n = n + 1")
            c.execute("INSERT INTO small VALUES (2, 'b')")
            lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        client.wait_lsn(lsn, timeout=300)
        st = client.status()
        tables = {t["name"]: t for t in st["tables"]}
        err = tables["big"]["error"] or ""
        assert tables["big"]["state"] == "error", tables["big"]
        assert len(err.splitlines()) == 1, err
        assert f"to {state_dir / 'spill'}/" in err and ".arrow failed at LSN " in err, err
        assert "No space left on device" in err and "transaction committed at LSN" in err, err
        assert tables["small"]["state"] == "ready", tables["small"]
        _matches(s, client, "small")
        assert st["stream_faults"] == [] and st["stream_error"] is None  # no reconnect loop
        assert not list((state_dir / "spill").glob("*.arrow"))
        # the slot stays at or below the failed transaction's commit: a restart resends it
        (commit,) = re.findall(r"transaction committed at LSN ([0-9A-F]+/[0-9A-F]+)", err)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            (held, past) = c.execute(
                "SELECT confirmed_flush_lsn <= %s::pg_lsn, %s::pg_lsn > %s FROM pg_replication_slots "
                "WHERE database = current_database()",
                (commit, commit, before),
            ).fetchone()
        assert held and past, (commit, before)
