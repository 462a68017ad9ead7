"""``replication_sensor``: keeps the service alive, observes every mirror, asks for maintenance.

Each tick (default every 10 s, running by default):

1. ``ensure_running()``: starts the service when nothing answers; when it had been seen running
   before (the cursor remembers its pid) that is a restart after a crash, and the sensor says so in
   its log, in the cursor (``restarts``) and on the observations (``service``).
2. One ``AssetObservation`` per ``mirror/<t>``: source LSN, applied LSN, flush LSN, lag (bytes of WAL,
   and Postgres's measured apply lag in seconds), buffer rows and bytes, data files and bytes, index
   blocks, pending deletes, deletion vectors, live rows.
3. ``RunRequest``s for maintenance whose thresholds (the resource's ``thresholds``) are crossed:

   ==========================  ==============================================================
   trigger                     asset
   ==========================  ==============================================================
   buffer bytes or rows        ``flush/<t>``
   pending deletes, or age     ``deletion_vectors/<t>`` (age: unpersisted changes — rows in the
                               buffer, pending deletes, or a flush/<t> newer than the last
                               deletion_vectors/<t> — older than ``persist_max_age_s``)
   index blocks                ``index_merge/<t>`` (more than the table policy's
                               ``index_max_blocks``, or ``index_merge_blocks``)
   small files, delete ratio   ``compaction/<t>`` (when the service's compaction planner,
                               asked for a dry run, picks files under the table's policy —
                               other than files already wholly deleted, which persist drops)
   table not mirrored yet      ``mirror/<t>`` (the initial copy; at most once an hour)
   ==========================  ==============================================================

   Several triggers of one table make one run. Run keys are ``<kinds>/<table>/<last change LSN>`` (the
   commit LSN of the table's last applied change; WAL of other tables or of no table, which moves the
   applied LSN, does not change it), so an unchanged table is never asked twice for the same work; no request is made for a table while a run
   touching its maintenance (or its mirror) is queued or running, nor within ``min_request_interval_s``
   of the previous request of the same kind.

A tick whose service cannot be started (or does not answer) is skipped with the reason; the next tick
tries again.

Cursor (JSON): ``{"pid", "restarts", "ticks", "tables": {t: {"dirty_since", "last_request": {kind: ts},
"materialized", "verify_at"}}}`` (``materialized``: the instance has a materialization of ``mirror/<t>``;
``verify_at``: the scheduled verify already reported, see :func:`first_sight`).
"""

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg

from mooncake_assets.dagster.jobs.maintenance import (
    FULL_OPTIMIZE,
    MAINTENANCE_TAG,
    MIRROR_JOB,
    active_runs,
    job_name,
)
from mooncake_assets.dagster.keys import ONE_SOURCE, SourceKeys
from mooncake_assets.dagster.resources.replication import (
    MaintenanceThresholds,
    ReplicationResource,
    lag_bytes,
    lag_verdict,
)
from mooncake_assets.engine.pg.conninfo import scrub
from mooncake_assets.engine.service import ServiceError

SENSOR_NAME = "replication_sensor"
DEFAULT_INTERVAL_S = 10


@dataclass
class SensorCursor:
    pid: int | None = None
    restarts: int = 0
    ticks: int = 0
    tables: dict = field(default_factory=dict)

    @staticmethod
    def load(text: str | None) -> "SensorCursor":
        try:
            d = json.loads(text) if text else {}
        except ValueError:
            d = {}
        return SensorCursor(
            pid=d.get("pid"),
            restarts=int(d.get("restarts", 0)),
            ticks=int(d.get("ticks", 0)),
            tables=dict(d.get("tables", {})),
        )

    def dump(self) -> str:
        return json.dumps(
            {"pid": self.pid, "restarts": self.restarts, "ticks": self.ticks, "tables": self.tables}, sort_keys=True
        )


