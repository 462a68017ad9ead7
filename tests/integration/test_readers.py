"""The engines people read the mirrors with, on both delete formats: each reads the persisted Iceberg table
and must equal Postgres (what ``mooncake verify --reader R`` checks; one run of the real command line).

This file keeps README.md's reader-compatibility table ("Reading the mirrors with other engines") true:
iceberg-rust (pyiceberg-core + DataFusion), polars, PyIceberg and DuckDB read Iceberg v3 deletion vectors
(Puffin) and v2 position-delete files alike.

One small table per delete format, a few updates and deletes (primary-key update, delete of a row of the
initial copy, delete of a row inserted later), one persist after them, read by every reader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from mooncake_assets.engine.iceberg import make_catalog
from mooncake_assets.readers import READERS, ReaderUnavailable, require
from mooncake_assets.verify import verify

from ..helpers import make_settings, mooncake, running_service

FORMATS = {"dv": "deletion-vectors", "pos": "position-deletes"}
SETUP = """
CREATE TABLE items_{f} (id int PRIMARY KEY, name text, qty int, price numeric(10,2), at timestamptz,
                        flag bool, note text);
INSERT INTO items_{f} SELECT g, 'n' || g, g % 13, g * 1.25, '2026-01-01 00:00+00'::timestamptz + g * interval '1 hour',
                             g % 2 = 0, CASE WHEN g % 5 = 0 THEN NULL ELSE repeat('x', g % 17) END
FROM generate_series(1, 300) g;
"""
CHANGES = """
UPDATE items_{f} SET qty = qty + 100, note = 'updated' WHERE id % 7 = 0;
DELETE FROM items_{f} WHERE id % 11 = 0;
UPDATE items_{f} SET id = 1000 WHERE id = 1;
INSERT INTO items_{f} SELECT g, 'late' || g, 1, 2.50, now(), NULL, NULL FROM generate_series(2001, 2020) g;
DELETE FROM items_{f} WHERE id IN (2003, 2010);
UPDATE items_{f} SET flag = NOT flag WHERE id BETWEEN 2011 AND 2015;
"""


def _drop_database(pg_cluster, name: str) -> None:
    import time

    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        for _attempt in range(50):  # a stopping service's walsender may still hold its slot for a moment
            try:
                for (slot,) in c.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall():
                    c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                return
            except psycopg.errors.ObjectInUse:
                time.sleep(0.2)


@pytest.fixture(scope="module")
def persisted(pg_cluster):
    """Settings of a state dir whose mirrors ``items_dv`` (v3, deletion vectors) and ``items_pos`` (v2,
    position deletes) were changed and persisted; the service is stopped again (readers of the persisted
    tables need only the catalog and the warehouse)."""
    db = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    dsn = pg_cluster.dsn(db)
    state = Path(tempfile.mkdtemp(prefix="mooncake-test-state-", dir="/var/tmp"))
    try:
        s = make_settings(state, dsn)
        with psycopg.connect(dsn, autocommit=True) as c:
            for f in FORMATS:
                c.execute(SETUP.format(f=f))
        with running_service(s) as client:
            for f, fmt in FORMATS.items():
                client.call("create_table", dst=f"items_{f}", src=f"public.items_{f}", delete_format=fmt)
                client.call("persist", table=f"items_{f}")  # the initial copy in Iceberg: deletes hit its files
            with psycopg.connect(dsn, autocommit=True) as c:
                for f in FORMATS:
                    c.execute(CHANGES.format(f=f))
            with psycopg.connect(dsn) as c:
                lsn = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
            client.wait_lsn(lsn, timeout=60)
            for f in FORMATS:
                client.call("persist", table=f"items_{f}")
        yield s
    finally:
        _drop_database(pg_cluster, db)
        shutil.rmtree(state, ignore_errors=True)


def _delete_file_formats(settings, name: str) -> set[str]:
    """The file formats of the delete files the current snapshot's scan tasks carry (PUFFIN / PARQUET)."""
    cat = make_catalog(settings.catalog, settings.warehouse_uri)
    tasks = cat.load_table(f"mooncake.{name}").scan().plan_files()
    return {d.file_format.value for t in tasks for d in t.delete_files}


@pytest.mark.parametrize("f", sorted(FORMATS))
def test_the_snapshot_holds_deletes_of_its_format(persisted, f):
    """The tables the readers read do carry deletes: Puffin deletion vectors on v3, Parquet
    position-delete files on v2 (else the reader tests below would prove nothing about deletes)."""
    assert _delete_file_formats(persisted, f"items_{f}") == {"dv": {"PUFFIN"}, "pos": {"PARQUET"}}[f]


