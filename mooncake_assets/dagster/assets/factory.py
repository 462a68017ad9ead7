"""The asset factory: per configured table, the mirror and its maintenance as Dagster assets (docs/architecture.md#dagster).

For mirror ``t`` of Postgres table ``schema.table``, the lineage reads source → buffer → Parquet →
Puffin/Iceberg → merged index → compacted files:

====================================  =====================================================================
asset key                             materializing it
====================================  =====================================================================
``postgres/<schema>/<table>``         (external) the source table in Postgres
``mirror/<t>``                        makes sure the service runs and mirrors the table (initial copy the
                                      first time), waits until it has applied the source's current LSN;
                                      the live mirror: in-memory buffer + files. Inputs from it are union
                                      reads (see ``resources/io_manager.py``)
``flush/<t>``                         buffer → Parquet file(s) + one index block (service ``flush``)
``deletion_vectors/<t>``              one Iceberg commit: new data files, Puffin deletion vectors, index,
                                      flush LSN (service ``persist``)
``index_merge/<t>``                   index blocks merged into one (service ``merge_index``)
``compaction/<t>``                    small / half-deleted files rewritten (service ``compact``)
====================================  =====================================================================

Asset groups are the stages (``postgres``, ``mirror``, ``flush``, ``deletion_vectors``, ``index_merge``,
``compaction``), so the global lineage graph reads as the pipeline, one node per table in each stage.
Each returns a ``MaterializeResult`` with rows, files, bytes, LSN and duration, and a Markdown table
of the data files where it changes them. A table the service does not mirror fails the maintenance
assets with a message naming ``mirror/<t>``.
"""

import time
from collections.abc import Callable, Sequence

import dagster as dg
from pydantic import Field

from mooncake_assets.dagster.keys import ONE_SOURCE, SourceKeys
from mooncake_assets.dagster.resources.io_manager import MIRROR_TABLE
from mooncake_assets.dagster.resources.replication import ReplicationResource, TableSpec
from mooncake_assets.engine.pg.conninfo import scrub
from mooncake_assets.engine.pg.names import asset_key_part
from mooncake_assets.engine.service import ServiceError

from .metadata import (
    files_markdown,
    iceberg_column_schema,
    postgres_column_schema,
    result_metadata,
    table_stats_metadata,
)

MAINTENANCE_KINDS = ("flush", "deletion_vectors", "index_merge", "compaction")
MIRROR = "mirror"


def source_key(spec: TableSpec) -> dg.AssetKey:
    """``postgres/<schema>/<table>``; a name part that is not ``[A-Za-z0-9_]+`` is mapped by
    :func:`~mooncake_assets.engine.pg.names.asset_key_part` (``Sales Data`` → ``Sales_Data_<hash>``)
    and the asset's description and metadata show the real names."""
    return dg.AssetKey(["postgres", *(asset_key_part(p) for p in spec.source_parts)])


def mirror_key(name: str) -> dg.AssetKey:
    return dg.AssetKey([MIRROR, name])


def maintenance_key(kind: str, name: str) -> dg.AssetKey:
    if kind not in MAINTENANCE_KINDS:
        raise ValueError(f"unknown maintenance kind {kind!r}; one of {', '.join(MAINTENANCE_KINDS)}")
    return dg.AssetKey([kind, name])


_DESCRIPTIONS = {
    "flush": "Flush the in-memory buffer of `{t}` to Parquet (one index block per flush). The rows stay "
    "visible to union reads throughout; they are not yet in Iceberg.",
    "deletion_vectors": "Persist `{t}` to Iceberg in one commit: flushed data files, pending deletes merged "
    "into one Puffin deletion vector per data file, the key index and the flush LSN.",
    "index_merge": "Merge the index blocks of `{t}` into one (k-way merge by hash): key lookups then cost one "
    "bucket probe.",
    "compaction": "Compact `{t}`: rewrite small files and files with many deleted rows, remap the index and "
    "replace the files in one Iceberg commit.",
}
_KINDS = {
    "flush": {"parquet"},
    "deletion_vectors": {"iceberg", "puffin"},
    "index_merge": {"index"},
    "compaction": {"iceberg", "parquet"},
}
_UPSTREAM = {"flush": None, "deletion_vectors": "flush", "index_merge": "deletion_vectors", "compaction": "index_merge"}


