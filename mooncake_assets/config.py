"""Where mooncake keeps things: state directory, source DSN, warehouse, catalog, service socket.

Defaults (docs/architecture.md#command-line): state dir ``$MOONCAKE_STATE_DIR`` or ``./.mooncake``; DSN ``$MOONCAKE_PG_DSN``
or the embedded local Postgres in ``<state>/pg``; warehouse ``$MOONCAKE_WAREHOUSE`` or
``file://<state>/warehouse``; catalog ``$MOONCAKE_CATALOG_URI`` or ``sqlite:///<state>/catalog.db``.
``$MOONCAKE_PUBLICATION`` or ``--publication``: an administrator's publication (see :class:`Settings`).
Settings given on the command line are saved in ``<state>/settings.json`` so that the background
service and later commands use the same ones — without passwords: the DSN (and a catalog URI) is
saved without its password, which later processes take from where libpq finds one (``PGPASSWORD``,
``~/.pgpass``/``PGPASSFILE``, a ``service=`` entry) or from ``MOONCAKE_PG_DSN``; a service started by
a process that was given the password gets it through its environment only
(:meth:`Settings.service_environment`). The state directory is created ``0700`` and its files
``0600`` (``engine/private.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .engine.pg.conninfo import PASSWORD_HINT, dsn_problem, split_password, split_uri_password, strip_password
from .engine.private import ensure_private_dir, warn_if_open, write_private


@dataclass
class Settings:
    """Resolved settings of one mooncake state directory.

    ``dsn``: None means "the embedded local Postgres". ``publication``: the name of a publication an
    administrator created (``FOR TABLE …``, ``FOR TABLES IN SCHEMA …``, ``FOR ALL TABLES``) that the
    service reads and never alters; None (the default) means the service keeps a publication of its
    own and adds each mirrored table to it (which needs ownership of the table). ``maintenance``: ``auto`` (the service flushes
    and persists by policy) or ``dagster`` (assets drive it; the service only enforces its memory cap).
    """

    state_dir: Path
    dsn: str | None = None
    publication: str | None = None
    warehouse: str | None = None
    catalog_uri: str | None = None
    maintenance: str = "auto"
    flush_rows: int = 200_000  # buffered rows of one table that trigger a flush (rows)
    flush_bytes: int = 256 << 20  # buffered Arrow bytes of one table that trigger a flush (bytes)
    persist_interval_s: float = 10.0  # auto mode: persist a dirty table at most this often (seconds)
    verify_interval_s: float = (
        600.0  # the service checks every mirror against its source this often (seconds; 0: never)
    )
    warn_persist_age_s: float = (
        600.0  # status warns when a table's changes are unpersisted for longer (seconds; 0: never)
    )
    warn_slot_wal_bytes: int = 1 << 30  # status warns when a table holds more WAL in the slot (bytes; 0: never)
    publication_check_s: float = 2.0  # the stream thread checks this often that every mirrored table is still
    #                                    in the publication (seconds; 0: never; see ReplicatorService._check_published)
    catalog_wait_s: float = 60.0  # schema change: how long to wait for the source to show the change's
    #                                    transaction before the table stops (seconds; see SourceCatalog)
    s3_endpoint: str | None = None  # s3:// warehouses: endpoint URL (MinIO, moto…); None = AWS S3
    s3_region: str | None = None  # s3:// warehouses: region (default us-east-1)
    s3_allow_http: bool | None = None  # allow a plain-http endpoint (None: only loopback ones)
    apply_mode: str | None = None  # change | run | auto (None: the service's default; $MOONCAKE_APPLY_MODE)
    decoder: str | None = None  # native | python (None: the service's default; $MOONCAKE_DECODER)
    memory_limit: int | None = None  # the service's memory budget (bytes; None: a quarter of MemTotal)
    copy_parallel: int | None = None  # create-table's initial copy: connections reading CTID ranges
    #                                    (None: the service's default, min(4, cores); 1: one COPY; $MOONCAKE_COPY_PARALLEL)
    extra: dict = field(default_factory=dict)

    @property
    def settings_file(self) -> Path:
        return self.state_dir / "settings.json"

    @property
    def warehouse_uri(self) -> str:
        return self.warehouse or f"file://{self.state_dir / 'warehouse'}"

    @property
    def catalog(self) -> str:
        return self.catalog_uri or f"sqlite:///{self.state_dir / 'catalog.db'}"

    @property
    def socket_path(self) -> Path:
        """Unix socket of the service's Arrow Flight endpoint (kept short: sun_path holds 107 bytes)."""
        p = self.state_dir / "service.sock"
        if len(str(p)) > 100:
            h = hashlib.sha1(str(self.state_dir).encode()).hexdigest()[:12]
            return Path("/tmp") / f"mooncake-{h}.sock"
        return p

    def source_dsn(self) -> str:
        """The DSN of the source Postgres: the configured one or the embedded cluster's (started if needed)."""
        if self.dsn:
            return self.dsn
        from .engine.pg import EmbeddedPostgres

        return EmbeddedPostgres(self.state_dir).start()

    def service_config(self):
        """The replicator service's configuration (``engine/service/config.py``) for these settings:
        the source DSN resolved (:meth:`source_dsn`, which starts the embedded Postgres when there is
        no DSN), the catalog and warehouse URIs with their defaults, the maintenance policies of
        ``extra`` (``maintenance``, ``maintenance_tables``) and its table discovery (``discover``: the
        ``schemas``/``tables``/``exclude`` patterns and ``interval_s``)."""
        from .engine.service.config import ServiceConfig

        extra = self.extra or {}
        discover = extra.get("discover") or {}  # a sources file's patterns (sources.SourceConfig.settings)
        return ServiceConfig(
            state_dir=self.state_dir,
            dsn=self.source_dsn(),
            socket_path=self.socket_path,
            catalog_uri=self.catalog,
            warehouse_uri=self.warehouse_uri,
            publication=self.publication,
            s3_endpoint=self.s3_endpoint,
            s3_region=self.s3_region,
            s3_allow_http=self.s3_allow_http,
            maintenance=self.maintenance,
            flush_rows=self.flush_rows,
            flush_bytes=self.flush_bytes,
            persist_interval_s=self.persist_interval_s,
            verify_interval_s=self.verify_interval_s,
            warn_persist_age_s=self.warn_persist_age_s,
            warn_slot_wal_bytes=self.warn_slot_wal_bytes,
            catalog_wait_s=self.catalog_wait_s,
            publication_check_s=float(self.publication_check_s),
            **({"apply_mode": self.apply_mode} if self.apply_mode else {}),
            **({"decoder": self.decoder} if self.decoder else {}),
            memory_limit=self.memory_limit,
            **({"copy_parallel": int(self.copy_parallel)} if self.copy_parallel else {}),
            maintenance_policy=dict(extra.get("maintenance") or {}),
            maintenance_tables={k: dict(v or {}) for k, v in (extra.get("maintenance_tables") or {}).items()},
            table_patterns={k: list(discover.get(k) or []) for k in ("schemas", "tables", "exclude")}
            if discover
            else {},
            discover_interval_s=float(discover.get("interval_s") or 0),
            **({"discover_retry_s": float(discover["retry_s"])} if discover.get("retry_s") else {}),
        )

    def save(self) -> None:
        """Write ``settings.json`` (``0600``, in a ``0700`` state directory), without passwords.
        Raises ``ValueError`` (one line, the DSN without its password) for a DSN libpq cannot parse,
        writing nothing."""
        if (problem := dsn_problem(self.dsn)) is not None:
            raise ValueError(problem)
        ensure_private_dir(self.state_dir)
        d = _without_passwords({k: v for k, v in asdict(self).items() if k != "state_dir"})
        write_private(self.settings_file, json.dumps(d, indent=1))

    def service_environment(self) -> dict[str, str]:
        """Environment entries for a service process started by this one: the DSN
        (``MOONCAKE_PG_DSN``) and catalog URI (``MOONCAKE_CATALOG_URI``) exactly as this process resolved
        them — with their passwords, which are never written to a file (``settings.json`` has them
        without), and beating any other value the inherited environment holds."""
        env = {}
        if self.dsn:
            env["MOONCAKE_PG_DSN"] = self.dsn
        if self.catalog_uri:
            env["MOONCAKE_CATALOG_URI"] = self.catalog_uri
        return env


