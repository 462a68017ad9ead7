"""engine/read/sandbox.py on a real DuckDB: a confined connection opens files under its roots only."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mooncake_assets.engine.read.sandbox import confine, confined, root_prefixes


def test_a_confined_connection_reads_its_roots_and_nothing_else(tmp_path):
    inside, outside = tmp_path / "warehouse" / "t", tmp_path / "other"
    inside.mkdir(parents=True)
    outside.mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), inside / "f.parquet")
    pq.write_table(pa.table({"a": [3]}), outside / "g.parquet")
    (outside / "secret.txt").write_text("s3cret")
    con = duckdb.connect()
    assert not confined(con)
    confine(con, [f"file://{tmp_path / 'warehouse'}"])
    assert confined(con) and confined(con.cursor())  # the database is confined: every cursor
    assert con.execute(f"SELECT sum(a) FROM read_parquet('{inside / 'f.parquet'}')").fetchone() == (3,)
    assert con.execute(f"SELECT count(*) FROM '{inside}/*.parquet'").fetchone() == (2,)
    con.register("arrow_rows", pa.table({"x": [7]}))  # registered Arrow data stays readable
    assert con.execute("SELECT x FROM arrow_rows").fetchone() == (7,)
    for sql in (
        f"SELECT * FROM read_parquet('{outside / 'g.parquet'}')",
        f"SELECT * FROM read_text('{outside / 'secret.txt'}')",
        f"SELECT * FROM read_parquet('{inside}/../../other/g.parquet')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT count(*) FROM glob('/etc/*')",
    ):
        with pytest.raises(duckdb.PermissionException):
            con.cursor().execute(sql).fetchall()
    for sql in ("SET enable_external_access = true", "SET allowed_directories = ['/']", "RESET allowed_directories"):
        with pytest.raises(duckdb.Error):  # nor can a statement undo it
            con.execute(sql)
    confine(con, ["/"])  # confining again leaves it as it is
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_csv('/etc/passwd')").fetchall()


def test_a_connection_confined_to_no_root_reads_registered_data_only():
    con = duckdb.connect()
    confine(con)
    con.register("t", pa.table({"x": [1, 2]}))
    assert con.execute("SELECT sum(x) FROM t").fetchone() == (3,)
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()


def test_root_prefixes():
    assert root_prefixes(["file:///a/b", "s3://bkt/wh/", "/c"]) == ["/a/b/", "/c/", "file:///a/b/", "s3://bkt/wh/"]


def test_confine_to_service_takes_the_roots_from_its_status(tmp_path):
    """The service's status names the roots; a ReadState source without a status (a test double, the
    bench's in-process source) or without roots leaves the connection as it is."""
    from mooncake_assets.engine.read.sandbox import confine_to_service

    class NoStatus:
        pass

    class Status:
        def __init__(self, doc):
            self.doc = doc

        def status(self):
            return self.doc

    for client in (None, NoStatus(), Status({"tables": []})):
        con = duckdb.connect()
        confine_to_service(con, client)
        assert not confined(con)
    con = duckdb.connect()
    confine_to_service(con, Status({"data_roots": [f"file://{tmp_path}"]}))
    assert confined(con)
    with pytest.raises(duckdb.PermissionException):
        con.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()


def test_cursors_of_one_database_confine_it_at_once(tmp_path):
    """The sql-server's readers are cursors of one database whose first statements may come at once:
    every one confines without an error (before the lock, 91 of 240 calls in 30 rounds failed with
    "Cannot change allowed_directories when enable_external_access is disabled")."""
    import threading

    errors: list[str] = []
    for _ in range(10):
        db = duckdb.connect()
        cursors = [db.cursor() for _ in range(8)]
        start = threading.Barrier(len(cursors))

        def go(c):
            start.wait()
            try:
                confine(c, [str(tmp_path)])
            except duckdb.Error as e:
                errors.append(str(e))

        threads = [threading.Thread(target=go, args=(c,)) for c in cursors]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert confined(db)
    assert not errors, errors[:2]
