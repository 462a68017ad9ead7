"""``ReplicationResource``: the Dagster side's client of the replicator service (docs/architecture.md#processes, #dagster).

The service is the single writer of every mirror; Dagster runs each step in its own process, so this
resource keeps no table state: every method is one call to the service over its Unix socket, or one
query on the source Postgres. ``ensure_running()`` starts the service detached (``mooncake start``'s
way) when nothing answers on the socket.

Errors: :class:`~mooncake_assets.engine.service.ServiceUnavailable` when the service does not answer
(temporary: ``ensure_running()`` or ``mooncake start`` helps); :class:`~mooncake_assets.engine.service.
ServiceError` with the service's one-line message when it refused a call (e.g. an unknown table:
permanent until the configuration changes).
"""

from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pyarrow as pa
from pydantic import Field, PrivateAttr

from mooncake_assets.config import Settings, load_settings
from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceClient, ServiceError, ServiceUnavailable
from mooncake_assets.engine.table.read_state import ReadState

DEFAULT_TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")


@dataclass(frozen=True)
class TableSpec:
    """One mirror to keep: ``name`` (the mirror's name, the last part of its asset keys) and ``source``
    (the Postgres table in its SQL form, ``schema.table`` with parts quoted where needed, e.g.
    ``"Sales Data"."Q1 Orders"``; see ``mooncake_assets/engine/pg/names.py``)."""

    name: str
    source: str

    @staticmethod
    def parse(text: str) -> "TableSpec":
        """``name`` (source ``public.name``), ``schema.table`` (name ``table``) or ``name=schema.table``.
        The source is parsed as Postgres parses a qualified name: unquoted parts fold to lower case,
        double-quoted parts are kept exactly (``q1_orders="Sales Data"."Q1 Orders"``).

        Raises ``ValueError`` (one line) for an empty entry, a source that does not parse, or a mirror
        name that is not letters, digits and ``_`` (then the ``name=schema.table`` form is suggested)."""
        from mooncake_assets.engine.pg.names import InvalidName, check_mirror_name, format_name, split_qualified_name

        text = text.strip()
        eq, quote = text.find("="), text.find('"')
        if eq >= 0 and (quote < 0 or eq < quote):  # a mirror name holds no quote, so a '=' before one splits
            name, source = (p.strip() for p in text.split("=", 1))
        else:
            name, source = None, text
        parts = split_qualified_name(source)
        if len(parts) > 2:
            raise InvalidName(f"table {source!r}: give schema.table (got {len(parts)} dotted parts)")
        if len(parts) == 1:
            parts = ["public", parts[0]]
        if name is None:
            name = parts[1]
            try:
                check_mirror_name(name)
            except InvalidName:
                raise InvalidName(
                    f"table {text!r}: its name {parts[1]!r} cannot be a mirror name; name the mirror: "
                    f"name={format_name(*parts)} (name: letters, digits and _)"
                ) from None
        check_mirror_name(name)
        return TableSpec(name, format_name(*parts))

    @property
    def source_parts(self) -> tuple[str, str]:
        """``(schema, table)`` as the catalogs spell them."""
        from mooncake_assets.engine.pg.names import split_qualified_name

        schema, table = split_qualified_name(self.source)
        return schema, table

    def __str__(self) -> str:
        return f"{self.name}={self.source}"


def _split_entries(text: str) -> list[str]:
    """Split a comma-separated list of table entries at commas outside double quotes."""
    out, cur, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def parse_tables(specs) -> list[TableSpec]:
    """Table specs from a comma-separated string (commas inside double quotes belong to a name) or a
    list of strings (see :meth:`TableSpec.parse`)."""
    if isinstance(specs, str):
        specs = _split_entries(specs)
    out = [TableSpec.parse(s) for s in specs if s and s.strip()]
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"mirror names must be unique; repeated: {', '.join(dup)}")
    return out


