"""Metadata helpers of the mirror and maintenance assets: result dicts, file tables, column schemas.

Nothing here keeps state; everything is read from the service's answers, Postgres's catalogs or the
Iceberg catalog's metadata files.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import dagster as dg

from mooncake_assets.engine.table.read_state import ReadState

MAX_FILE_ROWS = 40  # rows of the Markdown file table (the rest is summarized in one line)


def result_metadata(result: dict, prefix: str = "") -> dict:
    """A service result as Dagster metadata: numbers stay numbers, LSNs and names are text, lists and
    dicts become JSON."""
    out = {}
    for k, v in (result or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, bool):
            out[key] = dg.MetadataValue.bool(v)
        elif isinstance(v, int):
            out[key] = dg.MetadataValue.int(v)
        elif isinstance(v, float):
            out[key] = dg.MetadataValue.float(round(v, 4))
        elif isinstance(v, (list, dict)):
            out[key] = dg.MetadataValue.json(v)
        elif v is not None:
            out[key] = dg.MetadataValue.text(str(v))
    return out


def table_stats_metadata(st: dict) -> dict:
    """The mirror's state from the service's status (rows, files, bytes, LSNs, index, deletes)."""
    keys = (
        "applied_lsn",
        "flush_lsn",
        "live_rows",
        "buffer_rows",
        "buffer_bytes",
        "data_files",
        "data_bytes",
        "index_blocks",
        "pending_deletes",
        "deletion_vectors",
        "deleted_rows",
    )
    return result_metadata({k: st[k] for k in keys if k in st})


def files_markdown(read_state: ReadState) -> str:
    """A Markdown table of a ReadState's data files: name, where (Iceberg or staged), rows, deleted, live."""
    lines = ["| file | where | rows | deleted | live |", "|---|---|---:|---:|---:|"]
    files = read_state.files
    total = [0, 0]
    for i, f in enumerate(files):
        deleted = f.deleted_count
        total[0] += f.rows
        total[1] += deleted
        if i < MAX_FILE_ROWS:
            where = "staged" if "/staging/" in f.path else "iceberg"
            lines.append(f"| `{f.name}` | {where} | {f.rows:,} | {deleted:,} | {f.rows - deleted:,} |")
    if len(files) > MAX_FILE_ROWS:
        lines.append(f"| … {len(files) - MAX_FILE_ROWS} more | | | | |")
    lines.append(f"| **{len(files)} files** | | **{total[0]:,}** | **{total[1]:,}** | **{total[0] - total[1]:,}** |")
    mem = read_state.mem_rows
    if mem is not None:
        lines.append("")
        lines.append(f"plus {mem:,} rows in memory at LSN {read_state.lsn}")
    return "\n".join(lines)


def postgres_column_schema(dsn: str, source: str) -> dg.TableSchema:
    """Column names and types of the source table as mirrored (Postgres type → Iceberg/Arrow type)."""
    import psycopg

    from mooncake_assets.engine.cdc import describe_table

    with psycopg.connect(dsn, connect_timeout=10) as conn:
        schema = describe_table(conn, source, skip_unsupported=True)  # a refused column: shown by the mirror
    cols = []
    for c in schema.columns:
        cols.append(
            dg.TableColumn(
                name=c.name,
                type=c.type_name,
                description=f"mirrored as {c.arrow_type}",
                constraints=dg.TableColumnConstraints(
                    nullable=not c.not_null,
                    unique=c.is_key and len(schema.key_columns) == 1,
                    other=["primary key"] if c.is_key and schema.has_primary_key else [],
                ),
            )
        )
    return dg.TableSchema(columns=cols)


def iceberg_column_schema(catalog_uri: str, name: str, namespace: str = "mooncake") -> dg.TableSchema | None:
    """The mirror's column schema from a local SQLite Iceberg catalog and its local metadata file, read
    without side effects (None when either is not there: the mirror was not created yet)."""
    if not catalog_uri.startswith("sqlite:///"):
        return None
    db = Path(catalog_uri[len("sqlite:///") :])
    if not db.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
        try:
            row = con.execute(
                "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
                (namespace, name),
            ).fetchone()
        finally:
            con.close()
        if not row or not row[0] or not row[0].startswith(("file://", "/")):
            return None
        meta = json.loads(Path(row[0].removeprefix("file://")).read_text())
        schema = next(s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"])
    except (sqlite3.Error, OSError, ValueError, KeyError, StopIteration):
        return None
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=f["name"],
                type=f["type"] if isinstance(f["type"], str) else json.dumps(f["type"]),
                constraints=dg.TableColumnConstraints(nullable=not f.get("required", False)),
            )
            for f in schema["fields"]
        ]
    )
