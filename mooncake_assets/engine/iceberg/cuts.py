"""Consistent cuts: the Iceberg tags that name every mirrored table's snapshot at one Postgres LSN.

A cut at LSN ``L`` is a tag (Iceberg spec "Snapshot References": a ref of type ``tag``) named
``lsn-<X>-<Y>`` (the LSN ``X/Y`` with ``/`` replaced by ``-``, e.g. ``lsn-0-5B688D0``) on each table's
snapshot holding exactly the transactions whose commit LSN is below ``L``. Any Iceberg reader can then
read several tables at one point: ``FOR VERSION AS OF 'lsn-0-5B688D0'`` (Spark, Trino), or the tag's
``snapshot-id`` (PyIceberg, DuckDB).

Retention (:func:`cuts_to_drop`): the newest ``keep_cuts`` cuts of a table are kept (by LSN), and any
non-``main`` ref whose ``max-ref-age-ms`` has passed is dropped, as the spec's "Snapshot Retention
Policy" says (a ref's age is measured from its snapshot's ``timestamp-ms``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.update import SetSnapshotRefUpdate, TableUpdate

from ..lsn import Lsn

__all__ = ["CUT_TAG_PREFIX", "Cut", "cut_tag", "cuts_of", "cuts_to_drop", "parse_cut_tag", "tag_updates"]

CUT_TAG_PREFIX = "lsn-"
"""Prefix of a cut's tag name; the rest is the LSN ``X/Y`` written ``X-Y`` (upper-case hexadecimal)."""

_TAG_RE = re.compile(r"^lsn-([0-9A-Fa-f]{1,8})-([0-9A-Fa-f]{1,8})$")


def cut_tag(lsn: int) -> str:
    """The tag name of the cut at ``lsn``: ``Lsn(0x5B688D0)`` -> ``"lsn-0-5B688D0"``."""
    return CUT_TAG_PREFIX + str(Lsn(lsn)).replace("/", "-")


def parse_cut_tag(name: str) -> Lsn | None:
    """The LSN a cut tag names (``"lsn-0-5B688D0"`` -> ``Lsn('0/5B688D0')``); None for any other name.
    A plain LSN ``X/Y`` is accepted too (what ``--as-of-lsn`` is given)."""
    m = _TAG_RE.match(name) or re.match(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$", name)
    if m is None:
        return None
    return Lsn((int(m.group(1), 16) << 32) | int(m.group(2), 16))


@dataclass(frozen=True)
class Cut:
    """One cut on one table: ``tag`` (ref name), ``lsn``, ``snapshot_id`` it points to, ``timestamp_ms``
    (that snapshot's commit time, epoch ms: the cut was taken at or after it)."""

    tag: str
    lsn: Lsn
    snapshot_id: int
    timestamp_ms: int


def cuts_of(md: TableMetadata) -> list[Cut]:
    """The cut tags of a table's metadata, oldest LSN first (tags whose snapshot is gone are left out)."""
    out = []
    for name, ref in md.refs.items():
        lsn = parse_cut_tag(name) if name.startswith(CUT_TAG_PREFIX) else None
        if lsn is None or ref.snapshot_ref_type != SnapshotRefType.TAG:
            continue
        snap = md.snapshot_by_id(ref.snapshot_id)
        if snap is not None:
            out.append(Cut(name, lsn, ref.snapshot_id, snap.timestamp_ms))
    return sorted(out, key=lambda c: c.lsn)


def cuts_to_drop(md: TableMetadata, keep_cuts: int | None, now_ms: int) -> list[str]:
    """Names of the refs an expiry removes (sorted): cut tags beyond the newest ``keep_cuts`` (None: no
    count limit; 0: every cut goes), and any ref but ``main`` whose ``max-ref-age-ms`` is past
    (``now_ms - its snapshot's timestamp-ms > max-ref-age-ms``; spec "Snapshot Retention Policy")."""
    drop: set[str] = set()
    if keep_cuts is not None:
        cuts = cuts_of(md)
        drop.update(c.tag for c in cuts[: max(0, len(cuts) - keep_cuts)])
    for name, ref in md.refs.items():
        if name == MAIN_BRANCH or ref.max_ref_age_ms is None:
            continue
        snap = md.snapshot_by_id(ref.snapshot_id)
        if snap is not None and now_ms - snap.timestamp_ms > ref.max_ref_age_ms:
            drop.add(name)
    return sorted(drop)


def tag_updates(md: TableMetadata, name: str, snapshot_id: int, max_ref_age_ms: int | None) -> tuple[TableUpdate, ...]:
    """The metadata updates pointing tag ``name`` at ``snapshot_id`` (with ``max_ref_age_ms``, None for no
    limit): none when the tag already is exactly that. Raises ``ValueError`` for a snapshot ``md`` lacks."""
    if md.snapshot_by_id(snapshot_id) is None:
        raise ValueError(f"no snapshot {snapshot_id} to tag {name!r}")
    ref = md.refs.get(name)
    if ref is not None and ref.snapshot_id == snapshot_id and ref.max_ref_age_ms == max_ref_age_ms:
        return ()
    # PyIceberg's pydantic models take field names too (populate_by_name); mypy knows only the aliases
    update = SetSnapshotRefUpdate(  # type: ignore[call-arg]
        ref_name=name, type=SnapshotRefType.TAG, snapshot_id=snapshot_id, max_ref_age_ms=max_ref_age_ms
    )
    return (update,)
