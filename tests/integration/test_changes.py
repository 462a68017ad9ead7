"""The change feed (``mooncake changes``, ``ServiceClient.changes``) against the real Postgres and
the real service process.

Oracle: the source table read at quiet points (nothing else writes), each recorded with a cut LSN
the feed must serve (a persist's flush LSN — a snapshot's — and LSNs of the buffer window). For
every pair of cuts, applying the feed's deletes and inserts to the rows at the first gives the rows
at the second, across flushes, persists, index merges, compactions and a restart.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections import Counter
from itertools import combinations

import psycopg
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from mooncake_assets.engine.lsn import Lsn
from mooncake_assets.engine.service import ServiceError

from ..helpers import make_settings, mooncake, running_service

POLICY = {"target_file_bytes": 24 * 1024, "file_count_trigger": 2, "delete_ratio_percent": 10}
META = ("_change", "_commit_lsn")


def _lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _rows(dsn: str, table: str) -> Counter:
    with psycopg.connect(dsn, autocommit=True) as c:
        return Counter(c.execute(f"SELECT * FROM {table}").fetchall())


def _apply(before: Counter, feed) -> Counter:
    """``before`` with the feed applied: each delete removes one equal row (which must be there)."""
    cols = [c for c in feed.column_names if c not in META]
    out = Counter(before)
    for r in feed.to_pylist():
        row = tuple(r[c] for c in cols)
        if r["_change"] == "delete":
            assert out[row] > 0, f"delete of a row not in the read at since: {row}"
            out[row] -= 1
        else:
            out[row] += 1
    return +out


def _same_keys(feed, keys, where: str) -> None:
    """The keys feed (``deletes="keys"``) holds the full feed's inserts and its deletes' keys (the
    workload has no UPDATE that leaves a row as it was), the deletes' other columns null."""
    full, got = feed.to_pylist(), keys.to_pylist()
    ins = [r for r in got if r["_change"] == "insert"]
    assert ins == [r for r in full if r["_change"] == "insert"], where
    dels = [r for r in got if r["_change"] == "delete"]
    assert [r["id"] for r in dels] == [r["id"] for r in full if r["_change"] == "delete"], where
    assert all(r["v"] is None and r["n"] is None for r in dels), where


def _wait_streaming(client, timeout: float = 60.0) -> None:
    """After a restart the socket answers while the service still restores; wait until it streams."""
    deadline = time.time() + timeout
    while not client.status().get("streaming"):
        assert time.time() < deadline, "the service did not start streaming"
        time.sleep(0.05)


def _sql(dsn: str, *stmts: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for s in stmts:
            c.execute(s)


def _step(dsn, client, stmts, op=None, table=None):
    """Run ``stmts``, wait until applied, run maintenance ``op`` on ``table``; returns the persist's
    flush LSN (a snapshot cut) for ``persist``, else None."""
    _sql(dsn, *stmts)
    client.wait_lsn(_lsn(dsn))
    if op is None:
        return None
    res = client.call(op, table=table, **({"full": True} if op == "compact" else {}))
    if op == "compact":
        assert res["files_in"] >= 2, res  # the feed must see through a real rewrite
    return _snapshot_lsn(client.settings, table) if op == "persist" else None


def _snapshot_lsn(s, table: str) -> Lsn:
    """The current Iceberg snapshot's ``mooncake.flush-lsn`` (a cut; a persist that had nothing to
    commit advances the table's flush LSN without one)."""
    from mooncake_assets.engine.iceberg import IcebergMirrorTable, make_catalog
    from mooncake_assets.engine.storage import catalog_properties

    ice = IcebergMirrorTable.load(
        make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s)), f"mooncake.{table}"
    )
    return Lsn.parse(ice.table.metadata.current_snapshot().summary.additional_properties["mooncake.flush-lsn"])


