"""Which of Delta's errors say a range can no longer be read (resync), or was read
across a schema change, and which say neither."""

from __future__ import annotations

import pytest

from lakeprop.changes.feed import schema_changed, unreadable

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "gone", "across"),
    [
        (
            "[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version 2. "
            "Available versions: [3, 5]. SQLSTATE: 22003",
            True,
            False,
        ),
        ("[DELTA_CHANGE_DATA_FILE_NOT_FOUND] File .../_change_data/x.parquet", True, False),
        (
            "[DELTA_CHANGE_DATA_FEED_INCOMPATIBLE_SCHEMA_CHANGE] Retrieving table changes "
            "between version 2 and 4 failed because of an incompatible schema change.",
            False,
            True,
        ),
        ("[CAST_OVERFLOW] The value 3000000000 of the type BIGINT cannot be cast", False, False),
        ("Connection reset by peer", False, False),
    ],
)
def test_a_gone_range_and_a_schema_change_are_told_from_other_failures(
    error: str, gone: bool, across: bool
) -> None:
    assert unreadable(Exception(error)) is gone
    assert schema_changed(Exception(error)) is across