class MaintenanceThresholds(dg.Config):
    """When the sensor asks for maintenance, and when the ``replication_lag`` check warns or fails.

    A threshold of 0 disables that trigger. Index merge and compaction follow the table's maintenance
    policy (``settings.json`` ``extra.maintenance``, see ``engine/compaction/policy.py``) — the same
    rules the service applies — unless ``index_merge_blocks`` overrides the block count."""

    flush_buffer_bytes: int = Field(
        64 << 20, ge=0, description="Buffered Arrow bytes of one table that trigger flush/<t> (bytes)."
    )
    flush_buffer_rows: int = Field(
        500_000, ge=0, description="Buffered rows of one table that trigger flush/<t> (rows)."
    )
    persist_pending_deletes: int = Field(
        10_000, ge=0, description="Position deletes not yet in Puffin that trigger deletion_vectors/<t> (rows)."
    )
    persist_max_age_s: float = Field(
        120.0, ge=0, description="Unpersisted changes older than this trigger deletion_vectors/<t> (seconds)."
    )
    index_merge_blocks: int | None = Field(
        None,
        ge=0,
        description="Index blocks of one table that trigger index_merge/<t> (blocks; the run then "
        "merges whatever the policy says, full); None: more than the policy's index_max_blocks.",
    )
    compaction: bool = Field(
        True,
        description="Ask the service's compaction planner (a dry run under the table's policy: small files, "
        "delete ratio, size amplification) and request compaction/<t> when it picks files.",
    )
    min_request_interval_s: float = Field(
        30.0,
        ge=0,
        description="Least time between two sensor requests of one kind of maintenance for one table (seconds).",
    )
    lag_warn_bytes: int = Field(16 << 20, ge=0, description="replication_lag warns above this lag (bytes of WAL).")
    lag_fail_bytes: int = Field(256 << 20, ge=0, description="replication_lag fails above this lag (bytes of WAL).")
    lag_warn_s: float = Field(30.0, ge=0, description="replication_lag warns above this lag (seconds).")
    lag_fail_s: float = Field(300.0, ge=0, description="replication_lag fails above this lag (seconds).")


