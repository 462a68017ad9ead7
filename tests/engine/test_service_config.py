"""The service's configuration value: built from the application's settings, read by the engine."""

import dataclasses

import pytest

from mooncake_assets.config import Settings
from mooncake_assets.engine.compaction import policy_for
from mooncake_assets.engine.service.config import ServiceConfig


def test_settings_build_the_service_config(tmp_path):
    extra = {"maintenance": {"delete_ratio_percent": 40}, "maintenance_tables": {"orders": {"file_count_trigger": 3}}}
    s = Settings(
        state_dir=tmp_path,
        dsn="host=/tmp dbname=x",
        publication="pub",
        maintenance="dagster",
        flush_rows=7,
        catalog_wait_s=0.5,
        publication_check_s=0,
        s3_region="eu-west-1",
        extra=extra,
    )
    c = s.service_config()
    assert isinstance(c, ServiceConfig)
    assert (c.state_dir, c.dsn, c.socket_path, c.publication) == (tmp_path, s.dsn, s.socket_path, "pub")
    assert (c.catalog_uri, c.warehouse_uri) == (s.catalog, s.warehouse_uri)
    assert (c.maintenance, c.flush_rows, c.catalog_wait_s, c.publication_check_s, c.s3_region) == (
        "dagster",
        7,
        0.5,
        0.0,
        "eu-west-1",
    )
    for table in ("orders", "other"):  # the same policy the application's settings give
        assert c.policy(table) == policy_for(s, table)
    assert c.policy("orders").file_count_trigger == 3 and c.policy("orders").delete_ratio_percent == 40
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.dsn = "other"


def test_service_config_defaults_match_settings(tmp_path):
    c = Settings(state_dir=tmp_path, dsn="dbname=x").service_config()
    d = ServiceConfig(
        state_dir=tmp_path,
        dsn="dbname=x",
        socket_path=c.socket_path,
        catalog_uri=c.catalog_uri,
        warehouse_uri=c.warehouse_uri,
    )
    assert c == d


def test_copy_parallel_setting(tmp_path, monkeypatch):
    from mooncake_assets.config import load_settings
    from mooncake_assets.engine.service.config import default_copy_parallel

    c = Settings(state_dir=tmp_path, dsn="dbname=x").service_config()
    assert c.copy_parallel == default_copy_parallel() == max(1, min(4, __import__("os").cpu_count() or 1))
    assert Settings(state_dir=tmp_path, dsn="dbname=x", copy_parallel=1).service_config().copy_parallel == 1
    monkeypatch.setenv("MOONCAKE_COPY_PARALLEL", "3")
    assert load_settings(tmp_path / "sd", dsn="dbname=x").service_config().copy_parallel == 3
    with pytest.raises(ValueError, match="copy_parallel"):
        dataclasses.replace(c, copy_parallel=0)