WORKLOAD = [
    (["INSERT INTO ct SELECT g, 'a' || g, g FROM generate_series(301, 400) g"], "flush"),
    (["UPDATE ct SET n = n + 1000 WHERE id % 7 = 0", "DELETE FROM ct WHERE id % 11 = 0"], "persist"),
    (["UPDATE ct SET id = id + 10000 WHERE id BETWEEN 20 AND 25", "INSERT INTO ct VALUES (5000, 'x', 1)"], "persist"),
    (["DELETE FROM ct WHERE id % 5 = 0", "UPDATE ct SET v = 'u' || v WHERE id % 3 = 0"], "persist"),
    ([], "merge_index"),
    ([], "compact"),
    (["UPDATE ct SET n = -n WHERE id % 4 = 1", "DELETE FROM ct WHERE id = 5000"], "persist"),
]
KEYLESS = [
    "INSERT INTO kl VALUES ('d', 1), ('d', 1), (NULL, 2)",
    "DELETE FROM kl WHERE ctid = (SELECT ctid FROM kl WHERE a = 'd' LIMIT 1)",
    "UPDATE kl SET n = n + 1 WHERE a IS NULL",
]


def test_feed_applied_to_since_gives_until(pg_dsn, state_dir):
    _sql(
        pg_dsn,
        "CREATE TABLE ct (id int PRIMARY KEY, v text, n int)",
        "INSERT INTO ct SELECT g, 'v' || g, g FROM generate_series(1, 300) g",
        "CREATE TABLE kl (a text, n int)",
        "ALTER TABLE kl REPLICA IDENTITY FULL",
        "INSERT INTO kl VALUES ('a', 1), ('a', 1), ('b', 2)",
    )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster", extra={"maintenance": dict(POLICY)})
    cuts: list[tuple[int, Counter, Counter]] = []  # (lsn, ct rows, kl rows)
    with running_service(s) as client:
        client.call("create_table", dst="ct", src="public.ct")
        client.call("create_table", dst="kl", src="public.kl")
        client.settings = s
        first, kl_first = _snapshot_lsn(s, "ct"), _snapshot_lsn(s, "kl")
        kl_rows = _rows(pg_dsn, "kl")
        cuts.append((first, _rows(pg_dsn, "ct"), kl_rows))
        for i, (stmts, op) in enumerate(WORKLOAD):
            extra = [KEYLESS[i]] if i < len(KEYLESS) else []
            cut = _step(pg_dsn, client, stmts + extra, op, "ct")
            if op == "persist":
                client.call("persist", table="kl")
                cuts.append((cut, _rows(pg_dsn, "ct"), None))
    with running_service(s) as client:  # a restart: the buffer is gone, history is in the snapshots
        _wait_streaming(client)
        client.wait_lsn(_lsn(pg_dsn))
        _sql(pg_dsn, "UPDATE ct SET v = 'r' WHERE id % 9 = 2", "DELETE FROM ct WHERE id % 13 = 3")
        lsn = _lsn(pg_dsn)
        client.wait_lsn(lsn)
        cuts.append((Lsn.parse(lsn), _rows(pg_dsn, "ct"), _rows(pg_dsn, "kl")))  # in the buffer window
        _sql(pg_dsn, "INSERT INTO ct VALUES (7000, 'late', 7)", "UPDATE ct SET n = 0 WHERE id = 1")
        lsn = _lsn(pg_dsn)
        client.wait_lsn(lsn)
        cuts.append((Lsn.parse(lsn), _rows(pg_dsn, "ct"), _rows(pg_dsn, "kl")))

        checked = 0
        for (a, ra, _), (b, rb, _) in combinations(cuts, 2):
            head, feed = client.changes("ct", str(Lsn(a)), str(Lsn(b)))
            assert head["since"] == str(Lsn(a)) and head["until"] == str(Lsn(b))
            assert _apply(ra, feed) == rb, f"[{Lsn(a)}, {Lsn(b)})"
            _, keys = client.changes("ct", str(Lsn(a)), str(Lsn(b)), deletes="keys")
            _same_keys(feed, keys, f"[{Lsn(a)}, {Lsn(b)})")
            checked += 1
        assert checked == len(cuts) * (len(cuts) - 1) // 2 >= 21

        # the buffer window: exact commit LSNs, each inside the range; an UPDATE is a delete + insert by key
        (a, ra, _), (b, rb, kb) = cuts[-2], cuts[-1]
        _, feed = client.changes("ct", str(Lsn(a)), str(Lsn(b)))
        rows = feed.to_pylist()
        assert {(r["id"], r["_change"]) for r in rows} == {(7000, "insert"), (1, "delete"), (1, "insert")}
        assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)  # by key, delete before insert
        assert all(a <= Lsn.parse(r["_commit_lsn"]) < b for r in rows)
        # a persisted range: only the snapshots' LSNs are known
        _, feed = client.changes("ct", str(Lsn(cuts[0][0])), str(Lsn(cuts[1][0])))
        assert feed.num_rows and feed.column("_commit_lsn").null_count == feed.num_rows
        # keyless table, duplicates included: from the first snapshot to now
        _, feed = client.changes("kl", str(Lsn(kl_first)), str(Lsn(b)))
        assert _apply(kl_rows, feed) == kb

        # the default end is everything applied
        head, feed = client.changes("ct", str(Lsn(a)))
        assert Lsn.parse(head["until"]) >= b and _apply(ra, feed) == rb

        # ranges that cannot be served: one line each, naming what can
        with pytest.raises(ServiceError, match="oldest available LSN is") as e:
            client.changes("ct", "0/1", str(Lsn(b)))
        oldest = Lsn.parse(str(e.value).rsplit(" ", 1)[1])
        assert oldest <= cuts[0][0] and "created" in str(e.value)
        with pytest.raises(ServiceError, match="is not a cut"):
            client.changes("ct", str(Lsn(cuts[1][0] + 1)), str(Lsn(b)))
        with pytest.raises(ServiceError, match="is after"):
            client.changes("ct", str(Lsn(b)), str(Lsn(a)))
        with pytest.raises(ServiceError, match="table kl has no primary key: deletes as keys need one") as e:
            client.changes("kl", str(Lsn(kl_first)), str(Lsn(b)), deletes="keys")
        assert "\n" not in str(e.value)
        with pytest.raises(ServiceError, match="is ahead of the source's current WAL position"):  # at once
            client.changes("ct", str(Lsn(a)), str(Lsn(b + (1 << 40))), timeout=30)


