"""Model-based test of the index stack: MemIndex + FileIndex against plain Python dicts.

Random inserts, deletes, flushes (new blocks), index merges, data compactions and restarts (blocks
saved as bytes and restored); after every step every lookup (single and batched) must agree with the
model. Keys are ints (exact hashes) or strings (hashed: candidates are re-checked against the row, as
the table does). Several rows may share a key, as in tables without a primary key.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from mooncake_assets.engine.index import (
    FileIndex,
    IndexBlock,
    IndexMergePolicy,
    MemIndex,
    PositionMap,
)
from mooncake_assets.engine.index.key_hash import int_key_hashes, text_key_hashes

from .index_blocks import build_block_from_mem_index

UNIVERSE = list(range(12))


def make_machine(root: Path):
    class IndexMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.dir = Path(tempfile.mkdtemp(dir=root))
            self.n = 0
            self.mem_index = MemIndex()
            self.file_index = FileIndex()
            self.batches = {}  # batch id -> list of [key, alive]
            self.files = {}  # file name -> list of [key, alive (False = deleted by a DV)]
            self.next_batch = 0
            self.as_str = False

        def _key(self, k):
            return f"key-{k}" if self.as_str else k

        def _hash(self, keys):
            if self.as_str:
                return text_key_hashes([[self._key(k) for k in keys]])
            return int_key_hashes(np.array(keys, dtype=np.int64))

        def _path(self, what):
            self.n += 1
            return self.dir / f"{what}-{self.n}.idx"

        def _replace(self, old, new):
            self.file_index.replace_blocks(old, new)
            for b in old:
                b.unlink()

        @initialize(as_str=st.booleans())
        def setup(self, as_str):
            self.as_str = as_str

        # ------------------------------------------------------------------ changes
        @rule(keys=st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=8))
        def insert(self, keys):
            b = self.next_batch
            self.next_batch += 1
            self.batches[b] = [[k, True] for k in keys]
            hashes = self._hash(keys)
            if len(keys) <= 2:  # the per-row path the table uses
                for r, h in enumerate(hashes.tolist()):
                    self.mem_index.insert_one(h, b, r)
            else:
                self.mem_index.insert(hashes, b)

        @rule(key=st.sampled_from(UNIVERSE))
        def delete(self, key):
            h = int(self._hash([key])[0])
            # the table's way: MemIndex first (re-check the row's key), then the FileIndex
            for b, r in self.mem_index.lookup(h):
                row = self.batches[b][r]
                assert row[1], "the MemIndex only holds live rows"
                if row[0] == key:
                    row[1] = False
                    self.mem_index.remove(h, (b, r))
                    return
            for f, r in self.file_index.lookup(h):
                row = self.files[f][r]
                if row[0] == key and row[1]:
                    row[1] = False  # a position delete / DV
                    return
            live = [
                1 for rows in list(self.batches.values()) + list(self.files.values()) for k, a in rows if a and k == key
            ]
            assert not live, f"key {key} is live but the index did not find it"

        @rule(all_batches=st.booleans(), split=st.booleans())
        def flush(self, all_batches, split):
            ids = sorted(self.batches)
            if not all_batches:
                ids = ids[:-1]
            if not ids:
                return
            live = [(b, r) for b in ids for r, (k, a) in enumerate(self.batches[b]) if a]
            names = [f"data-{self.n}-a", f"data-{self.n}-b"] if split else [f"data-{self.n}"]
            self.n += 1
            cut = len(live) // 2 if split else len(live)
            new_rows = {name: [] for name in names}
            sources = {b: (np.full(len(self.batches[b]), -1), np.zeros(len(self.batches[b]), np.int64)) for b in ids}
            for i, (b, r) in enumerate(live):
                fi = 0 if i < cut else 1
                sources[b][0][r] = fi
                sources[b][1][r] = len(new_rows[names[fi]])
                new_rows[names[fi]].append([self.batches[b][r][0], True])
            pm = PositionMap(tuple(names), sources)
            block = build_block_from_mem_index(self._path("flush"), self.mem_index, pm)
            self.file_index.add_block(block)
            self.mem_index.drop_batches(ids)
            for b in ids:
                del self.batches[b]
            self.files.update(new_rows)

        @precondition(lambda self: len(self.file_index) >= 2)
        @rule(data=st.data())
        def merge(self, data):
            blocks = list(self.file_index.blocks)
            chosen = data.draw(st.lists(st.sampled_from(blocks), min_size=2, unique_by=id))
            merged = FileIndex.build_from_merge(chosen, self._path("merge"))
            self._replace(chosen, merged)

        @precondition(lambda self: len(self.file_index) >= 2)
        @rule()
        def policy_merge(self):
            picked = IndexMergePolicy(max_blocks=1, max_blocks_per_merge=3).pick(self.file_index)
            assert 2 <= len(picked) <= 3
            self._replace(picked, FileIndex.build_from_merge(picked, self._path("policy")))

        @precondition(lambda self: len(self.files) >= 1)
        @rule(data=st.data())
        def compact(self, data):
            names = sorted(self.files)
            chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
            new_name = f"compacted-{self.n}"
            self.n += 1
            new_rows = []
            sources = {}
            for name in chosen:
                rows = self.files[name]
                idx = np.full(len(rows), -1)
                nr = np.zeros(len(rows), np.int64)
                for r, (k, a) in enumerate(rows):
                    if a:
                        idx[r] = 0
                        nr[r] = len(new_rows)
                        new_rows.append([k, True])
                sources[name] = (idx, nr)
            pm = PositionMap((new_name,), sources)
            blocks = self.file_index.blocks_for_files(chosen)
            new = FileIndex.build_from_compaction(blocks, pm, self._path("compact"))
            self._replace(blocks, new)
            for name in chosen:
                del self.files[name]
            if new_rows:
                self.files[new_name] = new_rows

        @rule()
        def restart(self):
            """Save every block's bytes (as in a Puffin blob) and restore them as new files."""
            saved = [b.to_bytes() for b in self.file_index.blocks]
            for b in self.file_index.blocks:
                b.unlink()
            self.file_index = FileIndex([IndexBlock.from_bytes(data, self._path("restored")) for data in saved])

        # ------------------------------------------------------------------ checks
        @invariant()
        def lookups_agree_with_model(self):
            hashes = self._hash(UNIVERSE)
            batch = self.file_index.lookup_batch(hashes).as_lists(len(UNIVERSE))
            mem_qi, mem_b, mem_r = self.mem_index.lookup_batch(hashes)
            for i, key in enumerate(UNIVERSE):
                h = int(hashes[i])
                want_files = sorted(
                    (f, r) for f, rows in self.files.items() for r, (k, _) in enumerate(rows) if k == key
                )
                got = self.file_index.lookup(h)
                assert sorted(got) == want_files
                assert batch[i] == got
                want_mem = sorted(
                    (b, r) for b, rows in self.batches.items() for r, (k, a) in enumerate(rows) if a and k == key
                )
                assert sorted(self.mem_index.lookup(h)) == want_mem
                sel = mem_qi == i
                assert sorted(zip(mem_b[sel].tolist(), mem_r[sel].tolist())) == want_mem
            assert len(self.mem_index) == sum(a for rows in self.batches.values() for _, a in rows)
            assert self.file_index.num_entries == sum(len(rows) for rows in self.files.values())

        def teardown(self):
            for b in self.file_index.blocks:
                b.close()

    return IndexMachine


def test_index_state_machine(tmp_path):
    run_state_machine_as_test(
        make_machine(tmp_path),
        settings=settings(
            max_examples=75,
            stateful_step_count=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
