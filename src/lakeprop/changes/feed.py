"""The columns and change types of a Delta Change Data Feed."""

from __future__ import annotations

from collections.abc import Iterable

CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP = (
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
)
CDF_COLUMNS = frozenset({CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP})
"""The columns Delta adds to a table's own in its change feed."""


def own_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """A change set's (or snapshot's) source columns, the change feed's own aside: a
    column whose name starts with ``_commit`` counts as the feed's, on both paths."""
    return tuple(c for c in columns if not c.startswith("_commit") and c != CHANGE_TYPE)


INSERT, DELETE = "insert", "delete"
PREIMAGE, POSTIMAGE = "update_preimage", "update_postimage"
