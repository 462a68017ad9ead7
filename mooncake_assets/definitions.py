"""Dagster definitions: ``dagster dev -w workspace.yaml`` loads this module (DESIGN.md §7)."""
from __future__ import annotations

import dagster as dg

defs = dg.Definitions(assets=[])
