"""The smaller things a new user tripped on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg

from mooncake_assets.engine.service.process import kill_service

from ..helpers import REPO, make_settings, mooncake


def test_persist_counts_rows_of_the_files_it_adds_and_clean_restart_is_quiet(pg_dsn, state_dir):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE p (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO p SELECT g, 'v' || g FROM generate_series(1, 100) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")  # no persist of its own
    try:
        mooncake(s, "create-table", "p", "public.p", check=True)
        for round_ in range(3):
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute(
                    f"INSERT INTO p SELECT g, 'w' FROM generate_series({1000 * (round_ + 1)}, {1000 * (round_ + 1) + 49}) g"
                )
                c.execute(f"UPDATE p SET v = 'u{round_}' WHERE id <= 10")
            mooncake(s, "query", "SELECT count(*) FROM p", check=True)  # applied
            mooncake(s, "flush", "p", check=True)  # the rows leave the buffer here
            out = mooncake(s, "persist", "p", check=True).stdout
            assert "files_added=1" in out and "rows=60," in out and "rows_flushed=0" in out, out
        # a restart after a clean stop does not speak of an interrupted run; one after a kill does. The
        # unused file stands for what a run leaves behind (e.g. metadata files past the metadata log)
        log = s.state_dir / "service.log"
        stray = s.state_dir / "tables" / "p" / "index" / "unused-block.idx"
        for how in ("stop", "kill"):
            if how == "stop":
                mooncake(s, "stop", check=True)
            else:
                kill_service(s)
            stray.write_bytes(b"x")
            before = log.read_text()
            mooncake(s, "start", check=True)
            assert (
                mooncake(s, "query", "SELECT count(*) AS n FROM p", "--format", "csv", check=True).stdout == "n\n250\n"
            )
            after = log.read_text()[len(before) :]
            assert not stray.exists()
            if how == "stop":
                assert "interrupted run" not in after and "removed files no snapshot or index uses" in after, after
            else:
                assert "removed leftovers of an interrupted run" in after, after
    finally:
        mooncake(s, "stop")


def test_pg_stop_says_what_it_did_and_help_texts(state_dir):
    s = make_settings(state_dir, "postgresql://localhost/none")
    r = subprocess.run(
        [
            ".venv/bin/mooncake" if (REPO / ".venv/bin/mooncake").exists() else "mooncake",
            "--state-dir",
            str(state_dir),
            "pg",
            "stop",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0 and "embedded Postgres was not running" in r.stdout, (r.stdout, r.stderr)
    h = " ".join(mooncake(s, "drop-table", "--help", check=True).stdout.split())
    assert "Name of the mirror to drop" in h, h
    h = " ".join(mooncake(s, "bench", "--help", check=True).stdout.split())
    assert "Smaller sizes" in h and "as JSON to FILE" in h and "PNG plots" in h, h


def test_make_ui_passes_a_port():
    r = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "ui", "PORT=3011", "HOST=0.0.0.0"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert "mooncake ui --port 3011 --host 0.0.0.0" in r.stdout, r.stdout + r.stderr


def test_help_keeps_square_brackets():
    """Help texts are rich markup, where ``[word]`` is a style tag that vanishes: the readers extra,
    the S3 endpoint's environment and chaos' default case directory must still be printed."""

    def help_of(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "mooncake_assets.cli", *args, "--help"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "250"},
        )
        assert r.returncode == 0, r.stderr
        return " ".join(r.stdout.split())

    assert "pip install 'mooncake-assets[readers]'" in help_of("verify")
    assert "[env MOONCAKE_S3_ENDPOINT or AWS_ENDPOINT_URL; default AWS]" in help_of()
    assert "[default: ./tests/cases when it exists" in help_of("chaos")


def test_verify_with_a_reader_of_the_persisted_table_says_when_changes_are_not_persisted(pg_dsn, state_dir):
    """``verify --reader pyiceberg`` after changes that are not persisted yet is a mismatch (the reader sees
    the snapshot only); the line says so, with the snapshot's LSN and `mooncake persist`, instead of
    looking like a wrong mirror. After the persist it matches."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE vp (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO vp SELECT g, 'v' || g FROM generate_series(1, 20) g")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")  # no persist of its own
    try:
        mooncake(s, "create-table", "vp", "public.vp", check=True)
        with psycopg.connect(pg_dsn, autocommit=True) as c:
            c.execute("UPDATE vp SET v = 'new' WHERE id <= 3")
        mooncake(s, "query", "SELECT count(*) FROM vp", check=True)  # applied, not persisted
        r = mooncake(s, "verify", "--reader", "pyiceberg", "vp")
        assert r.returncode == 1 and "MISMATCH" in r.stdout, (r.stdout, r.stderr)
        assert "reads the persisted snapshot, at LSN" in r.stdout and "`mooncake persist vp`" in r.stdout, r.stdout
        assert "reads the persisted snapshot" not in mooncake(s, "verify", "vp", check=True).stdout  # union read
        mooncake(s, "persist", "vp", check=True)
        out = mooncake(s, "verify", "--reader", "pyiceberg", "vp", check=True).stdout
        assert "vp (public.vp): match" in out, out
    finally:
        mooncake(s, "stop")


