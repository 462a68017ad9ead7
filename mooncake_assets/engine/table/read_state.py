"""The ReadState: what a union read of one mirrored table needs at one LSN.

A ReadState names the table's live data files (Parquet, local or in the warehouse), each with the
positions deleted as of the LSN (a deletion vector: a 64-bit Roaring bitmap of row positions), and
the rows still in memory (the MemSlice's rows visible at that LSN). A reader scans the files minus
their deleted positions, plus the in-memory rows (``UNION ALL``), and sees exactly the transactions
committed before the LSN.

In-process a ReadState is this frozen dataclass with the deletion vectors as bitmaps
(``pyroaring.FrozenBitMap64``, hashable: readers memoize plans by them). Across the service's Flight
socket it has one encoding, :meth:`ReadState.to_wire` / :meth:`ReadState.from_wire` (JSON; each
vector as base64 of the portable Roaring serialization, the format the Iceberg v3 deletion-vector
blob carries in Puffin); only the Flight server and :class:`~..service.client.ServiceClient` call them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyroaring import BitMap64, FrozenBitMap64

from ..lsn import Lsn

__all__ = ["FileState", "ReadField", "ReadState"]


@dataclass(frozen=True)
class FileState:
    """One data file of a ReadState.

    ``name``: the file's name (unique in the table); ``path``: where a reader opens it (a local path,
    or a warehouse URL such as ``s3://…``); ``rows``: its row count; ``deleted``: the positions
    (0-based row numbers in the file) deleted as of the ReadState's LSN, None when none are.
    """

    name: str
    path: str
    rows: int
    deleted: FrozenBitMap64 | None = None

    @property
    def deleted_count(self) -> int:
        """Positions deleted as of the ReadState's LSN (0 when none)."""
        return len(self.deleted) if self.deleted is not None else 0

    @property
    def live_rows(self) -> int:
        """Rows a reader sees in the file: ``rows`` minus the deleted positions."""
        return self.rows - self.deleted_count


@dataclass(frozen=True)
class ReadField:
    """A current column for readers of files written under older schemas: its Iceberg field ``id``
    (Parquet ``field_id``), ``name``, ``type`` (DuckDB type text) and ``default`` (the value rows older
    than the column read, as text DuckDB casts to ``type``; None = NULL)."""

    id: int
    name: str
    type: str
    default: str | None = None


@dataclass(frozen=True)
class ReadState:
    """A union read's view of one table at ``lsn`` (module docstring).

    ``table``: the mirror's name; ``lsn``: the state holds the transactions committed before it;
    ``files``: live data files with their deleted positions; ``schema``: the current column names in
    order; ``fields``: per column, how to read files of older layouts (None when every file has
    today's layout); ``storage``: the warehouse's object-store hints for readers (None for a local
    warehouse); ``mem``: the in-memory rows (in-process), or, on the client side of the socket,
    ``ticket`` (fetch the rows with it once) and ``mem_rows`` (their count). ``token`` (in-process,
    set by the service): :meth:`content_token` of the state; ``mem`` is None when the asker already
    holds the state of that token.
    """

    table: str
    lsn: Lsn
    files: tuple[FileState, ...] = ()
    schema: tuple[str, ...] = ()
    fields: tuple[ReadField, ...] | None = None
    storage: dict[str, Any] | None = None
    ticket: str | None = None
    mem_rows: int | None = None
    mem: pa.Table | None = field(default=None, compare=False, repr=False)
    token: str | None = field(default=None, compare=False, repr=False)

    def with_(self, **changes: Any) -> ReadState:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)

    def content_token(self, rows: str) -> str:
        """32 hex digits naming what a read of this state sees, at any LSN: BLAKE2b over the wire form
        without ``lsn``, ``ticket`` and ``mem_rows`` (files, paths, deletion vectors, schema, fields,
        storage) and ``rows``, the token of the in-memory rows
        (:meth:`~.memslice.MemSlice.read_token`). Costs what the file list costs, nothing per row."""
        wire = self.to_wire()
        for k in ("lsn", "ticket", "mem_rows"):
            wire.pop(k, None)
        h = hashlib.blake2b(json.dumps(wire, sort_keys=True, default=str).encode(), digest_size=16)
        h.update(rows.encode())
        return h.hexdigest()

    # ------------------------------------------------------------------ the wire (Flight edge only)
    def to_wire(self) -> dict[str, Any]:
        """JSON-ready dict: ``{"table", "lsn" ("X/Y"), "files": [{"name", "path", "rows", "deleted"
        (base64 of the portable Roaring bitmap, or None)}], "schema", ["fields"], ["storage"],
        ["ticket"], ["mem_rows"]}`` (optional keys only when set). ``mem`` does not travel."""
        out: dict[str, Any] = {
            "table": self.table,
            "lsn": str(self.lsn),
            "files": [{"name": f.name, "path": f.path, "rows": f.rows, "deleted": _b64(f.deleted)} for f in self.files],
            "schema": list(self.schema),
        }
        if self.fields:
            out["fields"] = [{"id": f.id, "name": f.name, "type": f.type, "default": f.default} for f in self.fields]
        if self.storage:
            out["storage"] = self.storage
        if self.ticket is not None:
            out["ticket"] = self.ticket
        if self.mem_rows is not None:
            out["mem_rows"] = self.mem_rows
        return out

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> ReadState:
        """The inverse of :meth:`to_wire`. Raises ``ValueError`` on a bad LSN or bitmap."""
        fields = d.get("fields")
        return cls(
            table=d["table"],
            lsn=Lsn.parse(d["lsn"]),
            files=tuple(
                FileState(name=f["name"], path=f["path"], rows=int(f["rows"]), deleted=_from_b64(f.get("deleted")))
                for f in d.get("files", [])
            ),
            schema=tuple(d.get("schema") or ()),
            fields=tuple(
                ReadField(id=int(f["id"]), name=f["name"], type=f["type"], default=f.get("default")) for f in fields
            )
            if fields
            else None,
            storage=d.get("storage") or None,
            ticket=d.get("ticket"),
            mem_rows=d.get("mem_rows"),
        )


# Both directions are memoized (bounded): an unchanged file's vector is the same FrozenBitMap64 on every
# read (DiskFile caches it) and the same text on the client, so repeated reads neither re-encode nor
# re-decode it.
WIRE_CACHE = 256


def _b64(bm: FrozenBitMap64 | None) -> str | None:
    return _encode(bm) if bm else None


@functools.lru_cache(maxsize=WIRE_CACHE)
def _encode(bm: FrozenBitMap64) -> str:
    return base64.b64encode(bm.serialize()).decode()


def _from_b64(text: str | None) -> FrozenBitMap64 | None:
    if not text:
        return None
    return _decode(text)


@functools.lru_cache(maxsize=WIRE_CACHE)
def _decode(text: str) -> FrozenBitMap64 | None:
    try:
        bm = FrozenBitMap64.deserialize(base64.b64decode(text))
    except Exception as e:
        raise ValueError(f"a ReadState deletion vector is not a portable 64-bit Roaring bitmap: {e}") from None
    return bm or None


def frozen(bm: BitMap64) -> FrozenBitMap64 | None:
    """A DiskFile's deleted positions as a ReadState carries them (None when empty)."""
    return FrozenBitMap64(bm) if len(bm) else None
