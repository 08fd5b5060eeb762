"""The usage table with several instances: the leader (the holder of slot 0)
refreshes it, and counts the iterations the others recorded, also those recorded
after it last refreshed their hour.

A :class:`UsageTable` in shared mode stands in for the leader's, on real Delta
tables; iterations appended to the history without telling it are the other
instances'.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
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