class ReplicationResource(dg.ConfigurableResource):
    """Client of the replicator service of one state directory (one writer per state directory).

    Nothing is contacted when the resource is built: definitions load without a service or Postgres.
    """

    state_dir: str = Field(".mooncake", description="mooncake state directory (settings.json, service socket, tables).")
    tables: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TABLES),
        description="Mirrors to keep: 'name' (source public.name), 'schema.table' or 'name=schema.table'.",
    )
    dsn: str | None = Field(
        None,
        description="Source Postgres DSN; default: settings.json, MOONCAKE_PG_DSN, else the embedded Postgres. "
        "Give one with a password as dg.EnvVar('MOONCAKE_PG_DSN') (Dagster then shows the variable's "
        "name, not its value), or keep the password in PGPASSWORD / ~/.pgpass; it is never written to "
        "the state directory.",
    )
    warehouse: str | None = Field(
        None, description="Warehouse URI (file:// or s3://); default: settings.json or file://<state>/warehouse."
    )
    catalog: str | None = Field(
        None, description="Iceberg catalog URI; default: settings.json or sqlite:///<state>/catalog.db."
    )
    socket: str | None = Field(
        None, description="The service's Unix socket; default: the one the service of state_dir uses."
    )
    maintenance: str | None = Field(
        "dagster",
        description="Maintenance mode given to a service this resource starts (that process only; settings.json keeps its own): 'dagster' (assets drive flush/persist; "
        "the service only caps its memory) or 'auto'; None keeps settings.json's.",
    )
    thresholds: MaintenanceThresholds = Field(
        default_factory=MaintenanceThresholds, description="Sensor and lag-check thresholds."
    )
    start_timeout_s: float = Field(
        60.0, gt=0, description="How long ensure_running() waits for a started service to answer (seconds)."
    )
    call_timeout_s: float = Field(600.0, gt=0, description="Timeout of one maintenance call (seconds).")
    wait_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Read-your-writes: how long a read waits for the service to reach the source's LSN (seconds).",
    )

    _client: ServiceClient | None = PrivateAttr(default=None)
    _settings: Settings | None = PrivateAttr(default=None)

    # ------------------------------------------------------------------ configuration
    def settings(self) -> Settings:
        """The resolved :class:`Settings` (this resource's fields beat settings.json and the environment)."""
        if self._settings is None:
            s = load_settings(self.state_dir, dsn=self.dsn, warehouse=self.warehouse, catalog_uri=self.catalog)
            self._settings = s  # ``maintenance`` goes to a service this resource starts, not to settings.json
        return self._settings

    def table_specs(self) -> list[TableSpec]:
        return parse_tables(self.tables)

    def spec(self, name: str) -> TableSpec:
        for t in self.table_specs():
            if t.name == name:
                return t
        raise KeyError(f"{name!r} is not one of the configured mirrors ({', '.join(self.tables)})")

    @property
    def socket_path(self) -> Path:
        return Path(self.socket) if self.socket else self.settings().socket_path

    def source_dsn(self) -> str:
        """The source DSN (for the embedded Postgres: starts it when it is not running)."""
        return self.settings().source_dsn()

    # ------------------------------------------------------------------ service
    def client(self) -> ServiceClient:
        if self._client is None:
            self._client = ServiceClient(self.socket_path, timeout=self.call_timeout_s)
        return self._client

    def ping(self) -> bool:
        return self.client().ping()

    def ensure_running(self) -> dict:
        """Start the service (detached, its own session) unless it answers.

        Returns ``{"started": bool, "pid": int | None, "socket": str}``. Raises ``RuntimeError`` with the
        service log's tail when it does not come up within ``start_timeout_s``, ``ServiceUnavailable``
        when ``socket`` names a socket that the service of ``state_dir`` would not listen on."""
        from mooncake_assets.engine.service.process import service_pid, start_service

        s = self.settings()
        if self.ping():
            return {"started": False, "pid": service_pid(s), "socket": str(self.socket_path)}
        if self.socket_path != s.socket_path:
            raise ServiceUnavailable(
                f"no mooncake service answers on {self.socket_path}, and one started for "
                f"{s.state_dir} would listen on {s.socket_path}"
            )
        # start_service holds <state>/service.start.lock: sensors, runs and the CLI may race, one starts it
        pid, started = start_service(s, timeout=self.start_timeout_s, report=True, maintenance=self.maintenance)
        self.client().close()
        return {"started": started, "pid": pid, "socket": str(self.socket_path)}

    def call(self, action: str, timeout: float | None = None, **body) -> dict:
        """One service action (see engine/service/flight.py); returns its JSON result."""
        return self.client().call(action, timeout=timeout, **body)

    def status(self) -> dict:
        """The service's status: ``{"tables": [per-table stats as in `list-tables --json`], "applied_lsn",
        "confirmed_lsn", "slot", "publication", "stream_error", "streaming"}`` (LSNs as ``X/Y`` text)."""
        return self.call("status", timeout=30)

    def table_status(self, name: str) -> dict | None:
        """One table's entry of :meth:`status` (None when the service does not mirror it)."""
        for t in self.status()["tables"]:
            if t["name"] == name:
                return t
        return None

    def create_table(self, name: str, source: str | None = None, delete_format: str = "deletion-vectors") -> dict:
        """Mirror ``source`` (default: the configured source of ``name``) as ``name``: initial copy, then CDC.

        Returns ``{"table", "source", "rows", "copy_lsn", "seconds", "key", "replica_identity"}``."""
        source = source or self.spec(name).source
        return self.call(
            "create_table", timeout=max(self.call_timeout_s, 3600), dst=name, src=source, delete_format=delete_format
        )

    def drop_table(self, name: str) -> dict:
        return self.call("drop_table", table=name)

    def flush(self, name: str) -> dict:
        """Buffer → Parquet + one index block. Returns ``{"rows", "files", "bytes", "seconds"}``."""
        return self.call("flush", table=name)

    def persist(self, name: str) -> dict:
        """Flush, then one Iceberg commit with data files, Puffin deletion vectors, index and flush LSN.

        Returns ``{"rows", "files_added", "files_removed", "deleted_rows", "flush_lsn", "seconds"}``."""
        return self.call("persist", table=name)

    def merge_index(self, name: str, **kw) -> dict:
        """Merge the table's index blocks (the service's ``merge_index`` action; ``full``: whenever there are
        two or more, not only above the policy's ``index_max_blocks``)."""
        return self.call("merge_index", table=name, **kw)

    def compact(self, name: str, **kw) -> dict:
        """Rewrite small or half-deleted data files (the service's ``compact`` action; keywords ``full``:
        every persisted file, ``dry_run``: only plan, returning ``{"picked", "files", "checks"}``)."""
        return self.call("compact", table=name, **kw)

    def maintenance_policy(self, name: str) -> dict:
        """The table's maintenance policy as the service applies it (defaults overridden by settings.json
        ``extra.maintenance`` and ``extra.maintenance_tables.<name>``); ``{}`` when the engine has none."""
        try:
            from mooncake_assets.engine.compaction import policy_for
        except ImportError:
            return {}
        return policy_for(self.settings(), name).to_dict()

    def read_state(self, name: str, lsn: str | None = None, fetch: bool = True) -> ReadState:
        """The :class:`~mooncake_assets.engine.table.read_state.ReadState` of ``name`` at ``lsn`` (``X/Y``;
        None: everything applied): ``table``, ``lsn``, ``files`` (each ``name``, ``path``, ``rows``,
        ``deleted`` bitmap), ``schema``, ``ticket``, ``mem_rows``; with ``fetch`` the in-memory rows are
        fetched (the ticket is spent) into ``mem`` (a pyarrow Table)."""
        rs = self.client().read_state(name, lsn)
        if fetch:
            rs = rs.with_(mem=self.client().fetch(rs.ticket))
        return rs

    def changes(
        self,
        name: str,
        since: str,
        until: str | None = "persisted",
        deletes: str = "rows",
        sources: dict | None = None,
    ) -> tuple[str, pa.Table]:
        """The rows of mirror ``name`` that changed in ``[since, until)`` (``X/Y`` LSNs; ``until``
        ``"persisted"``, the default: the table's current Iceberg snapshot, a cursor that stays valid;
        None: everything applied), as one Arrow table: the table's columns plus ``_change``
        (``insert``/``delete``) and ``_commit_lsn`` (docs/changes.md). Returns ``(until, feed)``:
        keep ``until`` as the next call's ``since``. ``deletes="keys"``: deleted rows as their primary key
        only, other columns null. ``sources``: when given, filled with where the deleted rows came
        from (``rows_logged``/``rows_read``…, ``source``, ``replica_identity``: ``ServiceClient.changes``).
        ``ServiceError`` (one line) for a range that cannot be served; waits up to
        ``wait_timeout_s`` for an LSN not applied yet."""
        head, feed = self.client().changes(name, since, until, timeout=self.wait_timeout_s, deletes=deletes)
        if sources is not None:
            sources.update(head.get("sources") or {})
        return head["until"], feed

    def wait_lsn(self, lsn: str, timeout: float | None = None) -> dict:
        return self.client().wait_lsn(lsn, timeout=timeout or self.wait_timeout_s)

    def union_reader(self, con=None, read_your_writes: bool = True):
        """A :class:`~mooncake_assets.engine.read.UnionReader` on this service (optionally into ``con``)."""
        from mooncake_assets.engine.read import UnionReader

        return UnionReader(
            self.client(), self.source_dsn() if read_your_writes else None, con=con, wait_timeout=self.wait_timeout_s
        )

    # ------------------------------------------------------------------ source side
    def source_position(self, slot: str | None = None) -> dict:
        """Where the source is, from Postgres itself: ``{"source_lsn": X/Y, "confirmed_lsn": the slot's
        confirmed_flush_lsn or None, "apply_lag_s", "flush_lag_s": Postgres's measured lag of the
        service's walsender (seconds; None when it is not connected or fully caught up)}``."""
        import psycopg

        with psycopg.connect(self.source_dsn(), autocommit=True, connect_timeout=10) as c:
            src = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            out = {"source_lsn": src, "confirmed_lsn": None, "apply_lag_s": None, "flush_lag_s": None}
            if slot:
                row = c.execute(
                    "SELECT s.confirmed_flush_lsn::text, extract(epoch FROM r.write_lag)::float8, "
                    "extract(epoch FROM r.flush_lag)::float8 FROM pg_replication_slots s "
                    "LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = %s",
                    (slot,),
                ).fetchone()
                if row:
                    out.update(confirmed_lsn=row[0], apply_lag_s=row[1], flush_lag_s=row[2])
        return out

    def slot_name(self) -> str | None:
        """The replication slot of this state directory (from its registry; None before the first mirror)."""
        import json

        p = self.settings().state_dir / "tables.json"
        try:
            return json.loads(p.read_text()).get("slot")
        except (OSError, ValueError):
            return None

    def teardown_after_execution(self, context) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def lsn_int(text: str | None) -> int | None:
    """``X/Y`` LSN text → int (None stays None)."""
    if not text:
        return None
    return int(Lsn.parse(text))


