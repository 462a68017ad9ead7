"""Chunked initial copy: create-table's copy cut into CTID ranges that separate workers copy.

The service (:class:`ChunkedCopies`) does what create-table does up to the copy (checks, the Iceberg
table, the publication), creates a temporary slot that exports its snapshot and keeps that
replication connection open: the snapshot stays importable (PG docs, "Snapshot Synchronization
Functions") until :meth:`ChunkedCopies.finish` or :meth:`ChunkedCopies.abort`. Its plan is the
heap's CTID ranges (:func:`~..cdc.copy.copy_plan`).

A worker (:func:`copy_chunk`, any process that reaches Postgres and the warehouse; a Dagster step in
``mooncake_assets/dagster/jobs/chunked.py``) imports the snapshot, copies one range with
:func:`~..cdc.copy.copy_range` and writes Parquet files (≤ ``ROWS_PER_FILE`` rows) with their key
hashes (``.hash.npy``) under ``<warehouse>/mooncake-staging/<slot>/``.

:meth:`ChunkedCopies.finish` takes every staged file into the mirror and goes live as create-table
does: the files and the changes queued since the snapshot are published by one Iceberg commit whose
LSN is the snapshot's (the slot's consistent point). The union of the ranges at one snapshot is the
table at that snapshot, so the result equals create-table's.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow.parquet as pq
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from .. import storage
from ..cdc import ReplicationConnection
from ..cdc.copy import begin_copy_transaction, copy_plan, copy_range
from ..cdc.ranges import CtidRange, plan_ctid_ranges, table_pages
from ..index.key_hash import KeyHash
from ..lsn import Lsn
from ..pg.catalog import describe_table
from ..pg.conninfo import connect_error, with_options
from ..pg.schema import TableSchema
from ..table.mirror import MirrorTable
from .errors import MooncakeError

__all__ = ["ChunkedCopies", "copy_chunk", "staging_filesystem", "STAGING_DIR", "ROWS_PER_FILE"]

log = logging.getLogger("mooncake.service")

#: the folder under the warehouse that holds the chunks' Parquet files until ``finish``
STAGING_DIR = "mooncake-staging"
#: rows per staged Parquet file (create-table's copy cuts its files at the same count)
ROWS_PER_FILE = 1_000_000


def staging_filesystem(warehouse_uri: str, store: Any) -> tuple[AbstractFileSystem, str]:
    """``(fsspec filesystem, root path)`` of ``<warehouse>/mooncake-staging`` for ``warehouse_uri``
    (``store``: its :func:`~..storage.warehouse_store` config, None for a local warehouse)."""
    kind = storage.store_kind(warehouse_uri)
    if kind == "file":
        root = warehouse_uri[len("file://") :] if warehouse_uri.startswith("file://") else warehouse_uri
        return LocalFileSystem(auto_mkdir=True), f"{root.rstrip('/')}/{STAGING_DIR}"
    return storage.store_filesystem(kind, store), f"{warehouse_uri.split('://', 1)[1].rstrip('/')}/{STAGING_DIR}"


def _key_hasher(schema: TableSchema) -> tuple[list[str], KeyHash]:
    """The columns a new mirror of ``schema`` hashes its rows' keys from, and the hasher (as
    :class:`~..table.mirror.MirrorTable` makes them: the key, or the whole row of a key-less table)."""
    names = list(schema.key_columns) or [c.name for c in schema.columns]
    idx = [schema.column_index[n] for n in names]
    return names, KeyHash([schema.columns[i].type_oid for i in idx], keyed=bool(schema.key_columns))


def copy_chunk(
    dsn: str,
    plan: dict[str, Any],
    index: int,
    fs: AbstractFileSystem,
    root: str,
) -> dict[str, Any]:
    """Copy range ``index`` of ``plan`` (what :meth:`ChunkedCopies.begin` returned) at its snapshot
    into Parquet files under ``<root>/<slot>/`` (``fs``: :func:`staging_filesystem`).

    Returns ``{"range": "pages [a, b)", "rows": n, "files": [path, …], "seconds": s}``. Raises
    ``MooncakeError`` when Postgres cannot be reached or the snapshot is gone (the service that holds
    it stopped, or the copy was finished or aborted), ``ValueError`` naming a column whose value cannot
    be decoded."""
    t0 = time.time()
    start, end = plan["ranges"][index]
    rng = CtidRange(int(start), None if end is None else int(end))
    try:
        conn = psycopg.connect(with_options(dsn), autocommit=True)
    except psycopg.OperationalError as e:
        raise MooncakeError(f"cannot connect to Postgres: {connect_error(e)}") from None
    files: list[str] = []
    rows = 0
    try:
        try:
            begin_copy_transaction(conn, plan["snapshot"])
        except psycopg.Error as e:
            raise MooncakeError(
                f"table {plan['src']}: snapshot {plan['snapshot']} of slot {plan['slot']} is gone ({e}); "
                "begin the chunked copy again"
            ) from None
        schema = describe_table(conn, plan["src"], column_types=plan.get("column_types"), exclude=plan.get("exclude"))
        keys, hasher = _key_hasher(schema)
        writer: Any = None
        sink: Any = None
        hashes: list[np.ndarray] = []
        n = 0

        def close() -> None:
            nonlocal writer, sink, hashes, n
            if writer is not None:
                writer.close()
                sink.close()
                buf = io.BytesIO()
                np.save(buf, np.concatenate(hashes))
                with fs.open(files[-1][: -len(".parquet")] + ".hash.npy", "wb") as f:
                    f.write(buf.getvalue())
            writer, sink, hashes, n = None, None, [], 0

        for rb, key_text in copy_range(conn, schema, rng, text_columns=keys, text_as_arrow=True):
            if writer is None:
                files.append(f"{root}/{plan['slot']}/{index:05d}-{uuid.uuid4().hex[:8]}.parquet")
                sink = fs.open(files[-1], "wb")
                writer = pq.ParquetWriter(sink, schema.arrow_schema(), compression="zstd")
            writer.write_batch(rb, row_group_size=128 * 1024)
            hashes.append(hasher.hash_columns(key_text))
            n += rb.num_rows
            rows += rb.num_rows
            if n >= ROWS_PER_FILE:
                close()
        close()
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {"range": str(rng), "rows": rows, "files": files, "seconds": round(time.time() - t0, 3)}


@dataclass
class _Pending:
    """One chunked copy between begin and finish: create-table's job, the mirror, the schema, and the
    replication connection whose temporary slot exported the snapshot."""

    job: Any
    table: MirrorTable
    schema: TableSchema
    holder: ReplicationConnection
    copy_lsn: int
    plan: dict[str, Any]


class ChunkedCopies:
    """The chunked copies of one service (``provisioner``: its :class:`~.provision.TableProvisioner`)."""

    def __init__(self, provisioner: Any) -> None:
        self.prov = provisioner
        self.pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    def staging(self) -> tuple[AbstractFileSystem, str]:
        """The staging filesystem and root of this service's warehouse."""
        cfg = self.prov.config
        return staging_filesystem(cfg.warehouse_uri, storage.warehouse_store(cfg))

    def begin(
        self,
        dst: str,
        src: str,
        delete_format: str = "deletion-vectors",
        column_types: dict[str, str] | None = None,
        exclude: list[str] | None = None,
        parts: int = 4,
        min_range_pages: int = 1024,
    ) -> dict[str, Any]:
        """Start mirroring ``src`` as ``dst`` with a chunked copy: everything create-table checks and
        makes before its copy, a temporary slot whose exported snapshot stays open, and the plan.

        Returns the plan ``{"slot", "snapshot", "copy_lsn", "src", "dst", "ranges": [[start, end|None],
        …], "column_types", "exclude", "staging": "<warehouse>/mooncake-staging/<slot>"}``: up to
        ``parts`` ranges (chunks) of at least ``min_range_pages`` pages (one for a partitioned table or
        a server before Postgres 14). Errors as create-table's
        (``MooncakeError``, nothing left half-created)."""
        from .provision import _Create  # one create-table job: its undo is the provisioner's

        prov, column_types, exclude = self.prov, dict(column_types or {}), list(exclude or [])
        prov._check_request(dst, src, delete_format, {})
        try:
            conn = psycopg.connect(with_options(prov.dsn), autocommit=True)
        except psycopg.OperationalError as e:
            raise MooncakeError(f"cannot connect to Postgres: {connect_error(e)}") from None
        job = _Create(dst, src, delete_format, column_types, exclude, conn)
        holder: ReplicationConnection | None = None
        try:
            schema = prov._source_schema(job)
            table = prov._new_mirror(job, schema)
            prov._publish(job, schema)
            prov.svc.stream.ensure_slot()
            holder = ReplicationConnection(with_options(prov.dsn))
            slot = f"mooncake_copy_{uuid.uuid4().hex[:8]}"
            copy_lsn, snap = holder.create_slot(slot, export_snapshot=True, temporary=True)
            assert snap is not None  # export_snapshot=True: the slot exported its snapshot
            with prov.lock:
                assert job.cp is not None  # _new_mirror registered the copy
                job.cp["copy_lsn"] = copy_lsn
            prov.svc.stream.ensure_stream()
            with psycopg.connect(with_options(prov.dsn), autocommit=True) as c:
                begin_copy_transaction(c, snap)
                ranges = copy_plan(c, schema, max(1, parts), min_range_pages)
                if len(ranges) > 1:  # one range per chunk: the executor's concurrency is the worker count
                    ranges = plan_ctid_ranges(table_pages(c, schema), parts, min_range_pages)
                c.execute("COMMIT")
            fs, root = self.staging()
            plan = {
                "slot": slot,
                "snapshot": snap,
                "copy_lsn": str(Lsn(copy_lsn)),
                "src": job.src,
                "dst": dst,
                "ranges": [[r.start, r.end] for r in ranges],
                "column_types": column_types,
                "exclude": exclude,
                "staging": f"{root}/{slot}",
            }
            with self._lock:
                self.pending[slot] = _Pending(job, table, schema, holder, copy_lsn, plan)
            log.info("table %s: chunked copy of %s begun at %s (%d ranges)", dst, job.src, Lsn(copy_lsn), len(ranges))
            return plan
        except BaseException:
            if holder is not None:
                holder.close()
            prov._undo(job)
            conn.close()
            raise

    def finish(self, slot: str) -> dict[str, Any]:
        """Take the staged files of chunked copy ``slot`` into its mirror and go live: the files and
        the changes since the snapshot are persisted by one Iceberg commit at the snapshot's LSN; the
        temporary slot and the staging folder go. Returns ``{"table", "source", "rows", "files",
        "copy_lsn", "seconds"}``. ``MooncakeError`` for an unknown slot; any failure undoes the mirror."""
        t0 = time.time()
        p = self._take(slot)
        fs, _ = self.staging()
        rows = 0
        try:
            staged = sorted(f for f in fs.find(p.plan["staging"]) if f.endswith(".parquet"))
            for path in staged:
                local = p.table.dir / "staging" / Path(path).name
                local.parent.mkdir(parents=True, exist_ok=True)
                fs.get(path, str(local))
                with fs.open(path[: -len(".parquet")] + ".hash.npy", "rb") as f:
                    hashes = np.load(io.BytesIO(f.read()))
                n = pq.ParquetFile(local).metadata.num_rows
                if len(hashes) != n:
                    raise MooncakeError(
                        f"table {p.plan['dst']}: staged file {path}: {n} rows but {len(hashes)} key hashes"
                    )
                p.table.add_copied_file(local, n, hashes)
                rows += n
            p.holder.close()  # the temporary slot goes with its connection
            self.prov._go_live(p.job, p.table, p.schema, p.copy_lsn)
        except BaseException:
            self._drop(p)
            raise
        finally:
            p.job.conn.close()
        self._remove_staged(p)
        return {
            "table": p.plan["dst"],
            "source": p.plan["src"],
            "rows": rows,
            "files": len(staged),
            "copy_lsn": p.plan["copy_lsn"],
            "seconds": round(time.time() - t0, 3),
        }

    def abort(self, slot: str) -> dict[str, Any]:
        """Give up chunked copy ``slot``: the mirror it began is undone, its slot and staged files go."""
        p = self._take(slot)
        try:
            self._drop(p)
        finally:
            p.job.conn.close()
        return {"aborted": slot, "table": p.plan["dst"]}

    def _take(self, slot: str) -> _Pending:
        with self._lock:
            p = self.pending.pop(slot, None)
        if p is None:
            raise MooncakeError(f"no chunked copy in progress with slot {slot!r}")
        return p

    def _drop(self, p: _Pending) -> None:
        """Undo what ``begin`` made and remove the staged files (best effort)."""
        p.holder.close()
        self.prov._undo(p.job)
        self._remove_staged(p)

    def _remove_staged(self, p: _Pending) -> None:
        """Remove the staging folder of ``p`` (best effort: a warning names what is left)."""
        try:
            fs, _ = self.staging()
            if fs.exists(p.plan["staging"]):
                fs.rm(p.plan["staging"], recursive=True)
        except Exception:
            log.warning("chunked copy %s: staged files left in %s", p.plan["slot"], p.plan["staging"])

    def close(self) -> None:
        """Abort every chunked copy in progress (the service stops)."""
        for slot in list(self.pending):
            try:
                self.abort(slot)
            except Exception:
                pass
