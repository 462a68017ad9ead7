"""``mooncake verify``: compare each mirror with its source at one LSN (docs/architecture.md#command-line).

The source side is read at an exported snapshot of a *temporary logical slot*: that snapshot holds
exactly the transactions whose commit record starts before the slot's consistent point C, the same
rule the mirror's LSNs follow, so "source at C" and "mirror at C" are the same point in history.

Readers of the mirror:
- ``union`` (default): the service's union read at exactly C (after waiting for it to apply C);
- ``pyiceberg``: PyIceberg's scan of the persisted Iceberg table (persisted state only);
- ``duckdb-iceberg``: DuckDB's iceberg extension (``iceberg_scan``) over the same metadata;
- ``iceberg-rust``: iceberg-rust (``pyiceberg-core``) scanned by DataFusion;
- ``polars``: ``polars.scan_iceberg``.
All but ``union`` see only what was persisted (``mooncake_assets/readers.py``): they match when the source
has not changed since the last persist (e.g. after ``mooncake demo``).

Rows are compared as multisets with DuckDB (``EXCEPT ALL`` both ways) after the source rows were
decoded by the same text decoder the mirror uses.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import duckdb
import psycopg
import pyarrow as pa

from .config import Settings
from .engine.cdc import ReplicationConnection, describe_table, initial_copy
from .engine.lsn import Lsn
from .readers import READERS as ICEBERG_READERS
from .readers import read_mirror, require

READERS = ("union", *ICEBERG_READERS)


def _rows(n) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


@dataclass
class TableResult:
    name: str
    source: str
    match: bool
    source_rows: int
    mirror_rows: int
    missing: int  # rows in the source, not in the mirror
    extra: int  # rows in the mirror, not in the source
    error: str | None = None
    columns: list | None = None  # on a mismatch: the columns whose values differ (as multisets)
    note: str | None = None  # on a mismatch: what explains it (e.g. the mirror is stopped by an error)
    skipped: str | None = None  # not compared, and why (a read-only mirror whose source table was dropped)

    def line(self) -> str:
        if self.skipped:
            return f"{self.name} ({self.source}): skipped — {self.skipped}"
        if self.error:
            return f"{self.name}: ERROR {self.error}"
        state = "match" if self.match else "MISMATCH"
        return (
            f"{self.name} ({self.source}): {state} — source {_rows(self.source_rows)}, mirror {_rows(self.mirror_rows)}"
            + ("" if self.match else f", {self.missing} missing, {self.extra} extra")
            + (f" (values differ in: {', '.join(self.columns)})" if self.columns else "")
            + (f"; {self.note}" if self.note else "")
        )


def registry(settings: Settings) -> dict:
    p = settings.state_dir / "tables.json"
    if not p.exists():
        return {"tables": {}}
    return json.loads(p.read_text())


def compare(src: pa.Table, mir: pa.Table) -> tuple[int, int]:
    """(rows of ``src`` missing from ``mir``, rows of ``mir`` not in ``src``), as multisets."""
    con = duckdb.connect()
    mir = mir.select(src.column_names)
    con.register("s", src)
    con.register("m", mir)
    missing = con.execute("SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM m)").fetchone()[0]
    extra = con.execute("SELECT count(*) FROM (SELECT * FROM m EXCEPT ALL SELECT * FROM s)").fetchone()[0]
    return missing, extra


def differing_columns(src: pa.Table, mir: pa.Table) -> list[str]:
    """The columns whose values differ between ``src`` and ``mir`` as multisets (a diagnosis for a
    mismatch: a column read wrong shows up here, a row missing shows up in every column)."""
    con = duckdb.connect()
    con.register("s", src)
    con.register("m", mir.select(src.column_names))
    out = []
    for c in src.column_names:
        q = '"' + c.replace('"', '""') + '"'
        if con.execute(f"SELECT count(*) FROM (SELECT {q} FROM s EXCEPT ALL SELECT {q} FROM m)").fetchone()[0]:
            out.append(c)
    return out


def _mirror_rows(settings: Settings, name: str, reader: str, lsn: str, client=None) -> pa.Table:
    if reader == "union":
        from .engine.read import UnionReader

        r = UnionReader(client)
        return r.read_table(name, lsn=lsn)
    from .engine.iceberg import make_catalog
    from .engine.storage import catalog_properties, warehouse_store

    catalog = make_catalog(settings.catalog, settings.warehouse_uri, **catalog_properties(settings))
    tbl = catalog.load_table(f"mooncake.{name}")
    return read_mirror(reader, tbl, warehouse_store(settings))


def _persisted_lsn(settings: Settings, name: str) -> str | None:
    """``mooncake.flush-lsn`` (``X/Y``) of the mirror's current Iceberg snapshot: the point the readers
    of the persisted table see (None without a snapshot or the summary field)."""
    from .engine.iceberg import SUMMARY_FLUSH_LSN, make_catalog
    from .engine.storage import catalog_properties

    catalog = make_catalog(settings.catalog, settings.warehouse_uri, **catalog_properties(settings))
    snap = catalog.load_table(f"mooncake.{name}").current_snapshot()
    props = snap.summary.additional_properties if snap is not None and snap.summary is not None else {}
    return props.get(SUMMARY_FLUSH_LSN)


def _not_persisted_note(settings: Settings, result: TableResult, reader: str, lsn: str) -> TableResult:
    """A mismatch seen by a reader of the persisted table whose snapshot is older than ``lsn`` gets a note
    saying so: it reads only what was persisted, so changes made since look like a wrong mirror."""
    if result.match or result.error or result.note:
        return result
    try:
        at = _persisted_lsn(settings, result.name)
    except Exception:
        return result
    if at is not None and Lsn(at) < Lsn(lsn):
        result.note = (
            f"--reader {reader} reads the persisted snapshot, at LSN {at}: changes after it are not "
            f"persisted yet (`mooncake persist {result.name}`, then verify again)"
        )
    return result


def _judge(name: str, src_name: str, src: pa.Table, mir: pa.Table, lsn: str, stopped: dict[str, str]) -> TableResult:
    """The result for one table from its source and mirror rows at ``lsn`` (``stopped``: mirrors stopped by
    an error, name -> error, which then explains a mismatch)."""
    only_src = [c for c in src.column_names if c not in mir.column_names]
    only_mir = [c for c in mir.column_names if c not in src.column_names]
    if only_src or only_mir:
        return TableResult(
            name,
            src_name,
            False,
            src.num_rows,
            mir.num_rows,
            0,
            0,
            error=f"columns differ at LSN {lsn}: source only {only_src}, mirror only {only_mir} (a "
            "schema change reaches the mirror with the table's next row change)",
        )
    missing, extra = compare(src, mir)
    if (missing or extra) and stopped.get(name):
        return TableResult(
            name,
            src_name,
            False,
            src.num_rows,
            mir.num_rows,
            missing,
            extra,
            note=f"the mirror is stopped: {stopped[name]}",
        )
    # which columns differ, when no row is missing or extra (else every column would)
    return TableResult(
        name,
        src_name,
        missing == 0 and extra == 0,
        src.num_rows,
        mir.num_rows,
        missing,
        extra,
        columns=differing_columns(src, mir) if (missing or extra) and missing == extra else None,
    )


def verify(
    settings: Settings, names: list[str] | None = None, reader: str = "union", client=None, attempts: int = 5
) -> tuple[list[TableResult], str]:
    """Compare mirrors with their sources at one LSN. Returns (per-table results, LSN text).

    ``reader``: one of ``READERS``. Raises ``ValueError`` for an unknown reader or mirror and
    ``readers.ReaderUnavailable`` when the reader's library is not installed."""
    if reader not in READERS:
        raise ValueError(f"unknown reader {reader!r}; choose one of {', '.join(READERS)}")
    if reader != "union":
        require(reader)  # ReaderUnavailable: one line saying what to install
    reg = registry(settings)["tables"]
    names = names or sorted(reg)
    unknown = [n for n in names if n not in reg]
    if unknown:
        mirrors = ", ".join(sorted(reg)) or "none yet (`mooncake create-table NAME SCHEMA.TABLE` makes one)"
        raise ValueError(f"no mirrored table named {', '.join(unknown)}; mirrors: {mirrors}")
    dsn = settings.source_dsn()
    from .engine.pg.conninfo import with_options

    last_err = None
    stopped: dict[str, str] = {}  # mirrors stopped by an error (a mismatch is then explained by it)
    dropped: set[str] = set()  # read-only mirrors whose source table was dropped: nothing to compare with
    if client is not None:
        try:
            tables = client.status()["tables"]
            stopped = {t["name"]: t.get("error") or "" for t in tables if t.get("state") == "error"}
            dropped = {t["name"] for t in tables if t.get("source_dropped")}
        except Exception:
            stopped = {}
    for attempt in range(attempts):
        rc = ReplicationConnection(with_options(dsn))
        try:
            c_lsn, snap = rc.create_slot(
                f"mooncake_verify_{uuid.uuid4().hex[:8]}", export_snapshot=True, temporary=True
            )
            lsn = str(Lsn(c_lsn))
            if reader == "union":
                client.wait_lsn(lsn, timeout=60)
            results = []
            retry = False
            with psycopg.connect(with_options(dsn)) as conn:
                for name in names:
                    src_name = reg[name]["source"]
                    if name in dropped:
                        why = "its source table was dropped; the mirror is read-only (drop-table removes it)"
                        results.append(TableResult(name, src_name, True, 0, 0, 0, 0, skipped=why))
                        continue
                    try:
                        schema = describe_table(
                            conn, src_name, column_types=reg[name].get("column_types"), exclude=reg[name].get("exclude")
                        )
                        conn.rollback()
                        batches = list(initial_copy(conn, schema, snap))
                        src = (
                            pa.Table.from_batches(batches, schema=schema.arrow_schema())
                            if batches
                            else schema.arrow_schema().empty_table()
                        )
                        mir = _mirror_rows(settings, name, reader, lsn, client)
                    except Exception as e:
                        if "cannot read at LSN" in str(e):
                            retry = True
                            last_err = e
                            break
                        results.append(TableResult(name, src_name, False, 0, 0, 0, 0, error=str(e).splitlines()[0]))
                        continue
                    result = _judge(name, src_name, src, mir, lsn, stopped)
                    if reader != "union":
                        result = _not_persisted_note(settings, result, reader, lsn)
                    results.append(result)
            if not retry:
                return results, lsn
        finally:
            rc.close()
        time.sleep(0.2 * (attempt + 1))
    raise RuntimeError(f"could not find a moment to read every mirror exactly: {last_err}")