def test_a_main_option_after_the_command_and_bad_changes_ranges_are_one_line(state_dir):
    """``mooncake sync --source shop`` says where --source goes (click only said "No such option"); a
    command's own option of the same name is left alone. ``changes`` refuses --no-wait with --until (it
    waited for --until all the same) and names both accepted forms of an LSN. All before any service."""
    s = make_settings(state_dir, "postgresql://localhost/none")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mooncake_assets.cli", *args], capture_output=True, text=True, cwd=REPO
        )

    for args, name in ((["sync", "--source", "shop"], "--source"), (["status", "--config=m.yaml"], "--config")):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert f"error: {name} is an option of mooncake itself: give it before the command" in r.stderr
        assert f"mooncake {name} … {args[0]} …" in r.stderr
    r = cli("--state-dir", str(s.state_dir), "list-tables", "--bogus")
    assert r.returncode == 2 and "is an option of mooncake itself" not in r.stderr  # click's own error

    base = ["--state-dir", str(s.state_dir), "--dsn", s.dsn, "changes", "t"]
    r = cli(*base, "--since", "0/1", "--until", "5/0", "--no-wait")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--no-wait and --until 5/0 exclude each other" in r.stderr
    for bad in ("lsn-0-xyz", "0-1"):
        r = cli(*base, "--since", bad)
        assert r.returncode == 2 and f"--since '{bad}' is not an LSN: expected X/Y" in r.stderr
        assert "or a cut tag lsn-X-Y" in r.stderr
    r = cli(*base, "--since", "lsn-0-20", "--until", "0/10")
    assert r.returncode == 2 and "--since 0/20 is after --until 0/10" in r.stderr  # the tag read as its LSN
    # a bad --delete-format: the option's name, exit 2 like other bad options, and no service started for it
    r = cli("--state-dir", str(s.state_dir), "--dsn", s.dsn, "create-table", "x", "public.x", "--delete-format", "v4")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --delete-format must be deletion-vectors or position-deletes, not 'v4'"
    ), r.stderr
    assert not (s.state_dir / "service.pid").exists()


