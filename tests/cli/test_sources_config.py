"""The sources file ``mooncake.yaml`` (mooncake_assets/sources.py): checks, errors, table patterns, names.

In-process and without Postgres, except the command-line tests at the end, which run the real
``mooncake`` on bad files (they fail before anything is contacted)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mooncake_assets.sources import (
    ConfigError,
    MissingDsn,
    TablePattern,
    find_config,
    load_config,
    mirror_name,
)

GOOD = """
state_root: state
sources:
  orders:
    dsn_env: ORDERS_PG_DSN
    schemas: [sales]
    tables: [public.customers]
    exclude: ["sales.tmp_*"]
    maintenance: dagster
    maintenance_policy: {index_max_blocks: 4}
  metrics:
    dsn_env: METRICS_PG_DSN
    tables: ["public.*"]
"""


def write(tmp_path: Path, text: str, name: str = "mooncake.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    return e.value


def test_good_file(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert list(cfg.sources) == ["orders", "metrics"]
    o = cfg.sources["orders"]
    assert o.state_dir == (tmp_path / "state" / "orders").resolve()
    assert o.maintenance == "dagster" and o.maintenance_policy == {"index_max_blocks": 4}
    assert [p.text for p in o.tables] == ["public.customers"]
    s = o.settings({"ORDERS_PG_DSN": "host=/tmp dbname=orders"})
    assert s.state_dir == o.state_dir and s.dsn == "host=/tmp dbname=orders" and s.maintenance == "dagster"
    assert s.extra["maintenance"] == {"index_max_blocks": 4} and s.extra["source"] == "orders"
    assert cfg.source("metrics") is cfg.sources["metrics"]
    with pytest.raises(ValueError, match="give --source NAME"):
        cfg.source(None)


def test_missing_dsn_variable_is_named(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    with pytest.raises(MissingDsn, match="ORDERS_PG_DSN is not set"):
        cfg.sources["orders"].settings({})
    assert cfg.sources["orders"].settings({}, need_dsn=False).state_dir == cfg.sources["orders"].state_dir


@pytest.mark.parametrize(
    "text,key,problem",
    [
        ("sources: {a: {tables: [t]}}", "sources.a.dsn_env", "missing"),
        ("sources: {a: {dsn_env: X, tables: [t], dsn: 'host=h'}}", "sources.a.dsn", "never kept in the file"),
        (
            "sources: {a: {dsn_env: X, tables: [t], catalog: 'postgresql://u:secret@h/db'}}",
            "sources.a.catalog",
            "holds a password",
        ),
        (
            "sources: {a: {dsn_env: X, tables: [t], warehouse: 'host=h password=secret'}}",
            "sources.a.warehouse",
            "holds a password",
        ),
        ("sources: {a: {dsn_env: X, tables: [t], colour: red}}", "sources.a.colour", "unknown key"),
        ("sources: {a: {dsn_env: X, tables: [t], maintenance: sometimes}}", "sources.a.maintenance", "auto or dagster"),
        ("sources: {a: {dsn_env: X}}", "sources.a", "nothing to mirror"),
        ("sources: {a: {dsn_env: 'not a name', tables: [t]}}", "sources.a.dsn_env", "environment variable name"),
        ("sources: {a: {dsn_env: X, tables: 5}}", "sources.a.tables", "list of non-empty strings"),
        ("sources: {1a: {dsn_env: X, tables: [t]}}", "sources.1a", "source name"),
        ("sources: {}", "sources", "at least one"),
        ("sorces: {}", "sorces", "unknown key"),
        (
            "sources: {a: {dsn_env: X, tables: [t], warehouse: 's3://w'}, b: {dsn_env: Y, tables: [t], warehouse: 's3://w'}}",
            "sources.b.warehouse",
            "the same warehouse as source 'a'",
        ),
        (
            "sources: {a: {dsn_env: X, tables: [t], warehouse: 'file:///w'}, b: {dsn_env: Y, tables: [t], warehouse: 'file:///w/'}}",
            "sources.b.warehouse",
            "the same warehouse as source 'a'",
        ),
        (
            "state_root: /sr\nsources: {a: {dsn_env: X, tables: [t], catalog: 'sqlite:////sr/b/catalog.db'}, b: {dsn_env: Y, tables: [t]}}",
            "sources.a.catalog",
            "the same catalog as source 'b'",
        ),
        (
            "sources: {a: {dsn_env: X, tables: [t], maintenance_policy: {compact_min_filez: 8}}}",
            "sources.a.maintenance_policy",
            "unknown setting(s) compact_min_filez",
        ),
        (
            "sources: {a: {dsn_env: X, tables: [t], maintenance_policy: {file_count_trigger: many}}}",
            "sources.a.maintenance_policy",
            "file_count_trigger must be a int",
        ),
        (
            "sources: {a: {dsn_env: X, tables: [t], table_policies: {t: {index_max_blockz: 4}}}}",
            "sources.a.table_policies.t",
            "unknown setting(s) index_max_blockz",
        ),
    ],
)
def test_bad_file_names_file_key_and_problem(tmp_path, text, key, problem):
    e = error_of(tmp_path, text)
    assert e.key == key, str(e)
    assert problem in e.problem, str(e)
    assert str(e).startswith(f"{tmp_path / 'mooncake.yaml'}: {key}: ")


def test_bad_yaml_names_the_line(tmp_path):
    e = error_of(tmp_path, "sources:\n  a: [unclosed\n")
    assert "not valid YAML" in str(e) and "line " in str(e) and str(tmp_path / "mooncake.yaml") in str(e)


def test_patterns_pick_and_report_unmatched(tmp_path):
    cfg = load_config(
        write(
            tmp_path,
            """
            sources:
              a:
                dsn_env: X
                schemas: [sales, "nothing_*"]
                tables: [customers, "public.ord*", public.absent]
                exclude: ["sales.tmp_*", "sales.never"]
            """,
        )
    )
    tables = [("public", "customers"), ("public", "orders"), ("public", "other"), ("sales", "q1"), ("sales", "tmp_x")]
    picked, unmatched = cfg.sources["a"].pick(tables)
    assert picked == [("public", "customers"), ("public", "orders"), ("sales", "q1")]
    assert unmatched == ["schemas: nothing_*", "tables: public.absent", "exclude: sales.never"]


def test_pattern_parts():
    assert TablePattern.parse("t*") == TablePattern("t*", "public", "t*")
    assert TablePattern.parse('"a.b".c') == TablePattern('"a.b".c', "a.b", "c")
    assert TablePattern.parse("s.T").matches("s", "T") and not TablePattern.parse("s.T").matches("s", "t")


def test_mirror_names():
    assert mirror_name("public", "orders") == "orders"
    assert mirror_name("sales", "q1") == "sales__q1"
    assert mirror_name("public", "1st") == "t_1st"
    n = mirror_name("Sales Data", "Q1 Orders")
    assert n.startswith("Sales_Data_") and "__Q1_Orders_" in n
    assert len(mirror_name("s" * 60, "t" * 60)) == 63


def test_find_config(tmp_path):
    assert find_config(None, {}, cwd=tmp_path) is None
    p = write(tmp_path, GOOD)
    assert find_config(None, {}, cwd=tmp_path) == p.resolve()
    assert find_config(None, {"MOONCAKE_STATE_DIR": "x"}, cwd=tmp_path) is None
    assert find_config(None, {}, cwd=tmp_path, state_dir_given=True) is None
    other = write(tmp_path, GOOD, "other.yaml")
    assert find_config(None, {"MOONCAKE_CONFIG": str(other)}, cwd=tmp_path) == other.resolve()
    with pytest.raises(ConfigError, match="no such file"):
        find_config(tmp_path / "missing.yaml", {}, cwd=tmp_path)


# ------------------------------------------------------------------------------ the command line
def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "mooncake_assets.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=e,
        timeout=120,
    )


def test_cli_bad_config_names_file_key_problem(tmp_path):
    p = write(tmp_path, "sources: {a: {dsn_env: X, tables: [t], dsn: 'postgresql://u:pw@h/db'}}")
    r = cli("--config", str(p), "status", cwd=tmp_path)
    assert r.returncode == 2, r
    assert f"{p}: sources.a.dsn: a DSN or password is never kept in the file" in r.stderr
    assert "pw@" not in r.stderr


def test_cli_picks_up_mooncake_yaml_in_cwd(tmp_path):
    write(tmp_path, "sources: {a: {dsn_env: X, tables: [t], maintenance: never}}")
    r = cli("status", cwd=tmp_path)
    assert r.returncode == 2 and "mooncake.yaml: sources.a.maintenance: expected auto or dagster" in r.stderr


def test_cli_missing_dsn_variable_is_named(tmp_path):
    p = write(tmp_path, GOOD)
    r = cli("--config", str(p), "--source", "orders", "list-tables", cwd=tmp_path)
    assert r.returncode == 2 and "environment variable ORDERS_PG_DSN is not set" in r.stderr, r


def test_cli_needs_source_for_one_table_commands(tmp_path):
    p = write(tmp_path, GOOD)
    r = cli("--config", str(p), "flush", "t", cwd=tmp_path, env={"ORDERS_PG_DSN": "x", "METRICS_PG_DSN": "y"})
    assert r.returncode == 2 and "give --source NAME (one of orders, metrics)" in r.stderr, r
    r = cli("--config", str(p), "--source", "nope", "status", cwd=tmp_path)
    assert r.returncode == 2 and "--source nope: no such source" in r.stderr, r
    r = cli("--config", str(p), "--dsn", "host=x", "status", cwd=tmp_path)
    assert r.returncode == 2 and "--dsn: set per source" in r.stderr, r
    r = cli("--source", "orders", "--state-dir", str(tmp_path / "s"), "status", cwd=tmp_path)
    assert r.returncode == 2 and "--source needs a sources file" in r.stderr, r


def test_the_full_example_of_docs_sources_md_loads(tmp_path):
    """The example a new user copies from docs/sources.md is a valid file (its policy named a setting
    that does not exist, which only the service found out, later)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "sources.md").read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(write(tmp_path, example))
    assert list(cfg.sources) == ["orders", "metrics"]
    assert cfg.sources["orders"].maintenance_policy == {"file_count_trigger": 8}