def plan_maintenance(
    st: Mapping,
    th: MaintenanceThresholds,
    age_s: float | None = None,
    index_max_blocks: int = 16,
    compaction_plan: Mapping | None = None,
) -> list[tuple[str, str]]:
    """Which maintenance one table needs, as ``[(kind, reason)]`` in lineage order.

    ``st``: the table's entry of the service status; ``age_s``: how long its changes have waited to be
    persisted (None: nothing unpersisted); ``index_max_blocks``: the policy's block limit (used when
    ``th.index_merge_blocks`` is None); ``compaction_plan``: the service's compaction dry run (None:
    not asked)."""
    out = []
    buf_b, buf_r = int(st.get("buffer_bytes", 0)), int(st.get("buffer_rows", 0))
    if (th.flush_buffer_bytes and buf_b >= th.flush_buffer_bytes) or (
        th.flush_buffer_rows and buf_r >= th.flush_buffer_rows
    ):
        out.append(("flush", f"buffer {buf_r:,} rows / {buf_b:,} bytes"))
    pend = int(st.get("pending_deletes", 0))
    if th.persist_pending_deletes and pend >= th.persist_pending_deletes:
        out.append(("deletion_vectors", f"{pend:,} pending deletes"))
    elif th.persist_max_age_s and age_s is not None and age_s >= th.persist_max_age_s:
        out.append(("deletion_vectors", f"unpersisted changes {age_s:.0f}s old"))
    blocks = int(st.get("index_blocks", 0))
    if th.index_merge_blocks is None:
        if blocks > index_max_blocks:
            out.append(("index_merge", f"{blocks} index blocks > policy's {index_max_blocks}"))
    elif th.index_merge_blocks and blocks >= max(th.index_merge_blocks, 2):
        out.append(("index_merge", f"{blocks} index blocks ≥ {th.index_merge_blocks}"))
    if compaction_plan and int(compaction_plan.get("picked", 0)) > 0:
        files = compaction_plan.get("files") or []
        # a file whose rows are all deleted needs no rewrite: the next persist drops it
        useful = [f for f in files if float(f.get("delete_ratio_percent", 0)) < 100.0] if files else None
        if useful is None or useful:
            reasons = sorted(
                {
                    r
                    for f in (useful or [])
                    for r in ([f["reasons"]] if isinstance(f.get("reasons"), str) else f.get("reasons", []))
                }
            )
            n = len(useful) if useful is not None else int(compaction_plan["picked"])
            out.append(("compaction", f"{n} file(s) picked: {'; '.join(reasons)[:120]}"))
    return out


def busy_tables(
    instance: dg.DagsterInstance, all_tables: Iterable[str], keys: SourceKeys = ONE_SOURCE
) -> dict[str, str]:
    """``{table: run id}`` for tables with a queued or running run that touches their maintenance or mirror
    (asset keys as ``keys`` makes them)."""
    names = set(all_tables)
    out: dict[str, str] = {}
    for run in active_runs(instance):
        touched: set[str] = set()
        if run.asset_selection:
            for key in run.asset_selection:
                t = keys.table_of(key)
                if t is not None and t in names:
                    touched.add(t)
        elif run.tags.get(MAINTENANCE_TAG):
            touched = set(names)
        for t in touched:
            out.setdefault(t, run.run_id)
    return out


def _latest_ts(instance: dg.DagsterInstance, key: dg.AssetKey) -> float | None:
    ev = instance.get_latest_materialization_event(key)
    return ev.timestamp if ev is not None else None


def _lag(st: Mapping, source: Mapping | None) -> tuple[int | None, float | None]:
    """(bytes of WAL the mirror is behind, None: unknown; Postgres's measured apply lag in seconds, None:
    no source position) from the table's status entry and the source's position."""
    nbytes = lag_bytes(source.get("source_lsn") if source else None, st.get("applied_lsn"))
    seconds = round(float(source.get("apply_lag_s") or 0.0), 3) if source is not None else None
    return nbytes, seconds


