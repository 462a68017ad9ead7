"""Asset keys of one source's mirrors: :class:`SourceKeys` (the assets, the asset checks and the sensor
share them).

One state directory (``MOONCAKE_TABLES``): ``postgres/<schema>/<table>``, ``mirror/<t>``,
``<kind>/<t>``. A sources file (``mooncake.yaml``, docs/sources.md): per source
``postgres/<source>/<schema>/<table>``, ``<source>/<schema>/<table>`` (the mirror),
``<kind>/<source>/<schema>/<table>``; ``<kind>``: flush, deletion_vectors, index_merge, compaction.
"""

from dataclasses import dataclass, field

import dagster as dg

from mooncake_assets.dagster.jobs.maintenance import KINDS as MAINTENANCE_KINDS
from mooncake_assets.dagster.resources.replication import TableSpec
from mooncake_assets.engine.pg.names import asset_key_part

MIRROR = "mirror"

RESOURCE = "replication"


@dataclass
class SourceKeys:
    """The asset keys and the resource key of one source's assets.

    ``source`` None (one state directory, ``MOONCAKE_TABLES``): ``postgres/<schema>/<table>``,
    ``mirror/<t>``, ``<kind>/<t>``, resource ``replication``. A source of the sources file
    (``mooncake.yaml``, docs/sources.md): ``postgres/<source>/<schema>/<table>``,
    ``<source>/<schema>/<table>`` (the mirror), ``<kind>/<source>/<schema>/<table>``, resource
    ``replication__<source>``; ``parts`` maps each mirror name to its source ``(schema, table)``
    (key parts mapped by :func:`~mooncake_assets.engine.pg.names.asset_key_part`)."""

    source: str | None = None
    parts: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def resource_key(self) -> str:
        return RESOURCE if self.source is None else f"{RESOURCE}__{self.source}"

    @property
    def io_manager_key(self) -> str:
        """The I/O manager that loads this source's mirrors as inputs (union reads of its service)."""
        return "io_manager" if self.source is None else f"io_manager__{self.source}"

    def _tail(self, name: str) -> list[str]:
        if self.source is None:
            return [name]
        schema, table = self.parts[name]
        return [self.source, asset_key_part(schema), asset_key_part(table)]

    def mirror(self, name: str) -> dg.AssetKey:
        return dg.AssetKey([MIRROR, name]) if self.source is None else dg.AssetKey(self._tail(name))

    def maintenance(self, kind: str, name: str) -> dg.AssetKey:
        if kind not in MAINTENANCE_KINDS:
            raise ValueError(f"unknown maintenance kind {kind!r}; one of {', '.join(MAINTENANCE_KINDS)}")
        return dg.AssetKey([kind, *self._tail(name)])

    def postgres(self, spec: TableSpec) -> dg.AssetKey:
        parts = [asset_key_part(p) for p in spec.source_parts]
        return dg.AssetKey(["postgres", *([] if self.source is None else [self.source]), *parts])

    def table_of(self, key: dg.AssetKey) -> str | None:
        """The mirror name whose mirror or maintenance asset ``key`` is (None: not one of this source's)."""
        path = list(key.path)
        if self.source is None:
            return path[1] if len(path) == 2 and path[0] in (*MAINTENANCE_KINDS, MIRROR) else None
        tail = path[1:] if path and path[0] in MAINTENANCE_KINDS else path
        for name in self.parts:
            if tail == self._tail(name):
                return name
        return None


ONE_SOURCE = SourceKeys()
