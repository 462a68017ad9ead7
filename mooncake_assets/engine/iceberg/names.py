"""The names this package writes into Iceberg metadata: table properties, snapshot summary keys, blob types."""

from __future__ import annotations

DELETE_FORMATS = {"deletion-vectors": 3, "position-deletes": 2}
"""``delete_format`` -> table format version: DVs in Puffin need v3; Parquet position deletes are v2."""

INDEX_BLOB_TYPE = "mooncake-hash-index-v1"
"""Puffin blob type of the mooncake hash index (under ``<location>/index/``, never a manifest entry)."""

SUMMARY_INDEX_FILE = "mooncake.index-file"
"""Snapshot summary key: location of the index Puffin file of the snapshot."""

SUMMARY_COMMIT_ID = "mooncake.commit-id"
"""Snapshot summary key: the id of the ``commit`` call that made the snapshot (a retry finds it)."""

SUMMARY_FLUSH_LSN = "mooncake.flush-lsn"
"""Snapshot summary key: the Postgres LSN (``X/Y``) the snapshot holds every change up to."""

SUMMARY_DELETE_LOG = "mooncake.delete-log"
#: how many entries of that snapshot's delete log hold the whole old row (REPLICA IDENTITY FULL); absent: none
SUMMARY_DELETE_LOG_ROWS = "mooncake.delete-log-rows"
"""Snapshot summary key: location of the snapshot's delete log (Parquet: the keys of the rows its commit
newly deleted from older data files, ``engine/table/delete_log.py``). Belongs to that one snapshot:
never carried over to a later one."""

PROPERTY_DELETE_FORMAT = "mooncake.delete-format"
"""Table property: ``deletion-vectors`` or ``position-deletes``."""

CREATED_BY = "mooncake-assets"
"""``engine-name`` of snapshot summaries and ``created-by`` of the Puffin files written here."""
