"""What the Dagster layer needs of Dagster and dagster-duckdb beyond their public exports, in one place.

Written against dagster 1.13 and dagster-duckdb 0.29 (``pyproject.toml`` pins 1.13.27 and 0.29.27);
importing this module under another minor series warns (:func:`version_mismatches`), and
``tests/dagster/test_compat.py`` fails, naming what changed, when an upgrade changes any item below.
Everything else the layer uses is exported by ``dagster`` (``import dagster as dg``) or
``dagster_duckdb`` (``DuckDBIOManager``).

Why each name is needed:

- ``DbIOManager``, ``DbClient``, ``DbTypeHandler``, ``TableSlice``, ``TablePartitionDimension``
  (``dagster._core.storage.db_io_manager``). They are the extension points of dagster-duckdb's I/O
  manager: ``DuckDBIOManager.create_io_manager`` (public) returns a ``DbIOManager`` built from one
  ``DbClient`` (how to connect, delete a slice, select a slice) and ``DbTypeHandler``\\ s (how one
  Python type is stored and loaded), and ``DuckDBIOManager.type_handlers()`` is typed with
  ``DbTypeHandler``, yet ``dagster`` exports none of them. The I/O manager builds a ``DbIOManager``
  with its own ``DbClient`` (inputs from a mirror asset connect to a union read, everything else to
  the asset database), the type handlers subclass ``DbTypeHandler``, and both read ``TableSlice`` /
  ``TablePartitionDimension`` fields (``table``, ``schema``, ``columns``, ``partition_dimensions``;
  ``partition_expr``, ``partitions``). ``MooncakeDbIOManager`` subclasses ``DbIOManager`` (same
  constructor keywords) and overrides only its public ``load_input`` for incremental mirror inputs.
- ``DuckDbClient`` (``dagster_duckdb.io_manager``; not exported by ``dagster_duckdb``): dagster-duckdb's
  own client. The mirror client delegates to it for the asset database (connect with the I/O
  manager's ``database`` and ``connection_config``, create the schema, delete a slice) and uses its
  ``get_select_statement`` for a slice's SELECT, so projections and partition filters (static keys,
  time windows) are written exactly as dagster-duckdb writes them.

Behaviour relied on (checked by the test): ``DbIOManager.load_input`` resolves the input's type
handler, builds the slice, opens ``db_client.connect(context, table_slice)`` and passes that same slice
and connection to the handler's ``load_input``; ``handle_output`` connects the same way, then calls
``ensure_schema_exists``, ``delete_table_slice`` and the handler's ``handle_output`` on that one
connection, in that order, with nothing after the handler but closing it (the incremental inputs'
cursors are committed in a transaction opened by ``delete_table_slice`` and committed when the
connection's context ends).
"""

from __future__ import annotations

import warnings

import dagster
import dagster_duckdb
from dagster._core.storage.db_io_manager import (
    DbClient,
    DbIOManager,
    DbTypeHandler,
    TablePartitionDimension,
    TableSlice,
)
from dagster_duckdb.io_manager import DuckDbClient

#: the minor series this module was written against: ``{distribution: "major.minor"}``
TESTED = {"dagster": "1.13", "dagster-duckdb": "0.29"}

__all__ = [
    "DbClient",
    "DbIOManager",
    "DbTypeHandler",
    "DuckDbClient",
    "TablePartitionDimension",
    "TableSlice",
    "TESTED",
    "version_mismatches",
]


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_mismatches() -> list[str]:
    """``["dagster 1.14.0 (written for 1.13)", …]`` for each installed distribution outside :data:`TESTED`
    (empty when every one is within)."""
    installed = {"dagster": dagster.__version__, "dagster-duckdb": dagster_duckdb.__version__}
    return [
        f"{name} {installed[name]} (written for {series})"
        for name, series in TESTED.items()
        if _series(installed[name]) != series
    ]


if version_mismatches():
    warnings.warn(
        "mooncake_assets.dagster.compat: " + "; ".join(version_mismatches()) + ": run tests/dagster/test_compat.py",
        stacklevel=2,
    )