def test_one_row_is_one_row_and_persist_seconds_are_rounded(pg_dsn, state_dir):
    """One copied row reads "1 row copied" (not "1 rows"), verify says "source 1 row", status says
    "not yet" as list-tables does, and persist's seconds are rounded to the millisecond."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE one (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO one VALUES (1, 'a')")
    s = make_settings(state_dir, pg_dsn, maintenance="dagster")
    try:
        out = mooncake(s, "create-table", "one", "public.one", check=True).stdout
        assert "1 row copied at LSN" in out, out
        status = mooncake(s, "status").stdout
        assert "one: " in status and "last verify: not yet" in status and "none yet" not in status, status
        v = mooncake(s, "verify", "one", check=True).stdout
        assert "source 1 row, mirror 1 row" in v, v
        persist = mooncake(s, "persist", "one", check=True).stdout
        secs = persist.split("seconds=")[1].split(",")[0].split()[0]
        assert len(secs.split(".")[-1]) <= 3, persist
    finally:
        mooncake(s, "stop")


def test_a_hand_edited_memory_limit_below_the_minimum_is_refused_naming_the_file(state_dir):
    """``memory_limit`` edited by hand in settings.json below the working minimum (or not a number):
    ``start`` and ``serve`` refuse in one line naming the file, the budget and the minimum, and start
    nothing; ``start --memory-limit`` with a good size replaces it."""
    s = make_settings(state_dir, "postgresql://nobody@127.0.0.1:1/none", memory_limit=64 << 20)
    f = state_dir / "settings.json"
    for cmd in ("start", "serve"):
        r = mooncake(s, cmd, timeout=120)
        msg = r.stderr.strip()
        assert r.returncode == 1 and len(msg.splitlines()) == 1, (cmd, r.stdout, r.stderr)
        assert f"memory_limit in {f}: memory limit 64.0 MiB" in msg and "minimum of 128.0 MiB" in msg, msg
    assert not (state_dir / "service.pid").exists()
    doc = json.loads(f.read_text())
    f.write_text(json.dumps({**doc, "memory_limit": "lots"}))
    r = mooncake(s, "start", timeout=120)
    assert r.returncode == 1 and "'lots' is not a number of bytes" in r.stderr and str(f) in r.stderr, r.stderr


def test_a_dsn_with_a_typo_is_refused_in_one_line_and_not_saved(pg_dsn, state_dir):
    """A DSN libpq cannot parse (``prot=`` for ``port=``, ``?sslmod=`` for ``?sslmode=``) is refused
    naming the bad parameter, shown without its password, and nothing is written to settings.json."""
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(pg_dsn)
    bad = {
        "prot": f"host={p['host']} prot={p.get('port', 5432)} dbname={p['dbname']} user={p['user']} password=hunter2secret",
        "sslmod": f"postgresql://{p['user']}:hunter2secret@localhost:{p.get('port', 5432)}/{p['dbname']}?sslmod=require",
    }
    for param, dsn in bad.items():
        r = subprocess.run(
            [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state_dir), "--dsn", dsn, "start"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = r.stdout + r.stderr
        assert r.returncode == 2 and len(out.strip().splitlines()) == 1, out
        assert f'"{param}"' in out and "hunter2secret" not in out and "********" in out, out
        assert not (state_dir / "settings.json").exists() and not (state_dir / "service.log").exists()


def test_start_with_a_wrong_password_and_no_mirror_fails_in_one_line(pg_cluster, pg_dsn, state_dir):
    """``start`` logs in to the source before starting a service: a wrong password fails in one line
    (exit 1, the DSN without its password) and starts nothing, even with no mirror to copy yet."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from ..helpers import replication_role

    with replication_role(pg_cluster.dsn(), pg_dsn, "pw_", "right-pw") as role:
        d = conninfo_to_dict(pg_dsn) | {"user": role, "password": "wrong-pw-hunter2"}
        s = make_settings(state_dir, make_conninfo(**d))
        r = mooncake(s, "start", timeout=120)
        msg = r.stderr.strip()
        assert r.returncode == 1 and len(msg.splitlines()) == 1 and "running" not in r.stdout, (r.stdout, r.stderr)
        assert "password authentication failed" in msg and "hunter2" not in msg, msg
        assert not (state_dir / "service.pid").exists()


