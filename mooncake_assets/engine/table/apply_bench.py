"""Micro-benchmark of the apply path, in-process: row-wise ``apply`` vs columnar runs + ``apply_run``.

Generated transactions (the reference's :class:`~..cdc.txn.Change` objects, as the assembler yields
them) are applied to a fresh :class:`~.mirror.MirrorTable` without Iceberg in three ways:

- ``change``: ``MirrorTable.apply`` change by change (today's service path);
- ``run``: :func:`~..cdc.columnar.columnar_transaction` (the conversion from the reference) and
  ``MirrorTable.apply_run`` per run — what the service does in ``apply_mode=run``;
- ``run_only``: ``apply_run`` of runs converted beforehand (what is left once a decoder produces runs
  directly).

Each includes sealing the MemSlice at the end (the row-wise path decodes there). Figures are µs of
CPU time of this process per row (best of ``repeat``, single thread), per table shape (``narrow``: bigint key, text,
integer; ``wide``: bigint key and 20 columns of text, integer, double, numeric and timestamp), per
transaction size (``10`` rows and ``100000`` rows) and workload (``insert``; ``update``: updates of
existing keys without old tuple; ``mixed``: nine such updates then a delete, over and over — runs of
at most nine rows, the worst case of the run form). Run: ``python -m mooncake_assets.engine.table.apply_bench``
(``--quick`` for smaller totals); prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..cdc.columnar import columnar_transaction
from ..cdc.pgoutput import Relation, RelationColumn, TupleData
from ..cdc.txn import Change, Transaction
from ..pg.schema import ColumnSpec, TableSchema, assign_field_ids
from .mirror import MirrorTable

__all__ = ["run_apply_bench"]

OID = 16384
T0 = datetime(2026, 1, 1, tzinfo=UTC)
NUMERIC = (1700, (12 << 16 | 2) + 4)


def _shape(wide: bool) -> tuple[list[ColumnSpec], Callable[[int, int], list[str | None]]]:
    cols = [ColumnSpec("id", 20, -1, "bigint", pa.int64(), not_null=True, is_key=True)]
    if not wide:
        cols += [ColumnSpec("v", 25, -1, "text", pa.string()), ColumnSpec("n", 23, -1, "integer", pa.int32())]

        def row(i: int, gen: int) -> list[str | None]:
            return [str(i), f"value-{i}-{gen}", str(i % 1000)]

    else:
        kinds = [
            ("text", 25, -1, pa.string()),
            ("integer", 23, -1, pa.int32()),
            ("double precision", 701, -1, pa.float64()),
            ("numeric(12,2)", *NUMERIC, pa.decimal128(12, 2)),
            ("timestamp with time zone", 1184, -1, pa.timestamp("us", tz="UTC")),
        ]
        for j in range(20):
            name, oid, typmod, t = kinds[j % 5]
            cols.append(ColumnSpec(f"c{j}", oid, typmod, name, t))

        def row(i: int, gen: int) -> list[str | None]:
            out: list[str | None] = [str(i)]
            for j in range(20):
                k = j % 5
                out.append(
                    f"text {i} {j} {gen}"
                    if k == 0
                    else str(i + j)
                    if k == 1
                    else f"{i * 0.25 + j:.3f}"
                    if k == 2
                    else f"{i}.{j:02d}"
                    if k == 3
                    else f"2026-01-{1 + (i + j) % 28:02d} 12:{j:02d}:00+00"
                )
            return out

    assign_field_ids(cols)
    return cols, row


def _table(path: Path, cols: list[ColumnSpec]) -> MirrorTable:
    schema = TableSchema(
        schema="public", name="t", oid=OID, columns=cols, key_columns=["id"], has_primary_key=True, replica_identity="d"
    )
    t = MirrorTable("t", "public.t", schema, None, path)
    t.column_map(OID, [c.name for c in cols])
    return t


def _tup(vals: list[str | None]) -> TupleData:
    return TupleData(
        "".join("n" if v is None else "t" for v in vals), [None if v is None else v.encode() for v in vals]
    )


def _txns(
    cols: list[ColumnSpec], row: Callable[[int, int], list[str | None]], workload: str, size: int, total: int
) -> tuple[list[Transaction], list[Transaction]]:
    """(setup transactions, measured transactions): ``total`` rows in transactions of ``size`` changes."""
    rel = Relation(
        None,
        OID,
        "public",
        "t",
        "d",
        [RelationColumn(1 if c.is_key else 0, c.name, c.type_oid, c.typmod) for c in cols],
    )
    lsn = 1000

    def txn(changes: list[Change]) -> Transaction:
        nonlocal lsn
        lsn += 64
        return Transaction(lsn, lsn, lsn + 8, T0, changes)

    setup: list[Transaction] = []
    if workload in ("update", "mixed"):  # the rows to update and delete, loaded first (not measured)
        setup = [txn([Change("insert", OID, new=_tup(row(i, 0)), relation=rel) for i in range(total)])]
    out = []
    for start in range(0, total, size):
        chs = []
        for i in range(start, min(start + size, total)):
            if workload == "insert":
                chs.append(Change("insert", OID, new=_tup(row(i, 0)), relation=rel))
            elif workload == "mixed" and i % 10 == 9:
                chs.append(
                    Change("delete", OID, old=_tup([str(i)] + [None] * (len(cols) - 1)), old_kind="K", relation=rel)
                )
            else:
                chs.append(Change("update", OID, new=_tup(row(i, 1)), relation=rel))
        out.append(txn(chs))
    return setup, out


def _measure(
    cols: list[ColumnSpec], setup: list[Transaction], txns: list[Transaction], mode: str, repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as d:
            t = _table(Path(d), cols)
            for tx in setup:
                for ch in tx.changes:
                    t.apply(ch, tx.commit_lsn)
            t.mem.seal()
            pre = [columnar_transaction(tx).runs for tx in txns] if mode == "run_only" else None
            t0 = time.process_time()
            if mode == "change":
                for tx in txns:
                    for ch in tx.changes:
                        t.apply(ch, tx.commit_lsn)
            elif mode == "run":
                for tx in txns:
                    for run in columnar_transaction(tx).runs:
                        t.apply_run(run, tx.commit_lsn)
            else:
                assert pre is not None
                for tx, runs in zip(txns, pre):
                    for run in runs:
                        t.apply_run(run, tx.commit_lsn)
            t.mem.seal()
            best = min(best, time.process_time() - t0)
    return best


def run_apply_bench(quick: bool = False, repeat: int = 3) -> dict[str, Any]:
    """µs per row of each apply mode (module docstring): ``{shape: {workload: {size: {mode: us}}}}``."""
    out: dict[str, Any] = {}
    for wide in (False, True):  # warm-up (first calls of the Arrow kernels), not measured
        cols, row = _shape(wide)
        setup, txns = _txns(cols, row, "update", 100, 300)
        for m in ("change", "run"):
            _measure(cols, setup, txns, m, 1)
    for shape in ("narrow", "wide"):
        cols, row = _shape(shape == "wide")
        for workload in ("insert", "update", "mixed"):
            for size in (10, 100_000):
                total = (5_000 if quick else 20_000) if size == 10 else (20_000 if quick else 100_000)
                setup, txns = _txns(cols, row, workload, size, total)
                res = {
                    m: round(_measure(cols, setup, txns, m, repeat) / total * 1e6, 2)
                    for m in ("change", "run", "run_only")
                }
                out.setdefault(shape, {}).setdefault(workload, {})[str(size)] = res
    return out


def main() -> None:  # pragma: no cover (a command-line entry)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps(run_apply_bench(args.quick, args.repeat), indent=2))


if __name__ == "__main__":  # pragma: no cover
    main()
