"""The replication_lag verdict the asset check and the sensor share, in process: no Postgres."""

from mooncake_assets.dagster.resources.replication import MaintenanceThresholds, lag_verdict


def test_lag_verdict_thresholds():
    th = MaintenanceThresholds(lag_warn_bytes=100, lag_fail_bytes=1000, lag_warn_s=5.0, lag_fail_s=60.0)
    assert lag_verdict(0, 0.0, th) == "pass"
    assert lag_verdict(100, 5.0, th) == "pass"  # equal to a limit is within it
    assert lag_verdict(101, None, th) == "warn" and lag_verdict(0, 5.5, th) == "warn"
    assert lag_verdict(1001, 0.0, th) == "fail" and lag_verdict(0, 61.0, th) == "fail"
    assert lag_verdict(None, 0.0, th) == "warn" and lag_verdict(None, 61.0, th) == "fail"
    off = MaintenanceThresholds(lag_warn_bytes=0, lag_fail_bytes=0, lag_warn_s=0, lag_fail_s=0)
    assert lag_verdict(10**12, 10**6, off) == "pass"  # a limit of 0 is off