def test_stop_during_an_initial_copy_says_so_and_leaves_no_mirror(pg_dsn, state_dir):
    """``stop`` while create-table copies (held here by a lock on the source table) says that it
    interrupts the copy, create-table fails in one line saying so, and after the next start no mirror
    of the table is listed (the partial copy is dropped, not shown as ready)."""
    from ..helpers import service_tables, wait_until

    s = make_settings(state_dir, pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE cp (id int PRIMARY KEY)")
        c.execute("INSERT INTO cp SELECT generate_series(1, 100)")
    try:
        mooncake(s, "start", check=True)
        with psycopg.connect(pg_dsn) as lock:
            lock.execute("LOCK TABLE cp IN ACCESS EXCLUSIVE MODE")
            cmd = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state_dir), "--dsn", pg_dsn]
            create = subprocess.Popen(
                cmd + ["create-table", "cp", "public.cp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            wait_until(lambda: service_tables(s).get("cp", {}).get("state") == "copying", what="the copy")
            out = mooncake(s, "stop", check=True).stdout
        assert "interrupting the copy of public.cp as cp" in out and "create-table cp public.cp again" in out, out
        _, err = create.communicate(timeout=60)
        assert create.returncode == 1 and len(err.strip().splitlines()) == 1, err
        assert "the copy of public.cp as cp was interrupted" in err, err
        mooncake(s, "start", check=True)
        tables = json.loads(mooncake(s, "list-tables", "--json", check=True).stdout)["tables"]
        assert [t["name"] for t in tables] == [], tables
    finally:
        mooncake(s, "stop")


def test_login_refused_tells_a_refused_login_from_an_unreachable_source():
    """``start`` fails on a login the server refused and starts (with a warning) when the source cannot
    be reached now; the messages are libpq's, as psycopg 3 raised them against PostgreSQL 15."""
    from mooncake_assets.engine.pg.conninfo import login_refused

    refused = [
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "postgres"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  database "nodb" does not exist',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.1"',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: fe_sendauth: no password supplied',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  role "x" is not permitted to log in',
    ]
    transient = [
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?',
        "failed to resolve host 'nohost.invalid': [Errno -2] Name or service not known",
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  the database system is starting up',
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many clients already',
        'connection failed: connection to server at "10.0.0.9", port 5432 failed: timeout expired',
    ]
    assert all(login_refused(m) for m in refused)
    assert not any(login_refused(m) for m in transient)


def test_a_read_of_a_name_that_is_no_readable_mirror_says_why(pg_dsn, state_dir):
    """``mooncake query``, ``UnionReader.query`` and ``UnionReader.register``/``read_table`` (the Dagster IO
    manager's read) of a mirror in its initial copy, of one whose copy a stop interrupted, and of a name
    that is no mirror say which in one line (the mirror, its source, the command to run; the mirrors
    there are) instead of DuckDB's "Table with name big does not exist!"."""
    from mooncake_assets.engine.read import MirrorNotReadable, UnionReader
    from mooncake_assets.engine.service import ServiceClient, ServiceError

    from ..helpers import service_tables, wait_until

    s = make_settings(state_dir, pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        for t in ("a", "b", "big"):
            c.execute(f"CREATE TABLE {t} (id int PRIMARY KEY)")
            c.execute(f"INSERT INTO {t} SELECT generate_series(1, 100)")

    def every_read(expect: str) -> None:
        r = mooncake(s, "query", "SELECT count(*) FROM Big", timeout=60)
        assert r.returncode == 1 and r.stderr.strip() == f"error: {expect}", r.stderr
        client = ServiceClient(s.socket_path)
        reader = UnionReader(client, pg_dsn)
        try:
            try:
                reader.query("SELECT count(*) FROM big")
                raise AssertionError("read a mirror that is not readable")
            except MirrorNotReadable as e:
                assert str(e) == expect.replace("Big", "big"), e
            for read in (lambda: reader.register("big"), lambda: reader.read_table("big")):
                try:
                    read()
                    raise AssertionError("read a mirror that is not readable")
                except ServiceError as e:
                    assert str(e) == expect.replace("Big", "big"), e
        finally:
            reader.close()
            client.close()

    try:
        mooncake(s, "create-table", "a", "public.a", check=True)
        mooncake(s, "create-table", "b", "public.b", check=True)
        every_read("no mirror named Big; mirrors: a, b (see `mooncake list-tables`)")
        with psycopg.connect(pg_dsn) as lock:  # the copy waits for the lock: it stays in its initial copy
            lock.execute("LOCK TABLE big IN ACCESS EXCLUSIVE MODE")
            cmd = [sys.executable, "-m", "mooncake_assets.cli", "--state-dir", str(state_dir), "--dsn", pg_dsn]
            create = subprocess.Popen(
                cmd + ["create-table", "big", "public.big"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            wait_until(lambda: service_tables(s).get("big", {}).get("state") == "copying", what="the copy")
            r = mooncake(s, "query", "SELECT count(*) FROM big", timeout=60)
            assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert "error: mirror big is still in its initial copy of public.big" in r.stderr, r.stderr
            assert "it can be read once its create-table finishes; see `mooncake status`" in r.stderr, r.stderr
            mooncake(s, "stop", check=True)
        create.communicate(timeout=60)
        mooncake(s, "start", check=True)
        every_read(
            "mirror Big's initial copy of public.big was interrupted (the service stopped during it) and nothing "
            "of it is kept: run `mooncake create-table Big public.big` again".replace("Big", "big")
        )
        mooncake(s, "create-table", "big", "public.big", check=True)  # mirrored again: readable, not "interrupted"
        r = mooncake(s, "query", "SELECT count(*) AS n FROM big", "--format", "csv", check=True)
        assert r.stdout == "n\n100\n", r.stdout
        assert json.loads(mooncake(s, "list-tables", "--json", check=True).stdout).get("interrupted") in (None, [])
    finally:
        mooncake(s, "stop")


def test_a_stopped_mirror_that_cannot_be_read_names_its_lsn_and_reason():
    """The one line for a mirror that status shows stopped (``error``) and for no mirrors at all."""
    from mooncake_assets.engine.read.missing import explain_missing, missing_table

    status = {
        "tables": [
            {"name": "big", "source": "public.big", "state": "error", "applied_lsn": "0/16B3748", "error": "boom"}
        ]
    }
    assert explain_missing("BIG", status) == "mirror big is stopped at LSN 0/16B3748: boom; see `mooncake status`"
    assert explain_missing("x", {"tables": []}).startswith("no mirror named x; there are no mirrors yet")
    assert missing_table('Catalog Error: Table with name "main".big does not exist!\nDid you mean') == "big"
    assert missing_table("Catalog Error: Function with name f does not exist!") is None
    # a schema-qualified name (the source's, as a user writes it): say to name the mirror alone
    msg = 'Catalog Error: Table with name "shop.orders" does not exist because schema "shop" does not exist.'
    assert missing_table(msg) == "shop.orders"
    ready = {"tables": [{"name": "orders", "source": "shop.orders", "state": "ready"}]}
    assert explain_missing("shop.orders", ready) == (
        "no table shop.orders: a mirror is read by its mirror name, without a schema: orders "
        "(the mirror of shop.orders); write FROM orders"
    )
    assert explain_missing("other.x", ready) == "no mirror named other.x; mirrors: orders (see `mooncake list-tables`)"


def test_a_read_whose_source_is_down_says_so_and_names_no_wait(state_dir):
    """With the source down (a dedicated cluster, stopped under a running service), ``query`` and
    ``changes`` say in one line that the source cannot be reached for read-your-writes, naming it
    (no password) and ``--no-wait``, instead of "OperationalError: connection failed: …"; ``query
    --no-wait`` still reads what the service applied."""
    import shutil
    import tempfile
    from pathlib import Path

    from mooncake_assets.engine.pg import EmbeddedPostgres
    from mooncake_assets.engine.service.process import stop_service

    root = Path(tempfile.mkdtemp(prefix="mooncake-srcdown-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    s = make_settings(state_dir, pg.dsn())
    try:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute("CREATE TABLE d (id int PRIMARY KEY)")
            c.execute("INSERT INTO d SELECT generate_series(1, 10)")
        out = mooncake(s, "create-table", "d", "public.d", check=True).stdout
        lsn = out.split(" at LSN ")[1].split()[0]
        pg._run([str(pg.bin("pg_ctl")), "stop", "-m", "fast", "-w", "-D", str(pg.data_dir)], check=False)
        for args in (("query", "SELECT count(*) FROM d"), ("changes", "d", "--since", lsn)):
            r = mooncake(s, *args, timeout=120)
            assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
            assert (
                r.stderr.startswith("error: cannot reach the source postgresql://")
                and "for read-your-writes" in r.stderr
            )
            assert "--no-wait reads what the service has applied" in r.stderr and "OperationalError" not in r.stderr
        r = mooncake(s, "query", "--no-wait", "SELECT count(*) AS n FROM d", "--format", "csv", check=True)
        assert r.stdout == "n\n10\n", r.stdout
    finally:
        stop_service(s)
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)


def test_a_read_before_any_mirror_says_there_is_none(pg_dsn, state_dir):
    """A new user's first ``query`` in a fresh state directory, before any create-table, says there is no
    mirror yet and how to make one (it said "replication is not running (no mirrored table?)")."""
    s = make_settings(state_dir, pg_dsn)
    try:
        mooncake(s, "start", check=True)
        r = mooncake(s, "query", "SELECT count(*) FROM orders", timeout=120)
        assert r.returncode == 1 and r.stderr.strip() == (
            "error: no mirror named orders; there are no mirrors yet (`mooncake create-table NAME SCHEMA.TABLE` "
            "makes one)"
        ), r.stderr
    finally:
        mooncake(s, "stop")


def test_the_changes_note_names_the_replica_identity_statement_only_when_rows_were_read_back():
    """``mooncake changes`` (and an incremental Dagster input) note why whole deleted rows were read
    from data files (the source sends only keys) and the statement that changes it; nothing for FULL,
    no reads, or an older service's head."""
    from mooncake_assets.engine.table.changes import identity_note

    read = {"rows_read": 40, "files_read": 3, "source": 'public."User"', "replica_identity": "d"}
    note = identity_note(read, "users", "--deletes keys")
    assert note is not None and note.count("\n") == 0
    assert note.startswith("note: 40 deleted rows of users were read back from its data files")
    assert 'ALTER TABLE public."User" REPLICA IDENTITY FULL' in note and note.endswith("or read --deletes keys")
    assert identity_note({**read, "replica_identity": "i"}, "users", "k") is not None  # an index: keys too
    assert identity_note({**read, "replica_identity": "f"}, "users", "k") is None  # (a compaction's rows)
    assert identity_note({**read, "rows_read": 0}, "users", "k") is None  # (deletes as keys read no rows)
    assert identity_note({}, "users", "k") is None  # an older service's head
