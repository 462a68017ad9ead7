"""A table created while its source is being written: the changes that arrive during its initial copy
are queued (per transaction, cut back from the stream's batch runs) and applied before it goes live."""

from __future__ import annotations

import random
import threading
import time

import psycopg

from ..helpers import make_settings, running_service
from .test_mirror_converges import _all_match


def test_create_table_during_a_write_workload_converges(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE acc (id int PRIMARY KEY, bal bigint NOT NULL)")
        c.execute("INSERT INTO acc SELECT g, 0 FROM generate_series(1, 2000) g")
        c.execute("CREATE TABLE hist (id int PRIMARY KEY, delta int)")
    s = make_settings(state_dir, pg_dsn, maintenance="auto", persist_interval_s=0.5)
    stop = threading.Event()

    def workload():
        rng = random.Random(11)
        n = 0
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            while not stop.is_set():
                with c.transaction():
                    for _ in range(rng.randint(1, 5)):
                        n += 1
                        i, d = rng.randint(1, 2000), rng.randint(-5, 5)
                        c.execute("UPDATE acc SET bal = bal + %s WHERE id = %s", (d, i))
                        c.execute("INSERT INTO hist VALUES (%s, %s)", (n, d))
                        if rng.random() < 0.1:
                            c.execute("DELETE FROM hist WHERE id = %s", (rng.randint(1, n),))

    with running_service(s) as client:
        client.call("create_table", dst="acc", src="public.acc")
        th = threading.Thread(target=workload)
        th.start()
        try:
            time.sleep(1.0)
            client.call("create_table", dst="hist", src="public.hist")  # copied while written
            time.sleep(1.5)
        finally:
            stop.set()
            th.join()
        _all_match(s, client)
        st = {t["name"]: t for t in client.status()["tables"]}
        assert st["acc"]["missing_keys"] == 0 and st["hist"]["missing_keys"] == 0, st
