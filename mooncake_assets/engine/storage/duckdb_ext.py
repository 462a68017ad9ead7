"""DuckDB connections with the ``iceberg`` extension loaded offline, from the PyPI packages
``duckdb-extension-iceberg`` and ``duckdb-extension-avro`` (whose wheels ship the signed extension binaries
for one DuckDB version; both are test extras of this project).

Nothing is downloaded: the binaries are loaded from the installed packages. Their DuckDB version must be
the running one (``duckdb==1.5.5`` here); otherwise a clear ``RuntimeError`` says what is installed.
"""

from __future__ import annotations

import importlib
import importlib.resources
from pathlib import Path
from typing import Any, cast

import duckdb

_EXTENSIONS = ("avro", "iceberg")  # avro first: iceberg reads manifests through it


def extension_file(name: str, duckdb_version: str | None = None) -> Path:
    """Path of the ``<name>.duckdb_extension`` binary shipped by the ``duckdb_extension_<name>`` package.

    ``duckdb_version``: like ``v1.5.5``; defaults to the running DuckDB's. Raises ``RuntimeError`` when the
    package is not installed or ships no binary for that version.
    """
    version = duckdb_version or "v" + duckdb.__version__.lstrip("v")
    module_name = f"duckdb_extension_{name}"
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise RuntimeError(
            f"DuckDB extension package {module_name.replace('_', '-')} is not installed; install the readers extra "
            f"(pip install 'mooncake-assets[readers]') or 'pip install duckdb-extension-{name}=={version.lstrip('v')}'"
        ) from None
    root = Path(str(importlib.resources.files(module))) / "extensions"
    path = root / version / f"{name}.duckdb_extension"
    if not path.is_file():
        shipped = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise RuntimeError(
            f"{module_name} ships no extension for DuckDB {version} (it has {shipped or 'none'}); "
            f"install the package version matching duckdb=={version.lstrip('v')}"
        )
    return path


def connect_with_iceberg(extension_dir: str | None = None, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the ``avro`` and ``iceberg`` extensions loaded, no network needed.

    ``extension_dir``: None loads the binaries straight from the installed packages (nothing is written);
    a directory makes DuckDB ``INSTALL`` them there (its ``extension_directory``) and ``LOAD`` them by name,
    for processes that want a persistent extension directory. Automatic download of other extensions is
    switched off. Then ``SELECT * FROM iceberg_scan('<metadata json location>')`` reads a table.
    Raises ``RuntimeError`` when the extension packages are missing or built for another DuckDB.
    """
    config: dict[str, str | bool | int | float | list[str]] = {"autoinstall_known_extensions": "false"}
    if extension_dir is not None:
        Path(extension_dir).mkdir(parents=True, exist_ok=True)
        config["extension_directory"] = str(extension_dir)
    con = duckdb.connect(database, config=config)
    version = cast(tuple[Any, ...], con.sql("PRAGMA version").fetchone())[0]  # one row, always
    try:
        for name in _EXTENSIONS:
            path = extension_file(name, version)
            if extension_dir is None:
                con.execute(f"LOAD '{path}'")
            else:
                con.execute(f"FORCE INSTALL '{path}'")
                con.execute(f"LOAD {name}")
    except BaseException:
        con.close()
        raise
    return con