def test_changes_command(pg_dsn, state_dir):
    _sql(pg_dsn, "CREATE TABLE cc (id int PRIMARY KEY, v text)", "INSERT INTO cc VALUES (1, 'a'), (2, 'b')")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    with running_service(s) as client:
        client.call("create_table", dst="cc", src="public.cc")
        since = str(_snapshot_lsn(s, "cc"))
        _sql(
            pg_dsn,
            "UPDATE cc SET v = 'z' WHERE id = 2",
            "INSERT INTO cc VALUES (3, 'c')",
            "DELETE FROM cc WHERE id = 1",
        )
        r = mooncake(s, "changes", "cc", "--since", since, "--format", "json", check=True)
        rows = json.loads(r.stdout)
        assert [(x["id"], x["v"], x["_change"]) for x in rows] == [
            (1, "a", "delete"),
            (2, "b", "delete"),
            (2, "z", "insert"),
            (3, "c", "insert"),
        ]
        assert all(x["_commit_lsn"] for x in rows)
        assert "changes of cc in [" in r.stderr and "2 inserts, 2 deletes" in r.stderr
        # rows 1 and 2 came back from the copied data file: the note says why and what to do
        assert "note: 2 deleted rows of cc were read back from its data files" in r.stderr, r.stderr
        assert "ALTER TABLE public.cc REPLICA IDENTITY FULL" in r.stderr
        until = r.stderr.split(", ")[1].split(")")[0]
        out = state_dir / "feed.parquet"
        mooncake(
            s,
            "changes",
            "cc",
            "--since",
            since,
            "--until",
            until,
            "--format",
            "parquet",
            "--output",
            str(out),
            check=True,
        )
        assert pq.read_table(out).num_rows == 4
        csv = mooncake(s, "changes", "cc", "--since", since, "--until", until, "--format", "csv", check=True).stdout
        assert csv.splitlines()[0] == "id,v,_change,_commit_lsn" and len(csv.splitlines()) == 5
        assert pq.read_table(io.BytesIO(out.read_bytes())).column_names[-2:] == ["_change", "_commit_lsn"]

        keys = mooncake(s, "changes", "cc", "--since", since, "--until", until, "--format", "json", "--deletes", "keys")
        assert "note:" not in keys.stderr
        assert [(x["id"], x["v"], x["_change"]) for x in json.loads(keys.stdout)] == [
            (1, None, "delete"),
            (2, None, "delete"),
            (2, "z", "insert"),
            (3, "c", "insert"),
        ]
        wrong = mooncake(s, "changes", "cc", "--since", since, "--deletes", "all")
        assert wrong.returncode == 2 and "--deletes must be rows or keys, not 'all'" in wrong.stderr
        bad = mooncake(s, "changes", "cc", "--since", until, "--until", since)
        assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "is after --until" in bad.stderr
        old = mooncake(s, "changes", "cc", "--since", "0/1", "--until", until)
        assert old.returncode == 1 and "oldest available LSN is" in old.stderr
        assert "table cc: no changes before LSN" in old.stderr and "created" in old.stderr
        assert Lsn.parse(old.stderr.split()[-1]) <= Lsn.parse(since) and old.stderr.strip().count("\n") == 0
        future = mooncake(s, "changes", "cc", "--since", since, "--until", "FF/0", "--max-wait", "30")
        assert future.returncode == 2 and "is ahead of the source's current WAL position" in future.stderr, future
        assert future.stderr.strip().count("\n") == 0, future.stderr
        # an LSN not applied yet is waited for (read-your-writes), then served
        later = threading.Timer(1.0, _sql, (pg_dsn, "INSERT INTO other_wal SELECT 1"))
        _sql(pg_dsn, "CREATE TABLE other_wal (x int)")
        ahead = str(Lsn(Lsn.parse(_lsn(pg_dsn)) + 1))  # past everything written so far
        later.start()
        try:
            waited = mooncake(
                s, "changes", "cc", "--since", since, "--until", ahead, "--format", "csv", "--max-wait", "60"
            )
        finally:
            later.join()
        assert waited.returncode == 0, waited.stderr
        assert f"changes of cc in [{since}, {ahead}): 2 inserts, 2 deletes" in waited.stderr
        nolsn = mooncake(s, "changes", "cc", "--since", "nope")
        assert nolsn.returncode == 2 and "is not an LSN" in nolsn.stderr
        persisted = mooncake(
            s, "changes", "cc", "--since", since, "--until", "persisted", "--format", "csv", check=True
        )
        assert f"changes of cc in [{since}, {since})" in persisted.stderr  # nothing persisted since
        mooncake(s, "persist", "cc", check=True)
        persisted = mooncake(
            s, "changes", "cc", "--since", since, "--until", "persisted", "--format", "csv", check=True
        )
        assert "2 inserts, 2 deletes" in persisted.stderr

        # the Dagster resource: a cursor that advances over snapshots
        from mooncake_assets.dagster.resources import ReplicationResource

        res = ReplicationResource(state_dir=str(state_dir), dsn=pg_dsn, tables=["cc"])
        cursor, feed = res.changes("cc", since)
        assert Lsn.parse(cursor) > Lsn.parse(since) and feed.num_rows == 4
        assert res.changes("cc", cursor) == (cursor, feed.schema.empty_table())

        # a consistent cut's tag is a cut of the feed, also where the table committed nothing new for it
        _sql(pg_dsn, "CREATE TABLE other (x int)", "INSERT INTO other VALUES (1)")
        client.wait_lsn(_lsn(pg_dsn))
        cut = json.loads(mooncake(s, "cut", "cc", "--json", check=True).stdout)
        assert cut["tables"]["cc"]["committed"] is False  # the tag names the snapshot the persist above made
        _sql(pg_dsn, "INSERT INTO cc VALUES (4, 'd')")
        client.wait_lsn(_lsn(pg_dsn))
        mooncake(s, "persist", "cc", check=True)  # the buffer window now starts past the cut's LSN
        r = mooncake(s, "changes", "cc", "--since", cut["lsn"], "--until", "persisted", "--format", "json", check=True)
        assert [(x["id"], x["_change"]) for x in json.loads(r.stdout)] == [(4, "insert")]
        tag = "lsn-" + cut["lsn"].replace("/", "-")  # the cut's tag names the same LSN
        by_tag = mooncake(s, "changes", "cc", "--since", tag, "--until", "persisted", "--format", "json", check=True)
        assert by_tag.stdout == r.stdout and f"changes of cc in [{cut['lsn']}, " in by_tag.stderr
        assert mooncake(s, "changes", "cc", "--since", tag, "--until", tag, check=True).stderr.startswith(
            f"changes of cc in [{cut['lsn']}, {cut['lsn']}): 0 inserts"
        )

        # a dropped and re-created mirror: its history starts anew at the new initial copy
        mooncake(s, "drop-table", "cc", check=True)
        mooncake(s, "create-table", "cc", "public.cc", check=True)
        again = mooncake(s, "changes", "cc", "--since", since)
        assert again.returncode == 1 and "re-created" in again.stderr and "oldest available LSN is" in again.stderr