def observation(
    name: str, st: Mapping, source: Mapping | None, service_note: str | None, keys: SourceKeys = ONE_SOURCE
) -> dg.AssetObservation:
    src_lsn = source.get("source_lsn") if source else None
    meta = {
        "source_lsn": dg.MetadataValue.text(src_lsn or "unknown"),
        "applied_lsn": dg.MetadataValue.text(st.get("applied_lsn", "")),
        "flush_lsn": dg.MetadataValue.text(st.get("flush_lsn", "")),
        "state": dg.MetadataValue.text(st.get("state", "")),
    }
    lb, lag_s = _lag(st, source)
    if lb is not None:
        meta["lag_bytes"] = dg.MetadataValue.int(lb)
    if lag_s is not None:
        meta["lag_seconds"] = dg.MetadataValue.float(lag_s)
    for k in (
        "buffer_rows",
        "buffer_bytes",
        "data_files",
        "data_bytes",
        "index_blocks",
        "pending_deletes",
        "deletion_vectors",
        "deleted_rows",
        "live_rows",
    ):
        if k in st:
            meta[k] = dg.MetadataValue.int(int(st[k]))
    if st.get("error"):
        meta["error"] = dg.MetadataValue.text(str(st["error"]))
    if st.get("warnings"):  # no persist for too long, too much WAL held (the service's warn_* settings)
        meta["warnings"] = dg.MetadataValue.text("; ".join(st["warnings"]))
    ver = st.get("verify")  # the service's last scheduled verify (engine/service/verifier.py)
    if ver:
        meta["verify_result"] = dg.MetadataValue.text(str(ver.get("result")))
        meta["verify_lsn"] = dg.MetadataValue.text(str(ver.get("lsn") or ""))
        meta["verify_at"] = dg.MetadataValue.text(str(ver.get("at") or ""))
        if ver.get("detail"):
            meta["verify_detail"] = dg.MetadataValue.text(str(ver["detail"]))
    if service_note:
        meta["service"] = dg.MetadataValue.text(service_note)
    return dg.AssetObservation(asset_key=keys.mirror(name), metadata=meta)


def _lag_check(
    key: dg.AssetKey, name: str, st: Mapping, meta: dict, th: MaintenanceThresholds
) -> dg.AssetCheckEvaluation:
    """The ``replication_lag`` check from this tick's numbers (a stopped mirror fails)."""
    nbytes = meta["lag_bytes"].value if "lag_bytes" in meta else None
    seconds = float(st.get("lag_seconds") or (meta["lag_seconds"].value if "lag_seconds" in meta else 0.0) or 0.0)
    stopped = st.get("state") == "error"
    verdict = lag_verdict(nbytes, seconds, th)
    fail = stopped or verdict == "fail"
    warn = verdict == "warn"
    lag_txt = (f"{nbytes:,} bytes" if nbytes is not None else "unknown bytes") + f", {seconds:.1f}s"
    desc = (
        f"{name} is stopped: {st.get('error')}"
        if stopped
        else f"{name} is {lag_txt} behind {st.get('source')} (applied LSN {st.get('applied_lsn')}; seen by {SENSOR_NAME})"
    )
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name="replication_lag",
        passed=not (fail or warn),
        severity=dg.AssetCheckSeverity.ERROR if fail else dg.AssetCheckSeverity.WARN,
        description=desc[:1000],
        metadata={
            "lag_bytes": dg.MetadataValue.int(nbytes if nbytes is not None else -1),
            "lag_seconds": dg.MetadataValue.float(round(seconds, 3)),
            "applied_lsn": dg.MetadataValue.text(st.get("applied_lsn", "")),
        },
    )


