"""Consistent cuts (``mooncake cut`` / ``persist --all``): every mirror committed at ONE LSN and tagged
``lsn-X-Y``. A workload moves amounts between two mirrored tables in single transactions (the sum of
both is constant) while cuts are taken; every cut read by PyIceberg at the tags' snapshots and by
DuckDB's ``iceberg_scan`` at those snapshots has the constant sum, and so does every union read
(``mooncake query``, read-your-writes and ``--no-wait``) taken while the workload runs. An untouched third table is tagged
on its current snapshot. Expiry keeps the tagged snapshots (and drops cuts beyond ``keep_cuts``).
"""

from __future__ import annotations

import json
import random
import threading
import time

import psycopg
import pytest

from mooncake_assets.engine.iceberg import IcebergMirrorTable, make_catalog
from mooncake_assets.engine.iceberg.cuts import cuts_of, parse_cut_tag
from mooncake_assets.engine.service import ServiceError
from mooncake_assets.engine.storage.duckdb_ext import connect_with_iceberg

from ..helpers import make_settings, mooncake, running_service

ROWS = 50
TOTAL = 2 * ROWS * 100
# (coalesce: the workload may move every row out of one table, whose sum is then NULL)
SUM_SQL = "SELECT coalesce((SELECT sum(amount) FROM a), 0) + coalesce((SELECT sum(amount) FROM b), 0) AS total"


def _workload(dsn: str, stop: threading.Event, done: list[int]) -> None:
    """Move amounts between a and b, one transaction each: an update on each side, or a row deleted
    from one table and inserted into the other with its amount. The sum of a and b never changes."""
    rnd = random.Random(7)
    next_id = 10_000
    with psycopg.connect(dsn) as c:
        while not stop.is_set():
            with c.transaction():
                k = rnd.randint(1, 9)
                src, dst = rnd.choice([("a", "b"), ("b", "a")])
                (left,) = c.execute(f"SELECT count(*) FROM {src}").fetchone()
                if rnd.random() < 0.8 or left <= ROWS // 5:  # (a row moves only out of a table with rows to spare)
                    x = c.execute(f"SELECT id FROM {src} ORDER BY random() LIMIT 1").fetchone()
                    y = c.execute(f"SELECT id FROM {dst} ORDER BY random() LIMIT 1").fetchone()
                    if x is not None and y is not None:
                        c.execute(f"UPDATE {src} SET amount = amount - %s WHERE id = %s", (k, x[0]))
                        c.execute(f"UPDATE {dst} SET amount = amount + %s WHERE id = %s", (k, y[0]))
                else:
                    row = c.execute(
                        f"DELETE FROM {src} WHERE id = (SELECT min(id) FROM {src}) RETURNING amount"
                    ).fetchone()
                    if row is not None:
                        next_id += 1
                        c.execute(f"INSERT INTO {dst} VALUES (%s, %s)", (next_id, row[0]))
            done[0] += 1


def _sum(tbl) -> int:
    return sum(v for v in tbl["amount"].to_pylist())