def test_changes_older_than_expired_snapshots_name_the_oldest_lsn(pg_dsn, state_dir):
    """Once a compaction's cleanup has expired the older snapshots, a range from one of them is refused
    in one line naming the table, that snapshots expired, and the oldest LSN still available, which is
    then a valid start."""
    _sql(
        pg_dsn,
        "CREATE TABLE ex (id int PRIMARY KEY, v text)",
        "INSERT INTO ex SELECT g, 'v' FROM generate_series(1, 50) g",
    )
    policy = dict(POLICY, snapshot_retention_s=0, retain_snapshots=1, keep_cuts=0)
    s = make_settings(state_dir, pg_dsn, maintenance="dagster", extra={"maintenance": policy})
    with running_service(s) as client:
        client.call("create_table", dst="ex", src="public.ex")
        client.settings = s
        first = _snapshot_lsn(s, "ex")
        for stmt in ("UPDATE ex SET v = 'a' WHERE id % 2 = 0", "INSERT INTO ex VALUES (100, 'x')"):
            _step(pg_dsn, client, [stmt], "persist", "ex")
        _step(pg_dsn, client, [], "compact", "ex")  # its cleanup expires all but the newest snapshot
        with pytest.raises(ServiceError, match="older snapshots have expired") as e:
            client.changes("ex", str(first))
        msg = str(e.value)
        assert msg.count("\n") == 0 and "table ex: no changes before LSN" in msg, msg
        oldest = Lsn.parse(msg.rsplit(" ", 1)[1])
        assert oldest > first
        head, feed = client.changes("ex", str(oldest))  # the LSN it names is a start that works
        assert head["since"] == str(oldest) and feed.num_rows == 0
        old = mooncake(s, "changes", "ex", "--since", str(first))
        assert old.returncode == 1 and old.stderr.strip().count("\n") == 0
        assert "table ex:" in old.stderr and f"the oldest available LSN is {oldest}" in old.stderr


