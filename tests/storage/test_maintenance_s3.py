"""Compaction and index merge (tests/integration/test_maintenance.py) with the warehouse on moto's S3 server.

The tests are run from there with ``make_settings`` patched to put the warehouse in a fresh bucket and
the endpoint given the way a user would: ``MOONCAKE_S3_ENDPOINT`` in the environment (the service and
the ``mooncake`` commands inherit it)."""

from __future__ import annotations

import pytest

from tests.integration import test_maintenance as maintenance


@pytest.fixture()
def maintenance_on_s3(monkeypatch, moto_server, s3_bucket):
    monkeypatch.setenv("MOONCAKE_S3_ENDPOINT", moto_server.endpoint)
    original = maintenance.make_settings

    def s3_make_settings(state_dir, dsn, **kw):
        return original(state_dir, dsn, warehouse=f"s3://{s3_bucket}/wh", **kw)

    monkeypatch.setattr(maintenance, "make_settings", s3_make_settings)
    return s3_bucket


def test_compact_and_merge_index_commands_on_s3(pg_dsn, state_dir, moto_server, maintenance_on_s3):
    maintenance.test_compact_and_merge_index_commands(pg_dsn, state_dir)
    keys = moto_server.keys(maintenance_on_s3, "wh/mooncake/acc/")
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
