"""The columns and change types of a Delta Change Data Feed."""

from __future__ import annotations

CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP = (
    "_change_type",
    "_commit_version",
    "_commit_timestamp",
)
CDF_COLUMNS = frozenset({CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP})
"""The columns Delta adds to a table's own in its change feed."""
INSERT, DELETE = "insert", "delete"
PREIMAGE, POSTIMAGE = "update_preimage", "update_postimage"
