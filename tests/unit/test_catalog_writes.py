"""How one instance writes its changed catalog rows (appended, MERGEd or whole), and
reads a job the table holds twice."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest

from devkit.specs import job_row
from lakeprop.spec import JobKey
from lakeprop.state.catalog_table import WriteKind, write_kind
from lakeprop.state.job_row import one_row_per_job

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 1)
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


def test_a_job_held_twice_is_read_once_as_its_latest_row() -> None:
    key = JobKey(0, "db", "t", "a")
    older = job_row(key, 1, watermark=3, at=T0, log_offset=5)
    later = job_row(key, 1, watermark=9, at=T0, log_offset=5)  # a flush after it
    newer = job_row(key, 1, watermark=None, at=T0, log_offset=7)  # a later message
    other = job_row(JobKey(0, "db", "t", "b"), 2, watermark=1, at=T0, log_offset=1)
    assert one_row_per_job([older, other]) == ([older, other], 0)
    assert one_row_per_job([later, older, other]) == ([later, other], 1)
    assert one_row_per_job([older, newer, later]) == ([newer], 2)


def test_a_row_of_partition_zero_is_later_than_one_of_a_partition_written_before() -> None:
    key = JobKey(0, "db", "t", "a")
    before = replace(job_row(key, 1, watermark=3, at=T0, log_offset=500), log_partition=2)
    now = job_row(key, 1, watermark=None, at=T0, log_offset=10)
    assert one_row_per_job([before, now]) == ([now], 1)
    assert one_row_per_job([now, before]) == ([now], 1)
