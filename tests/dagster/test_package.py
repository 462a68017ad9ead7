"""The Dagster layer is one package, mooncake_assets.dagster: the wheel installs ``mooncake_assets`` only,
and the source tree's top-level ``resources``/``sensors``/``jobs`` folders re-export it."""

import importlib
import tomllib

from setuptools import find_packages

from ..helpers import REPO


def test_only_mooncake_assets_is_installed():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(where=str(REPO), include=cfg["include"], exclude=cfg.get("exclude", ()))
    assert "mooncake_assets.dagster" in packages
    assert {p.split(".")[0] for p in packages} == {"mooncake_assets"}


def test_top_level_folders_re_export_the_dagster_package():
    for name in ("resources", "sensors", "jobs"):
        shim = importlib.import_module(name)
        real = importlib.import_module(f"mooncake_assets.dagster.{name}")
        assert shim.__all__ == real.__all__
        assert all(getattr(shim, n) is getattr(real, n) for n in real.__all__), name
