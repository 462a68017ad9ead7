"""A warehouse whose index blobs were written under the key hash before ``KEY_HASH_VERSION`` (blake2b of
the key's text for non-exact keys, no version in the blob) still finds its keys after a restart:
exact (integer) keys keep their blocks, the others are rebuilt from the data files, and deletes and
updates land on the right rows."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import psycopg
import pyarrow.parquet as pq
from psycopg.types.string import TextLoader

from mooncake_assets.engine.deletes import PuffinBlob, read_puffin, write_puffin
from mooncake_assets.engine.index import IndexBlock, splitmix64
from mooncake_assets.engine.pg.conninfo import OUTPUT_SETTINGS
from mooncake_assets.verify import verify

from ..helpers import make_settings, running_service


def _old_hash(texts: list, exact: bool) -> int:
    """The key hash index blobs held before versions: splitmix64 of the integer for one integer key
    column, else splitmix64(blake2b-64 of per value b"\\x00" (NULL) or b"\\x01" + len (4 bytes LE) +
    UTF-8)."""
    if exact:
        return splitmix64(int(texts[0]))
    raw = bytearray()
    for v in texts:
        if v is None:
            raw += b"\x00"
        else:
            b = v.encode()
            raw += b"\x01" + len(b).to_bytes(4, "little") + b
    return splitmix64(int.from_bytes(hashlib.blake2b(bytes(raw), digest_size=8).digest(), "little"))


def _table(client, name):
    return {t["name"]: t for t in client.status()["tables"]}[name]


def _lsn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _texts_by_n(dsn, table, cols):
    """n -> the key columns' output-function text (what pgoutput and COPY carry), for every row."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for k, v in OUTPUT_SETTINGS.items():
            c.execute(f"SET {k} = '{v}'")
        q = f"SELECT n, {', '.join(cols)} FROM public.{table}"
        for d in c.execute(q + " LIMIT 0").description[1:]:
            c.adapters.register_loader(d.type_code, TextLoader)
        return {int(r[0]): list(r[1:]) for r in c.execute(q).fetchall()}


def _write_old_index(state_dir, table, texts_of_row, exact) -> int:
    """Replace the table's index blob(s) by what the old code wrote for its data files: one IndexBlock
    over all of them, old hash, header without a key hash version. Returns the number of data files."""
    root = next(p for p in (state_dir / "warehouse").rglob(table) if (p / "data").is_dir())
    files = sorted((root / "data").glob("*.parquet"))
    hashes, fids, rows = [], [], []
    for i, f in enumerate(files):
        t = pq.read_table(f)
        for r, row in enumerate(t.to_pylist()):
            hashes.append(_old_hash(texts_of_row(row), exact))
            fids.append(i)
            rows.append(r)
    block = IndexBlock.build(
        state_dir / f"{table}-old.idx",
        np.array(hashes, np.uint64),
        np.array(fids),
        np.array(rows),
        [f.name for f in files],
    )
    data = block.path.read_bytes()
    head = json.dumps({"blocks": [{"name": block.path.name, "size": len(data)}]}).encode()
    blob = len(head).to_bytes(4, "little") + head + data
    puffins = list((root / "index").glob("*.puffin"))
    assert puffins
    for p in puffins:
        old = read_puffin(p.read_bytes()).blobs[0]
        out, _ = write_puffin(
            [
                PuffinBlob(
                    type=old.type,
                    fields=[],
                    data=blob,
                    snapshot_id=old.snapshot_id,
                    sequence_number=old.sequence_number,
                )
            ],
            {"created-by": "old"},
        )
        p.write_bytes(out)
    return len(files)