def first_sight(
    instance: dg.DagsterInstance,
    name: str,
    st: Mapping,
    obs: dg.AssetObservation,
    th: MaintenanceThresholds,
    tcur: dict | None = None,
    keys: SourceKeys = ONE_SOURCE,
) -> list:
    """What makes a mirror's state visible at first sight in the Dagster UI, beside the observation:

    - an ``AssetMaterialization`` of ``mirror/<t>`` when the instance has none (the mirror was created
      outside Dagster: ``mooncake create-table``, another instance): the asset then shows when it was
      found mirrored and at which LSN instead of "Never materialized"; recorded once: ``tcur["materialized"]``
      remembers that the instance has one (found, or recorded here), so later ticks do not ask again
      (a wiped asset is recorded again once the sensor's cursor is reset);
    - an ``AssetCheckEvaluation`` of ``replication_lag`` from this tick's numbers (the observation's lag in
      bytes and seconds, :func:`~mooncake_assets.dagster.resources.replication.lag_verdict`; a stopped
      mirror fails), so the check is never "Not evaluated" while the mirror is observed;
    - an ``AssetCheckEvaluation`` of ``mirror_matches_source`` from the service's last scheduled verify
      (counts and checksums at one LSN, engine/service/verifier.py) when it is new (``tcur["verify_at"]``
      remembers the one already reported; a full row comparison is the check's own run). The sensor
      compares nothing itself."""
    key = keys.mirror(name)
    meta = dict(obs.metadata)
    out = []
    if not (tcur or {}).get("materialized"):
        if instance.get_latest_materialization_event(key) is None:
            meta_m = dict(
                meta,
                recorded_by=dg.MetadataValue.text(
                    f"{SENSOR_NAME}: {name} was found mirrored by the service (created outside Dagster)"
                ),
            )
            out.append(
                dg.AssetMaterialization(
                    asset_key=key,
                    metadata=meta_m,
                    description=f"mirror of {st.get('source')} found at applied LSN {st.get('applied_lsn')}",
                )
            )
        if tcur is not None:
            tcur["materialized"] = True
    out.append(_lag_check(key, name, st, meta, th))
    ver = st.get("verify") or {}
    if tcur is not None and ver.get("result") in ("match", "mismatch") and ver.get("at") != tcur.get("verify_at"):
        tcur["verify_at"] = ver.get("at")
        ok = ver["result"] == "match"
        out.append(
            dg.AssetCheckEvaluation(
                asset_key=key,
                check_name="mirror_matches_source",
                passed=ok,
                severity=dg.AssetCheckSeverity.ERROR,
                description=(
                    f"scheduled verify at LSN {ver.get('lsn')} ({ver.get('at')}): "
                    + ("counts and checksums match the source" if ok else str(ver.get("detail") or "mismatch"))
                )[:1000],
                metadata={
                    "lsn": dg.MetadataValue.text(str(ver.get("lsn") or "")),
                    "verified_at": dg.MetadataValue.text(str(ver.get("at") or "")),
                    "kind": dg.MetadataValue.text("scheduled checksum verify (mooncake service)"),
                },
            )
        )
    return out


def evaluate(
    context: dg.SensorEvaluationContext, replication: ReplicationResource, keys: SourceKeys = ONE_SOURCE
) -> dg.SensorResult:
    """One tick of the sensor (see the module docstring) over the mirrors of ``replication``'s state
    directory, their assets keyed by ``keys``."""
    cur = SensorCursor.load(context.cursor)
    cur.ticks += 1
    now = time.time()
    try:
        info = replication.ensure_running()
    except Exception as e:
        context.log.error(scrub(f"the mooncake service is not answering and could not be started: {e}"))
        return _skip(f"mooncake service down and not startable: {str(e).splitlines()[0]}", cur)
    note = _service_note(context, cur, info)
    try:
        status = replication.status()
    except ServiceError as e:  # it answered a ping a moment ago: a crash or a hang; the next tick sees
        context.log.error(f"the mooncake service did not answer its status: {e}")
        return _skip(f"mooncake service status failed: {str(e).splitlines()[0]}", cur)
    source = _source_position(context, replication, status)
    by_name = {t["name"]: t for t in status["tables"]}
    specs = replication.table_specs()
    tick = _Tick(
        context,
        replication,
        cur,
        now,
        source,
        note,
        busy=busy_tables(context.instance, [s.name for s in specs], keys),
        th=replication.thresholds,
        keys=keys,
    )
    for spec in specs:
        tick.table(spec.name, by_name.get(spec.name))
    for n in tick.notes:
        context.log.info(n)
    return dg.SensorResult(run_requests=tick.requests, asset_events=tick.events, cursor=cur.dump())


def _skip(reason: str, cur: SensorCursor) -> dg.SensorResult:
    return dg.SensorResult(skip_reason=reason, cursor=cur.dump())


def _service_note(context: dg.SensorEvaluationContext, cur: SensorCursor, info: Mapping) -> str | None:
    """What the tick says about the service (started, restarted) on the observations; counts restarts and
    remembers the pid in ``cur``. ``info``: ``ensure_running()``'s ``{"pid", "started"}``."""
    note = None
    if info["started"]:
        if cur.pid is not None:
            cur.restarts += 1
            note = (
                f"restarted: the service (pid {cur.pid}) had stopped answering; now pid {info['pid']} "
                f"(restart #{cur.restarts})"
            )
            context.log.warning(f"mooncake service {note}")
        else:
            note = f"started (pid {info['pid']})"
            context.log.info(f"mooncake service {note}")
    elif cur.pid is not None and info["pid"] is not None and info["pid"] != cur.pid:
        cur.restarts += 1  # restarted meanwhile by someone else (a run's ensure_running, `mooncake start`)
        note = f"restarted since the last tick: pid {cur.pid} → {info['pid']} (restart #{cur.restarts})"
        context.log.warning(f"mooncake service {note}")
    cur.pid = info["pid"]
    return note