@pytest.mark.slow
def test_cuts_have_the_constant_sum(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("a", "b", "c"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, amount bigint NOT NULL)")
            c.execute(f"INSERT INTO {t} SELECT g, 100 FROM generate_series(1, {ROWS}) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        for t in ("a", "b", "c"):
            client.call("create_table", dst=t, src=f"public.{t}")
        stop, done = threading.Event(), [0]
        worker = threading.Thread(target=_workload, args=(pg_dsn, stop, done), daemon=True)
        worker.start()
        cuts = []
        union_totals: list[str] = []
        try:
            for i in range(4):
                before = done[0]
                deadline = time.time() + 30
                while done[0] < before + 20 and time.time() < deadline:  # some transactions between cuts
                    time.sleep(0.05)
                if i == 1:  # through the CLI as well as the service's action
                    r = mooncake(s, "persist", "--all", check=True)
                    assert r.stdout.startswith("cut lsn-"), r.stdout
                    cuts.append(r.stdout.split()[1])
                elif i == 3:
                    res = json.loads(mooncake(s, "cut", "--json", check=True).stdout)
                    assert res["tag"] == "lsn-" + res["lsn"].replace("/", "-")
                    cuts.append(res["tag"])
                else:
                    res = client.call("cut", timeout=600)
                    assert set(res["tables"]) == {"a", "b", "c"}
                    assert res["tables"]["a"]["committed"] and res["tables"]["a"]["flush_lsn"] == res["lsn"]
                    cuts.append(res["tag"])
                # a union read over both mirrors while the workload runs (latest, then what is applied)
                for mode in ((), ("--no-wait",)):
                    r = mooncake(s, "query", "--format", "csv", *mode, SUM_SQL, check=True)
                    union_totals.append(r.stdout.splitlines()[1])
        finally:
            stop.set()
            worker.join(timeout=30)
        assert done[0] >= 60 and len(set(cuts)) == 4
        assert union_totals == [str(TOTAL)] * 8, union_totals  # every union read has the constant sum

        catalog = make_catalog(s.catalog, s.warehouse_uri)
        tables = {t: catalog.load_table(f"mooncake.{t}") for t in ("a", "b", "c")}
        duck = connect_with_iceberg()
        a_sums = set()
        for tag in cuts:
            lsn = parse_cut_tag(tag)
            total = duck_total = 0
            for name in ("a", "b"):
                tbl = tables[name]
                ref = tbl.metadata.refs[tag]
                snap = tbl.metadata.snapshot_by_id(ref.snapshot_id)
                assert snap.summary.additional_properties["mooncake.flush-lsn"] == str(lsn)
                rows = tbl.scan(snapshot_id=ref.snapshot_id).to_arrow()
                # DuckDB's iceberg_scan picks the snapshot by id (snapshot_from_id)
                got = duck.sql(
                    f"SELECT sum(amount) FROM iceberg_scan('{tbl.metadata_location}', snapshot_from_id = {ref.snapshot_id})"
                ).fetchone()[0]
                assert got == _sum(rows)
                total += _sum(rows)
                duck_total += got
                if name == "a":
                    a_sums.add(got)
            assert total == duck_total == TOTAL, (tag, total, duck_total)
            # c never changes: every cut after the first tags its one snapshot holding the initial rows
            c_ref = tables["c"].metadata.refs[tag]
            assert _sum(tables["c"].scan(snapshot_id=c_ref.snapshot_id).to_arrow()) == ROWS * 100
        assert len({tables["c"].metadata.refs[tag].snapshot_id for tag in cuts}) == 1
        assert len(a_sums) > 1  # the cuts differ, so each read really was at its own snapshot

        # the CLI lists them and reads one as of its LSN
        listed = json.loads(mooncake(s, "list-cuts", "--json", check=True).stdout)
        assert [c["tag"] for c in listed] == sorted(cuts, key=parse_cut_tag)
        assert all(set(c["tables"]) == {"a", "b", "c"} for c in listed)
        r = mooncake(
            s,
            "query",
            "--as-of-lsn",
            str(parse_cut_tag(cuts[1])),
            "--format",
            "csv",
            "SELECT (SELECT sum(amount) FROM a) + (SELECT sum(amount) FROM b) AS total",
            check=True,
        )
        assert r.stdout.splitlines() == ["total", str(TOTAL)], r.stdout
        assert f"read the cut {cuts[1]}" in r.stderr

        r = mooncake(s, "query", "--as-of-lsn", "0/1", "SELECT 1")
        assert r.returncode == 1 and "no table has the cut lsn-0-1" in r.stderr, r.stderr
        r = mooncake(s, "query", "--as-of-lsn", "yesterday", "SELECT 1")
        assert r.returncode == 2 and "not a cut" in r.stderr, r.stderr
        r = mooncake(s, "persist")
        assert r.returncode == 2 and "--all" in r.stderr, r.stderr
        with pytest.raises(ServiceError, match="no mirrored table 'nope'"):
            client.call("cut", tables=["a", "nope"])
        # a cut of some tables: only they get the tag
        part = client.call("cut", tables=["a"])
        assert set(part["tables"]) == {"a"} and part["tag"] not in catalog.load_table("mooncake.b").metadata.refs
        assert part["tag"] in catalog.load_table("mooncake.a").metadata.refs

        # expiry keeps the tagged snapshots; keep_cuts=2 drops the two oldest cuts
        future = int(time.time() * 1000) + 60_000
        for name in ("a", "b"):
            mine = sorted(cuts + ([part["tag"]] if name == "a" else []), key=parse_cut_tag)
            ice = IcebergMirrorTable.load(catalog, f"mooncake.{name}")
            ice.expire_snapshots(future, retain_last=1, delete_files=True)
            md = catalog.load_table(f"mooncake.{name}").metadata
            assert [c.tag for c in cuts_of(md)] == mine
            ice.expire_snapshots(future, retain_last=1, delete_files=True, keep_cuts=len(mine) - 2)
            md = catalog.load_table(f"mooncake.{name}").metadata
            assert [c.tag for c in cuts_of(md)] == mine[2:]
        for tag in sorted(cuts, key=parse_cut_tag)[2:]:
            total = sum(
                _sum(
                    catalog.load_table(f"mooncake.{n}")
                    .scan(snapshot_id=catalog.load_table(f"mooncake.{n}").metadata.refs[tag].snapshot_id)
                    .to_arrow()
                )
                for n in ("a", "b")
            )
            assert total == TOTAL


def test_query_as_of_a_cut_names_a_table_the_cut_does_not_hold(pg_dsn, state_dir):
    """``query --as-of-lsn`` over a mirror that exists but is not in the cut (a cut of some tables) says
    so in one line naming the table and the cut's tables, not DuckDB's bare "Table ... does not exist"."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("x1", "x2"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
            c.execute(f"INSERT INTO {t} SELECT generate_series(1, 5)")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        for t in ("x1", "x2"):
            client.call("create_table", dst=t, src=f"public.{t}")
        tag = client.call("cut", tables=["x1"])["tag"]
        r = mooncake(s, "query", "--as-of-lsn", tag, "--format", "csv", "SELECT count(*) AS n FROM x1", check=True)
        assert r.stdout.splitlines() == ["n", "5"], r.stdout
        r = mooncake(s, "query", "--as-of-lsn", tag, "SELECT count(*) FROM X2")
        msg = r.stderr.strip()
        assert r.returncode == 1 and len(msg.splitlines()) == 1, (r.stdout, r.stderr)
        assert f"table x2 is not in the cut {tag} (the cut holds x1" in msg, msg
        r = mooncake(s, "query", "--as-of-lsn", tag, "SELECT count(*) FROM nope")
        assert r.returncode == 1 and "nope" in r.stderr and "not in the cut" not in r.stderr, r.stderr
