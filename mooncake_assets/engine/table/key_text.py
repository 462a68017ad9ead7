"""Key values of data files back as PostgreSQL text, to rebuild a table's FileIndex from its data files.

The key hash (:mod:`mooncake_assets.engine.index.key_hash`) is defined on the text Postgres sends.
Data files hold typed values, so rebuilding the index of persisted rows means printing each key value
the way Postgres's output function does (:mod:`~mooncake_assets.engine.cdc.text_out`) under the
sessions' pinned settings (``DateStyle=ISO``,
``TimeZone=UTC``, ``extra_float_digits=3``, ``bytea_output=hex``, ``lc_monetary=C``):

===========================================  =================================================
Arrow type (Postgres type)                   text
===========================================  =================================================
string (text, varchar, uuid, json, numeric   the stored value: it *is* Postgres's text
without a typmod, anything kept as text)
int16/32/64 (smallint, integer, bigint, oid) decimal digits
bool                                         ``t`` / ``f``
float32/64 (real, double precision)          shortest round-trip digits; fixed notation when the
                                             decimal exponent is in [-4, 6) (real) or [-4, 15)
                                             (double), else ``1.5e+15``; ``NaN``, ``Infinity``,
                                             ``-Infinity``, ``-0`` (Postgres's ``float8out``)
decimal128 (numeric(p,s))                    digits with exactly ``s`` decimals
decimal128 (money)                           ``-$1,234.56``
date32, time64, timestamp[tz]                ISO (``2024-01-31``, ``12:00:00.5``,
                                             ``2024-01-31 12:00:00.5+00``, ``… BC``, ``infinity``)
binary (bytea)                               ``\\x0aff``
list of the above (arrays)                   Postgres array text ``{1,NULL,"a b"}``
struct of the above (composite types)        record text ``(1,,"a b")``
===========================================  =================================================

Keys of other types (hstore, PostGIS geometry, arrays of those) cannot be printed here: :func:`key_text_columns` raises ``ValueError`` naming the column. Sources: the Postgres manual,
"Date/Time Output", "Floating-Point Types" (``extra_float_digits``), "Array Value Input",
"Monetary Types".

When: :meth:`~.mirror.MirrorTable.restore_index` calls :func:`rebuild_file_index` for index blobs
written under an older key hash (see :func:`~..index.key_hash.blob_needs_rebuild`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..cdc.text_out import TextColumn
from ..iceberg.lineage import has_lineage
from ..index import FileIndex, IndexBlock

if TYPE_CHECKING:
    from ..index.key_hash import KeyHash
    from ..pg.schema import TableSchema
    from .disk_files import DiskFile


class RestoredTable(Protocol):
    """What :func:`rebuild_file_index` reads of a restored :class:`~.mirror.MirrorTable` (a protocol, so
    this module does not import the table it serves)."""

    name: str
    error: str | None
    dir: Path
    schema: TableSchema
    _key_idx: list[int]
    hasher: KeyHash
    iceberg: Any
    evolved: bool
    arrow_schema: pa.Schema
    defaults: dict[int, pa.Scalar]

    @property
    def files(self) -> dict[str, DiskFile]:
        """The table's data files by name (rows are read from their ``read_path``)."""
        ...


__all__ = ["key_text_columns", "rebuild_file_index"]

log = logging.getLogger(__name__)

_MONEY_OID = 790
_BYTEA_OID = 17


def _money_text(v: Decimal) -> str:
    sign = "-" if v < 0 else ""
    whole, _, frac = f"{abs(v):.2f}".partition(".")
    return f"{sign}${int(whole):,}.{frac}"


class _KeyColumn(TextColumn):
    """:class:`~..cdc.text_out.TextColumn` with money; refuses types whose text it cannot reproduce."""

    def __init__(self, typ: pa.DataType, name: str = "", type_oid: int = 0) -> None:
        super().__init__(typ)
        self.name, self.oid = name, type_oid
        if self.child is not None:
            cast(_KeyColumn, self.child).name = name  # children are of type(self)
        elif (
            pa.types.is_map(typ)
            or pa.types.is_dictionary(typ)
            or (pa.types.is_binary(typ) and type_oid not in (0, _BYTEA_OID))
        ):
            raise ValueError(f"key column {name!r} ({typ}) cannot be printed as Postgres text")

    def text(self, v: Any) -> str | None:
        if v is None:
            return None
        if self.oid == _MONEY_OID:
            return _money_text(Decimal(v))
        return super().text(v)


def key_text_columns(table: pa.Table, names: Sequence[str], type_oids: Sequence[int]) -> list[pa.Array]:
    """The key columns ``names`` of ``table`` as Postgres text, one ``pa.string()`` array per column
    (NULL stays NULL). ``type_oids``: the columns' pg_type oids (money and bytea need them). Raises
    ``ValueError`` for a column whose type's text cannot be reproduced (module docstring)."""
    out = []
    for name, oid in zip(names, type_oids):
        col = table.column(name).combine_chunks()
        t = col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            out.append(col.cast(pa.string()))
        elif pa.types.is_integer(t):
            out.append(pc.cast(col, pa.string()))
        elif pa.types.is_boolean(t):
            out.append(pc.if_else(col, "t", "f"))
        else:
            c = _KeyColumn(t, name, oid)
            out.append(pa.array([c.text(v) for v in c.storage(col)], type=pa.string()))
    return out


def _read_file(table: RestoredTable, f: DiskFile) -> pa.Table:
    path = f.read_path
    t = pq.read_table(table.iceberg.io.new_input(path).open() if "://" in path else path)
    if table.evolved or has_lineage(t.schema):  # an older layout, or a compaction's lineage columns
        from .evolution import project

        t = project(t, table.arrow_schema, table.defaults)
    return t


def rebuild_file_index(table: RestoredTable, names: Sequence[str] | None = None) -> FileIndex:
    """A new FileIndex of a restored :class:`~.mirror.MirrorTable`: one IndexBlock per live data file
    (``names``: only these),
    every row hashed from its key's Postgres text (reads each data file's key columns once). When a key
    column's text cannot be reproduced, sets ``table.error`` (the mirror shows ``error`` and stops
    following: an index missing its persisted rows would apply updates and deletes to nothing) and
    returns an empty FileIndex."""
    specs = [table.schema.columns[i] for i in table._key_idx]
    blocks = []
    try:
        for f in table.files.values() if names is None else [table.files[n] for n in names]:
            data = _read_file(table, f)
            texts = key_text_columns(data, [s.name for s in specs], [s.type_oid for s in specs])
            hashes = table.hasher.hash_columns(texts)
            n = len(hashes)
            blocks.append(
                IndexBlock.build(
                    str(table.dir / "index" / f"{uuid.uuid4().hex}.idx"),
                    hashes,
                    np.zeros(n, dtype=np.uint32),
                    np.arange(n, dtype=np.uint32),
                    [f.name],
                )
            )
    except ValueError as e:
        # the mirror stops here rather than follow with an index that misses its persisted rows
        why = "it was saved under an older key hash" if names is None else "files persisted after its last save"
        table.error = (
            f"table {table.name}: cannot rebuild its index from the data files ({e}); {why}: drop-table, "
            "then create-table"
        )
        log.error("%s", table.error)
        for b in blocks:
            b.unlink()
        return FileIndex()
    if names is None:
        log.info("table %s: index rebuilt from %d data files (saved under an older key hash)", table.name, len(blocks))
    return FileIndex(blocks)
