"""The stream loop's counters in ``status`` (``stream_counts``) and its opt-in cProfile.

One-row transactions applied by a real service show up in ``stream_counts`` (``transactions``
applied, ``batches`` that read data, loop ``reads``); a service started with
``MOONCAKE_STREAM_PROFILE`` writes its replication thread's cProfile stats there when it stops
(``scripts/profile_service_loop.py --cprofile`` reads them).
"""

from __future__ import annotations

import pstats

import psycopg

from mooncake_assets.engine.service import ServiceClient
from mooncake_assets.engine.service.process import start_service, stop_service
from mooncake_assets.engine.service.replication import PROFILE_ENV

from ..helpers import make_settings


def test_stream_counts_and_profile(pg_dsn, state_dir, tmp_path):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE sc (id int PRIMARY KEY, n int)")
        c.execute("INSERT INTO sc SELECT g, 0 FROM generate_series(1, 10) g")
    settings = make_settings(state_dir, pg_dsn)
    prof = tmp_path / "stream.prof"
    start_service(settings, extra_env={PROFILE_ENV: str(prof)})
    client = ServiceClient(settings.socket_path)
    try:
        client.call("create_table", dst="sc", src="public.sc", timeout=600)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            client.wait_lsn(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0], timeout=120)
            before = client.status()["stream_counts"]
            for i in range(1, 8):  # seven one-row transactions
                c.execute("UPDATE sc SET n = n + 1 WHERE id = %s", (i,))
            client.wait_lsn(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0], timeout=120)
        after = client.status()["stream_counts"]
        assert set(after) == {"reads", "batches", "transactions"}, after
        assert after["transactions"] - before["transactions"] >= 7, (before, after)
        assert 1 <= after["batches"] - before["batches"] <= after["reads"] - before["reads"], (before, after)
        assert after["batches"] <= after["reads"], after
    finally:
        client.close()
        stop_service(settings)
    st = pstats.Stats(str(prof))
    assert any(name == "_stream_once" for (_, _, name) in st.stats), "the replication thread was not profiled"
