"""TableWatch: a new commit in a Delta log, seen from a listing alone (no Spark)."""

from __future__ import annotations

from pathlib import Path

from lakeprop.client.api import TableWatch
from lakeprop.client.scans import SparkScan


def commit(table: Path, version: int) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("{}\n")


def test_a_watch_reports_each_new_commit_once_and_a_missing_table_once(tmp_path: Path) -> None:
    table = tmp_path / "requests"
    # local paths never touch the session
    watch = TableWatch(SparkScan(), str(table))
    assert [watch.changed(), watch.changed()] == [True, False]  # no table yet: look once
    commit(table, 0)
    assert [watch.changed(), watch.changed()] == [True, False]
    commit(table, 1)
    commit(table, 2)
    assert [watch.changed(), watch.changed()] == [True, False]
    assert watch.seen == 2
