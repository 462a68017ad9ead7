"""Re-export of :mod:`mooncake_assets.dagster.sensors` (``replication_sensor``).

Kept at the top of the source tree, where the project's layout names it; it is not installed (the
wheel holds ``mooncake_assets`` only), so code imports ``mooncake_assets.dagster.sensors``.
"""

from mooncake_assets.dagster.sensors import *  # noqa: F403
from mooncake_assets.dagster.sensors import __all__
