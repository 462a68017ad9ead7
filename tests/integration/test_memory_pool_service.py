"""The background service process allocates Arrow memory from the pool chosen for it."""

from __future__ import annotations

from mooncake_assets.engine.service.process import ARROW_POOL_ENV, SERVICE_MEMORY_POOL

from ..helpers import make_settings, running_service


def test_service_process_uses_its_memory_pool(pg_dsn, state_dir, monkeypatch):
    monkeypatch.delenv(ARROW_POOL_ENV, raising=False)
    with running_service(make_settings(state_dir, pg_dsn)) as client:
        st = client.status()
        assert st["memory_pool"] == SERVICE_MEMORY_POOL
        assert st["arrow_allocated_bytes"] >= 0