def _source_position(
    context: dg.SensorEvaluationContext, replication: ReplicationResource, status: Mapping
) -> dict | None:
    try:
        return replication.source_position(status.get("slot"))
    except Exception as e:  # Postgres unreachable: still observe what the service knows
        context.log.warning(scrub(f"could not read the source's position: {e}"))
        return None


@dataclass
class _Tick:
    """One tick over the configured tables: what it knows (service status aside) and what it produces
    (asset events, run requests, log notes)."""

    context: dg.SensorEvaluationContext
    replication: ReplicationResource
    cur: SensorCursor
    now: float
    source: Mapping | None  # the source's position (None: Postgres unreachable)
    note: str | None  # what the tick says about the service on every observation
    busy: dict[str, str]  # {table: id of a run in flight touching it}
    th: MaintenanceThresholds
    keys: SourceKeys = field(default_factory=SourceKeys)  # the asset keys of this source's mirrors
    events: list = field(default_factory=list)
    requests: list[dg.RunRequest] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self, t: str, st: Mapping | None) -> None:
        """Observe table ``t`` (``st``: its entry of the service status, None: not mirrored) and ask for
        what it needs."""
        tcur = self.cur.tables.setdefault(t, {})
        last_req = tcur.setdefault("last_request", {})
        if st is None:
            self._not_mirrored(t)
            return
        if st.get("state") == "copying":
            return
        obs = observation(t, st, self.source, self.note, self.keys)
        self.events.append(obs)
        self.events.extend(first_sight(self.context.instance, t, st, obs, self.th, tcur, self.keys))
        if st.get("state") == "error":
            self.context.log.error(f"mirror {t} stopped on an error: {st.get('error')}")
            return
        plan = [
            (k, r)
            for k, r in self._plan(t, st, tcur)
            if self.now - float(last_req.get(k, 0)) >= self.th.min_request_interval_s
        ]
        if not plan:
            return
        if t in self.busy:
            self.notes.append(f"{t}: {', '.join(k for k, _ in plan)} wanted, but run {self.busy[t]} is in flight")
            return
        self.requests.append(maintenance_request(t, st, plan, self.th, self.keys))
        for k, _ in plan:
            last_req[k] = self.now
        self.notes.append(f"{t}: " + "; ".join(f"{k}: {r}" for k, r in plan))

    def _not_mirrored(self, t: str) -> None:
        if t in self.busy:
            self.notes.append(f"{t}: not mirrored yet, run {self.busy[t]} in flight")
            return
        # one request per hour at most: a copy that fails (e.g. no such table) is not retried every tick
        key = self.keys.mirror(t)
        self.requests.append(
            dg.RunRequest(
                run_key=f"{key.to_user_string()}/create/{int(self.now // 3600)}",
                job_name=job_name(MIRROR_JOB),
                asset_selection=[key],
                tags={"mooncake/table": t, "mooncake/trigger": SENSOR_NAME, "mooncake/reason": "not mirrored yet"},
            )
        )
        self.notes.append(f"{t}: not mirrored yet, requesting {key.to_user_string()}")

    def _plan(self, t: str, st: Mapping, tcur: dict) -> list[tuple[str, str]]:
        """:func:`plan_maintenance` for ``t``, with its policy's block limit and (when compaction is on and
        no run is in flight for it) the service's compaction dry run."""
        age = _unpersisted_age(self.context.instance, t, st, tcur, self.now, self.keys)
        policy = _policy(self.replication, t)
        ask_planner = self.th.compaction and t not in self.busy
        compaction = _compaction_plan(self.context, self.replication, t, st) if ask_planner else None
        return plan_maintenance(
            st, self.th, age, index_max_blocks=int(policy.get("index_max_blocks", 16)), compaction_plan=compaction
        )


