"""``mooncake chaos``: a seeded chaos run against the real service, checked by ``verify``.

One run (one seed) makes a fresh source database in the configured Postgres and a fresh state
directory, mirrors five tables that cover the change shapes the mirror must get right, and drives a
workload chosen by ``random.Random(seed)``:

==============================  ===============================================================
table                           shape
==============================  ===============================================================
``c_items``                     int key, TOAST text (``STORAGE EXTERNAL``), numeric, timestamptz
                                (± infinity), text[]; REPLICA IDENTITY DEFAULT
``c_full``                      bigint key, TOAST jsonb, float8 (NaN/±Infinity); IDENTITY FULL
``c_nokey``                     no key: whole-row identity, duplicate rows, bytea
``c_comp``                      composite (int, text) key; Parquet position deletes (format v2)
``c_part``                      list-partitioned root (publish_via_partition_root), rows move
                                between partitions, partitions added while running
==============================  ===============================================================

Steps are row changes (inserts, updates of keys and of non-key columns with TOAST left untouched,
deletes, duplicate-row deletes), mixed transactions, savepoints rolled back, aborted transactions,
large transactions streamed before commit (the source DSN sets ``logical_decoding_work_mem=64kB``),
TRUNCATE (one or several tables, RESTART IDENTITY), schema changes (ADD COLUMN with and without a
default, RENAME, DROP, int→bigint / varchar→text / numeric precision widening, then updates of the
new columns), random maintenance (flush, persist, merge-index, compact) and faults: SIGKILL of the service (also in the middle of a persist and while a streamed
transaction is open) and ``pg_terminate_backend`` of its walsender. Every ``phase`` steps the run
waits for the service, then checks every table with ``verify`` (union read at one LSN); every few
phases it persists every table and checks PyIceberg too. A mismatch, a stopped table or a missing-key
report is a *divergence*.

The choices depend only on the seed and on the source's state (which the choices determine), so a
seed replays the same workload. With ``jitter`` the services the run starts get
``MOONCAKE_JITTER=<seed>.<start>`` (:mod:`mooncake_assets.engine.faults`): seeded delays at the
points where timing matters (source-catalog lookups, the apply loop, a persist's unlocked upload
against a schema switch, the stream of a restarted service), so races are looked for on purpose and
a failing seed replays with the same delays; the OS scheduler's timing still varies on top. A failing
seed is written to ``cases_dir`` as ``chaos-<seed>-<steps>.json`` (seed, steps, the divergences and
the operation log), which ``tests/cdc/test_chaos.py`` replays.

Injected faults for tests (Iceberg commit conflicts, kills at given points) are one mechanism:
:mod:`mooncake_assets.engine.faults`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from .engine.private import ensure_private_dir

__all__ = ["ChaosResult", "run_chaos"]

TABLES = ["c_items", "c_full", "c_nokey", "c_comp", "c_part"]
BIG = "(SELECT string_agg(md5(%s::text || g), '') FROM generate_series(1, %s) g)"  # incompressible text

SETUP = [
    "CREATE TABLE c_items (id int PRIMARY KEY, grp int, name text, big text, amount numeric(12,2), "
    "at timestamptz, tags text[])",
    "ALTER TABLE c_items ALTER COLUMN big SET STORAGE EXTERNAL",
    "CREATE TABLE c_full (id bigint PRIMARY KEY, doc jsonb, f float8)",
    "ALTER TABLE c_full ALTER COLUMN doc SET STORAGE EXTERNAL",
    "ALTER TABLE c_full REPLICA IDENTITY FULL",
    "CREATE TABLE c_nokey (k int, v text, blob bytea)",
    "CREATE TABLE c_comp (a int, b text, v int, PRIMARY KEY (a, b))",
    "CREATE TABLE c_part (id int, region text, v text, n int, PRIMARY KEY (id, region)) PARTITION BY LIST (region)",
    "CREATE TABLE c_part_eu PARTITION OF c_part FOR VALUES IN ('eu')",
    "CREATE TABLE c_part_us PARTITION OF c_part FOR VALUES IN ('us')",
    "INSERT INTO c_items SELECT g, g % 7, 'n' || g, CASE WHEN g % 5 = 0 THEN "
    + BIG % ("g", 100)
    + " END, g * 1.25, now(), ARRAY['a', 'b' || g] FROM generate_series(1, 200) g",
    "INSERT INTO c_full SELECT g, jsonb_build_object('g', g), g / 3.0 FROM generate_series(1, 100) g",
    "INSERT INTO c_nokey SELECT g % 13, 'v' || (g % 5), '\\x00ff'::bytea FROM generate_series(1, 150) g",
    "INSERT INTO c_comp SELECT g % 20, 'b' || (g / 20), g FROM generate_series(1, 120) g",
    "INSERT INTO c_part SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'v', 0 FROM generate_series(1, 100) g",
]


# ------------------------------------------------------------------------------------------ runner
@dataclass
class ChaosResult:
    seed: int
    steps: int
    phases: int = 0
    iceberg_checks: int = 0
    kills: int = 0
    walsender_kills: int = 0
    maintenance: int = 0
    transactions: int = 0
    schema_changes: int = 0
    divergences: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    case_file: str | None = None
    mode: str = "dagster"
    jitter: bool = False

    def line(self) -> str:
        return (
            f"seed {self.seed}: {self.steps} steps ({self.mode} maintenance{', jitter' if self.jitter else ''}), "
            f"{self.transactions} transactions, "
            f"{self.schema_changes} schema changes, "
            f"{self.phases} verify phases (+{self.iceberg_checks} PyIceberg), {self.maintenance} maintenance calls, "
            f"{self.kills} service kills, {self.walsender_kills} walsender kills, "
            f"{len(self.divergences)} divergences, {self.seconds:.0f}s"
            + (f" -> {self.case_file}" if self.case_file else "")
        )


class _Workload:
    """The seeded statements of a chaos run: inserts, updates, deletes, schema changes and a big
    transaction over ``TABLES``, each returned as SQL text for ``_Run.txn``.

    A base of ``_Run``: it reads the run's RNG (``rng``), source connection (``conn``), id counter
    (``next_id``) and the columns the run added (``extra``, ``ncol``, ``widened``), which ``_Run``
    sets; the statements depend only on them and the source's rows, so a seed replays.
    """

    rng: random.Random
    conn: psycopg.Connection
    next_id: int
    extra: dict[str, list[list[str]]]
    ncol: int
    widened: set[str]
    parts: int  # partitions of the partitioned table

    def count(self, table: str) -> int:
        return self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

    def pick(self, table: str, col: str, n: int) -> list:
        """n existing values of ``col`` at a seeded offset (deterministic given the source's state)."""
        total = self.count(table)
        if total == 0:
            return []
        off = self.rng.randrange(total)
        return [
            r[0]
            for r in self.conn.execute(
                f"SELECT {col} FROM {table} ORDER BY {col} OFFSET %s LIMIT %s", (off, n)
            ).fetchall()
        ]

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # -- workload ---------------------------------------------------------------------------------
    def stmt_insert(self, t: str | None = None) -> list[str]:
        t = t or self.rng.choice(TABLES)
        n = self.rng.randint(1, 12)
        ids = [self.new_id() for _ in range(n)]
        if t == "c_items":
            big = "NULL" if self.rng.random() < 0.5 else BIG % (ids[0], 100)
            at = self.rng.choice(["now()", "'infinity'", "'-infinity'", "'2001-02-03 04:05:06+07'"])
            return [
                f"INSERT INTO c_items SELECT g, g % 7, 'i' || g, {big}, (g % 1000) / 8.0, {at}, "
                f"ARRAY['x', NULL, 'y' || g] FROM generate_series({ids[0]}, {ids[-1]}) g"
            ]
        if t == "c_full":
            doc = "jsonb_build_object('k', " + (BIG % (ids[0], 80) if self.rng.random() < 0.4 else "'small'") + ")"
            f = self.rng.choice(["1.5", "'NaN'", "'Infinity'", "'-Infinity'", "-0.0", "g / 7.0"])
            return [f"INSERT INTO c_full SELECT g, {doc}, {f} FROM generate_series({ids[0]}, {ids[-1]}) g"]
        if t == "c_nokey":
            k = self.rng.randint(0, 15)
            return [f"INSERT INTO c_nokey SELECT {k}, 'v' || (g % 3), '\\x0102'::bytea FROM generate_series(1, {n}) g"]
        if t == "c_comp":
            a = self.rng.randint(0, 40)
            return [f"INSERT INTO c_comp SELECT {a}, 'n' || g, g FROM generate_series({ids[0]}, {ids[-1]}) g"]
        region = self.rng.choice(["eu", "us"] + [f"p{i}" for i in range(3, self.parts + 1)])
        return [f"INSERT INTO c_part SELECT g, '{region}', 'v', 0 FROM generate_series({ids[0]}, {ids[-1]}) g"]

    def stmt_update(self) -> list[str]:
        t = self.rng.choice(TABLES)
        r = self.rng.random()
        if t == "c_items":
            ids = self.pick("c_items", "id", self.rng.randint(1, 8))
            if not ids:
                return []
            lst = ",".join(map(str, ids))
            if r < 0.5:
                return [
                    f"UPDATE c_items SET grp = grp + 1, amount = amount + 0.01 WHERE id IN ({lst})"
                ]  # TOAST untouched
            if r < 0.65:
                return [f"UPDATE c_items SET big = {BIG % (ids[0], 90)} WHERE id IN ({lst})"]
            if r < 0.85:
                new = self.new_id()
                return [f"UPDATE c_items SET id = {new} WHERE id = {ids[0]}"]  # key change
            if len(ids) >= 2:
                a, b = ids[0], ids[1]  # swap two keys
                return [
                    f"UPDATE c_items SET id = -1 WHERE id = {a}",
                    f"UPDATE c_items SET id = {a} WHERE id = {b}",
                    f"UPDATE c_items SET id = {b} WHERE id = -1",
                ]
            return [f"UPDATE c_items SET at = 'infinity' WHERE id = {ids[0]}"]
        if t == "c_full":
            ids = self.pick("c_full", "id", self.rng.randint(1, 6))
            if not ids:
                return []
            lst = ",".join(map(str, ids))
            if r < 0.6:
                return [f"UPDATE c_full SET f = f * 2 WHERE id IN ({lst})"]
            return [f"UPDATE c_full SET id = id + 1000000 WHERE id IN ({lst})"]
        if t == "c_nokey":
            k = self.rng.randint(0, 15)
            return [f"UPDATE c_nokey SET v = v || 'u' WHERE ctid = (SELECT min(ctid) FROM c_nokey WHERE k = {k})"]
        if t == "c_comp":
            a = self.rng.randint(0, 40)
            if r < 0.5:
                return [f"UPDATE c_comp SET v = v + 1 WHERE a = {a}"]
            return [f"UPDATE c_comp SET b = b || 'x' WHERE a = {a}"]
        ids = self.pick("c_part", "id", self.rng.randint(1, 6))
        if not ids:
            return []
        lst = ",".join(map(str, ids))
        if r < 0.5:
            return [f"UPDATE c_part SET n = n + 1 WHERE id IN ({lst})"]
        region = self.rng.choice(["eu", "us"] + [f"p{i}" for i in range(3, self.parts + 1)])
        return [f"UPDATE c_part SET region = '{region}' WHERE id IN ({lst})"]  # moves partitions

    def stmt_delete(self) -> list[str]:
        t = self.rng.choice(TABLES)
        if t == "c_nokey":
            k = self.rng.randint(0, 15)
            if self.rng.random() < 0.7:
                return [
                    f"DELETE FROM c_nokey WHERE ctid = (SELECT min(ctid) FROM c_nokey WHERE k = {k})"
                ]  # one duplicate
            return [f"DELETE FROM c_nokey WHERE k = {k}"]
        if t == "c_comp":
            return [f"DELETE FROM c_comp WHERE a = {self.rng.randint(0, 40)} AND v % 2 = 0"]
        col = "id"
        ids = self.pick(t, col, self.rng.randint(1, 6))
        if not ids:
            return []
        return [f"DELETE FROM {t} WHERE {col} IN ({','.join(map(str, ids))})"]

    def stmt_insert_then_delete(self) -> list[str]:
        i = self.new_id()
        return [
            f"INSERT INTO c_items VALUES ({i}, 0, 'tmp', NULL, 1, now(), NULL)",
            f"UPDATE c_items SET name = 'tmp2' WHERE id = {i}",
            f"DELETE FROM c_items WHERE id = {i}",
        ]

    _ADD_TYPES = [
        ("int", None),
        ("int", "7"),
        ("text", "'d'"),
        ("numeric(8,2)", "1.5"),
        ("boolean", "true"),
        ("date", "'2020-01-01'"),
        ("varchar(4)", None),
        ("text", None),
    ]
    _SET_VALUES = {
        "int": "42",
        "bigint": "5000000000",
        "text": "'u'",
        "varchar(4)": "'u'",
        "numeric(8,2)": "2.25",
        "numeric(12,2)": "1234567.25",
        "boolean": "false",
        "date": "'2021-05-05'",
    }
    _WIDEN = {"int": "bigint", "varchar(4)": "text", "numeric(8,2)": "numeric(12,2)"}
    _BASE_WIDEN = [("c_comp", "v"), ("c_part", "n"), ("c_items", "grp")]  # int columns the workload uses

    def _where(self, t: str) -> str:
        if t == "c_nokey":
            return f"k = {self.rng.randint(0, 15)}"
        if t == "c_comp":
            return f"a = {self.rng.randint(0, 40)}"
        return f"id % 7 = {self.rng.randint(0, 6)}"

    def stmt_schema(self) -> list[str]:
        """A schema change the mirror must follow as Iceberg schema evolution: ADD COLUMN (with and
        without default), RENAME / DROP / widen (int→bigint, varchar(4)→text, numeric precision) of a
        column the run added, widening of a workload column, or an UPDATE of an added column. No DROP on
        the key-less table (whole-row identity: stopping it would be right, but is not what this tests)."""
        t = self.rng.choice(TABLES)
        cols = self.extra.setdefault(t, [])
        r = self.rng.random()
        if r < 0.3 or not cols:
            self.ncol += 1
            typ, default = self.rng.choice(self._ADD_TYPES)
            if t == "c_comp":  # format v2 (position deletes): Iceberg v2 has no initial-default
                default = None
            cols.append([f"x{self.ncol}", typ])
            return [f"ALTER TABLE {t} ADD COLUMN x{self.ncol} {typ}" + (f" DEFAULT {default}" if default else "")]
        if r < 0.37:
            bt, bc = self.rng.choice(self._BASE_WIDEN)
            if (bt, bc) not in self.widened:
                self.widened.add((bt, bc))
                return [f"ALTER TABLE {bt} ALTER COLUMN {bc} TYPE bigint"]
        c = self.rng.choice(cols)
        if r < 0.5:
            self.ncol += 1
            old, c[0] = c[0], f"y{self.ncol}"
            return [f"ALTER TABLE {t} RENAME COLUMN {old} TO {c[0]}"]
        if r < 0.62 and t != "c_nokey":
            cols.remove(c)
            return [f"ALTER TABLE {t} DROP COLUMN {c[0]}"]
        if r < 0.75 and c[1] in self._WIDEN:
            c[1] = self._WIDEN[c[1]]
            return [f"ALTER TABLE {t} ALTER COLUMN {c[0]} TYPE {c[1]}"]
        return [f"UPDATE {t} SET {c[0]} = {self._SET_VALUES[c[1]]} WHERE {self._where(t)}"]

    def big_txn_stmts(self) -> list[str]:
        lo = self.new_id()
        self.next_id += 3000
        return [
            f"INSERT INTO c_comp SELECT 1000 + g % 50, 'big' || g, g FROM generate_series({lo}, {lo + 2999}) g",
            "UPDATE c_comp SET v = -v WHERE a BETWEEN 1000 AND 1010",
        ]


class _Run(_Workload):
    """One seeded chaos run: the source tables, the service, the random steps and the checks.

    Its statements come from ``_Workload``; the steps, kills and checks here share one state (the
    seeded RNG, the connections, the service, the op log written to the case file).
    """

    def __init__(
        self,
        seed: int,
        steps: int,
        base_dsn: str,
        workdir: Path,
        phase: int,
        log,
        schema_rate: float = 0.0,
        jitter: bool = False,
    ):
        from .config import load_settings

        self.rng = random.Random(seed)
        self.res = ChaosResult(seed, steps, jitter=jitter)
        self.starts = 0  # services started so far: each gets its own jitter sequence
        self.phase = phase
        self.log = log
        self.ops: list[str] = []
        self.db = f"chaos_{seed}_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(base_dsn, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {self.db}")
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        d = conninfo_to_dict(base_dsn)
        self.plain_dsn = make_conninfo(**{**d, "dbname": self.db})
        d["options"] = (d.get("options", "") + " -c logical_decoding_work_mem=64kB").strip()
        d["dbname"] = self.db
        self.dsn = make_conninfo(**d)
        self.base_dsn = base_dsn
        self.state = workdir
        self.settings = load_settings(workdir, dsn=self.dsn)
        self.res.mode = "auto" if seed % 3 == 0 else "dagster"
        self.settings.maintenance = self.res.mode
        self.settings.persist_interval_s = 1.0
        self.settings.save()
        self.conn = psycopg.connect(self.plain_dsn, autocommit=True)
        self.client = None
        self.next_id = 10_000
        self.open_stream: psycopg.Connection | None = None
        self.parts = 2
        self.schema_rate = schema_rate
        self.extra: dict[str, list[list[str]]] = {}  # table -> [[column, type]] added by the run
        self.ncol = 0
        self.widened: set[str] = set()

    # -- plumbing ---------------------------------------------------------------------------------
    def sql(self, q: str, params=None):
        self.ops.append(q if params is None else f"{q} -- {params!r}")
        cur = self.conn.execute(q, params)
        return cur.fetchall() if cur.description else None

    def txn(self, stmts: list, rollback: bool = False):
        self.ops.append(("ROLLBACK: " if rollback else "TXN: ") + " ; ".join(stmts))
        with self.conn.transaction(force_rollback=rollback):
            for s in stmts:
                self.conn.execute(s)
        self.res.transactions += 1

    def start(self):
        from .engine.service import ServiceClient
        from .engine.service.process import start_service

        # the service gets the jitter seed in its environment (seed.start: a restart has a sequence of its own)
        start_service(
            self.settings, extra_env={"MOONCAKE_JITTER": f"{self.res.seed}.{self.starts}"} if self.res.jitter else None
        )
        self.starts += 1
        if self.client is not None:
            self.client.close()
        self.client = ServiceClient(self.settings.socket_path)

    def kill(self, during: str | None = None):
        from .engine.service.process import kill_service

        if during:
            th = threading.Thread(target=self._quiet_call, args=(during, self.rng.choice(TABLES)), daemon=True)
            th.start()
            time.sleep(self.rng.random() * 0.3)
        kill_service(self.settings)
        self.ops.append(f"-- SIGKILL the service{' during ' + during if during else ''}")
        self.res.kills += 1
        time.sleep(0.2)
        self.start()

    def _quiet_call(self, action, table):
        try:
            self.client.call(action, table=table, timeout=30)
        except Exception:
            pass

    def schema_step(self):
        stmts = self.stmt_schema()  # a schema change + a row change that carries it
        t = stmts[0].split()[2]  # (pgoutput shows a table's new schema with its
        self.txn(stmts + self.stmt_insert(t) + (self.stmt_update() if self.rng.random() < 0.5 else []))
        self.res.schema_changes += 1  # next row change: see docs/schema-changes.md)

    def maintenance_step(self) -> None:
        """One maintenance call (flush, persist, merge_index or compact) on a random table."""
        op = self.rng.choice(["flush", "flush", "persist", "persist", "merge_index", "compact"])
        t = self.rng.choice(TABLES)
        self.ops.append(f"-- {op} {t}")
        self.res.maintenance += 1
        try:
            self.client.call(op, table=t, timeout=120)
        except Exception as e:  # a stopped table shows up in the next check
            self.ops.append(f"--   {op} failed: {str(e).splitlines()[0][:200]}")

    def kill_with_open_txn(self) -> None:
        """SIGKILL the service while a streamed transaction is open, then commit or roll it back."""
        c = psycopg.connect(self.plain_dsn)
        stmts = self.big_txn_stmts()
        self.ops.append("OPEN: " + " ; ".join(stmts))
        for s in stmts:
            c.execute(s)
        time.sleep(0.3)
        self.kill()
        commit = self.rng.random() < 0.6
        (c.commit if commit else c.rollback)()
        self.ops.append("COMMIT (open txn)" if commit else "ROLLBACK (open txn)")
        c.close()
        self.res.transactions += 1

    def kill_walsender(self) -> None:
        """Terminate the slot's walsender (pg_terminate_backend); the service must reconnect."""
        self.ops.append("-- pg_terminate_backend(walsender)")
        with psycopg.connect(self.base_dsn, autocommit=True) as c:
            c.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (self.client.status()["slot"],),
            )
        self.res.walsender_kills += 1

    def step(self, i: int):
        if self.schema_rate and self.rng.random() < self.schema_rate:
            return self.schema_step()
        r = self.rng.random()
        if r < 0.30:
            stmts = self.stmt_insert()
            self.txn(stmts)
        elif r < 0.50:
            stmts = self.stmt_update()
            if stmts:
                self.txn(stmts)
        elif r < 0.60:
            stmts = self.stmt_delete()
            if stmts:
                self.txn(stmts)
        elif r < 0.70:  # a mixed transaction
            stmts = []
            for _ in range(self.rng.randint(2, 5)):
                stmts += self.rng.choice(
                    [self.stmt_insert, self.stmt_update, self.stmt_delete, self.stmt_insert_then_delete]
                )()
            self.txn(stmts)
        elif r < 0.75:  # savepoint rolled back inside a committed txn
            keep, drop = self.stmt_insert(), self.stmt_update() + self.stmt_insert()
            self.txn(keep + ["SAVEPOINT s1"] + drop + ["ROLLBACK TO SAVEPOINT s1"] + self.stmt_delete())
        elif r < 0.78:  # aborted transaction
            self.txn(self.stmt_insert() + self.stmt_update() + self.stmt_delete(), rollback=True)
        elif r < 0.81:  # large (streamed) transaction, maybe with a savepoint
            stmts = self.big_txn_stmts()
            if self.rng.random() < 0.5:
                stmts = stmts[:1] + ["SAVEPOINT s"] + self.big_txn_stmts() + ["ROLLBACK TO SAVEPOINT s"] + stmts[1:]
            self.txn(stmts, rollback=self.rng.random() < 0.25)
        elif r < 0.825:  # truncate
            if self.rng.random() < 0.5:
                t = self.rng.choice(["c_nokey", "c_comp", "c_full"])
                self.txn([f"TRUNCATE {t}"])
            else:
                self.txn(
                    [
                        "TRUNCATE c_nokey, c_comp RESTART IDENTITY",
                        "INSERT INTO c_nokey VALUES (1, 'after', NULL), (1, 'after', NULL)",
                    ]
                )
        elif r < 0.835 and self.parts < 6:  # a partition created while mirroring
            self.parts += 1
            self.txn([f"CREATE TABLE c_part_p{self.parts} PARTITION OF c_part FOR VALUES IN ('p{self.parts}')"])
        elif r < 0.855:  # a schema change
            self.schema_step()
        elif r < 0.93:  # maintenance
            self.maintenance_step()
        elif r < 0.942:  # SIGKILL of the service
            self.kill(during=self.rng.choice([None, None, "persist", "flush", "compact"]))
        elif r < 0.949:  # SIGKILL while a streamed transaction is open
            self.kill_with_open_txn()
        elif r < 0.962:  # the walsender is killed; the service reconnects
            self.kill_walsender()
        else:
            stmts = self.stmt_insert_then_delete()
            self.txn(stmts)

    # -- checks -----------------------------------------------------------------------------------
    def check(self, step: int, iceberg: bool):
        from .verify import verify

        self.res.phases += 1
        try:
            results, lsn = verify(self.settings, TABLES, "union", self.client)
        except Exception as e:
            self.res.divergences.append({"step": step, "reader": "union", "error": f"{type(e).__name__}: {e}"[:500]})
            return
        for r in results:
            if not r.match:
                self.res.divergences.append(
                    {"step": step, "reader": "union", "lsn": lsn, "table": r.name, "detail": r.line()}
                )
        for t in self.client.status()["tables"]:
            if t.get("error") and t.get("state") == "error":
                self.res.divergences.append({"step": step, "table": t["name"], "error": t["error"][:500]})
            if t.get("missing_keys"):
                self.res.divergences.append(
                    {"step": step, "table": t["name"], "error": f"{t['missing_keys']} changes found no live row"}
                )
        if iceberg:
            self.res.iceberg_checks += 1
            for t in TABLES:
                self.client.call("persist", table=t, timeout=120)
            results, lsn = verify(self.settings, TABLES, "pyiceberg")
            for r in results:
                if not r.match:
                    self.res.divergences.append(
                        {"step": step, "reader": "pyiceberg", "lsn": lsn, "table": r.name, "detail": r.line()}
                    )

    def run(self):
        for q in SETUP:
            self.conn.execute(q)
        self.start()
        for t in TABLES:
            self.client.call(
                "create_table",
                dst=t,
                src=f"public.{t}",
                delete_format="position-deletes" if t == "c_comp" else "deletion-vectors",
                timeout=300,
            )
        self.check(0, iceberg=True)
        for i in range(1, self.res.steps + 1):
            self.step(i)
            if i % self.phase == 0 or i == self.res.steps:
                n_before = len(self.res.divergences)
                self.check(i, iceberg=(i // self.phase) % 3 == 0 or i == self.res.steps)
                self.log(
                    f"  seed {self.res.seed} step {i}: {self.res.phases} phases, {self.res.kills} kills, "
                    f"{len(self.res.divergences)} divergences"
                )
                if len(self.res.divergences) > n_before:
                    break  # later phases would only repeat it

    def close(self, keep: bool):
        from .engine.service.process import stop_service

        try:
            if self.client is not None:
                self.client.close()
            stop_service(self.settings)
        finally:
            self.conn.close()
            with psycopg.connect(self.base_dsn, autocommit=True) as c:
                for (slot,) in c.execute(
                    "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (self.db,)
                ).fetchall():
                    try:
                        c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                    except psycopg.Error:
                        pass
                if not keep:
                    c.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
            if not keep:
                shutil.rmtree(self.state, ignore_errors=True)


def run_chaos(
    seed: int,
    steps: int,
    base_dsn: str,
    *,
    workdir: str | os.PathLike | None = None,
    cases_dir: str | os.PathLike | None = None,
    phase: int = 25,
    log=print,
    schema_rate: float = 0.0,
    jitter: bool = False,
) -> ChaosResult:
    """One seeded chaos run (see module docstring). ``base_dsn``: a database of the source cluster
    (a fresh database is created beside it, and dropped after a clean run). ``workdir``: where the run's
    state directory goes (a temp dir under /var/tmp by default; kept, with the database, when the run
    diverged). ``cases_dir``: where a failing seed is written. ``phase``: steps between checks.
    ``schema_rate``: the share of steps that are schema changes on top of the workload's own ~2 %
    (0..1; 0 keeps a seed's workload as it always was). ``jitter``: seeded delays inside the services
    the run starts (see module docstring; the workload is the same with or without)."""
    t0 = time.time()
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"mooncake-chaos-{seed}-", dir="/var/tmp"))
    ensure_private_dir(root)  # the run's state directory: owner-only
    run = _Run(seed, steps, base_dsn, root, phase, log, schema_rate, jitter)
    failed = True
    try:
        run.run()
        failed = bool(run.res.divergences)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        msg = msg if len(msg) <= 1200 else msg[:300] + " … " + msg[-900:]
        run.res.divergences.append({"step": None, "error": f"the run itself failed: {msg}"})
    finally:
        run.res.seconds = time.time() - t0
        if run.res.divergences and cases_dir:
            p = Path(cases_dir) / f"chaos-{seed}-{steps}.json"
            ensure_private_dir(p.parent)
            p.write_text(
                json.dumps(
                    {
                        "seed": seed,
                        "steps": steps,
                        "phase": phase,
                        "schema_rate": schema_rate,
                        "jitter": jitter,
                        "result": asdict(run.res),
                        "state_dir": str(root),
                        "database": run.db,
                        "ops": run.ops[-400:],
                    },
                    indent=1,
                )
            )
            run.res.case_file = str(p)
        run.close(keep=failed)
    return run.res
