"""The chunked initial copy as a Dagster job whose chunks are separate steps.

``chunked_copy`` (one state directory) or ``chunked_copy__<source>`` (a sources file) mirrors one
table as create-table does, with its copy cut into CTID ranges (``engine/service/chunked.py``):

- ``plan``: the source's service checks the table, makes the mirror, creates a temporary slot whose
  exported snapshot it keeps open, and plans the ranges; one dynamic output per range;
- ``copy_chunk`` (one step per range): imports the snapshot, copies its range and writes Parquet
  files with their key hashes under ``<warehouse>/mooncake-staging/<slot>/``;
- ``publish``: the service takes the staged files into the mirror and goes live, one Iceberg commit
  at the snapshot's LSN; then CDC goes on from there.

The job runs on Dagster's multiprocess executor, so the steps are separate processes; a cluster's
executor (Kubernetes, Celery) spreads them over machines that reach Postgres and the warehouse. A
failed chunk aborts the copy (the mirror it began is undone, its slot and staged files removed).

Run config: ``ops: {plan: {config: {table: "name" | "name=schema.table", parts: 4,
min_range_pages: 1024, delete_format: "deletion-vectors"}}}``.
"""

import dagster as dg
from pydantic import Field

from mooncake_assets.dagster.resources.replication import ReplicationResource, TableSpec
from mooncake_assets.engine.service.chunked import copy_chunk, staging_filesystem
from mooncake_assets.engine.storage import warehouse_store

JOB = "chunked_copy"


class ChunkedCopyConfig(dg.Config):
    """What to mirror and how many chunks."""

    table: str = Field(description="The mirror: 'name' (a configured mirror), 'schema.table' or 'name=schema.table'.")
    parts: int = Field(4, ge=1, description="Chunks: the heap is cut into up to this many CTID ranges, one step each.")
    min_range_pages: int = Field(1024, ge=1, description="The smallest range worth a chunk (8 KiB pages).")
    delete_format: str = Field("deletion-vectors", description="deletion-vectors or position-deletes.")


#: the multiprocess executor, its step processes forked from a server that imported the job's modules
#: once (a step then starts in well under a second instead of importing Dagster and pyarrow anew)
EXECUTOR = dg.multiprocess_executor.configured(
    {"start_method": {"forkserver": {"preload_modules": ["mooncake_assets.dagster.jobs.chunked"]}}},
    name="chunked_copy_executor",
)


def job_name(source: str | None) -> str:
    """``chunked_copy`` or ``chunked_copy__<source>``."""
    return JOB if source is None else f"{JOB}__{source}"


def _spec(resource: ReplicationResource, text: str) -> TableSpec:
    """A configured mirror by name, else ``text`` parsed as :meth:`TableSpec.parse` parses it."""
    for t in resource.table_specs():
        if t.name == text:
            return t
    return TableSpec.parse(text)


def build_chunked_copy_job(source: str | None, resource_key: str) -> dg.JobDefinition:
    """The chunked copy job of one source (its :class:`ReplicationResource` under ``resource_key``),
    on the multiprocess executor."""
    suffix = "" if source is None else f"__{source}"

    @dg.op(
        name=f"plan{suffix}",
        required_resource_keys={resource_key},
        out={"chunks": dg.DynamicOut(dict), "plan": dg.Out(dict)},
    )
    def plan(context: dg.OpExecutionContext, config: ChunkedCopyConfig):
        """Ask the service to begin the copy (``chunked_copy_begin``): the plan dict (slot, exported
        snapshot, copy LSN, CTID ranges, staging root) on ``plan`` and one ``chunks`` output per range."""
        resource: ReplicationResource = getattr(context.resources, resource_key)
        spec = _spec(resource, config.table)
        resource.ensure_running()
        p = resource.call(
            "chunked_copy_begin",
            dst=spec.name,
            src=spec.source,
            delete_format=config.delete_format,
            parts=config.parts,
            min_range_pages=config.min_range_pages,
        )
        context.log.info(f"table {spec.name}: {len(p['ranges'])} chunks at {p['copy_lsn']} (slot {p['slot']})")
        yield dg.Output(p, "plan")
        for i in range(len(p["ranges"])):
            yield dg.DynamicOutput({**p, "index": i}, output_name="chunks", mapping_key=f"r{i}")

    @dg.op(name=f"copy_chunk{suffix}", required_resource_keys={resource_key})
    def chunk(context: dg.OpExecutionContext, item: dict) -> dict:
        """Copy one CTID range of the exported snapshot to Parquet under the staging root
        (:func:`copy_chunk`); a failure gives up the whole copy (``chunked_copy_abort``) and re-raises."""
        resource: ReplicationResource = getattr(context.resources, resource_key)
        s = resource.settings()
        fs, root = staging_filesystem(s.warehouse_uri, warehouse_store(s))
        try:
            done = copy_chunk(resource.source_dsn(), item, item["index"], fs, root)
        except BaseException:
            try:  # one failed chunk ends the copy: nothing half-made is left
                resource.call("chunked_copy_abort", slot=item["slot"])
            except Exception:
                pass
            raise
        context.log.info(f"{done['range']}: {done['rows']} rows in {done['seconds']} s")
        return {**done, "slot": item["slot"]}

    @dg.op(name=f"publish{suffix}", required_resource_keys={resource_key})
    def publish(context: dg.OpExecutionContext, p: dict, done: list[dict]) -> dict:
        """Once every chunk is staged: ``chunked_copy_finish``, one Iceberg commit at the snapshot's LSN;
        returns the service's ``{"table", "rows", "files", "copy_lsn", …}``."""
        resource: ReplicationResource = getattr(context.resources, resource_key)
        out = resource.call("chunked_copy_finish", slot=p["slot"])
        context.log.info(f"table {out['table']}: {out['rows']} rows in {out['files']} files at {out['copy_lsn']}")
        context.add_output_metadata({"rows": out["rows"], "copy_lsn": out["copy_lsn"], "chunks": len(done)})
        return out

    @dg.graph(name=job_name(source))
    def chunked_copy():
        """plan → copy_chunk per range (a separate step each) → publish."""
        chunks, p = plan()
        publish(p, chunks.map(chunk).collect())

    return chunked_copy.to_job(
        name=job_name(source),
        executor_def=EXECUTOR,
        description="Mirror one table with its initial copy cut into chunks that run as separate steps "
        "(docs/scaling.md).",
    )


def job_for_state_dir(state_dir: str) -> dg.JobDefinition:
    """The ``chunked_copy`` job bound to the service of ``state_dir`` (its settings.json gives the DSN,
    warehouse and catalog): what ``dg.build_reconstructable_job`` rebuilds in each step's process when
    the job runs outside a code location (scripts, tests)."""
    defs = dg.Definitions(
        jobs=[build_chunked_copy_job(None, "replication")],
        resources={"replication": ReplicationResource(state_dir=state_dir, tables=[])},
    )
    return defs.get_job_def(JOB)
