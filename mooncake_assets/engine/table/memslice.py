"""MemSlice: the in-memory buffer of committed rows not yet flushed (docs/architecture.md#data-path).

Rows arrive as Postgres text values (one list per row, in the table's column order) and are kept in
an *open* row buffer; every ``batch_rows`` rows (or when a reader or a flush needs them) the buffer is
decoded column-wise into an Arrow ``RecordBatch`` with vectorized casts. Each row carries:

- ``ins_lsn`` (uint64): the commit LSN of the transaction that inserted it;
- ``del_lsn`` (uint64): the commit LSN of the transaction that deleted it, 0 while live — this is the
  **BatchDeletionVector**, stamped so that a read at LSN L sees exactly the commits with
  ``commit_lsn < L``;
- ``hash`` (uint64): the key hash (see :mod:`.keys`), kept so a flush builds its IndexBlock without
  re-hashing.

Locations are ``(batch_id, row)``; the open buffer has ``batch_id == len(batches)``. The **MemIndex**
maps key hash → locations (several for duplicate rows of key-less tables).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa

from ..cdc.decode import ewkb_srid_suspect
from ..index import MemIndex
from ..lsn import Lsn

if TYPE_CHECKING:
    from ..pg.schema import ColumnSpec

#: the table's text decoder: column-major value lists -> ``pa.RecordBatch``
Decoder = Callable[[list[list[Any]]], Any]
#: (column index, cheap text test) of :func:`_suspect_checks`
Suspect = tuple[int, Callable[[str], bool]]

LIVE = 0


class BadRowError(ValueError):
    """A buffered row whose text cannot be decoded to the table's Arrow types (found when the open
    buffer is sealed). ``lsn``: commit LSN of the transaction that wrote the row. Permanent."""

    def __init__(self, message: str, lsn: int, columns: list[Any] | None = None):
        super().__init__(f"{message} (a row committed at LSN {Lsn(lsn)})")
        self.lsn = lsn
        self.columns = list(columns or [])  # the columns whose values could not be decoded


class Carried:
    """A value carried over from an existing row (unchanged TOAST), already typed: ``scalar`` is the
    Arrow scalar (kept as Arrow so values Python cannot hold, such as timestamp 'infinity', carry over
    exactly); ``value`` is its Python value (raises for such values)."""

    __slots__ = ("scalar",)

    def __init__(self, scalar: pa.Scalar):
        self.scalar = scalar

    @property
    def value(self) -> Any:
        return self.scalar.as_py()

    def __repr__(self) -> str:  # pragma: no cover
        return f"Carried({self.scalar!r})"


@dataclass
class Batch:
    """One sealed batch: ``rb`` rows with their ``ins_lsn``/``del_lsn``/``hash`` arrays (same length)."""

    rb: pa.RecordBatch
    ins_lsn: np.ndarray
    del_lsn: np.ndarray
    hashes: np.ndarray


class MemSlice:
    """Committed, unflushed rows of one table plus their MemIndex.

    ``decode``: callable(list of column value lists) -> pa.RecordBatch (the table's text decoder);
    values that are :class:`Carried` are patched in after the vectorized decode. ``specs``: the
    table's ColumnSpecs, one per ``schema`` field (what :func:`_suspect_checks` needs beyond Arrow
    types: a PostGIS column's SRID).
    """

    def __init__(
        self, schema: pa.Schema, decode: Decoder, batch_rows: int = 16384, specs: list[ColumnSpec] | None = None
    ) -> None:
        self.schema = schema
        self._decode = decode
        self.batch_rows = batch_rows
        self.batches: list[Batch] = []
        self.index = MemIndex()
        self._rows: list[list[Any]] = []
        self._ins: list[int] = []
        self._hashes: list[int] = []
        self._open_del: dict[int, int] = {}
        self.deleted_rows = 0
        self._bytes = 0
        self._suspects = _suspect_checks(schema, specs)

    # -- writes -------------------------------------------------------------------------------
    def append(self, values: list[Any], h: int, lsn: int) -> tuple[int, int]:
        """Append one row (text values / None / Carried) with key hash ``h`` at commit LSN ``lsn``.

        A value that may not decode (``numeric`` NaN for a decimal column, ``time`` 24:00, …; see
        :func:`_suspect_checks`) has its row decoded at once, so :class:`BadRowError` is raised by the
        change that brought it rather than by a later read or flush."""
        for i, suspect in self._suspects:
            v = values[i]
            if v.__class__ is str and suspect(v):
                try:
                    self._decode([[None if isinstance(x, Carried) else x] for x in values])
                except ValueError as e:
                    raise BadRowError(str(e), lsn, getattr(e, "columns", None)) from None
                except Exception:
                    pass
                break
        loc = (len(self.batches), len(self._rows))
        self._rows.append(values)
        self._ins.append(lsn)
        self._hashes.append(h)
        self.index.insert_one(h, loc[0], loc[1])
        if len(self._rows) >= self.batch_rows:
            self.seal()
        return loc

    def is_live(self, loc: tuple[int, int]) -> bool:
        b, r = loc
        if b == len(self.batches):
            return r not in self._open_del
        return cast(bool, self.batches[b].del_lsn[r] == LIVE)

    def delete(self, loc: tuple[int, int], h: int, lsn: int) -> None:
        """Mark the row at ``loc`` deleted by the commit at ``lsn`` and drop it from the MemIndex."""
        b, r = loc
        if b == len(self.batches):
            self._open_del[r] = lsn
        else:
            self.batches[b].del_lsn[r] = lsn
        self.index.remove(h, loc)
        self.deleted_rows += 1

    def find(self, h: int) -> list[tuple[int, int]]:
        """Live locations whose key hash is ``h``."""
        return [loc for loc in self.index.lookup(h) if self.is_live(loc)]

    def row_values(self, loc: tuple[int, int]) -> list[Any]:
        """The row's values: text/None/Carried for the open buffer, Carried for sealed batches."""
        b, r = loc
        if b == len(self.batches):
            return list(self._rows[r])
        rb = self.batches[b].rb
        return [Carried(rb.column(i)[r]) for i in range(rb.num_columns)]

    # -- sealing ------------------------------------------------------------------------------
    def seal(self) -> None:
        """Decode the open row buffer into a sealed Arrow batch (no-op when it is empty)."""
        if not self._rows:
            return
        cols = [list(c) for c in zip(*self._rows)]
        patches = []
        for ci, col in enumerate(cols):
            idx = [i for i, v in enumerate(col) if isinstance(v, Carried)]
            if idx:
                patches.append((ci, idx, [col[i].scalar for i in idx]))
                for i in idx:
                    col[i] = None
        try:
            rb = self._decode(cols)
        except ValueError as e:  # name the commit that brought the value (the open buffer stays as it was)
            bad = next((i for i in range(len(self._rows)) if not self._decodes([[c[i]] for c in cols])), 0)
            raise BadRowError(str(e), self._ins[bad], getattr(e, "columns", None)) from None
        if patches:
            arrays = list(rb.columns)
            for ci, idx, scalars in patches:  # splice the carried values in, in Arrow (no Python round trip)
                base = arrays[ci]
                carried = _scalars_to_array(scalars, base.type)
                pick = np.arange(len(base), dtype=np.int64)
                pick[idx] = len(base) + np.arange(len(idx), dtype=np.int64)
                arrays[ci] = pa.concat_arrays([base, carried]).take(pa.array(pick))
            rb = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        n = len(self._rows)
        dl = np.zeros(n, dtype=np.uint64)
        for r, lsn in self._open_del.items():
            dl[r] = lsn
        self.batches.append(
            Batch(rb, np.array(self._ins, dtype=np.uint64), dl, np.array(self._hashes, dtype=np.uint64))
        )
        self._bytes += rb.nbytes
        self._rows, self._ins, self._hashes, self._open_del = [], [], [], {}

    def evolve(
        self,
        schema: pa.Schema,
        decode: Decoder,
        convert: Callable[[pa.RecordBatch], pa.RecordBatch],
        specs: list[ColumnSpec] | None = None,
    ) -> None:
        """Switch to a new table schema (a source schema change): the open buffer is sealed with the old
        decoder, every sealed batch is converted with ``convert(RecordBatch) -> RecordBatch`` (see
        :func:`.evolution.project`), then rows decode with ``decode`` into ``schema``. LSN stamps,
        hashes and the MemIndex are unchanged (locations stay valid). Raises :class:`BadRowError`
        from sealing (the slice is then unchanged)."""
        self.seal()
        self.batches = [Batch(convert(b.rb), b.ins_lsn, b.del_lsn, b.hashes) for b in self.batches]
        self._bytes = sum(b.rb.nbytes for b in self.batches)
        self.schema = schema
        self._decode = decode
        self._suspects = _suspect_checks(schema, specs)

    def _decodes(self, cols: list[list[Any]]) -> bool:
        try:
            self._decode(cols)
            return True
        except ValueError:
            return False

    # -- reads --------------------------------------------------------------------------------
    def visible(self, lsn: int | None = None) -> pa.Table:
        """Rows visible at ``lsn`` (commits with commit_lsn < lsn; None = all applied) as one Arrow table."""
        self.seal()
        parts = []
        for b in self.batches:
            if lsn is None:
                mask = b.del_lsn == LIVE
            else:
                L = np.uint64(lsn)
                mask = (b.ins_lsn < L) & ((b.del_lsn == LIVE) | (b.del_lsn >= L))
            if mask.all():
                parts.append(b.rb)
            elif mask.any():
                parts.append(b.rb.filter(pa.array(mask)))
        if not parts:
            return self.schema.empty_table()
        return pa.Table.from_batches(parts, schema=self.schema)

    def drain(self) -> tuple[pa.Table, np.ndarray, int]:
        """Take every live row out (for a flush) and empty the slice.

        Returns (live rows, their key hashes, ``horizon``): the largest insert or delete LSN among the
        rows taken out, so a read at an LSN <= horizon can no longer be served exactly (0 when empty).
        """
        self.seal()
        parts, hashes = [], []
        horizon = 0
        for b in self.batches:
            if len(b.ins_lsn):
                horizon = max(horizon, int(b.ins_lsn.max()), int(b.del_lsn.max()))
            mask = b.del_lsn == LIVE
            if mask.any():
                parts.append(b.rb.filter(pa.array(mask)) if not mask.all() else b.rb)
                hashes.append(b.hashes[mask])
        table = pa.Table.from_batches(parts, schema=self.schema) if parts else self.schema.empty_table()
        hs = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
        self.clear()
        return table, hs, horizon

    def clear(self) -> None:
        self.batches = []
        self.index = MemIndex()
        self._rows, self._ins, self._hashes, self._open_del = [], [], [], {}
        self.deleted_rows = 0
        self._bytes = 0

    @property
    def num_rows(self) -> int:
        """Rows held (live and deleted), sealed and open."""
        return cast(int, sum(b.rb.num_rows for b in self.batches) + len(self._rows))

    @property
    def live_rows(self) -> int:
        return self.num_rows - self.deleted_rows

    @property
    def nbytes(self) -> int:
        """Approximate bytes held: sealed Arrow buffers plus ~64 bytes per value in the open buffer."""
        ncols = len(self.schema)
        return self._bytes + len(self._rows) * ncols * 64

    def is_empty(self) -> bool:
        return self.num_rows == 0


def _scalars_to_array(scalars: list[Any], t: pa.DataType) -> pa.Array:
    """Arrow scalars (of type ``t``) as one array, in Arrow (values Python cannot hold carry over).
    ``pa.array`` refuses a NULL map scalar among others, so nested types go one scalar at a time."""
    try:
        return pa.array(scalars, type=t)
    except (TypeError, pa.ArrowException):
        return pa.concat_arrays([pa.array([sc], type=t) if sc.is_valid else pa.nulls(1, t) for sc in scalars])


def _suspect_checks(schema: pa.Schema, specs: list[ColumnSpec] | None = None) -> list[Suspect]:
    """(column index, cheap text test) for columns whose decoder can reject a value Postgres accepts:
    PostGIS columns (a value with another SRID than the column's, ``ColumnSpec.kind == "wkb"`` and
    ``srid``: :func:`~..cdc.decode.ewkb_srid_suspect`; only with ``specs``, the table's ColumnSpecs in
    ``schema``'s order), decimals (NaN), times (24:00:00), dates/timestamps (years past 9999 may exceed
    the range), arrays (explicit lower bounds, other dimensions, such elements). A hit only costs a
    one-row decode."""
    out: list[Suspect] = []
    for i, f in enumerate(schema):
        t = f.type
        spec = specs[i] if specs is not None else None
        if spec is not None and spec.kind == "wkb":  # PostGIS: a value with another SRID
            out.append((i, ewkb_srid_suspect(spec.srid or 0)))
        elif pa.types.is_decimal(t):
            out.append((i, lambda v: v == "NaN"))
        elif pa.types.is_time(t):
            out.append((i, lambda v: v.startswith("24")))
        elif pa.types.is_timestamp(t) or pa.types.is_date(t):
            out.append((i, lambda v: len(v) > 4 and v[4] != "-" and not v.endswith("infinity")))
        elif pa.types.is_list(t):
            nd = 0
            while pa.types.is_list(t):
                nd, t = nd + 1, t.value_type
            out.append(
                (
                    i,
                    cast(  # the default binds this column's nd; mypy cannot infer such a lambda
                        Callable[[str], bool],
                        lambda v, nd=nd: (
                            v.startswith("[")
                            or "NaN" in v
                            or "24:" in v
                            or (v != "{}" and len(v) - len(v.lstrip("{")) != nd)
                        ),
                    ),
                )
            )
    return out
