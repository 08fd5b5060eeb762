"""Change detection from a Delta log's files alone (no Spark): idle, changed, cleaned up, gone."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import cast

import pytest
from pyspark.sql import SparkSession

from lakeprop.tables.probe import CommitChanges, DeltaLogProbe, estimate_change_rows

PROBE = DeltaLogProbe(cast(SparkSession, None))  # local paths never touch the session


def commits(table: Path, *versions: int) -> str:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (log / f"{version:020d}.json").write_text("{}\n")
    return str(table)


def checkpoint(table: Path, version: int) -> None:
    log = table / "_delta_log"
    (log / f"{version:020d}.checkpoint.parquet").write_bytes(b"")
    (log / "_last_checkpoint").write_text(json.dumps({"version": version, "size": 1}))


def cleaned_up(table: Path, *versions: int) -> None:
    for version in versions:
        (table / "_delta_log" / f"{version:020d}.json").unlink()


def test_an_idle_table_is_unchanged_and_a_new_commit_is_seen(tmp_path: Path) -> None:
    table = commits(tmp_path / "t", 0, 1, 2)
    assert PROBE.changed_since(table, 2) is False
    assert PROBE.changed_since(table, 1) is True
    commits(tmp_path / "t", 3)
    assert PROBE.changed_since(table, 2) is True
    assert PROBE.has_version_after(table, 2) and not PROBE.has_version_after(table, 3)


def test_commits_removed_by_log_clean_up_are_read_from_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "t"
    table = commits(path, *range(12))
    checkpoint(path, 10)
    cleaned_up(path, *range(10))
    assert PROBE.changed_since(table, 3) is True  # versions 4..11 happened
    assert PROBE.changed_since(table, 11) is False
    checkpoint(path, 11)
    cleaned_up(path, 10, 11)  # the log holds only the checkpoint at 11 now
    assert PROBE.changed_since(table, 11) is False


def test_a_dropped_or_younger_table_no_longer_holds_the_version(tmp_path: Path) -> None:
    assert PROBE.changed_since(str(tmp_path / "nothing"), 4) is None
    table = commits(tmp_path / "t", 0, 1)  # replaced by a table with two versions
    assert PROBE.changed_since(table, 4) is None


class RoundTrips(DeltaLogProbe):
    """A probe whose answers come from a dict, noting the thread each one ran on."""

    def __init__(self, answers: dict[str, bool | None]) -> None:
        super().__init__(cast(SparkSession, None), remote_threads=4)
        self.answers = answers
        self.threads: dict[str, str] = {}

    def changed_since(self, location: str, version: int) -> bool | None:
        self.threads[location] = threading.current_thread().name
        return self.answers[location]


def test_many_probes_answer_in_order_and_object_stores_are_asked_at_once() -> None:
    answers = {"s3a://b/t1": True, "/data/t2": False, "s3a://b/t3": None, "abfss://c@a/t4": False}
    probe = RoundTrips(answers)
    assert probe.changed_since_all([(loc, 1) for loc in answers]) == list(answers.values())
    assert probe.threads["/data/t2"] == threading.current_thread().name
    remote = {probe.threads[loc] for loc in answers if "://" in loc}
    assert all(name.startswith("lakeprop-probe") for name in remote)


@pytest.mark.parametrize(
    ("metrics", "added", "rows"),
    [
        (
            {
                "numTargetRowsInserted": "3",
                "numTargetRowsUpdated": "2",
                "numTargetRowsDeleted": "1",
                "numOutputRows": "90",
            },
            0,
            8,
        ),
        ({"numUpdatedRows": "4", "numCopiedRows": "50"}, 0, 8),
        ({"numDeletedRows": "5", "numCopiedRows": "50"}, 0, 5),
        ({"numOutputRows": "7", "numFiles": "1"}, 7, 7),
        ({}, 6, 6),  # no metrics: the rows of the files the commit added
        ({"numOutputRows": "not a number"}, 0, 0),
    ],
)
def test_change_rows_are_estimated_from_the_operation_metrics(
    metrics: dict[str, str], added: int, rows: int
) -> None:
    assert estimate_change_rows(metrics, added) == rows


def test_a_commits_change_rows_are_read_from_its_log_file(tmp_path: Path) -> None:
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    commit = [
        {
            "commitInfo": {
                "operation": "MERGE",
                "operationMetrics": {
                    "numTargetRowsInserted": "2",
                    "numTargetRowsUpdated": "1",
                    "numTargetRowsDeleted": "0",
                },
            }
        },
        {"add": {"path": "a.parquet", "dataChange": True, "stats": json.dumps({"numRecords": 9})}},
    ]
    (log / f"{1:020d}.json").write_text("\n".join(json.dumps(a) for a in commit) + "\n")
    blind = [{"commitInfo": {"operation": "CONVERT"}}, commit[1]]
    (log / f"{2:020d}.json").write_text("\n".join(json.dumps(a) for a in blind) + "\n")
    location = str(tmp_path / "t")
    assert [PROBE.change_rows(location, v) for v in (1, 2, 3)] == [4, 9, None]


def test_an_overwrite_counts_the_rows_it_removed_or_says_it_cannot(tmp_path: Path) -> None:
    """An overwrite of many rows that writes a few is many deletes plus a few inserts:
    removed files' statistics count the deletes; without them the count is a lower
    bound, never taken as a small change set."""
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)

    def commit(version: int, *actions: dict[str, object]) -> None:
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions))

    write = {"commitInfo": {"operation": "WRITE", "operationMetrics": {"numOutputRows": "5"}}}
    added = {"add": {"path": "n.parquet", "dataChange": True, "stats": '{"numRecords": 5}'}}
    commit(1, write, added, {"remove": {"path": "o.parquet", "dataChange": True}})
    counted = {"path": "o.parquet", "dataChange": True, "stats": '{"numRecords": 100000}'}
    commit(2, write, added, {"remove": counted})
    optimize = {"commitInfo": {"operation": "OPTIMIZE", "operationMetrics": {"numAddedFiles": "1"}}}
    commit(
        3,
        optimize,
        {"add": {"path": "c.parquet", "dataChange": False, "stats": '{"numRecords": 9}'}},
        {"remove": {"path": "n.parquet", "dataChange": False}},
    )
    location = str(tmp_path / "t")
    assert PROBE.commit_changes(location, 1) == CommitChanges(5, False, exact=False)
    assert PROBE.commit_changes(location, 2) == CommitChanges(100_005, False, exact=True)
    assert PROBE.commit_changes(location, 3) == CommitChanges(0, False, exact=True)
    vector = {"storageType": "u", "pathOrInlineDv": "ab", "offset": 1, "sizeInBytes": 36}
    delete = {"commitInfo": {"operation": "DELETE", "operationMetrics": {"numDeletedRows": "1"}}}
    commit(4, delete, {"remove": {**counted, "deletionVector": vector}})
    assert PROBE.commit_changes(location, 4) == CommitChanges(
        1, False, exact=True, vectored_removes=True
    )


def test_a_range_with_a_metadata_commit_or_a_missing_one_may_have_changed_columns(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    table = commits(path, 0, 1, 2, 3)
    log = path / "_delta_log"
    (log / f"{2:020d}.json").write_text('{"commitInfo":{}}\n{"metaData":{"id":"x"}}\n')
    assert not PROBE.metadata_changed(table, 2, 3)
    assert PROBE.metadata_changed(table, 1, 3)
    assert not PROBE.metadata_changed(table, 3, 3)  # an empty range
    cleaned_up(path, 3)
    assert PROBE.metadata_changed(table, 2, 3)
