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


UNREADABLE_RANGE = (
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
    "DELTA_MISSING_CHANGE_DATA",
    "DELTA_CHANGE_TABLE_FEED_DISABLED",
    "DELTA_VERSIONS_NOT_CONTIGUOUS",
    "DELTA_FILE_NOT_FOUND",
    "VersionNotFoundException",
    "DELTA_VERSION_NOT_FOUND",
    "FileNotFoundException",
    "change data was not recorded",
    "not enabled for change data feed",
)
"""Delta's refusals to read a range whose change data, or whose first version, is
gone: resync from a snapshot."""


def unreadable(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta refusing a range of a change feed it no longer holds."""
    text = str(exc)
    return any(marker in text for marker in UNREADABLE_RANGE)


SCHEMA_CHANGED = (
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_DATA_SCHEMA",
    "DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE",
)
"""Delta's refusals to read a change feed across a non-additive schema change."""


def schema_changed(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta refusing to read a range across a schema change."""
    return any(marker in str(exc) for marker in SCHEMA_CHANGED)