def _unpersisted_age(
    instance: dg.DagsterInstance, t: str, st: Mapping, tcur: dict, now: float, keys: SourceKeys = ONE_SOURCE
) -> float | None:
    """Seconds ``t``'s changes have waited to be persisted (None: nothing unpersisted): rows in the buffer,
    pending deletes, or a ``flush/<t>`` newer than the last ``deletion_vectors/<t>``, counted from when a
    tick first saw them (``tcur["dirty_since"]``) or the last persist, whichever is later."""
    dirty = (
        int(st.get("buffer_rows", 0)) > 0
        or int(st.get("pending_deletes", 0)) > 0
        or (_latest_ts(instance, keys.maintenance("flush", t)) or 0)
        > (_latest_ts(instance, keys.maintenance("deletion_vectors", t)) or 0)
    )
    if not dirty:
        tcur.pop("dirty_since", None)
        return None
    tcur.setdefault("dirty_since", now)
    persisted = _latest_ts(instance, keys.maintenance("deletion_vectors", t)) or 0
    return now - max(tcur["dirty_since"], persisted)


def maintenance_request(
    t: str, st: Mapping, plan: Sequence[tuple[str, str]], th: MaintenanceThresholds, keys: SourceKeys = ONE_SOURCE
) -> dg.RunRequest:
    """The run request for ``plan`` (``[(kind, reason)]``, lineage order) of table ``t``: one kind's job, or
    ``full_optimize_job`` restricted to the planned assets; keyed by the table's last change LSN."""
    kinds = [k for k, _ in plan]
    reason = "; ".join(f"{k}: {r}" for k, r in plan)
    run_config = {}
    if "index_merge" in kinds and th.index_merge_blocks is not None:  # our own limit: merge even below the policy's
        run_config = {"ops": {_op_name(keys.maintenance("index_merge", t).path): {"config": {"full": True}}}}
    tail = t if keys.source is None else "/".join(keys.mirror(t).path)
    return dg.RunRequest(
        run_key=f"{'+'.join(kinds)}/{tail}/{st.get('last_change_lsn') or st.get('applied_lsn')}",
        run_config=run_config,
        job_name=job_name(kinds[0] if len(kinds) == 1 else FULL_OPTIMIZE),
        asset_selection=[keys.maintenance(k, t) for k in kinds],
        tags={
            "mooncake/table": t,
            MAINTENANCE_TAG: "+".join(kinds),
            "mooncake/trigger": SENSOR_NAME,
            "mooncake/reason": reason[:200],
        },
    )


def _op_name(path) -> str:
    return "__".join(path)


def _policy(replication: ReplicationResource, table: str) -> dict:
    try:
        return replication.maintenance_policy(table)
    except Exception:  # a bad policy in settings.json is the service's error to report; use defaults here
        return {}


def _compaction_plan(context, replication: ReplicationResource, table: str, st: Mapping) -> dict | None:
    """The service's compaction dry run for ``table`` (None when there is nothing to plan or it failed)."""
    if int(st.get("data_files", 0)) < 2 and int(st.get("deleted_rows", 0)) == 0:
        return None
    try:
        return replication.compact(table, dry_run=True)
    except Exception as e:
        context.log.warning(f"compaction planning of {table} failed: {e}")
        return None


def build_replication_sensor(
    jobs: Sequence,
    interval_s: int = DEFAULT_INTERVAL_S,
    running: bool = True,
    name: str = SENSOR_NAME,
    keys: SourceKeys = ONE_SOURCE,
) -> dg.SensorDefinition:
    """The sensor, targeting the maintenance ``jobs`` (and the mirror assets through the global asset job).
    ``keys``: the source it watches (its resource key and asset keys; one sensor per source of a
    sources file, each with its own cursor)."""

    @dg.sensor(
        name=name,
        minimum_interval_seconds=max(int(interval_s), 1),
        jobs=list(jobs),
        default_status=dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED,
        description="Keeps the mooncake service running (restarts it after a crash), records lag and buffer "
        "observations on the mirror assets and requests maintenance runs when thresholds are crossed.",
        required_resource_keys={keys.resource_key},
    )
    def replication_sensor(context: dg.SensorEvaluationContext):
        return evaluate(context, getattr(context.resources, keys.resource_key), keys)

    return replication_sensor