def test_discover_interval_reaches_the_service_config(tmp_path):
    """``discover_interval_s`` and the patterns go to settings.json's ``extra.discover`` and from there
    to the service's :class:`ServiceConfig` (table discovery, engine/service/discovery.py); off by default."""
    from mooncake_assets.config import load_settings
    from mooncake_assets.engine.pg.patterns import TableSelection

    text = GOOD.replace("    maintenance: dagster\n", "    maintenance: dagster\n    discover_interval_s: 2.5\n")
    cfg = load_config(write(tmp_path, text))
    o, m = cfg.sources["orders"], cfg.sources["metrics"]
    assert o.discover_interval_s == 2.5 and m.discover_interval_s == 0
    s = o.settings({"ORDERS_PG_DSN": "host=/tmp dbname=orders"}, save=True)
    assert s.extra["discover"] == {
        "schemas": ["sales"],
        "tables": ["public.customers"],
        "exclude": ["sales.tmp_*"],
        "interval_s": 2.5,
        "config": str((tmp_path / "mooncake.yaml").resolve()),  # the service re-reads edited patterns there
    }
    sc = load_settings(o.state_dir, dsn="host=/tmp dbname=orders").service_config()  # what `serve` builds
    assert sc.discover_interval_s == 2.5
    from mooncake_assets.sources import patterns_reloader

    reload = patterns_reloader(load_settings(o.state_dir, dsn="host=/tmp dbname=orders"))  # what `serve` adds
    assert reload is not None and reload() is None  # the first call: unchanged since the start
    sel = TableSelection.from_dict(dict(sc.table_patterns))
    assert sel.pick([("sales", "a"), ("sales", "tmp_x"), ("public", "customers"), ("public", "other")]) == (
        [("sales", "a"), ("public", "customers")],
        [],
    )
    ms = m.settings({"METRICS_PG_DSN": "host=/tmp dbname=m"}).service_config()
    assert ms.discover_interval_s == 0 and ms.table_patterns["tables"] == ["public.*"]
    for bad in ("-1", "soon", "true"):
        e = error_of(tmp_path, GOOD.replace("    maintenance: dagster\n", f"    discover_interval_s: {bad}\n"))
        assert e.key == "sources.orders.discover_interval_s" and "seconds" in e.problem, e


