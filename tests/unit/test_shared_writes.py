"""Which failures of a shared state table's write are a race with another instance
(retried, or read again) and which are not."""

from __future__ import annotations

import pytest

from lakeprop.state.shared import conflicting

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "race"),
    [
        (
            "[DELTA_METADATA_CHANGED] MetadataChangedException: The metadata of the Delta "
            "table delta.`/s/catalog` has been changed by a concurrent update.",
            True,
        ),
        ("ConcurrentAppendException: Files were added to the root of the table", True),
        ("[DELTA_CONCURRENT_DELETE_READ] ConcurrentDeleteReadException: ...", True),
        ("ProtocolChangedException: The protocol version of the Delta table", True),
        ("AnalysisException: cannot resolve column", False),
        ("Connection refused", False),
    ],
)
def test_every_kind_of_delta_commit_race_is_told_from_other_failures(
    error: str, race: bool
) -> None:
    assert conflicting(RuntimeError(error)) is race
