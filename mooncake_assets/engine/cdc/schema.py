"""Moved to :mod:`mooncake_assets.engine.pg.schema` (a Postgres table's schema and its Arrow mapping
belong at the Postgres edge). This alias exists only while branches in flight still import it."""
import sys

from ..pg import schema as _schema

sys.modules[__name__] = _schema
