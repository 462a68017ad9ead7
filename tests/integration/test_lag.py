"""Lag that reads zero under load.

Under a sustained pgbench load, ``list-tables``' ``lag_bytes`` (the source's current WAL position minus
the applied LSN, read without waiting for the apply thread) agrees with what the source itself says in
``pg_stat_replication`` (``pg_current_wal_lsn() - write_lsn``, the position the service reports as
applied) within 10 %. Samples are compared at the same moment: the source is sampled right before and
right after each status call, and the WAL written between those two samples is the only slack allowed
on top of the 10 % (no wall-time thresholds).
"""

from __future__ import annotations

import json
import subprocess
import time

import psycopg
import pytest

from mooncake_assets.demo import _pg_bin
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.pg.embedded import reset_signals

from ..helpers import make_settings, mooncake, running_service

PG_SIDE = (
    "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, r.write_lsn - '0/0'::pg_lsn FROM pg_stat_replication r "
    "JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = %s"
)


@pytest.mark.slow
def test_lag_agrees_with_pg_stat_replication_under_load(pg_dsn, state_dir, tmp_path):
    # a custom pgbench script that writes WAL faster than the service applies it: a lag that lasts
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE bulk (id bigserial PRIMARY KEY, k int, v text)")
        c.execute("CREATE TABLE small (id int PRIMARY KEY, n int)")
        c.execute("INSERT INTO small SELECT g, 0 FROM generate_series(1, 10) g")
    script = tmp_path / "bulk.sql"
    script.write_text(
        "\\set k random(1, 10)\n"
        "INSERT INTO bulk (k, v) SELECT :k, md5(g::text) FROM generate_series(1, 200) g;\n"
        "UPDATE small SET n = n + 1 WHERE id = :k;\n"
    )
    settings = make_settings(state_dir, pg_dsn, maintenance="auto")
    with running_service(settings) as client:
        for t in ("bulk", "small"):
            client.call("create_table", dst=t, src=f"public.{t}", timeout=600)
        slot = client.status()["slot"]
        bench = subprocess.Popen(
            [_pg_bin("pgbench"), "-n", "-c", "1", "-j", "1", "-T", "600", "-f", str(script), pg_dsn],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=reset_signals,  # else it inherits SIGTERM ignored and terminate() waits out its -T 600
        )
        samples = []
        try:
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                while len(samples) < 10:
                    cur_a, w_a = c.execute(PG_SIDE, (slot,)).fetchone()
                    st = client.status()
                    cur_b, w_b = c.execute(PG_SIDE, (slot,)).fetchone()
                    row = next(t for t in st["tables"] if t["name"] == "bulk")
                    samples.append(
                        (
                            int(cur_a) - int(w_a),
                            int(cur_b) - int(w_b),
                            int(cur_b) - int(cur_a),
                            row["lag_bytes"],
                            row["lag_seconds"],
                        )
                    )
                    time.sleep(0.2)  # spread the samples over the run (spacing only, nothing is timed)
            human = mooncake(settings, "list-tables", check=True).stdout
            doc = json.loads(mooncake(settings, "list-tables", "--json", check=True).stdout)
        finally:
            bench.terminate()
            try:
                bench.wait(timeout=30)
            except subprocess.TimeoutExpired:
                bench.kill()
                bench.wait()
        assert "lag" in human.splitlines()[2] or " lag " in human, human
        assert all("lag_seconds" in t for t in doc["tables"]), doc
        print("samples (pg lag before, after, WAL between, lag_bytes, lag_seconds):", samples)
        pg = sum((a + b) / 2 for a, b, _, _, _ in samples)
        ours = sum(x for _, _, _, x, _ in samples)
        slack = sum(d for _, _, d, _, _ in samples)
        assert pg > 0 and sum(1 for *_, x, _ in samples if x > 0) >= len(samples) // 2, samples
        assert abs(ours - pg) <= 0.10 * pg + slack, (ours, pg, slack, samples)
        # the oldest unapplied commit has an age whenever bytes are unapplied
        assert all(s > 0 for _, _, _, x, s in samples if x > 64 * 1024), samples
        # once the load stops and the service catches up, both read zero
        client.wait_lsn(
            psycopg.connect(pg_dsn, autocommit=True).execute("SELECT pg_current_wal_lsn()::text").fetchone()[0],
            timeout=120,
        )
        st = client.status()
        row = next(t for t in st["tables"] if t["name"] == "bulk")
        assert row["lag_bytes"] < 64 * 1024 and (row["lag_bytes"] > 0 or row["lag_seconds"] == 0), row
        assert Lsn.parse(row["applied_lsn"]) > 0