def _require_table(replication: ReplicationResource, name: str, keys: SourceKeys = ONE_SOURCE) -> dict:
    replication.ensure_running()
    st = replication.table_status(name)
    mirror = keys.mirror(name).to_user_string()
    if st is None:
        raise dg.Failure(description=f"the service does not mirror {name!r} yet: materialize {mirror} first")
    if st.get("state") == "copying":
        raise dg.Failure(description=f"{name} is still being copied (initial copy); try again when {mirror} is done")
    if st.get("state") == "error":
        raise dg.Failure(
            description=f"mirror {name} stopped on an error: {st.get('error')}",
            metadata={"error": st.get("error") or ""},
        )
    return st


def _call(fn: Callable[[], dict], what: str) -> dict:
    try:
        return fn()
    except ServiceError as e:
        raise dg.Failure(description=f"{what} failed: {e}") from None


def build_mirror_asset(
    spec: TableSpec,
    group: str = MIRROR,
    column_schema: dg.TableSchema | None = None,
    keys: SourceKeys = ONE_SOURCE,
) -> dg.AssetsDefinition:
    """``mirror/<t>`` (``keys``: a source's ``<source>/<schema>/<table>``): the live mirror of
    ``spec.source`` (see the module docstring). ``column_schema``: definition-time column metadata
    (else it comes with each materialization)."""
    name = spec.name
    metadata = {MIRROR_TABLE: name, "mooncake/source": spec.source, "dagster/table_name": f"mooncake.{name}"}
    tags = {"mooncake/table": name}
    if keys.source is not None:
        metadata["mooncake/source_name"] = keys.source
        tags["mooncake/source_name"] = keys.source
    if column_schema is not None:
        metadata["dagster/column_schema"] = column_schema

    @dg.asset(
        key=keys.mirror(name),
        deps=[keys.postgres(spec)],
        group_name=group,
        kinds={"postgres", "iceberg", "duckdb"},
        description=(
            f"Live mirror of Postgres table `{spec.source}` as Iceberg table `mooncake.{name}`: changes "
            "stream in by logical replication; reads see the persisted files, the flushed files and the "
            "in-memory rows with every delete applied (union read at an LSN)."
        ),
        metadata=metadata,
        tags=tags,
        required_resource_keys={keys.resource_key},
        io_manager_key=keys.io_manager_key,
    )
    def _mirror(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        replication: ReplicationResource = getattr(context.resources, keys.resource_key)
        t0 = time.time()
        started = replication.ensure_running()
        st = replication.table_status(name)
        meta: dict = {"source": dg.MetadataValue.text(spec.source)}
        if started["started"]:
            meta["service"] = dg.MetadataValue.text(f"started (pid {started['pid']})")
        if st is not None and st.get("state") == "copying":  # another run is copying it: wait for that copy
            context.log.info(f"{name} is being copied by another run; waiting for the copy to finish")
            deadline = time.time() + replication.call_timeout_s
            while st is not None and st.get("state") == "copying" and time.time() < deadline:
                time.sleep(1.0)
                st = replication.table_status(name)
            if st is None or st.get("state") == "copying":
                raise dg.Failure(
                    description=f"the initial copy of {name} by another run did not finish "
                    f"within {replication.call_timeout_s:.0f}s (or failed); try again"
                )
        if st is None:
            context.log.info(f"mirroring {spec.source} as {name}: initial copy, then change data capture")
            created = _call(lambda: replication.create_table(name, spec.source), f"mirroring {spec.source}")
            meta.update(result_metadata(created, prefix="initial_copy/"))
        elif st.get("state") == "error":
            raise dg.Failure(description=f"mirror {name} stopped on an error: {st.get('error')}")
        source_lsn = replication.union_reader().barrier()  # the mirror has applied everything committed so far
        st = replication.table_status(name) or {}
        meta.update(table_stats_metadata(st))
        meta["source_lsn"] = dg.MetadataValue.text(source_lsn or "")
        meta["dagster/row_count"] = dg.MetadataValue.int(int(st.get("live_rows", 0)))
        try:
            meta["dagster/column_schema"] = postgres_column_schema(replication.source_dsn(), spec.source)
        except Exception as e:  # schema metadata is informative; the mirror itself is fine
            context.log.warning(scrub(f"could not read the column schema of {spec.source}: {e}"))
        meta["duration_s"] = dg.MetadataValue.float(round(time.time() - t0, 3))
        return dg.MaterializeResult(metadata=meta)

    return _mirror


class FullConfig(dg.Config):
    """Run configuration of ``index_merge/<t>`` and ``compaction/<t>``."""

    full: bool = Field(
        False,
        description="index_merge: merge whenever there are two or more blocks; compaction: rewrite "
        "every persisted file. Default: what the table's maintenance policy picks.",
    )


def _kind_metadata(kind: str, meta: dict, res: dict, before: dict, after: dict) -> None:
    """Add to ``meta`` what a ``kind`` run reports: its output counts (``res``) and the table's status
    ``before``/``after`` that matter for it."""
    if kind == "flush":
        meta["rows"] = dg.MetadataValue.int(int(res.get("rows", 0)))
        meta["files"] = dg.MetadataValue.int(int(res.get("files", 0)))
        meta["bytes"] = dg.MetadataValue.int(int(res.get("bytes", 0)))
    elif kind == "deletion_vectors":
        meta["rows"] = dg.MetadataValue.int(int(res.get("rows", 0)))
        meta["files"] = dg.MetadataValue.int(int(res.get("files_added", 0)))
        meta["deletion_vectors"] = dg.MetadataValue.int(int(after.get("deletion_vectors", 0)))
        meta["pending_deletes_before"] = dg.MetadataValue.int(int(before.get("pending_deletes", 0)))
    elif kind == "index_merge":
        meta["index_blocks_before"] = dg.MetadataValue.int(int(before.get("index_blocks", 0)))
        meta["index_blocks"] = dg.MetadataValue.int(int(after.get("index_blocks", 0)))
        meta["rows"] = dg.MetadataValue.int(int(res.get("entries_out", 0)))  # index entries written
    elif kind == "compaction":
        meta["rows"] = dg.MetadataValue.int(int(res.get("rows_out", 0)))
        meta["files"] = dg.MetadataValue.int(int(res.get("files_out", 0)))
        meta["bytes"] = dg.MetadataValue.int(int(res.get("bytes_out", 0)))
        meta["data_files_before"] = dg.MetadataValue.int(int(before.get("data_files", 0)))
        meta["data_bytes_before"] = dg.MetadataValue.int(int(before.get("data_bytes", 0)))
        meta["deleted_rows_before"] = dg.MetadataValue.int(int(before.get("deleted_rows", 0)))


def build_maintenance_asset(
    kind: str, spec: TableSpec, group: str | None = None, keys: SourceKeys = ONE_SOURCE
) -> dg.AssetsDefinition:
    """``<kind>/<t>`` (``keys``: a source's ``<kind>/<source>/<schema>/<table>``) for kind in flush,
    deletion_vectors, index_merge, compaction (the last two take :class:`FullConfig`)."""
    name = spec.name
    up = _UPSTREAM[kind]
    dep = keys.mirror(name) if up is None else keys.maintenance(up, name)
    tags = {"mooncake/table": name, "mooncake/maintenance": kind}
    if keys.source is not None:
        tags["mooncake/source_name"] = keys.source
    decorate = dg.asset(
        key=keys.maintenance(kind, name),
        deps=[dep],
        group_name=group or kind,
        kinds=_KINDS[kind],
        description=_DESCRIPTIONS[kind].format(t=name),
        tags=tags,
        required_resource_keys={keys.resource_key},
    )
    if kind in ("index_merge", "compaction"):

        @decorate
        def _configured(context: dg.AssetExecutionContext, config: FullConfig) -> dg.MaterializeResult:
            return _maintain(context, getattr(context.resources, keys.resource_key), config.full)

        asset_def = _configured
    else:

        @decorate
        def _plain(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
            return _maintain(context, getattr(context.resources, keys.resource_key), False)

        asset_def = _plain

    def _maintain(context, replication: ReplicationResource, full: bool) -> dg.MaterializeResult:
        t0 = time.time()
        before = _require_table(replication, name, keys)
        ops = {
            "flush": replication.flush,
            "deletion_vectors": replication.persist,
            "index_merge": lambda n: replication.merge_index(n, full=full),
            "compaction": lambda n: replication.compact(n, full=full),
        }
        res = _call(lambda: ops[kind](name), f"{kind} of {name}")
        after = replication.table_status(name) or {}
        meta = result_metadata(res)
        meta["lsn"] = dg.MetadataValue.text(after.get("flush_lsn" if kind != "flush" else "applied_lsn", ""))
        meta["data_files"] = dg.MetadataValue.int(int(after.get("data_files", 0)))
        meta["data_bytes"] = dg.MetadataValue.int(int(after.get("data_bytes", 0)))
        _kind_metadata(kind, meta, res, before, after)
        meta.setdefault("bytes", dg.MetadataValue.int(int(after.get("data_bytes", 0))))
        meta.setdefault("rows", dg.MetadataValue.int(int(after.get("live_rows", 0))))
        meta.setdefault("files", dg.MetadataValue.int(int(after.get("data_files", 0))))
        if kind != "index_merge":
            try:
                meta["data_files_table"] = dg.MetadataValue.md(files_markdown(replication.read_state(name)))
            except ServiceError as e:
                context.log.warning(f"could not list the files of {name}: {e}")
        meta["duration_s"] = dg.MetadataValue.float(round(time.time() - t0, 3))
        context.log.info(
            f"{kind} of {name}: " + ", ".join(f"{k}={v}" for k, v in res.items() if k not in ("files", "reasons"))
        )
        return dg.MaterializeResult(metadata=meta)

    return asset_def


def build_table_assets(
    specs: Sequence[TableSpec], catalog_uri: str | None = None, keys: SourceKeys = ONE_SOURCE
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    """Every asset of the configured mirrors: the external source tables, ``mirror/<t>`` and the four
    maintenance assets per table (keyed by ``keys``, see :class:`SourceKeys`). ``catalog_uri``: a local
    SQLite Iceberg catalog to take the mirrors' column schemas from at load time (skipped when absent;
    nothing else is contacted)."""
    out: list = []
    seen_sources = set()
    for spec in specs:
        if spec.source not in seen_sources:
            seen_sources.add(spec.source)
            schema_name, table_name = spec.source_parts
            out.append(
                dg.AssetSpec(
                    key=keys.postgres(spec),
                    group_name="postgres",
                    kinds={"postgres"},
                    description=f"Postgres table `{spec.source}`, the source of the mirror (logical replication, pgoutput).",
                    metadata={
                        "mooncake/source": spec.source,
                        "mooncake/source_schema": schema_name,
                        "mooncake/source_table": table_name,
                    },
                )
            )
        schema = iceberg_column_schema(catalog_uri, spec.name) if catalog_uri else None
        out.append(build_mirror_asset(spec, column_schema=schema, keys=keys))
        out.extend(build_maintenance_asset(kind, spec, keys=keys) for kind in MAINTENANCE_KINDS)
    return out
