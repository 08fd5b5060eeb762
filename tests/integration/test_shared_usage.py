"""The usage table with several instances: the leader (the holder of slot 0)
refreshes it, and counts the iterations the others recorded, also those recorded
after it last refreshed their hour. With one instance, the first refresh into a
table it created appends, and the later ones replace the rows of their hours.

A :class:`UsageTable` in shared mode stands in for the leader's, on real Delta
tables; iterations appended to the history without telling it are the other
instances'. So is the history an instance created: the others write it too.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from lakeprop.state.history import IterationHistory, IterationRecord, MemberRecord
from lakeprop.state.usage import UsageRow, UsageTable, usage_of

pytestmark = pytest.mark.integration


def iteration(job_id: int, ended: datetime) -> IterationRecord:
    member = MemberRecord(job_id, f"job{job_id}", "replica", 1, 3, 0, "")
    return IterationRecord(
        f"it{job_id}-{ended:%H%M%S}",
        1,
        "db",
        "t",
        "tail",
        1,
        2,
        5,
        1,
        "",
        ended - timedelta(seconds=2),
        ended,
        "success",
        0,
        "",
        [member],
        spark_jobs=3,
    )


def test_the_leader_counts_an_iteration_another_instance_recorded_after_it_refreshed_the_hour(
    spark: SparkSession, tmp_path: Path
) -> None:
    history = IterationHistory(spark, str(tmp_path / "iterations"))
    history.ensure()
    now = [datetime(2026, 11, 28, 14, 56)]
    usage = UsageTable(
        spark, str(tmp_path / "usage"), history.path, shared=True, clock=lambda: now[0]
    )
    usage.ensure()
    # the leader records one of its own at 14:55 and refreshes the hour
    own = iteration(1, datetime(2026, 11, 28, 14, 55))
    history.record([own])
    usage.recorded([own.ended_at])
    usage.refresh()
    # another instance records an iteration that ended at 14:59:50, at 15:00:01:
    # the leader does not hear of it, and records nothing more in that hour
    history.record([iteration(2, datetime(2026, 11, 28, 14, 59, 50))])
    now[0] = datetime(2026, 11, 28, 15, 2)
    usage.refresh()

    table = sorted(
        (UsageRow(**r.asDict()) for r in spark.read.format("delta").load(usage.path).collect()),
        key=lambda r: (r.account_id, r.job_id, r.hour),
    )
    assert table == usage_of(spark.read.format("delta").load(history.path).collect())
    assert [r.job_id for r in table] == [1, 2]


def usage_rows(spark: SparkSession, path: str) -> list[UsageRow]:
    return sorted(
        (UsageRow(**r.asDict()) for r in spark.read.format("delta").load(path).collect()),
        key=lambda r: (r.account_id, r.job_id, r.hour),
    )


def test_the_first_refresh_into_a_new_table_appends_and_the_next_replaces_the_hour(
    spark: SparkSession, tmp_path: Path
) -> None:
    history = IterationHistory(spark, str(tmp_path / "iterations"))
    history.ensure()
    usage = UsageTable(spark, str(tmp_path / "usage"), history.path)
    usage.ensure()
    for minute in (10, 20):  # two iterations of one job in one hour, refreshed after each
        done = iteration(1, datetime(2026, 12, 7, 2, minute))
        history.record([done])
        usage.recorded([done.ended_at])
        usage.refresh()

    table = usage_rows(spark, usage.path)
    assert table == usage_of(spark.read.format("delta").load(history.path).collect())
    assert [(r.job_id, r.iterations) for r in table] == [(1, 2)]  # the hour's row, once
    operations = DeltaTable.forPath(spark, usage.path).history().orderBy("version")
    assert [r["operation"] for r in operations.collect()] == ["CREATE TABLE", "WRITE", "MERGE"]


def test_an_instance_that_created_the_history_reads_what_another_recorded_in_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    # the first instance to start creates the table; another records its iterations
    # before the first has recorded any: a slot the first takes over is rolled
    # forward from them, and a downstream job's freshness is credited from them
    created = IterationHistory(spark, str(tmp_path / "iterations"))
    created.ensure()
    other = IterationHistory(spark, created.path)
    other.ensure()
    assert created.is_new and not other.is_new
    ended = datetime(2026, 12, 2, 19, 39, 39)
    member = replace(
        iteration(7, ended).members[0],
        target_version=5,
        target_origin_table="db.events",
        target_origin_at=ended - timedelta(seconds=9),
    )
    other.record([replace(iteration(7, ended), members=[member])])

    assert not created.is_new
    assert created.latest_success() == {(7, None): (2, ended)}
    assert created.writes_of("db", "t", 7, 10) == [(5, "db.events", ended - timedelta(seconds=9))]
