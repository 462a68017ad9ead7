"""Many sources in one deployment: the configuration file ``mooncake.yaml`` (docs/sources.md).

A deployment mirrors several PostgreSQL databases ("sources"). Each source is one state directory
``<state_root>/<name>`` driven by the one-source machinery unchanged (its own replicator service,
replication slot, publication, ``settings.json``, ``tables.json``); this module only turns the file
into one :class:`~mooncake_assets.config.Settings` per source and says which source tables its
patterns pick.

Where the file is (:func:`find_config`): ``--config FILE``, else ``$MOONCAKE_CONFIG``, else
``./mooncake.yaml`` when no state directory was named (``--state-dir``/``$MOONCAKE_STATE_DIR``).

The file (every key but ``sources`` optional; checked by :func:`parse_config`, which raises
:class:`ConfigError` naming the file, the key path and the problem)::

    state_root: /var/lib/mooncake     # default: .mooncake beside the file; relative: to the file
    sources:
      orders:                         # [A-Za-z_][A-Za-z0-9_]*, at most 63 characters
        dsn_env: ORDERS_PG_DSN        # the environment variable holding the DSN (required)
        schemas: [sales]              # whole schemas (glob patterns)
        tables: [public.customers, "public.order_*"]   # schema.table glob patterns (table: public)
        exclude: ["sales.tmp_*"]
        warehouse: s3://lake/orders   # default file://<state>/warehouse
        catalog: sqlite:////data/orders-catalog.db     # default sqlite:///<state>/catalog.db
        publication: orders_pub       # an administrator's publication (default: the service's own)
        maintenance: auto             # auto | dagster
        maintenance_policy: {file_count_trigger: 8}    # settings.json extra.maintenance
        table_policies: {orders: {index_max_blocks: 4}} # extra.maintenance_tables
        discover_interval_s: 5        # the service mirrors new tables the patterns pick (0, default: off)

No password may be written in the file: a ``dsn`` key, or any value holding ``password=`` or a
``user:password@`` URI, is an error (the DSN's password comes with its variable, ``PGPASSWORD``,
``~/.pgpass`` or a ``service=`` entry; docs/names-and-secrets.md).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .config import Settings, load_settings
from .engine.pg.patterns import TablePattern, TableSelection, list_source_tables
from .engine.pg.patterns import mirror_name as mirror_name  # re-exported: sync and the service name mirrors alike

CONFIG_NAME = "mooncake.yaml"
_SOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URI_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]+@")
_KV_PASSWORD = re.compile(r"(^|\s)password\s*=", re.IGNORECASE)
MAINTENANCE_MODES = ("auto", "dagster")

_SOURCE_KEYS = {
    "dsn_env": "the name of the environment variable holding the source's DSN",
    "schemas": "schemas to mirror whole (list of glob patterns)",
    "tables": "tables to mirror (list of schema.table glob patterns)",
    "exclude": "tables not to mirror (list of schema.table glob patterns)",
    "warehouse": "warehouse URI",
    "catalog": "Iceberg catalog URI",
    "publication": "an administrator's publication",
    "maintenance": "auto or dagster",
    "maintenance_policy": "maintenance policy of every table (mapping)",
    "table_policies": "maintenance policy per mirror name (mapping of mappings)",
    "discover_interval_s": "seconds between the running service's looks for new tables the patterns pick (0: off)",
}
_TOP_KEYS = ("state_root", "sources")


class ConfigError(ValueError):
    """A bad configuration file: ``str()`` is ``<file>: <key path>: <problem>`` (one line)."""

    def __init__(self, path: Path | str, key: str, problem: str):
        self.path, self.key, self.problem = Path(path), key, problem
        super().__init__(f"{path}: {key}: {problem}" if key else f"{path}: {problem}")


class MissingDsn(ValueError):
    """A source's ``dsn_env`` variable is not set (the message names the variable and the source)."""