def load_settings(
    state_dir: str | os.PathLike | None = None,
    *,
    dsn: str | None = None,
    warehouse: str | None = None,
    catalog_uri: str | None = None,
    s3_endpoint: str | None = None,
    publication: str | None = None,
) -> Settings:
    """Settings for a state dir: explicit arguments beat the environment, which beats the saved file.
    Raises ``ValueError`` naming the bad parameter (the DSN shown without its password) when the
    resulting DSN does not parse; nothing is written."""
    sd = Path(state_dir or os.environ.get("MOONCAKE_STATE_DIR") or ".mooncake").resolve()
    s = Settings(state_dir=sd)
    f = s.settings_file
    if sd.exists():
        warn_if_open(sd)
    if f.exists():
        saved = json.loads(f.read_text())
        for k, v in saved.items():
            if hasattr(s, k):
                setattr(s, k, v)
        if split_password(s.dsn)[1] is not None or split_uri_password(s.catalog_uri)[1] is not None:
            _drop_saved_passwords(s, saved)  # written by an older version: keep it in memory only
    s.dsn = dsn or os.environ.get("MOONCAKE_PG_DSN") or s.dsn
    s.publication = publication or os.environ.get("MOONCAKE_PUBLICATION") or s.publication
    s.warehouse = warehouse or os.environ.get("MOONCAKE_WAREHOUSE") or s.warehouse
    s.catalog_uri = catalog_uri or os.environ.get("MOONCAKE_CATALOG_URI") or s.catalog_uri
    s.apply_mode = os.environ.get("MOONCAKE_APPLY_MODE") or s.apply_mode
    s.decoder = os.environ.get("MOONCAKE_DECODER") or s.decoder
    s.copy_parallel = int(os.environ.get("MOONCAKE_COPY_PARALLEL") or 0) or s.copy_parallel
    from .engine.storage.config import apply_s3_settings  # S3 endpoint/region/allow_http: env names there

    apply_s3_settings(s, endpoint=s3_endpoint)
    split_password(s.dsn)  # remember the passwords, to blank them out of output and logs
    split_uri_password(s.catalog_uri)
    if (problem := dsn_problem(s.dsn)) is not None:  # a typo (prot=, ?sslmod=) is refused, never saved
        raise ValueError(problem)
    return s


def _without_passwords(d: dict) -> dict:
    """``d`` (the content of ``settings.json``) with the password taken out of its ``dsn`` and
    ``catalog_uri`` (changed in place and returned; a missing one becomes None)."""
    d["dsn"] = strip_password(d.get("dsn"))
    d["catalog_uri"] = split_uri_password(d.get("catalog_uri"))[0]
    return d


def _drop_saved_passwords(s: Settings, saved: dict) -> None:
    """Rewrite ``s``'s ``settings.json``, whose content ``saved`` holds a password (an older version
    wrote it), without it (every other key kept as it is)."""
    import logging

    try:
        write_private(s.settings_file, json.dumps(_without_passwords(dict(saved)), indent=1))
        logging.getLogger("mooncake.state").warning(
            "removed a password from %s (passwords are not kept in the state directory; %s)",
            s.settings_file,
            PASSWORD_HINT,
        )
    except OSError as e:
        logging.getLogger("mooncake.state").warning(
            "%s holds a password and could not be rewritten: %s", s.settings_file, e
        )
