"""Asset checks of the mirror assets: ``mirror_matches_source`` and ``replication_lag``.

- ``mirror_matches_source``: the union read of the mirror equals the source table at one LSN, as a
  multiset of rows (so the counts and the content both match) — :func:`mooncake_assets.verify.verify`,
  which reads Postgres at the exported snapshot of a temporary slot and the mirror at exactly that
  LSN. Fails (severity ERROR) on any missing or extra row, or when the table cannot be read.
- ``replication_lag``: how far the mirror is behind its source: bytes of WAL between
  ``pg_current_wal_lsn()`` and the mirror's applied LSN, and Postgres's own measure of the service's
  apply lag (seconds, ``pg_stat_replication.write_lag``). Warns above the resource's ``lag_warn_*``
  thresholds, fails above ``lag_fail_*`` (``mooncake_assets.dagster.resources.replication.lag_verdict``,
  which the sensor's evaluation of this check shares), and fails when the byte lag is unknown (no
  source or mirror LSN).
  When the service does not answer, the lag is measured from the slot's confirmed (durable) LSN and the
  check does not pass (WARN, or ERROR above the fail thresholds): nobody is applying changes.
"""

import dagster as dg

from mooncake_assets.dagster.keys import ONE_SOURCE, SourceKeys
from mooncake_assets.dagster.resources.replication import ReplicationResource, TableSpec, lag_bytes, lag_verdict
from mooncake_assets.engine.pg.conninfo import scrub
from mooncake_assets.engine.service import ServiceError


def build_mirror_matches_source(spec: TableSpec, keys: SourceKeys = ONE_SOURCE) -> dg.AssetChecksDefinition:
    name = spec.name

    @dg.asset_check(
        asset=keys.mirror(name),
        name="mirror_matches_source",
        description=f"The mirror {name} has the same rows as {spec.source} at one LSN (multiset comparison).",
        required_resource_keys={keys.resource_key},
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        from mooncake_assets.verify import verify

        replication: ReplicationResource = getattr(context.resources, keys.resource_key)

        try:
            replication.ensure_running()
            results, lsn = verify(replication.settings(), [name], "union", replication.client())
        except (ServiceError, ValueError, RuntimeError, TimeoutError) as e:
            return dg.AssetCheckResult(
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=scrub(f"could not compare {name} with {spec.source}: {e}"),
                metadata={"error": dg.MetadataValue.text(str(e))},
            )
        r = results[0]
        meta = {
            "lsn": dg.MetadataValue.text(lsn),
            "source_rows": dg.MetadataValue.int(r.source_rows),
            "mirror_rows": dg.MetadataValue.int(r.mirror_rows),
            "missing_rows": dg.MetadataValue.int(r.missing),
            "extra_rows": dg.MetadataValue.int(r.extra),
        }
        if r.error:
            meta["error"] = dg.MetadataValue.text(r.error)
        return dg.AssetCheckResult(
            passed=bool(r.match),
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{r.line()} (LSN {lsn})",
            metadata=meta,
        )

    return _check


def build_replication_lag(spec: TableSpec, keys: SourceKeys = ONE_SOURCE) -> dg.AssetChecksDefinition:
    name = spec.name

    @dg.asset_check(
        asset=keys.mirror(name),
        name="replication_lag",
        description=f"How far the mirror {name} is behind {spec.source} (bytes of WAL, seconds); "
        "warn/fail thresholds from the replication resource.",
        required_resource_keys={keys.resource_key},
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        replication: ReplicationResource = getattr(context.resources, keys.resource_key)
        th = replication.thresholds
        status = None
        try:
            status = replication.status()
        except ServiceError:
            pass
        slot = status["slot"] if status else replication.slot_name()
        pos = replication.source_position(slot)
        table = next((t for t in status["tables"] if t["name"] == name), None) if status else None
        if status is not None and table is None:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.ERROR, description=f"the service does not mirror {name}"
            )
        if table is not None:
            lsn, basis = table.get("applied_lsn"), "applied"
            seconds = pos["apply_lag_s"] or 0.0
        else:
            lsn, basis = pos["confirmed_lsn"], "durable (the service is not answering)"
            seconds = None
        nbytes = lag_bytes(pos["source_lsn"], lsn)
        verdict = lag_verdict(nbytes, seconds, th)
        # an unknown byte lag fails here (the sensor's evaluation only warns): no LSN to measure from
        fail = verdict == "fail" or nbytes is None
        warn = verdict == "warn" or table is None
        meta = {
            "source_lsn": dg.MetadataValue.text(pos["source_lsn"]),
            "mirror_lsn": dg.MetadataValue.text(lsn or "unknown"),
            "basis": dg.MetadataValue.text(basis),
            "lag_bytes": dg.MetadataValue.int(nbytes if nbytes is not None else -1),
            "warn_bytes": dg.MetadataValue.int(th.lag_warn_bytes),
            "fail_bytes": dg.MetadataValue.int(th.lag_fail_bytes),
            "warn_seconds": dg.MetadataValue.float(th.lag_warn_s),
            "fail_seconds": dg.MetadataValue.float(th.lag_fail_s),
        }
        if seconds is not None:
            meta["lag_seconds"] = dg.MetadataValue.float(round(seconds, 3))
        lag_txt = (f"{nbytes:,} bytes" if nbytes is not None else "unknown bytes") + (
            f", {seconds:.1f}s" if seconds is not None else ""
        )
        desc = f"{name} is {lag_txt} behind {spec.source} ({basis} LSN {lsn or '?'} vs source {pos['source_lsn']})"
        if fail:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.ERROR, description=desc, metadata=meta
            )
        if warn:
            return dg.AssetCheckResult(
                passed=False, severity=dg.AssetCheckSeverity.WARN, description=desc, metadata=meta
            )
        return dg.AssetCheckResult(passed=True, description=desc, metadata=meta)

    return _check


def build_mirror_checks(specs, keys: SourceKeys = ONE_SOURCE) -> list[dg.AssetChecksDefinition]:
    out = []
    for spec in specs:
        out += [build_mirror_matches_source(spec, keys), build_replication_lag(spec, keys)]
    return out