DK_KEYS = ["a,b", 'q"uote', "it's", "NULL", "\\N", "", "ünï©ødé ✓ 🦆", "tab\tnew\nline", "back\\slash", "{a,b}"]


def test_keys_feed_from_delete_logs_equals_the_files_for_a_composite_key_of_many_types(pg_dsn, state_dir):
    """A primary key of timestamptz (±infinity, BC), text (commas, quotes, backslashes, 'NULL', '\\N',
    '', unicode, control characters), numeric (NaN, long values) and uuid, in an order that is not the
    table's: the initial copy writes the rows, the deletes' keys come from pgoutput. The keys feed takes
    them from the persist's delete log; it equals the full-row feed's deleted keys (read from the
    files), and the feed after the log file is removed (keys read from the files). Pending deletes in
    the buffer window the same."""
    from mooncake_assets.engine.iceberg import SUMMARY_DELETE_LOG

    _sql(
        pg_dsn,
        "CREATE TABLE dk (t text, v text, u uuid, n numeric, ts timestamptz, PRIMARY KEY (ts, t, n, u))",
        "INSERT INTO dk SELECT k.t, 'v' || g || '.' || k.i, md5(g::text || k.t)::uuid,"
        " CASE g % 3 WHEN 0 THEN 'NaN'::numeric WHEN 1 THEN g / 8.0 ELSE -g * 1000000000000000000000.5 END,"
        " CASE (g + k.i) % 4 WHEN 0 THEN 'infinity'::timestamptz WHEN 1 THEN '-infinity'"
        " WHEN 2 THEN timestamptz '0044-03-15 12:00:00+00 BC' + g * interval '1 us'"
        " ELSE timestamptz '2024-02-29 12:34:56.789+05:30' END"
        " FROM unnest(ARR::text[]) WITH ORDINALITY k(t, i), generate_series(1, 4) g".replace("ARR", _pg_array(DK_KEYS)),
    )
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    key = ["ts", "t", "n", "u"]
    text_rows = "SELECT ts::text, t, n::text, u::text, v FROM dk"
    with running_service(s) as client:
        client.call("create_table", dst="dk", src="public.dk")
        a = _snapshot_lsn(s, "dk")
        before = set(_text_rows(pg_dsn, text_rows))
        _sql(
            pg_dsn,
            "DELETE FROM dk WHERE v LIKE 'v1.%' OR v LIKE '%.3'",
            "UPDATE dk SET v = v || 'x' WHERE v LIKE 'v2.%'",  # the key unchanged: no old key sent
            "UPDATE dk SET t = t || '!' WHERE v LIKE 'v3.%'",  # a key change
        )
        client.wait_lsn(_lsn(pg_dsn))
        client.call("persist", table="dk")
        b = _snapshot_lsn(s, "dk")
        after = set(_text_rows(pg_dsn, text_rows))
        _sql(pg_dsn, "DELETE FROM dk WHERE v LIKE 'v4.%'")  # pending in the buffer window
        now = Lsn.parse(_lsn(pg_dsn))
        client.wait_lsn(str(now))
        pending = len(after - set(_text_rows(pg_dsn, text_rows)))
        summary = _current_summary(s, "dk")
        assert summary.get(SUMMARY_DELETE_LOG), summary
        want = len(before - after)
        assert want >= 25

        def deleted(feed):
            return feed.filter(pc.equal(feed.column("_change"), "delete")).select(key)

        feeds = {}
        for lo, hi in [(a, b), (b, now), (a, now)]:
            _, keys = client.changes("dk", str(Lsn(lo)), str(Lsn(hi)), deletes="keys")
            _, full = client.changes("dk", str(Lsn(lo)), str(Lsn(hi)))
            assert deleted(keys).equals(deleted(full)), (Lsn(lo), Lsn(hi))
            feeds[lo, hi] = keys
        assert deleted(feeds[a, b]).num_rows == want
        assert deleted(feeds[b, now]).num_rows == pending == 9
        os.remove(summary[SUMMARY_DELETE_LOG].removeprefix("file://"))  # now read from the data files
        for (lo, hi), keys in feeds.items():
            _, again = client.changes("dk", str(Lsn(lo)), str(Lsn(hi)), deletes="keys")
            assert again.equals(keys), (Lsn(lo), Lsn(hi))


