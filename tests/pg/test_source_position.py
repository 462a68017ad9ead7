"""engine/service/source_position.py against a real Postgres: the source's WAL position, the refusal of
an LSN past it, a source that cannot be asked, and the shared connection's catalog look-ups."""

from __future__ import annotations

import threading

import psycopg
import pytest

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service.source_position import AHEAD_OF_SOURCE, SourcePosition


def test_position_refusal_and_lookups(pg_dsn):
    pos = SourcePosition(pg_dsn)
    try:
        assert pos.query("SELECT 1", []) is None  # no connection made yet
        now = pos.current()
        with psycopg.connect(pg_dsn) as c:
            assert now is not None and now <= Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        assert pos.error is None and pos.seen == now
        pos.refuse_ahead(now)  # at the position: reachable, not refused
        with pytest.raises(ValueError, match=AHEAD_OF_SOURCE) as e:
            pos.refuse_ahead(now + (1 << 40))
        assert str(Lsn(now + (1 << 40))) in str(e.value) and "\n" not in str(e.value)
        assert pos.query("SELECT oid::int8 FROM pg_class WHERE relname = %s", ["pg_class"]) == [(1259,)]
        got: list[int | None] = []  # several threads take turns on the one connection
        threads = [threading.Thread(target=lambda: got.append(pos.current())) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 8 and all(g is not None and g >= now for g in got)
    finally:
        pos.close()


def test_a_source_that_cannot_be_asked_refuses_nothing():
    pos = SourcePosition("host=127.0.0.1 port=1 dbname=x user=nobody password=not-shown connect_timeout=1")
    assert pos.current() is None
    assert pos.error and "not-shown" not in pos.error
    pos.refuse_ahead(1 << 60)  # cannot be asked: nothing refused (the caller waits as before)
    assert pos.query("SELECT 1", []) is None
