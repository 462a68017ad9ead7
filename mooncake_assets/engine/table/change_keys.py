"""The change feed with deletes as keys (``deletes="keys"``): inserted rows in full, deleted rows as
their primary key only.

The full-row feed (:mod:`.changes`) reads every deleted row back from the older data file that held
it. Deletes of a few percent of a table's rows fall into nearly every row group of its files, so
that costs about a scan of the whole table. A reader that applies the feed by key (delete the key,
then insert the new row) needs only the key, which is one narrow column of those files.

:func:`run_plan` executes a :class:`.changes.ChangePlan`; with ``plan.deletes == "keys"``:

- ``insert`` rows are read and returned in full, as in the full-row feed;
- rows of a data file that leaves the table (a compaction's input, a file whose rows are all
  deleted) are read in full. They are matched against the inserts, so a row that compaction copies
  unchanged into a new file cancels as in the full-row feed. The buffer's deleted rows are in
  memory and take part in that matching too;
- the other deleted rows (newly deleted positions of files that stay) are read as their key
  columns only, by field id.

Output: the full-row feed's columns and order, the non-key columns null on ``delete`` rows (every
non-key field is nullable). The deleted keys equal the keys of the full-row feed's deletes, except
that an UPDATE which leaves every value as it was shows here as the delete of its key and the
insert of the same row (the full-row feed drops such pairs; applying either gives the same table).
Tables without a primary key are refused when the plan is made
(:func:`.changes.check_deletes_mode`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .changes import ChangePlan, cancel_pairs, kept

__all__ = ["execute_keys", "run_plan"]


def run_plan(plan: ChangePlan) -> pa.Table:
    """The feed of ``plan``: :meth:`.changes.ChangePlan.execute` for ``deletes="rows"``,
    :func:`execute_keys` for ``deletes="keys"``."""
    return execute_keys(plan) if plan.deletes == "keys" else plan.execute()


def execute_keys(plan: ChangePlan) -> pa.Table:
    """The feed of ``plan`` with deletes as keys (module docstring): an Arrow table of the table's
    columns (non-key ones nullable) + ``_change`` + ``_commit_lsn``, the rows read once by
    :meth:`.changes.ChangePlan.gather`."""
    key_schema = pa.schema([plan.schema.field(k) for k in plan.key])
    ins, ins_l, full_d, full_dl, key_d, key_dl = plan.gather(key_schema)
    i_tab, i_lsn = plan.concat_rows(ins, ins_l)
    d_tab, d_lsn = plan.concat_rows(full_d, full_dl)
    keep_i, keep_d = cancel_pairs(i_tab, d_tab, plan.key)
    i_tab, i_lsn = kept(i_tab, i_lsn, keep_i)
    d_tab, d_lsn = kept(d_tab, d_lsn, keep_d)
    keys = [d_tab.select(plan.key).cast(key_schema)]
    keys += [t.cast(key_schema) if not t.schema.equals(key_schema) else t for t in key_d]
    k_lsn = np.concatenate([d_lsn, *key_dl])
    out_schema = pa.schema([f if f.name in plan.key else f.with_nullable(True) for f in plan.schema])
    k_tab = pa.concat_tables(keys).combine_chunks()
    dels = pa.Table.from_arrays(
        [k_tab.column(f.name) if f.name in plan.key else pa.nulls(k_tab.num_rows, f.type) for f in out_schema],
        schema=out_schema,
    )
    return plan.output(i_tab.cast(out_schema), i_lsn, dels, k_lsn)
