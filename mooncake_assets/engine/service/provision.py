"""Table provisioning: create-table (checks, publication, consistent initial copy) and drop-table.

create-table runs in phases, each undone when a later one fails (:meth:`TableProvisioner._undo`):
the request is checked (:meth:`~TableProvisioner._check_request`), the source table found and checked
(:meth:`~TableProvisioner._source_schema`: the pre-flight checks of ``engine/pg/preflight.py``;
``REPLICA IDENTITY FULL`` for a keyless table), the Iceberg table made and registered as copying
(:meth:`~TableProvisioner._new_mirror`), the table published (:meth:`~TableProvisioner._publish`),
copied at a temporary slot's exported snapshot (:meth:`~TableProvisioner._copy_at_snapshot`), and the
changes queued meanwhile applied before the mirror goes live (:meth:`~TableProvisioner._go_live`).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..cdc import ReplicationConnection, initial_copy
from ..iceberg import IcebergMirrorTable
from ..index.file_index import sorted_run
from ..lsn import Lsn
from ..pg import preflight
from ..pg import publication as pubs
from ..pg.catalog import describe_table, estimate_rows, nan_columns
from ..pg.conninfo import connect_error, with_options
from ..pg.names import InvalidName, TableName, case_collision, check_mirror_name, resolve_table
from ..pg.schema import TableSchema, column_option_hint, column_signature
from ..pg.slot import drop_slot
from ..table.disk_files import MAX_FILE_ROWS, PARQUET_COMPRESSION, ROW_GROUP_ROWS
from ..table.mirror import MirrorTable
from .errors import MooncakeError
from .parts import ProvisionerHost
from .registry import NAMESPACE
from .replication import apply_item

__all__ = ["TableProvisioner"]

log = logging.getLogger("mooncake.service")


def _refuse_nan_decimals(conn: psycopg.Connection[Any], schema: TableSchema) -> None:
    """Refuse a table whose ``numeric(p,s)`` columns (mapped to decimal128, which has no NaN) hold
    ``NaN`` now (:func:`~..pg.catalog.nan_columns`): the error names every such column and the
    create-table options that get past them (``MooncakeError``)."""
    bad = nan_columns(conn, schema)
    if bad:
        raise MooncakeError(
            f"table {schema.qualified_name}: column(s) "
            + ", ".join(f"{c.name} ({c.type_name})" for c in bad)
            + " hold 'NaN', which the Iceberg decimal they map to cannot hold; "
            + column_option_hint([c.name for c in bad])
        )


@dataclass
class _Create:
    """One create-table in progress: its request, its source connection and what it made so far
    (for :meth:`TableProvisioner._undo`)."""

    dst: str
    src: str
    delete_format: str
    column_types: dict[str, str]
    exclude: list[str]
    conn: psycopg.Connection[Any]
    ice: IcebergMirrorTable | None = None
    cp: dict[str, Any] | None = None
    created_pub: bool = False
    added_pub: bool = False


class TableProvisioner:
    """create-table and drop-table of one service. ``svc``: the :class:`~.service.ReplicatorService`
    as a :class:`~.parts.ProvisionerHost` (its lock, registry, Iceberg catalog, stream loop and source
    catalog)."""

    def __init__(self, svc: ProvisionerHost) -> None:
        self.svc = svc
        self.reg = svc.reg
        self.lock = svc.lock
        self.config = svc.config
        self.dsn = svc.config.dsn

    def create_table(
        self,
        dst: str,
        src: str,
        delete_format: str = "deletion-vectors",
        column_types: dict[str, str] | None = None,
        exclude: list[str] | None = None,
        **kw: Any,
    ) -> dict[str, Any]:
        """Mirror Postgres table ``src`` as ``dst``: publication, consistent initial copy, then CDC.

        ``column_types``: column -> ``"text"`` (mirror it as Postgres's exact text whatever its type);
        ``exclude``: columns left out of the mirror. Both are recorded with the mirror (registry) and
        apply across restarts. The result's ``text_columns``: ``[name, type]`` of the columns mirrored
        as their exact text (no structured mapping, or asked for).

        First the pre-flight checks of ``src`` (:func:`~..pg.preflight.table_checks`, and the slot and
        WAL sender checks) run; any error among them is raised before anything is changed, with the
        statement that fixes it. Then a table without a key gets ``REPLICA IDENTITY FULL`` (only when
        the role owns it; else the check asked an administrator to set it), the table goes into the
        service's own publication (never into an administrator's: it must be in it already), and
        the copy runs. ``publication`` (keyword, from the CLI): the publication the caller expects;
        a running service with another one refuses.

        Errors (``MooncakeError``, one line, nothing left half-created): a failed check, missing table,
        a column that cannot be mirrored exactly (every such column named, with the options that get
        past them), a ``numeric(p,s)`` column holding ``NaN`` (idem), a name already in use, an
        unreachable Postgres."""
        column_types = dict(column_types or {})
        exclude = list(exclude or [])
        self._check_request(dst, src, delete_format, kw)
        t0 = time.time()
        try:
            conn = psycopg.connect(with_options(self.dsn), autocommit=True)
        except psycopg.OperationalError as e:
            raise MooncakeError(f"cannot connect to Postgres: {connect_error(e)}") from None
        job = _Create(dst, src, delete_format, column_types, exclude, conn)
        try:
            schema = self._source_schema(job)
            table = self._new_mirror(job, schema)
            self._publish(job, schema)
            rows, copy_lsn = self._copy_at_snapshot(job, table, schema)
            self._go_live(job, table, schema, copy_lsn)
            return {
                "table": dst,
                "source": job.src,
                "rows": rows,
                "copy_lsn": str(Lsn(copy_lsn)),
                "seconds": round(time.time() - t0, 3),
                "key": schema.key_columns,
                "replica_identity": schema.replica_identity,
                "text_columns": [[c.name, c.type_name] for c in schema.columns if c.as_text],
                "excluded": exclude,
            }
        except BaseException:
            self._undo(job)
            raise
        finally:
            conn.close()

    def _check_request(self, dst: str, src: str, delete_format: str, kw: dict[str, Any]) -> None:
        """What create-table refuses before it connects: a bad delete format, another publication than
        the running service reads, an unreachable warehouse, a bad or taken mirror name, a source that
        is mirrored already (``MooncakeError``)."""
        if delete_format not in ("deletion-vectors", "position-deletes"):
            raise MooncakeError(f"delete_format must be deletion-vectors or position-deletes, not {delete_format!r}")
        if "publication" in kw and (kw["publication"] or None) != self.config.publication:
            raise MooncakeError(
                f"the running service reads {'publication ' + self.config.publication if self.config.publication else 'its own publication'}"
                f", not {'publication ' + kw['publication'] if kw['publication'] else 'its own'}: stop it "
                "(mooncake stop) and run the command again"
            )
        self.reg.check_publication_setting()
        try:  # a missing bucket, rejected credentials or a dead endpoint: one clear line, nothing created
            storage.check_warehouse(self.config.warehouse_uri, storage.warehouse_store(self.config))
        except storage.StorageError as e:
            raise MooncakeError(str(e)) from None
        try:
            check_mirror_name(dst)
        except InvalidName as e:
            raise MooncakeError(str(e)) from None
        with self.lock:
            if dst in self.reg.tables or dst in self.reg.doc["tables"]:
                raise MooncakeError(f"a mirrored table named {dst!r} already exists")
            same = [n for n in list(self.reg.tables) + list(self.reg.doc["tables"]) if n.lower() == dst.lower()]
            if same:
                raise MooncakeError(
                    f"mirror name {dst!r} differs from the existing mirror {same[0]!r} only in case; "
                    "mirror names must differ in more than case"
                )
            self.reg.refuse_second_mirror(dst, src)

    def _source_schema(self, job: _Create) -> TableSchema:
        """The source table found (``job.src`` becomes its quoted name), checked (pre-flight, column
        names, NaN in decimal columns, one mirror per source) and, when it has no key, given
        ``REPLICA IDENTITY FULL``: the schema to mirror. Nothing is changed before the checks pass."""
        conn = job.conn
        try:  # parsed and found as Postgres does (parse_ident, to_regclass); kept in its quoted form
            src_oid, src_name = resolve_table(conn, job.src)
        except InvalidName as e:
            raise MooncakeError(str(e)) from None
        src = job.src = str(src_name)
        # nothing is changed before it passes; the schema it read (with the column options) is mirrored
        schema = self._preflight(conn, src_name, src_oid, job.column_types, job.exclude)
        clash = case_collision(c.name for c in schema.columns)
        if clash:
            raise MooncakeError(
                f'table {src}: columns "{clash[0]}" and "{clash[1]}" differ only in case, which '
                "union reads (DuckDB) cannot tell apart; rename one of them on the source"
            )
        _refuse_nan_decimals(conn, schema)
        with self.lock:  # the same table under another name (search_path, quoting, a concurrent create)
            self.reg.refuse_second_mirror(job.dst, src, schema.oid)
        todo = [] if schema.has_primary_key or schema.key_columns else preflight.identity_todo(conn, schema)
        if todo:
            # the pre-flight check passed, so the role owns the table(s): set FULL on the table and,
            # for a partitioned one, on each partition (they log their own old rows)
            preflight.set_identity_full(conn, todo)
            schema = describe_table(conn, src, column_types=job.column_types, exclude=job.exclude)
        return schema

    def _new_mirror(self, job: _Create, schema: TableSchema) -> MirrorTable:
        """The mirror's empty Iceberg table (replacing one an interrupted create-table left) and its
        :class:`MirrorTable`, registered as being copied: the stream queues its changes from now on."""
        dst, catalog = job.dst, self.svc.catalog
        ident = self.reg.ident(dst)
        try:
            catalog.create_namespace_if_not_exists(NAMESPACE)
        except Exception:
            pass
        if catalog.table_exists(ident):  # not in the registry: left by a create that was killed
            log.warning("table %s: dropping the Iceberg table an interrupted create-table left", dst)
            self.reg.drop_iceberg(dst)
        shutil.rmtree(self.config.state_dir / "tables" / dst, ignore_errors=True)
        job.ice = IcebergMirrorTable.create(
            catalog,
            ident,
            schema.arrow_schema(),
            delete_format=job.delete_format,
            properties={"mooncake.source": job.src},
        )
        table = MirrorTable(dst, job.src, schema, job.ice, self.config.state_dir / "tables" / dst)
        with self.lock:
            job.cp = {"table": table, "copy_lsn": 0, "queue": []}  # queue all until the copy LSN is known
            self.reg.copying[schema.oid] = job.cp
            self.reg.progress[dst] = {"rows": 0, "bytes": 0, "total_rows": estimate_rows(job.conn, schema.oid)}
        return table

    def _publish(self, job: _Create, schema: TableSchema) -> None:
        """Add the table to the service's own publication (an administrator's is only read: the
        pre-flight check found the table in it); Postgres 18 is asked to send its stored generated
        columns."""
        if not self.reg.own_publication:
            return
        done = pubs.add_table(job.conn, self.reg.publication, schema.schema, schema.name, schema.oid)
        job.created_pub, job.added_pub = done == "created", done == "added"
        if any(c.generated for c in schema.columns):
            pubs.publish_generated_columns(job.conn, self.reg.publication)

    def _copy_at_snapshot(self, job: _Create, table: MirrorTable, schema: TableSchema) -> tuple[int, int]:
        """The initial copy at the snapshot a temporary slot exports; its consistent point (the copy
        LSN) splits copy and stream. Returns ``(rows, copy LSN)``; a value a column's mapping cannot
        hold raises ``MooncakeError`` naming the options that get past it."""
        self.svc.stream.ensure_slot()
        tmp = ReplicationConnection(with_options(self.dsn))
        try:
            tmp_slot = f"mooncake_copy_{uuid.uuid4().hex[:8]}"
            copy_lsn, snap = tmp.create_slot(tmp_slot, export_snapshot=True, temporary=True)
            assert snap is not None  # export_snapshot=True: the slot exported its snapshot
            with self.lock:
                assert job.cp is not None  # _new_mirror registered the copy
                job.cp["copy_lsn"] = copy_lsn
            self.svc.stream.ensure_stream()
            try:
                return self._copy(table, schema, snap), copy_lsn
            except ValueError as e:  # a value its column's mapping cannot hold: name the way past it
                if not getattr(e, "columns", None):
                    raise
                raise MooncakeError(
                    f"table {job.src}: initial copy: {e}; {column_option_hint(cast(Any, e).columns)}"
                ) from None
        finally:
            tmp.close()

    def _go_live(self, job: _Create, table: MirrorTable, schema: TableSchema, copy_lsn: int) -> None:
        """Under the lock: apply the changes queued during the copy (those at or after the copy LSN, in
        commit order), route the source's changes to the mirror, persist the copy and record the mirror
        as ``ready`` in the registry."""
        with self.lock:
            self.reg.copying.pop(schema.oid, None)
            table.applied_lsn = max(copy_lsn, self.svc.stream.applied_lsn)
            table.flushed_lsn = copy_lsn
            table.flush_lsn = 0
            if table.error:  # stopped while copying (its generated columns could not be computed)
                raise MooncakeError(table.error)
            # changes that arrived during the copy, in commit order
            assert job.cp is not None  # _new_mirror registered the copy
            for commit_lsn, _end_lsn, item, rel, xid in job.cp["queue"]:  # changes or columnar runs
                if commit_lsn < copy_lsn:
                    continue  # in the copy's snapshot
                apply_item(table, schema.oid, item, rel, commit_lsn, xid, self.svc.source_catalog)
                table.last_change_lsn = max(table.last_change_lsn, commit_lsn)
            self.reg.tables[job.dst] = table
            self.reg.by_oid[schema.oid] = table
            table.applied_lsn = max(table.applied_lsn, self.svc.stream.applied_lsn)
            # persist the copy: the flush LSN is the copy's consistent point unless more was applied
            table.flush_lsn = 0
            table.persist()
            self.reg.doc["tables"][job.dst] = {
                "source": job.src,
                "delete_format": job.delete_format,
                "state": "ready",
                "oid": schema.oid,
                "columns": column_signature(schema),
                "key": list(schema.key_columns),
                **({"column_types": job.column_types} if job.column_types else {}),
                **({"exclude": job.exclude} if job.exclude else {}),
            }
            self.reg.doc["admin_publication"] = self.config.publication
            (self.reg.doc.get("interrupted") or {}).pop(job.dst, None)  # mirrored again: no longer interrupted
            self.svc.stream.pub_seen[job.dst] = copy_lsn
            self.reg.save()
            self.reg.progress.pop(job.dst, None)

    def _undo(self, job: _Create) -> None:
        """What a failed create-table made, undone: registry entries, the Iceberg table, the publication
        change (best effort) and local staging."""
        dst, cp = job.dst, job.cp
        with self.lock:
            if cp is not None:
                self.reg.copying.pop(cp["table"].schema.oid, None)
            self.reg.tables.pop(dst, None)
            self.reg.progress.pop(dst, None)
            self.reg.doc["tables"].pop(dst, None)
        if job.ice is not None:
            self.reg.drop_iceberg(dst)
        try:
            if job.created_pub:
                pubs.drop(job.conn, self.reg.publication)
            elif job.added_pub:
                assert cp is not None  # the table was added to the publication after _new_mirror registered the copy
                pubs.remove_table(job.conn, self.reg.publication, cp["table"].schema.schema, cp["table"].schema.name)
        except Exception:
            pass
        shutil.rmtree(self.config.state_dir / "tables" / dst, ignore_errors=True)

    def _preflight(
        self,
        conn: psycopg.Connection[Any],
        src: TableName,
        oid: int,
        column_types: dict[str, str] | None = None,
        exclude: list[str] | None = None,
    ) -> TableSchema:
        """The pre-flight checks create-table runs before it changes anything (slots, WAL senders,
        wal_level and the table's own checks, with its column options) on the table ``src`` (``oid``,
        as ``resolve_table`` found it). Returns the table's schema as the checks read it (with the
        column options); raises MooncakeError with every error and its fix, one line."""
        checks = [
            c
            for c in preflight.server_checks(conn, self.reg.slot)
            if c.subject in ("wal_level", "replication slots", "WAL senders")
        ]
        table, schema = preflight.table_checks(
            conn,
            src,
            oid,
            publication=self.config.publication,
            own_publication=self.reg.doc["publication"],
            column_types=column_types,
            exclude=exclude,
        )
        errors = [c for c in checks + table if c.level == "error"]
        if errors:
            raise MooncakeError(f"cannot mirror {src}: " + " | ".join(c.sentence() for c in errors))
        assert schema is not None  # table_checks reads it unless one of its checks failed
        return schema

    def _copy(self, table: MirrorTable, schema: TableSchema, snapshot: str) -> int:
        """Initial copy at the exported snapshot into Parquet files (≤ ``MAX_FILE_ROWS`` rows each)
        with IndexBlocks.

        The reading connections' threads (:func:`~..cdc.copy.initial_copy`'s ``prepare``) decode each
        batch, hash its keys and sort the hashes (a sorted run); this thread only writes the batches
        to Parquet, and each file's IndexBlock is the merge of its runs (linear) instead of a sort of
        the whole file after its last batch."""
        total = 0

        def prepare(
            item: tuple[pa.RecordBatch, list[pa.Array]],
        ) -> tuple[pa.RecordBatch, tuple[np.ndarray, np.ndarray]]:
            rb, key_text = item
            return rb, sorted_run(table.hasher.hash_columns(key_text))

        with psycopg.connect(with_options(self.dsn)) as c:
            writer: Any  # a pyarrow ParquetWriter while a file is open (pyarrow has no type information)
            path: Path | None
            runs: list[tuple[np.ndarray, np.ndarray]]
            writer, path, n, runs = None, None, 0, []

            def close() -> None:
                nonlocal writer, path, n, runs
                if writer is not None:
                    writer.close()
                    assert path is not None  # opened together with the writer
                    table.add_copied_file(path, n, runs)
                writer, path, n, runs = None, None, 0, []

            for rb, (hashes, rows) in initial_copy(
                c,
                schema,
                snapshot,
                text_columns=table.key_names,
                text_as_arrow=True,
                progress=lambda r, b: self.reg.progress.get(table.name, {}).update(rows=r, bytes=b),
                parallel=self.config.copy_parallel,
                connect=lambda: psycopg.connect(with_options(self.dsn)),
                prepare=prepare,
            ):
                if writer is None:
                    path = table.dir / "staging" / f"{uuid.uuid4().hex}.parquet"
                    writer = pq.ParquetWriter(path, table.arrow_schema, compression=PARQUET_COMPRESSION)
                writer.write_batch(rb, row_group_size=ROW_GROUP_ROWS)
                runs.append((hashes, rows + np.uint64(n)))  # the batch's rows follow the file's first n
                n += rb.num_rows
                total += rb.num_rows
                if n >= MAX_FILE_ROWS:
                    close()
            close()
        return total

    def drop_table(self, name: str) -> dict[str, Any]:
        """Stop mirroring ``name``: remove it from the service's own publication (an administrator's is
        left as it is), drop its Iceberg table and local state; drop the slot (and the own
        publication) when it was the last table."""
        with self.lock:
            t = self.reg.table(name)
            self.reg.tables.pop(name)
            if self.reg.by_oid.get(t.schema.oid) is t:
                self.reg.by_oid.pop(t.schema.oid)
            meta = self.reg.doc["tables"].pop(name, None) or {}
            self.reg.save()
            last = not self.reg.doc["tables"]
            # a state dir made before mirrors were one per source may hold two of one source: the source
            # leaves the publication only with its last mirror
            shared = [
                n
                for n, m in self.reg.doc["tables"].items()
                if m.get("source") == t.source or (meta.get("oid") is not None and m.get("oid") == meta.get("oid"))
            ]
        with psycopg.connect(self.dsn, autocommit=True) as c:
            if self.reg.own_publication and not shared:  # an administrator's publication is never altered
                pubs.remove_table(c, self.reg.publication, t.schema.schema, t.schema.name)
            if last:
                self.svc.stream.halt()
                if self.reg.own_publication:
                    pubs.drop(c, self.reg.publication)
                self.reg.doc.pop("admin_publication", None)
                self.reg.save()
                drop_slot(c, self.reg.slot)
        self.reg.drop_iceberg(name)
        shutil.rmtree(t.dir, ignore_errors=True)
        return {"dropped": name, "slot_dropped": last}
