"""How one instance writes its changed catalog rows: appended, MERGEd or whole."""

from __future__ import annotations

import pytest

from lakeprop.state.catalog_table import WriteKind, write_kind

pytestmark = pytest.mark.unit

BIG = 100_000
FROM = 20_000


@pytest.mark.parametrize(
    ("table_rows", "replaced", "kind"),
    [
        (0, 0, WriteKind.APPEND),  # the first registrations
        (BIG, 0, WriteKind.APPEND),  # a bulk registration into a large catalog
        (10, 1, WriteKind.OVERWRITE),  # a small catalog is written whole
        (FROM - 1, 1, WriteKind.OVERWRITE),
        (FROM, 1, WriteKind.MERGE),
        (BIG, 200, WriteKind.MERGE),  # a tick's watermarks
    ],
)
def test_new_rows_are_appended_and_changed_ones_merged_into_a_large_catalog(
    table_rows: int, replaced: int, kind: WriteKind
) -> None:
    assert write_kind(table_rows, replaced, FROM) is kind
