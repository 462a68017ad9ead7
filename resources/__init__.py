"""Re-export of :mod:`mooncake_assets.dagster.resources` (the service client and the DuckDB I/O manager).

Kept at the top of the source tree, where the project's layout names it; it is not installed (the
wheel holds ``mooncake_assets`` only), so code imports ``mooncake_assets.dagster.resources``.
"""

from mooncake_assets.dagster.resources import *  # noqa: F403
from mooncake_assets.dagster.resources import __all__
