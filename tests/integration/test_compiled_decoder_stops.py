"""A change the mirror cannot take stops only its table on the compiled path (issue 14).

The service runs with ``decoder: native`` (checked in its log: the compiled receive loop and
``NativeDecoder(batch=True)``), so the changes below reach the tables as batch runs
(``engine/service/native_batch.py``). The stream is held (``MOONCAKE_FAULT=stream:apply=wait:<flag>``)
while six transactions T1-T6 commit and are sent, so they arrive in one read batch (checked in
``stream_counts``): the row the mirror cannot hold (numeric NaN in a ``numeric(10,2)`` column) sits
in T4, in one batch run of its table with T1 and T3, next to rows of another table in T4 itself.

What must hold, as on the reference path: the table stops with one line naming table, column and the
LSN of the failing row's commit (not a neighbour's); the slot is held at or below it; the other
table gets every row, those of the failing transaction included; the remedy the error names
(re-create with the column as text) gives a mirror equal to the source: nothing lost.
"""

from __future__ import annotations

import psycopg
import pytest

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import start_service, stop_service
from mooncake_assets.verify import verify

from ..helpers import make_settings, wait_until


def _lsn_now(c: psycopg.Connection) -> int:
    return Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


def _matches(s, client, *names: str) -> None:
    results, lsn = verify(s, list(names), "union", client)
    bad = [r.line() for r in results if not r.match]
    assert not bad, f"union read at LSN {lsn}: {bad}"


@pytest.mark.parametrize("apply_mode", ["run", "auto"])
def test_a_bad_row_inside_a_batch_run_stops_only_its_table_at_its_commit(pg_dsn, state_dir, monkeypatch, apply_mode):
    monkeypatch.delenv("MOONCAKE_DECODER", raising=False)
    flag = state_dir / "hold-stream"
    s = make_settings(state_dir, pg_dsn, decoder="native", apply_mode=apply_mode, maintenance="dagster")
    src = psycopg.connect(pg_dsn, autocommit=True)
    src.execute("CREATE TABLE b_good (id int PRIMARY KEY, v text)")
    src.execute("CREATE TABLE b_bad (id int PRIMARY KEY, price numeric(10,2))")
    src.execute("INSERT INTO b_good SELECT g, 'g' || g FROM generate_series(1, 20) g")
    src.execute("INSERT INTO b_bad SELECT g, g * 1.5 FROM generate_series(1, 20) g")
    start_service(s, extra_env={"MOONCAKE_FAULT": f"stream:apply=wait:{flag}"})
    client = ServiceClient(s.socket_path)
    try:
        client.call("create_table", dst="b_good", src="public.b_good")
        client.call("create_table", dst="b_bad", src="public.b_bad")
        log = (state_dir / "service.log").read_text()
        assert "replication stream started (compiled decoder)" in log, log[-2000:]
        # hold the stream at its next read batch, then commit five transactions behind it
        flag.touch()
        src.execute("INSERT INTO b_good VALUES (1000, 'trigger')")
        wait_until(lambda: (state_dir / "hold-stream.reached").exists(), what="the stream held at stream:apply")
        src.execute("INSERT INTO b_bad SELECT g, g FROM generate_series(100, 139) g")  # T1
        src.execute("INSERT INTO b_good SELECT g, 'x' FROM generate_series(100, 139) g")  # T2
        src.execute("INSERT INTO b_bad SELECT g, g FROM generate_series(140, 179) g")  # T3
        before = _lsn_now(src)
        with src.transaction():  # T4: good rows, the bad row in the middle of good ones, more good rows
            src.execute("INSERT INTO b_good SELECT g, 'y' FROM generate_series(200, 239) g")
            src.execute("INSERT INTO b_bad SELECT g, g FROM generate_series(200, 219) g")
            src.execute("INSERT INTO b_bad VALUES (220, 'NaN')")
            src.execute("INSERT INTO b_bad SELECT g, g FROM generate_series(221, 239) g")
            src.execute("UPDATE b_good SET v = 'updated' WHERE id <= 10")
        after = _lsn_now(src)
        src.execute("INSERT INTO b_bad SELECT g, g FROM generate_series(300, 339) g")  # T5
        src.execute("DELETE FROM b_good WHERE id BETWEEN 11 AND 15")  # T6
        end = _lsn_now(src)
        # every transaction sent to the held stream, so they reach the decoder in one read batch
        wait_until(
            lambda: src.execute(
                "SELECT r.sent_lsn >= %s::pg_lsn FROM pg_stat_replication r "
                "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s",
                (str(Lsn(end)), client.status()["slot"]),
            ).fetchone()[0],
            what="the walsender to send T1-T6",
        )
        counts = client.status()["stream_counts"]
        flag.unlink()

        def stopped():
            t = next(t for t in client.status()["tables"] if t["name"] == "b_bad")
            return t if t["state"] == "error" else None

        st = wait_until(stopped, what="b_bad stopped")
        _matches(s, client, "b_good")  # every row of the other table, T4's included
        now = client.status()["stream_counts"]  # the held batch (the trigger), then T1-T6 in one
        assert (now["batches"] - counts["batches"], now["transactions"] - counts["transactions"]) == (2, 7), now
        err = st["error"]
        assert "\n" not in err and "table b_bad" in err and "price" in err and "NaN" in err, err
        at = Lsn.parse(err.split("change at LSN ")[1].split()[0])
        assert before < at <= after, (str(Lsn(before)), err, str(Lsn(after)))  # T4's commit, not T1's or T3's
        slot = client.status()["slot"]
        confirmed = src.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()[0]
        assert Lsn.parse(confirmed) < at, (confirmed, err)  # held: a restart replays the commit
        # the remedy the error names gives the whole table back
        assert "--column-type price=text" in err, err
        client.call("drop_table", table="b_bad")
        client.call("create_table", dst="b_bad", src="public.b_bad", column_types={"price": "text"})
        src.execute("INSERT INTO b_bad VALUES (400, 'NaN'), (401, 2.25)")
        _matches(s, client, "b_bad", "b_good")
    finally:
        if flag.exists():
            flag.unlink()
        client.close()
        stop_service(s)
        src.close()