@pytest.mark.parametrize("f", sorted(FORMATS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_reader_matches_postgres(persisted, reader, f):
    """Reader R's rows of the persisted table equal Postgres's at one LSN (``verify``, as ``mooncake verify
    --reader R`` runs it)."""
    results, lsn = verify(persisted, [f"items_{f}"], reader)
    assert [r.match for r in results] == [True], f"at LSN {lsn}: {[r.line() for r in results]}"
    assert results[0].mirror_rows == 300 - 27 + 20 - 2  # 27 multiples of 11 up to 300 deleted, 20 late rows less 2


def test_verify_command_line_reads_with_iceberg_rust(persisted):
    """The real command line: ``mooncake verify --reader iceberg-rust items_dv`` prints the match, exits 0."""
    r = mooncake(persisted, "verify", "--reader", "iceberg-rust", "items_dv")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "items_dv (public.items_dv): match" in r.stdout, r.stdout
    assert "verified: 1/1 tables match" in r.stdout, r.stdout


def test_readers_cover_the_readme_table():
    """Every reader of ``mooncake verify --reader`` is in README.md's compatibility table, and back."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Reading the mirrors with other engines", 1)[1].split("\n## ", 1)[0]
    for name in READERS:
        assert f"`--reader {name}`" in section, name
    assert "tests/integration/test_readers.py" in section


def test_missing_reader_library_is_one_line_saying_what_to_install(monkeypatch):
    """A reader whose library cannot be imported: ``ReaderUnavailable``, one line naming the package."""
    monkeypatch.setitem(sys.modules, "datafusion", None)  # `import datafusion` raises ImportError
    with pytest.raises(ReaderUnavailable) as e:
        require("iceberg-rust")
    msg = str(e.value)
    assert "\n" not in msg
    assert "pip install 'mooncake-assets[readers]'" in msg and "datafusion<55" in msg
    with pytest.raises(ValueError, match="unknown reader 'spark'"):
        require("spark")


def _chdb_rows(settings, name: str, sql: str) -> subprocess.CompletedProcess:
    """Run ``sql`` (``{t}``: the mirror's table) in chDB in a child process whose working directory is the
    table's parent (chDB reads local files only under its ``user_files_path``, the working directory; its
    engine is one per process). Prints the result as CSV."""
    cat = make_catalog(settings.catalog, settings.warehouse_uri)
    loc = Path(cat.load_table(f"mooncake.{name}").location().removeprefix("file://"))
    query = sql.format(t=f"icebergLocal('{loc.name}')")
    code = f"import chdb, sys\nsys.stdout.write(str(chdb.query({query!r}, 'CSV')))\n"
    return subprocess.run([sys.executable, "-c", code], cwd=loc.parent, capture_output=True, text=True, timeout=300)


def test_clickhouse_reads_position_deletes_not_deletion_vectors(persisted):
    """ClickHouse (chDB 4.4, ``icebergLocal``), the README table's row: a v2 position-delete mirror reads as
    Postgres has it; a v3 deletion-vector mirror is refused. Runs where the optional ``clickhouse`` extra is
    installed (``pip install 'mooncake-assets[clickhouse]'``: chdb-core is a 180 MB wheel)."""
    pytest.importorskip("chdb")
    r = _chdb_rows(persisted, "items_pos", "SELECT id, qty, coalesce(note, '<null>') FROM {t} ORDER BY id")
    assert r.returncode == 0, r.stderr
    with psycopg.connect(persisted.dsn) as c:
        src = c.execute("SELECT id, qty, coalesce(note, '<null>') FROM items_pos ORDER BY id").fetchall()
    got = [tuple(line.split(",")) for line in r.stdout.splitlines()]
    assert got == [(str(i), str(q), f'"{n}"') for i, q, n in src]
    r = _chdb_rows(persisted, "items_dv", "SELECT count(*) FROM {t}")
    assert r.returncode != 0
    assert "Position deletes are supported only for parquet format" in r.stderr, r.stderr


def test_create_table_help_says_which_delete_format_for_which_readers(tmp_path):
    """``mooncake create-table --help`` (the real command line) names the readers of each delete format."""
    r = subprocess.run(
        [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(tmp_path), "create-table", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    for word in ("deletion-vectors", "position-deletes", "ClickHouse", "Daft", "iceberg-rust", "polars"):
        assert word in text, word