def test_old_hash_index_is_rebuilt_or_kept_on_restore(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE ik (id bigint PRIMARY KEY, n int)")
        c.execute("INSERT INTO ik SELECT g, g FROM generate_series(1, 400) g")
        c.execute("CREATE TABLE tk (k text PRIMARY KEY, n int)")
        c.execute("INSERT INTO tk SELECT 'key-' || g, g FROM generate_series(1, 400) g")
        c.execute("CREATE TABLE ck (a int, b text, n int, PRIMARY KEY (a, b))")
        c.execute("INSERT INTO ck SELECT g % 7, 'b' || g, g FROM generate_series(1, 400) g")
        c.execute("CREATE TABLE wr (a text, f float8, d date, m numeric(10,2), n int)")
        c.execute("ALTER TABLE wr REPLICA IDENTITY FULL")
        c.execute(
            "INSERT INTO wr SELECT CASE WHEN g % 5 = 0 THEN NULL ELSE 'ü' || g END, g * 1e14, "
            "date '2020-01-01' + g, g / 4.0, g FROM generate_series(1, 400) g"
        )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    tables = ("ik", "tk", "ck", "wr")
    with running_service(s) as client:
        for t in tables:
            client.call("create_table", dst=t, src=f"public.{t}")
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("INSERT INTO ik SELECT g, g FROM generate_series(401, 500) g")
            c.execute("INSERT INTO tk SELECT 'key-' || g, g FROM generate_series(401, 500) g")
            c.execute("INSERT INTO ck SELECT g % 7, 'b' || g, g FROM generate_series(401, 500) g")
            c.execute(
                "INSERT INTO wr SELECT 'w' || g, -g * 1e-5, date '2020-01-01' - g, -g, g "
                "FROM generate_series(401, 500) g"
            )
        client.wait_lsn(_lsn(pg_dsn))
        for t in tables:
            client.call("persist", table=t)
    # the service is stopped: make the warehouse look as the old code left it
    wr_texts = _texts_by_n(pg_dsn, "wr", ["a", "f", "d", "m", "n"])
    nfiles = {
        "ik": _write_old_index(state_dir, "ik", lambda r: [str(r["id"])], True),
        "tk": _write_old_index(state_dir, "tk", lambda r: [r["k"]], False),
        "ck": _write_old_index(state_dir, "ck", lambda r: [str(r["a"]), r["b"]], False),
        "wr": _write_old_index(state_dir, "wr", lambda r: wr_texts[r["n"]], False),
    }
    assert all(n >= 2 for n in nfiles.values()), nfiles
    with running_service(s) as client:
        st = {t: _table(client, t) for t in tables}
        assert st["ik"]["index_blocks"] == 1  # the exact hash did not change: the old block is kept
        for t in ("tk", "ck", "wr"):
            assert st[t]["index_blocks"] == nfiles[t]  # rebuilt: one block per data file
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM ik WHERE id IN (17, 450)")
            c.execute("UPDATE ik SET n = -n WHERE id IN (3, 499)")
            c.execute("DELETE FROM tk WHERE k IN ('key-17', 'key-450')")
            c.execute("UPDATE tk SET n = -n WHERE k IN ('key-3', 'key-499')")
            c.execute("DELETE FROM ck WHERE (a, b) IN ((17 % 7, 'b17'), (450 % 7, 'b450'))")
            c.execute("UPDATE ck SET n = -n WHERE b IN ('b3', 'b499')")
            c.execute("DELETE FROM wr WHERE n IN (17, 450, 20)")  # 20: a NULL in the key
            c.execute("UPDATE wr SET n = -n WHERE n IN (3, 499)")
        client.wait_lsn(_lsn(pg_dsn))
        for t in tables:
            got = _table(client, t)
            assert got["missing_keys"] == 0, t
            assert got["pending_deletes"] == (3 + 2 if t == "wr" else 2 + 2), t  # found in the persisted files
        results, _ = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
        for t in tables:
            client.call("persist", table=t)  # the next blob carries the key hash version
    with running_service(s) as client:
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("DELETE FROM tk WHERE k = 'key-100'")
            c.execute("DELETE FROM wr WHERE n = 100")
        client.wait_lsn(_lsn(pg_dsn))
        assert all(_table(client, t)["missing_keys"] == 0 for t in tables)
        results, _ = verify(s, None, "union", client)
        assert all(r.match for r in results), [r.line() for r in results]
