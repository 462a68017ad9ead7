"""The schema role of a mirrored table: its columns, key, Iceberg field ids and schema evolution.

A table's rows are keyed by its primary key (or replica identity index); a table without one
(``REPLICA IDENTITY FULL``) by the whole row as it was when its rows were hashed. Its Iceberg field
ids are the Iceberg table's (Iceberg spec "Schemas and Data Types": a column keeps its id across
renames); a followed ``ALTER TABLE`` (:mod:`.evolution`) switches decoding at the change's LSN and
makes the next persist commit the new schema.

:class:`TableSchemaRole` is one role of :class:`~.mirror.MirrorTable` (a mixin over the table's
state: ``schema``, ``mem``, ``iceberg``, the LSNs).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from ..cdc import TableSchema, decode_text_columns
from .evolution import SchemaChange, field_id_of, project

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from ..iceberg.table import IcebergMirrorTable
    from ..pg.schema import ColumnSpec
    from .delete_log import DeleteLog
    from .memslice import MemSlice

log = logging.getLogger("mooncake.table")

__all__ = ["TableSchemaRole", "initial_defaults"]


def value_columns(col_names: list[str], key_names: list[str]) -> list[str]:
    """The columns of ``col_names`` that are not in ``key_names``, in table order (the values a delete
    log's whole old rows hold, :mod:`.delete_log`)."""
    return [n for n in col_names if n not in key_names]


class TableSchemaRole:
    """Schema state and evolution of a :class:`~.mirror.MirrorTable` (module docstring)."""

    # the table's state this role reads and sets (set up by MirrorTable.__init__; declared for the type checker)
    name: str
    schema: TableSchema
    arrow_schema: pa.Schema
    iceberg: Any  # its IcebergMirrorTable, or None (see MirrorTable); Any: MirrorTable uses it unchecked
    mem: MemSlice
    delete_log: DeleteLog
    defaults: dict[int, pa.Scalar]
    key_names: list[str]
    flushed_lsn: int
    next_field_id: int
    schema_pending: bool
    evolved: bool
    last_schema_change: str | None
    _col_names: list[str]
    _key_idx: list[int]
    _match_full_row: bool
    _read_fields: list[dict[str, Any]] | None
    _schema_versions: list[Schema]
    _relmap: dict[int, list[int]]
    _identity: dict[int, list[int]]
    _row_cache: dict[str, pa.Table]

    @staticmethod
    def _sync_field_ids(schema: TableSchema, iceberg: IcebergMirrorTable | None) -> int:
        """Take the Iceberg table's field ids for our columns (by name, list elements too); returns the
        next free field id."""
        last = 0
        if iceberg is not None:
            ice = iceberg.schema
            last = iceberg.table.metadata.last_column_id or 0
            for c in schema.columns:
                try:
                    f = ice.find_field(c.name)
                except ValueError:
                    continue
                c.field_id = f.field_id
                ids = _nested_ids(f.field_type)
                if ids:
                    c.element_ids = ids
        return (
            max([last] + [c.field_id for c in schema.columns] + [max(c.element_ids, default=0) for c in schema.columns])
            + 1
        )

    @staticmethod
    def _iceberg_has_columns(iceberg: IcebergMirrorTable) -> bool:
        return "mooncake.columns" in iceberg.table.metadata.properties

    def _set_schema(self, schema: TableSchema, hash_field_ids: list[int] | None = None) -> None:
        self.schema = schema
        self.arrow_schema = schema.arrow_schema()
        self._col_names = [c.name for c in schema.columns]
        # a table without a key (REPLICA IDENTITY FULL) is keyed by the whole row — the columns it had when
        # its rows were hashed (``hash_field_ids``): a column added later is only re-checked
        if schema.key_columns:
            self.key_names = list(schema.key_columns)
        elif hash_field_ids:
            by_id = {c.field_id: c.name for c in schema.columns}
            self.key_names = [by_id[f] for f in hash_field_ids]
        else:
            self.key_names = list(self._col_names)
        self._key_idx = [self._col_names.index(k) for k in self.key_names]
        # a change carrying the whole old row (REPLICA IDENTITY FULL) picks among several candidate rows by
        # comparing all columns: for keyed tables (a DEFERRABLE key may repeat inside a transaction) and
        # for key-less ones hashed on fewer columns than they now have
        self._match_full_row = bool(schema.key_columns) or len(self._key_idx) < len(self._col_names)
        self.defaults = initial_defaults(schema.columns)
        self._read_fields = None

    @property
    def hash_field_ids(self) -> list[int]:
        """Field ids of the columns row keys are hashed from (the key, or a key-less table's original row)."""
        return [self.schema.columns[i].field_id for i in self._key_idx]

    def evolve(self, change: SchemaChange) -> None:
        """Follow a source schema change at ``change.lsn`` (a :class:`.evolution.SchemaChange`): seal the
        open buffer under the old schema, convert the buffered rows, switch decoding, and make the next
        persist commit the new Iceberg schema. Reads at LSNs before the change are refused afterwards.
        Raises :class:`BadRowError` (nothing changed) when a buffered row cannot be decoded."""
        hash_ids = self.hash_field_ids
        new = TableSchema(
            schema=self.schema.schema,
            name=self.schema.name,
            oid=self.schema.oid,
            columns=change.columns,
            key_columns=change.key_columns,
            has_primary_key=self.schema.has_primary_key,
            replica_identity=self.schema.replica_identity,
            relkind=self.schema.relkind,
            excluded=list(self.schema.excluded),
            column_types=dict(self.schema.column_types),
        )
        old_arrow, new_arrow = self.arrow_schema, new.arrow_schema()
        defaults = initial_defaults(new.columns)
        self.mem.evolve(
            new_arrow,
            self._decode,
            lambda rb: project(pa.RecordBatch.from_arrays(rb.columns, schema=old_arrow), new_arrow, defaults),
            specs=new.columns,
        )
        self._set_schema(new, hash_ids if not new.key_columns else None)
        # the delete log's entries (keys and whole old rows, as text of the old columns) are not decoded
        # under the new ones (a column added, dropped, renamed or retyped): it starts again, and the change
        # feed reads what no log holds from the data files (engine/table/delete_log.py)
        self.delete_log = self.delete_log.restarted(self.key_names, value_columns(self._col_names, self.key_names))
        self._relmap.clear()
        self._identity.clear()
        self.__dict__.get("_relations_seen", {}).clear()
        self._row_cache.clear()
        self.flushed_lsn = max(self.flushed_lsn, change.lsn)
        self.next_field_id = max(self.next_field_id, change.next_field_id)
        self.schema_pending = True
        self.evolved = True
        self._schema_versions.append(self.iceberg_schema())  # files may be flushed under each version
        self.last_schema_change = change.describe()
        log.info("table %s: %s", self.name, self.last_schema_change)

    def columns_property(self) -> str:
        """The Iceberg table property ``mooncake.columns``: the mirror's columns as a restart needs them."""
        from ..pg.schema import column_signature

        return json.dumps(
            {
                "columns": column_signature(self.schema),
                "key": list(self.schema.key_columns),
                "hash_field_ids": self.hash_field_ids,
            }
        )

    def iceberg_schema(self) -> Schema:
        """The current schema as a PyIceberg ``Schema`` (our field ids; added columns carry their
        ``initial-default``)."""
        from pyiceberg.io.pyarrow import pyarrow_to_schema

        sch = pyarrow_to_schema(self.arrow_schema, format_version=getattr(self.iceberg, "format_version", 3))
        if not self.defaults:
            return sch
        fields = []
        for f in sch.fields:
            d = self.defaults.get(f.field_id)
            if d is not None and d.is_valid:
                try:
                    from pyiceberg.conversions import to_json
                    from pyiceberg.types import PrimitiveType

                    value = d.as_py()
                    # to_json dispatches on the type (a nested one raises, caught below)
                    to_json(
                        cast(PrimitiveType, f.field_type), value
                    )  # checked here: the metadata writer would fail on it later
                    f = f.model_copy(update={"initial_default": value})
                except Exception:
                    log.warning(
                        "table %s: column %s: its default cannot be an Iceberg initial-default; Iceberg "
                        "readers show NULL for rows older than the column",
                        self.name,
                        f.name,
                    )
            fields.append(f)
        return type(sch)(*fields, schema_id=sch.schema_id)

    def read_fields(self) -> list[dict[str, Any]] | None:
        """For readers of a table whose files may have older layouts (None otherwise): per current column
        ``{"id", "name", "type" (DuckDB type), "default" (text DuckDB casts, or None)}``."""
        if not self.evolved:
            return None
        if self._read_fields is None:
            import duckdb

            con = duckdb.connect()
            empty = self.arrow_schema.empty_table()
            types = con.from_arrow(empty).types
            out = []
            for f, t in zip(self.arrow_schema, types):
                fid = field_id_of(f)
                d = cast(dict[int | None, pa.Scalar], self.defaults).get(fid)  # None: no field id, no default
                text = None
                if d is not None and d.is_valid:
                    one = pa.Table.from_arrays([pa.repeat(d, 1)], names=["v"])
                    # one row in, one row out
                    text = cast(tuple[Any, ...], con.from_arrow(one).project("CAST(v AS VARCHAR)").fetchone())[0]
                out.append({"id": fid, "name": f.name, "type": str(t), "default": text})
            con.close()
            self._read_fields = out
        return self._read_fields

    # ------------------------------------------------------------------ decoding helpers
    def _decode(self, cols: list[list[Any]]) -> pa.RecordBatch:
        return decode_text_columns(self.schema.columns, cols, column_major=True)


def _nested_ids(t: Any) -> list[int]:
    """The field ids nested in an Iceberg type, in the pre-order :func:`~..pg.schema.assign_field_ids`
    gives them (list: element, then inside it; struct: each field, then inside it; map: key, value,
    then inside them)."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(t, ListType):
        return [t.element_id] + _nested_ids(t.element_type)
    if isinstance(t, MapType):
        return [t.key_id, t.value_id] + _nested_ids(t.key_type) + _nested_ids(t.value_type)
    if isinstance(t, StructType):
        out: list[int] = []
        for f in t.fields:
            out += [f.field_id] + _nested_ids(f.field_type)
        return out
    return []


def initial_defaults(columns: Iterable[ColumnSpec]) -> dict[int, pa.Scalar]:
    """Field id → Arrow scalar of the value rows older than a column read (its ``initial_default``
    text decoded with the column's own decoder). Raises ``ValueError`` for a text the type rejects."""
    return {
        c.field_id: decode_text_columns([c], [[c.initial_default]], column_major=True).column(0)[0]
        for c in columns
        if c.initial_default is not None
    }
