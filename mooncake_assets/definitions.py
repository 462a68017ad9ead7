"""The code location ``workspace.yaml`` loads: ``defs``, built from the environment and settings.json.

``dagster dev -w workspace.yaml`` (or ``dagster dev -m mooncake_assets.definitions``) imports this
module; ``defs`` is ``build_definitions(load_config())``. The definitions themselves, and where each
configuration value comes from, are in :mod:`mooncake_assets.dagster.definitions`.
"""

from mooncake_assets.dagster.definitions import (
    DagsterConfig,
    build_definitions,
    dagster_home,
    load_config,
    materialize_keys,
)

__all__ = ["DagsterConfig", "build_definitions", "dagster_home", "defs", "load_config", "materialize_keys"]

defs = build_definitions(load_config())