@dataclass
class SourceConfig:
    """One source of the file: its name, where its state lives and what to mirror (see the module)."""

    name: str
    state_dir: Path
    dsn_env: str
    schemas: list[str] = field(default_factory=list)
    tables: list[TablePattern] = field(default_factory=list)
    exclude: list[TablePattern] = field(default_factory=list)
    warehouse: str | None = None
    catalog: str | None = None
    publication: str | None = None
    maintenance: str | None = None
    maintenance_policy: dict = field(default_factory=dict)
    table_policies: dict = field(default_factory=dict)
    discover_interval_s: float = 0.0
    config_path: Path | None = None  # the file it came from: the running service re-reads its patterns

    def dsn(self, environ: Mapping[str, str] | None = None) -> str:
        """The DSN from ``$<dsn_env>``; :class:`MissingDsn` naming the variable when it is unset/empty."""
        env = os.environ if environ is None else environ
        v = env.get(self.dsn_env)
        if not v:
            raise MissingDsn(
                f"source {self.name!r}: environment variable {self.dsn_env} is not set "
                f"(sources.{self.name}.dsn_env names it; set it to the source's DSN)"
            )
        return v

    def settings(self, environ: Mapping[str, str] | None = None, save: bool = False, need_dsn: bool = True) -> Settings:
        """The :class:`Settings` of this source's state directory: the file's values beat
        ``settings.json``; ``save``: write them to ``settings.json`` (without passwords) so that the
        source's service and later commands use the same. :class:`MissingDsn` as :meth:`dsn`, unless
        not ``need_dsn`` (a command that only talks to the service, e.g. ``stop``: then the DSN is
        settings.json's, without its password)."""
        try:
            dsn = self.dsn(environ)
        except MissingDsn:
            if need_dsn:
                raise
            dsn = None
        s = load_settings(
            self.state_dir,
            dsn=dsn,
            warehouse=self.warehouse,
            catalog_uri=self.catalog,
            publication=self.publication,
        )
        if self.maintenance:
            s.maintenance = self.maintenance
        extra = dict(s.extra or {})
        if self.maintenance_policy:
            extra["maintenance"] = dict(self.maintenance_policy)
        if self.table_policies:
            extra["maintenance_tables"] = {k: dict(v) for k, v in self.table_policies.items()}
        extra["source"] = self.name
        # the running service's table discovery (engine/service/discovery.py): the patterns, and how often
        extra["discover"] = {**self.selection.to_dict(), "interval_s": float(self.discover_interval_s)}
        if self.config_path is not None:  # edited patterns reach the running service without a restart
            extra["discover"]["config"] = str(self.config_path)
        s.extra = extra
        if save:
            s.save()
        return s

    @property
    def selection(self) -> TableSelection:
        """The source's ``schemas``/``tables``/``exclude`` as one :class:`TableSelection`."""
        return TableSelection(tuple(self.schemas), tuple(self.tables), tuple(self.exclude))

    def pick(self, tables: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
        """``(the (schema, table) pairs of tables that the patterns pick, in order, the patterns that
        match none of tables)``; an exclude pattern that excludes nothing is reported too
        (:meth:`TableSelection.pick`)."""
        return self.selection.pick(tables)


@dataclass
class MooncakeConfig:
    """A parsed ``mooncake.yaml``: ``path`` (the file), ``state_root``, ``sources`` by name (file order)."""

    path: Path
    state_root: Path
    sources: dict[str, SourceConfig]

    def source(self, name: str | None) -> SourceConfig:
        """The source ``name``; None: the only one. ``ValueError`` (one line) for an unknown name, or
        None with more than one source."""
        if name is None:
            if len(self.sources) == 1:
                return next(iter(self.sources.values()))
            raise ValueError(
                f"{self.path} has {len(self.sources)} sources: give --source NAME (one of {', '.join(self.sources)})"
            )
        if name not in self.sources:
            raise ValueError(f"no source {name!r} in {self.path} (sources: {', '.join(self.sources)})")
        return self.sources[name]


def find_config(
    explicit: str | os.PathLike | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    state_dir_given: bool = False,
) -> Path | None:
    """The configuration file to use, or None (one-source mode): ``explicit`` (``--config``); else None
    when a state directory was named on the command line (``state_dir_given``); else
    ``$MOONCAKE_CONFIG``; else None when ``$MOONCAKE_STATE_DIR`` is set; else ``<cwd>/mooncake.yaml``
    when it exists. A named file that does not exist is a :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    named = explicit or (None if state_dir_given else env.get("MOONCAKE_CONFIG"))
    if named:
        p = Path(named)
        if not p.is_file():
            raise ConfigError(p, "", "no such file" + ("" if explicit else " (named by $MOONCAKE_CONFIG)"))
        return p.resolve()
    if state_dir_given or env.get("MOONCAKE_STATE_DIR"):
        return None
    p = (cwd or Path.cwd()) / CONFIG_NAME
    return p.resolve() if p.is_file() else None


def load_config(path: str | os.PathLike) -> MooncakeConfig:
    """Read and check ``path`` (see :func:`parse_config`); unreadable or non-YAML text is a
    :class:`ConfigError` too."""
    import yaml

    p = Path(path).resolve()
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(p, "", f"cannot read it: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(p, "", f"not valid YAML: {where}{getattr(e, 'problem', None) or e}") from None
    return parse_config(data, p)


def parse_config(data, path: Path) -> MooncakeConfig:
    """Check the YAML document ``data`` of file ``path`` and build the :class:`MooncakeConfig`.

    Raises :class:`ConfigError` for: a document that is not a mapping, an unknown key (the known ones
    are listed), a missing ``sources`` or ``dsn_env``, a value of the wrong type, a bad source or
    variable name, a ``maintenance`` other than auto/dagster, a source with no ``schemas``/``tables``,
    a password anywhere in the file, and two sources sharing a warehouse or catalog (their mirrors
    would share the Iceberg namespace)."""
    if not isinstance(data, dict):
        raise ConfigError(path, "", "expected a mapping with a 'sources' key")
    _no_passwords(data, path, "")
    for k in data:
        if k not in _TOP_KEYS:
            raise ConfigError(path, str(k), f"unknown key (known: {', '.join(_TOP_KEYS)})")
    root = data.get("state_root", ".mooncake")
    if not isinstance(root, str) or not root:
        raise ConfigError(path, "state_root", "expected a directory path")
    state_root = (path.parent / os.path.expanduser(root)).resolve()
    sources = data.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise ConfigError(path, "sources", "expected a mapping of source names to their settings (at least one)")
    out = {str(n): _parse_source(str(n), v, path, state_root) for n, v in sources.items()}
    _check_own_storage(out, path)
    return MooncakeConfig(path, state_root, out)


def _check_own_storage(sources: dict[str, SourceConfig], path: Path) -> None:
    """:class:`ConfigError` when two sources would share a warehouse or a catalog: compared as the
    source uses it (a trailing ``/`` of a warehouse does not count; a source without one uses
    ``file://<state>/warehouse`` and ``sqlite:///<state>/catalog.db``, which another source may not name)."""
    for attr in ("warehouse", "catalog"):
        seen: dict[str, SourceConfig] = {}
        for s in sources.values():
            v = getattr(s, attr)
            if v is None:
                v = f"file://{s.state_dir}/warehouse" if attr == "warehouse" else f"sqlite:///{s.state_dir}/catalog.db"
            v = v.rstrip("/") if attr == "warehouse" else v
            other = seen.get(v)
            if other is not None:
                named = s if getattr(s, attr) is not None else other
                first = other if named is s else s
                raise ConfigError(
                    path,
                    f"sources.{named.name}.{attr}",
                    f"the same {attr} as source {first.name!r}: every source needs its own (mirrors of "
                    "different sources would collide in it)",
                )
            seen[v] = s


def _no_passwords(node, path: Path, key: str) -> None:
    """:class:`ConfigError` at the first ``dsn`` key or string holding a password under ``node``."""
    if isinstance(node, dict):
        for k, v in node.items():
            sub = f"{key}.{k}" if key else str(k)
            if str(k) in ("dsn", "password"):
                raise ConfigError(
                    path,
                    sub,
                    "a DSN or password is never kept in the file: put the DSN in an environment variable "
                    "and name it with dsn_env (the password can also come from PGPASSWORD or ~/.pgpass)",
                )
            _no_passwords(v, path, sub)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _no_passwords(v, path, f"{key}[{i}]")
    elif isinstance(node, str) and (_URI_PASSWORD.search(node) or _KV_PASSWORD.search(node)):
        raise ConfigError(
            path,
            key,
            "holds a password: keep passwords out of the file (in the dsn_env variable, PGPASSWORD or "
            "~/.pgpass; for a catalog, its own environment)",
        )


def _parse_source(name: str, d, path: Path, state_root: Path) -> SourceConfig:
    at = f"sources.{name}"
    if not _SOURCE_NAME.fullmatch(name):
        raise ConfigError(path, at, "a source name is 1-63 ASCII letters, digits and _, not starting with a digit")
    if not isinstance(d, dict):
        raise ConfigError(path, at, "expected a mapping (dsn_env, schemas/tables, ...)")
    for k in d:
        if k not in _SOURCE_KEYS:
            raise ConfigError(path, f"{at}.{k}", f"unknown key (known: {', '.join(_SOURCE_KEYS)})")
    env = d.get("dsn_env")
    if env is None:
        raise ConfigError(path, f"{at}.dsn_env", "missing: name the environment variable that holds the DSN")
    if not isinstance(env, str) or not _ENV_NAME.fullmatch(env):
        raise ConfigError(path, f"{at}.dsn_env", f"expected an environment variable name, not {env!r}")
    lists = {k: _str_list(d.get(k), path, f"{at}.{k}") for k in ("schemas", "tables", "exclude")}
    if not lists["schemas"] and not lists["tables"]:
        raise ConfigError(path, at, "nothing to mirror: give schemas and/or tables")
    strs = {k: _opt_str(d.get(k), path, f"{at}.{k}") for k in ("warehouse", "catalog", "publication", "maintenance")}
    if strs["maintenance"] is not None and strs["maintenance"] not in MAINTENANCE_MODES:
        raise ConfigError(path, f"{at}.maintenance", f"expected auto or dagster, not {strs['maintenance']!r}")
    policy = d.get("maintenance_policy") or {}
    if not isinstance(policy, dict):
        raise ConfigError(path, f"{at}.maintenance_policy", "expected a mapping of policy settings")
    per_table = d.get("table_policies") or {}
    if not isinstance(per_table, dict) or not all(isinstance(v, dict) for v in per_table.values()):
        raise ConfigError(path, f"{at}.table_policies", "expected a mapping of mirror names to policy mappings")
    _check_policy(policy, path, f"{at}.maintenance_policy")
    every = d.get("discover_interval_s", 0)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every < 0:
        raise ConfigError(path, f"{at}.discover_interval_s", f"expected a number of seconds (0: off), not {every!r}")
    for mirror, p in per_table.items():
        _check_policy(p, path, f"{at}.table_policies.{mirror}")
    return SourceConfig(
        name=name,
        state_dir=state_root / name,
        dsn_env=env,
        schemas=lists["schemas"],
        tables=[TablePattern.parse(t) for t in lists["tables"]],
        exclude=[TablePattern.parse(t) for t in lists["exclude"]],
        maintenance_policy=dict(policy),
        table_policies={str(k): dict(v) for k, v in per_table.items()},
        discover_interval_s=float(every),
        config_path=Path(path).resolve(),
        **strs,
    )


def _check_policy(policy: dict, path: Path, key: str) -> None:
    """A maintenance policy mapping must name known settings with values of their types
    (``MaintenancePolicy.from_dict``): a typo is an error of the file, not a service that fails later."""
    from .engine.compaction.policy import MaintenancePolicy

    try:
        MaintenancePolicy.from_dict(policy)
    except ValueError as e:
        raise ConfigError(path, key, str(e).removeprefix("maintenance policy: ")) from None


def _str_list(v, path: Path, key: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise ConfigError(path, key, "expected a list of non-empty strings")
    return [x.strip() for x in v]


def _opt_str(v, path: Path, key: str) -> str | None:
    if v is not None and (not isinstance(v, str) or not v):
        raise ConfigError(path, key, "expected a non-empty string")
    return v


# ------------------------------------------------------------------------------------ source tables
def source_tables(dsn: str) -> list[tuple[str, str]]:
    """Every table of the source database that could be mirrored, as ``(schema, table)`` sorted:
    ordinary and partitioned tables (``relkind`` r/p, not partitions, not temporary or unlogged), outside
    the system schemas (PostgreSQL docs, "pg_class"; :func:`~.engine.pg.patterns.list_source_tables`)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as c:
        return [(s, t) for s, t, _oid in list_source_tables(c)]


def patterns_reloader(settings: Settings):
    """:func:`reload_patterns` for the source whose settings are ``settings`` (settings.json's
    ``extra.discover.config`` and ``extra.source``, written by :meth:`SourceConfig.settings`), or None
    for a state directory that no sources file describes."""
    extra = settings.extra or {}
    path, source = (extra.get("discover") or {}).get("config"), extra.get("source")
    return reload_patterns(path, source) if path and source else None


def reload_patterns(path: str, source: str):
    """A function the service's table discovery calls before each look: the ``schemas``/``tables``/
    ``exclude`` patterns of ``source`` in the sources file ``path`` when the file changed since the
    last call (its modification time), else None. A file that no longer loads (or lost the source) is
    logged once per change and gives None: the patterns in use stay."""
    seen: list[float | None] = [None]

    def reload():
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            return None
        if seen[0] is None:  # the first call: the patterns the service started with come from this file
            seen[0] = mtime
            return None
        if mtime == seen[0]:
            return None
        seen[0] = mtime
        try:
            return load_config(path).source(source).selection.to_dict()
        except (ConfigError, ValueError, OSError) as e:
            logging.getLogger("mooncake.service").warning("table discovery: %s not reloaded: %s", path, e)
            return None

    return reload
