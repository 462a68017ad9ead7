"""Re-export of :mod:`mooncake_assets.dagster.jobs` (the maintenance jobs and their schedules).

Kept at the top of the source tree, where the project's layout names it; it is not installed (the
wheel holds ``mooncake_assets`` only), so code imports ``mooncake_assets.dagster.jobs``.
"""

from mooncake_assets.dagster.jobs import *  # noqa: F403
from mooncake_assets.dagster.jobs import __all__