def _pg_array(values: list[str]) -> str:
    """``values`` as a Postgres text array literal (E'' string, each element double-quoted)."""
    body = ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "E'{" + body.replace("\\", "\\\\").replace("'", "''") + "}'"


def _text_rows(dsn: str, query: str) -> list[tuple]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute(query).fetchall()


def _current_summary(s, table: str) -> dict[str, str]:
    from mooncake_assets.engine.iceberg import IcebergMirrorTable, make_catalog
    from mooncake_assets.engine.storage import catalog_properties

    ice = IcebergMirrorTable.load(
        make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s)), f"mooncake.{table}"
    )
    return dict(ice.table.metadata.current_snapshot().summary.additional_properties)


RF_STEPS = [
    [
        "UPDATE rf SET n = n + 1 WHERE id % 7 = 1",  # rows with a TOASTed value among them: 'u' in the new row
        "DELETE FROM rf WHERE id % 11 = 0",
        "UPDATE rf SET id = id + 1000 WHERE id BETWEEN 20 AND 24",  # key changes
        "UPDATE rf SET big = big || 'x' WHERE id = 31",  # the TOASTed value changed
    ],
    ["UPDATE rf SET t = NULL, ts = NULL WHERE id % 13 = 2", "DELETE FROM rf WHERE id % 10 = 1 AND id > 100"],
    [
        "UPDATE rf SET f = -f WHERE id % 17 = 3",
        "DELETE FROM rf WHERE id IN (50, 1021)",
        "UPDATE rf SET n = n WHERE id % 23 = 5",
    ],
]