def lag_bytes(source_lsn: str | None, lsn: str | None) -> int | None:
    """Bytes of WAL between ``lsn`` and ``source_lsn`` (≥ 0; None when either is unknown)."""
    a, b = lsn_int(source_lsn), lsn_int(lsn)
    if a is None or b is None:
        return None
    return max(a - b, 0)


LAG_VERDICTS = ("pass", "warn", "fail")


def lag_verdict(nbytes: int | None, seconds: float | None, th: MaintenanceThresholds) -> str:
    """The ``replication_lag`` verdict, one of :data:`LAG_VERDICTS`, for a mirror ``nbytes`` bytes of WAL
    (:func:`lag_bytes`; None: unknown) and ``seconds`` (None: not measured) behind its source, against
    ``th.lag_warn_bytes``/``lag_fail_bytes``/``lag_warn_s``/``lag_fail_s`` (a limit of 0 is off; a value
    equal to a limit is within it).

    ``"fail"`` above a fail limit; ``"warn"`` above a warn limit, **or when the byte lag is unknown**
    (the source's or the mirror's LSN could not be read: nothing shows the mirror is behind, nor that it
    is not — so it does not pass, but it is no failure either); ``"pass"`` otherwise. Used by the
    ``replication_lag`` asset check and by the sensor's evaluation of it, which add their own failures
    (a stopped mirror; a service that is not answering and has no slot to resume from)."""

    def over(v, limit) -> bool:
        return v is not None and limit > 0 and v > limit

    if over(nbytes, th.lag_fail_bytes) or over(seconds, th.lag_fail_s):
        return "fail"
    if nbytes is None or over(nbytes, th.lag_warn_bytes) or over(seconds, th.lag_warn_s):
        return "warn"
    return "pass"


__all__ = [
    "ReplicationResource",
    "MaintenanceThresholds",
    "TableSpec",
    "parse_tables",
    "DEFAULT_TABLES",
    "ServiceError",
    "ServiceUnavailable",
    "lsn_int",
    "lag_bytes",
    "lag_verdict",
    "LAG_VERDICTS",
]
