"""A LOCAL (file://) warehouse directory becomes unwritable for a while.

(The S3 endpoint outage is tested in tests/storage/test_s3_mirror.py.) The tests run as root, for whom
``chmod`` changes nothing, so the outage is made with the immutable attribute (``chattr +i``) on every
directory and file of the warehouse: nothing can be created, changed, renamed or removed there, even
by root (EPERM), while the files already in it stay readable, as on a volume remounted read-only. Where
the attribute cannot be set (no CAP_LINUX_IMMUTABLE, or a file system without it) the test is skipped. During the outage writes keep
arriving in Postgres; the service must keep applying them (union reads stay exact), fail each persist
with an error naming the table and the warehouse, show the table as ``retrying``, retry with backoff,
and never confirm the slot past the table's flush LSN. Once the directory is writable again it
converges: union reader and PyIceberg both match the source, and the slot moves on.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine import storage
from mooncake_assets.engine.lsn import Lsn

from ..helpers import make_settings, mooncake, running_service, wait_until
from .conftest import Mirror, drop_database, new_database, new_state_dir


def _entries(root: Path) -> list[str]:
    """``root`` and every directory and file under it."""
    return [str(root)] + [str(Path(d) / n) for d, dirs, files in os.walk(root) for n in dirs + files]


def _chattr(flag: str, paths: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["chattr", flag, *paths], capture_output=True, text=True)


def _can_make_immutable(parent: Path) -> bool:
    probe = parent / "immutable-probe"
    probe.mkdir()
    try:
        if shutil.which("chattr") is None or _chattr("+i", [str(probe)]).returncode != 0:
            return False
        try:
            (probe / "x").write_bytes(b"x")
            return False  # the attribute did not stop the write
        except PermissionError:
            return True
    finally:
        _chattr("-i", [str(probe)])
        shutil.rmtree(probe, ignore_errors=True)


def _slot_confirmed(dsn: str, slot: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return Lsn.parse(
            c.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()[0]
        )


def _wal_now(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return Lsn.parse(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])


@pytest.mark.parametrize(
    "err",
    [
        PermissionError(
            errno.EPERM, "Failed to open local file '/wh/t/data/x.parquet'. Detail: [errno 1] Operation not permitted"
        ),
        PermissionError(errno.EACCES, "Cannot create directory '/wh/t/metadata'. Detail: [errno 13] Permission denied"),
        OSError(errno.EROFS, "Read-only file system"),
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        NotADirectoryError(
            errno.ENOTDIR, "Failed to open local file '/wh/t/data/x.parquet'. Detail: [errno 20] Not a directory"
        ),
        OSError(errno.EIO, "Input/output error"),
    ],
)
def test_local_warehouse_write_errors_are_classified_temporary(err):
    """What the local filesystem raises when the warehouse directory cannot be written is a storage
    fault that retrying may cure (someone frees the disk, remounts the volume read-write)."""
    e = storage.classify(err, location="file:///wh", what="persist of t")
    assert isinstance(e, storage.StorageError) and e.retryable, e
    assert str(e).startswith("persist of t in file:///wh: the warehouse directory cannot be written"), str(e)
    assert os.strerror(err.errno) in str(e) or err.strerror in str(e), str(e)
    assert storage.is_retryable(err)


def test_other_os_errors_are_not_storage_faults():
    assert storage.classify(FileNotFoundError(errno.ENOENT, "No such file or directory")) is None
    assert storage.classify(FileExistsError(errno.EEXIST, "File exists")) is None
    assert storage.classify(OSError("no errno at all")) is None


def test_local_warehouse_unwritable_for_a_while(pg_cluster):
    """Steady writes; the file:// warehouse becomes unwritable (every entry immutable) for ~5 s: state
    'retrying' with an error naming the table, the warehouse and the cause (status, list-tables --json,
    an explicit `mooncake persist`); retried with backoff; flush LSN and the slot's confirmed_flush_lsn
    stay where they were while the changes keep being applied; afterwards everything is persisted and
    `verify` (union reader) and `verify --reader pyiceberg` match the source."""
    db = new_database(pg_cluster)
    dsn = pg_cluster.dsn(db)
    state = new_state_dir()
    if not _can_make_immutable(state):
        drop_database(pg_cluster, db)
        shutil.rmtree(state, ignore_errors=True)
        pytest.skip("cannot make a directory immutable here (chattr +i needs CAP_LINUX_IMMUTABLE and ext4/xfs/btrfs)")
    s = make_settings(state, dsn, maintenance="auto", persist_interval_s=0.3)
    warehouse = Path(s.warehouse_uri.removeprefix("file://"))
    stop = threading.Event()
    done = {"txns": 0, "error": None}

    def workload():
        try:
            n = 10_000
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    with c.transaction():
                        c.execute("UPDATE wu SET v = v + 1 WHERE id = %s", (n % 500 + 1,))
                        c.execute("INSERT INTO wu VALUES (%s, 0)", (n,))
                        if n % 5 == 0:
                            c.execute("DELETE FROM wu WHERE id = %s", (n - 3,))
                    n += 1
                    done["txns"] += 1
                    time.sleep(0.005)
        except Exception as e:  # surfaced below
            done["error"] = e

    locked: list[str] = []
    try:
        with running_service(s) as client:
            m = Mirror(s, client, dsn)
            m.sql(
                "CREATE TABLE wu (id int PRIMARY KEY, v int NOT NULL)",
                "INSERT INTO wu SELECT g, 0 FROM generate_series(1, 500) g",
            )
            m.create("wu")
            slot = client.status()["slot"]
            th = threading.Thread(target=workload)
            th.start()
            try:
                wait_until(
                    lambda: (x := m.status("wu"))["state"] == "ready" and Lsn.parse(x["flush_lsn"]) > 0,
                    what="a first persist",
                )
                # ---------------------------------------------------------------- warehouse unwritable
                locked = _entries(warehouse)
                r = _chattr("+i", locked)
                assert r.returncode == 0, r.stderr
                down = wait_until(lambda: (x := m.status("wu"))["state"] == "retrying" and x, what="state retrying")
                assert "persist of wu" in down["error"] and str(warehouse) in down["error"], down["error"]
                assert "Operation not permitted" in down["error"] and "temporary" in down["error"], down["error"]
                # list-tables --json (the command line) reports the same
                lt = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)
                row = next(t for t in lt["tables"] if t["name"] == "wu")
                assert row["state"] == "retrying" and "persist of wu" in row["error"], row
                # an explicit persist fails at once, in one clear line naming the table
                r = mooncake(s, "persist", "wu")
                assert r.returncode != 0, r.stdout
                msg = " ".join(r.stderr.split())
                assert "table wu" in msg and "persist of wu" in msg and "Operation not permitted" in msg, r.stderr
                assert "stay in the buffer" in msg and "Traceback" not in r.stderr, r.stderr
                flush_down = Lsn.parse(m.status("wu")["flush_lsn"])
                # The slot may already stand past the flush LSN: while the table was clean (all persisted)
                # the service rightly confirmed the WAL end of keepalives. From the outage on the table is
                # dirty, so the slot must not move: nothing is confirmed past what it stood at then.
                held = max(flush_down, _slot_confirmed(dsn, slot))
                # the workload goes on; changes are applied (union reads exact), nothing is confirmed
                # past that point, and the persist keeps being retried (failure count grows)
                for _ in range(8):
                    time.sleep(0.5)
                    assert _slot_confirmed(dsn, slot) <= held
                    assert Lsn.parse(m.status("wu")["flush_lsn"]) == flush_down
                m.check("wu")
                during = m.status("wu")
                assert during["state"] == "retrying" and Lsn.parse(during["applied_lsn"]) > flush_down, during
                assert int(re.search(r"failed (\d+)x", during["error"]).group(1)) >= 3, during["error"]  # retried
                assert _slot_confirmed(dsn, slot) <= held
            finally:
                if locked:
                    _chattr("-i", locked)  # ------------------------------------------- writable again
                stop.set()
                th.join()
            assert done["error"] is None and done["txns"] > 100, done
            end = _wal_now(dsn)
            wait_until(
                lambda: (x := m.status("wu"))["state"] == "ready" and Lsn.parse(x["flush_lsn"]) >= end and x,
                timeout=90,
                what="the persist to succeed once the warehouse is writable again",
            )
            assert m.status("wu")["error"] is None and m.status("wu")["missing_keys"] == 0
            for reader in ("union", "pyiceberg"):
                r = mooncake(s, "verify", "wu", "--reader", reader)
                assert r.returncode == 0 and "verified: 1/1" in r.stdout, (reader, r.stdout, r.stderr)
            wait_until(lambda: _slot_confirmed(dsn, slot) >= end, what="the slot to be confirmed again")
    finally:
        if locked:
            _chattr("-i", locked)
        drop_database(pg_cluster, db)
        shutil.rmtree(state, ignore_errors=True)