def test_full_row_feed_of_a_replica_identity_full_table_reads_no_data_file_for_deleted_rows(pg_dsn, state_dir):
    """REPLICA IDENTITY FULL: every UPDATE and DELETE carries the whole old row (TOASTed values too,
    flattened by Postgres). Columns of many types with NULLs and a long text stored out of line; updates
    that keep and that change the key, deletes, an update that changes nothing, persists between them, a
    restart. For every pair of cuts the full-row feed applied to the source's rows at the first gives
    those at the second, and the service says (head ``sources``) that every deleted row of a data file
    came from the delete logs and none was read from a data file."""
    _sql(
        pg_dsn,
        "CREATE TABLE rf (id int PRIMARY KEY, t text, n numeric(12,2), ts timestamptz, f float8, b boolean, big text)",
        "ALTER TABLE rf ALTER COLUMN big SET STORAGE EXTERNAL",
        "ALTER TABLE rf REPLICA IDENTITY FULL",
        "INSERT INTO rf SELECT g, CASE WHEN g % 5 = 0 THEN NULL ELSE 't,' || g END,"
        " CASE WHEN g % 7 = 0 THEN NULL ELSE g * 1.25 END,"
        " CASE WHEN g % 6 = 0 THEN NULL ELSE timestamptz '2024-02-29 12:00:00.5+05:30' + g * interval '1 min' END,"
        " CASE WHEN g % 4 = 0 THEN NULL ELSE g / 3.0 END, CASE WHEN g % 3 = 0 THEN NULL ELSE g % 2 = 0 END,"
        " CASE WHEN g % 10 = 1 THEN (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 200) i) END"
        " FROM generate_series(1, 200) g",
    )
    with psycopg.connect(pg_dsn, autocommit=True) as c:  # the long values really are out of line
        toasted = c.execute("SELECT count(*) FROM rf WHERE pg_column_size(big) > 6000").fetchone()[0]
    assert toasted == 20
    # no compaction: a compacted file's rows are read in full (and cancel), which would hide what this shows
    never = {"delete_ratio_percent": 100, "file_count_trigger": 10_000}
    s = make_settings(state_dir, pg_dsn, maintenance="dagster", extra={"maintenance": never})
    cuts: list[tuple[Lsn, Counter]] = []
    with running_service(s) as client:
        client.call("create_table", dst="rf", src="public.rf")
        client.settings = s
        cuts.append((_snapshot_lsn(s, "rf"), _rows(pg_dsn, "rf")))
        for stmts in RF_STEPS:
            cuts.append((_step(pg_dsn, client, stmts, "persist", "rf"), _rows(pg_dsn, "rf")))
            summary = _current_summary(s, "rf")
            assert int(summary.get("mooncake.delete-log-rows", 0)) > 0, json.dumps(summary)
    with running_service(s) as client:  # a restart: the logs are read back from the warehouse
        _wait_streaming(client)
        client.wait_lsn(_lsn(pg_dsn))
        _sql(pg_dsn, "UPDATE rf SET b = NOT b WHERE id % 19 = 4", "DELETE FROM rf WHERE id = 77")
        lsn = _lsn(pg_dsn)
        client.wait_lsn(lsn)
        cuts.append((Lsn.parse(lsn), _rows(pg_dsn, "rf")))  # in the buffer window: the in-memory log
        logged = 0
        for (a, ra), (b, rb) in combinations(cuts, 2):
            head, feed = client.changes("rf", str(Lsn(a)), str(Lsn(b)))
            assert _apply(ra, feed) == rb, f"[{Lsn(a)}, {Lsn(b)})"
            src = head["sources"]
            assert src["rows_read"] == 0 and src["rows_logged"] > 0, (Lsn(a), Lsn(b), src)
            logged += src["rows_logged"]
        assert logged > 100
        # the same range with the logs gone reads the data files, and gives the same feed
        a, b = cuts[0][0], cuts[-1][0]
        _, feed = client.changes("rf", str(Lsn(a)), str(Lsn(b)))
        from mooncake_assets.engine.iceberg import IcebergMirrorTable, make_catalog
        from mooncake_assets.engine.storage import catalog_properties

        ice = IcebergMirrorTable.load(make_catalog(s.catalog, s.warehouse_uri, **catalog_properties(s)), "mooncake.rf")
        for snap in ice.table.metadata.snapshots:
            loc = snap.summary.additional_properties.get("mooncake.delete-log") if snap.summary else None
            if loc:
                os.remove(loc.removeprefix("file://"))
        head, again = client.changes("rf", str(Lsn(a)), str(Lsn(b)))
        assert again.equals(feed)
        assert head["sources"]["rows_read"] > 0, head