def test_sync_knows_the_refusals_of_a_race_with_table_discovery(tmp_path):
    """``sync`` and the service's table discovery may mirror the same new table at once: the loser's
    create is refused by the registry's one-mirror-per-source check, and sync takes exactly those
    refusals (the registry's own messages, for a ready and a copying mirror) as "mirrored meanwhile"."""
    import threading
    from types import SimpleNamespace

    from mooncake_assets.cli import _RaceRefusal
    from mooncake_assets.engine.service.config import ServiceConfig
    from mooncake_assets.engine.service.errors import MooncakeError
    from mooncake_assets.engine.service.registry import TableRegistry

    cfg = ServiceConfig(
        state_dir=tmp_path,
        dsn="dbname=x",
        socket_path=tmp_path / "s",
        catalog_uri="sqlite://",
        warehouse_uri="file:///x",
    )
    reg = TableRegistry(cfg, None, threading.RLock())  # type: ignore[arg-type]  # no catalog needed
    reg.doc["tables"]["sales__orders"] = {"source": "sales.orders", "oid": 11}
    t = SimpleNamespace(source="sales.items", name="sales__items", schema=SimpleNamespace(oid=12))
    reg.copying[12] = {"table": t}
    for src, oid in (("sales.orders", 11), ("sales.items", 12)):
        with pytest.raises(MooncakeError) as e:
            reg.refuse_second_mirror(src.replace(".", "__"), src, oid)
        with pytest.raises(_RaceRefusal):
            _RaceRefusal.check(str(e.value))
    _RaceRefusal.check("a mirrored table named 'x' already exists")  # another refusal: sync reports it
    _RaceRefusal.check("cannot mirror sales.secrets: role r has no SELECT privilege on it")
