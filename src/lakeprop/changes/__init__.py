"""The change set: what the engine reads from a source's change feed and every
consumer applies. Below the engine and the consumers, which both use it."""

from __future__ import annotations

from lakeprop.changes.bounds import Bounds, boundable, bounded_columns, bounds_after
from lakeprop.changes.feed import CDF_COLUMNS, own_columns
from lakeprop.changes.latest import latest_change_per_key, latest_change_per_key_arrow
from lakeprop.changes.widening import widens

__all__ = [
    "CDF_COLUMNS",
    "Bounds",
    "boundable",
    "bounded_columns",
    "bounds_after",
    "latest_change_per_key",
    "latest_change_per_key_arrow",
    "own_columns",
    "widens",
]
