"""Usage from the iteration history: per account, job and hour, shared iterations
split between their jobs, nothing counted twice (no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from lakeprop.client.render import usage_table
from lakeprop.state.usage import UsageRow, usage_of

T = datetime(2026, 11, 23, 9, 59, 50)


def iteration(
    account: int,
    members: list[tuple[int, str, int]],
    rows_read: int,
    jobs: int,
    seconds: float,
    ended: datetime = T,
    queued: float | None = None,
    task: float | None = None,
    cached: int | None = None,
    paused: float | None = None,
) -> dict[str, Any]:
    return {
        "account_id": account,
        "database": "db",
        "table": "t",
        "rows_read": rows_read,
        "spark_jobs": jobs,
        "started_at": ended - timedelta(seconds=seconds),
        "ended_at": ended,
        "queued_seconds": queued,
        "task_seconds": task,
        "bytes_cached": cached,
        "paused_seconds": paused,
        "members": [
            {"job_id": job_id, "job_name": name, "rows_written": written}
            for job_id, name, written in members
        ],
    }


def test_a_shared_iteration_is_split_and_hours_and_accounts_stay_apart() -> None:
    history = [
        iteration(
            1,
            [(10, "copy", 3), (11, "idx", 3)],
            rows_read=3,
            jobs=4,
            seconds=10.0,
            queued=4.0,
            task=6.0,
            cached=3000,
            paused=1.0,
        ),
        iteration(1, [(10, "copy", 5)], rows_read=5, jobs=6, seconds=2.0, task=2.5, cached=500),
        iteration(1, [(10, "copy", 1)], 1, 2, 1.0, ended=T + timedelta(seconds=20)),  # 10:00
        iteration(2, [(20, "copy", 7)], 7, 6, 3.0),
    ]
    nine, ten = datetime(2026, 11, 23, 9), datetime(2026, 11, 23, 10)
    assert usage_of(history) == [
        UsageRow(1, "db", "t", "copy", 10, nine, 2, 6.5, 8, 6.5, 8.0, 7.0, 2.0, 5.5, 2000.0, 0.5),
        UsageRow(1, "db", "t", "copy", 10, ten, 1, 1.0, 1, 1.0, 2.0, 1.0),
        UsageRow(1, "db", "t", "idx", 11, nine, 1, 1.5, 3, 1.5, 2.0, 5.0, 2.0, 3.0, 1500.0, 0.5),
        UsageRow(2, "db", "t", "copy", 20, nine, 1, 7.0, 7, 7.0, 6.0, 3.0),
    ]
    # an account's total is what the service spent: the shared read counted once
    account_1 = [u for u in usage_of(history) if u.account_id == 1]
    assert sum(u.rows_read for u in account_1) == 3 + 5 + 1
    assert sum(u.wall_seconds for u in account_1) == 10.0 + 2.0 + 1.0
    assert sum(u.task_seconds for u in account_1) == 6.0 + 2.5
    assert sum(u.bytes_cached for u in account_1) == 3000 + 500


def test_an_iteration_without_members_charges_nobody() -> None:
    assert usage_of([iteration(1, [], 3, 1, 1.0)]) == []


def test_the_cli_table_shows_one_line_per_job_and_hour() -> None:
    rows = [
        UsageRow(
            1,
            "db",
            "t",
            "copy",
            10,
            datetime(2026, 11, 23, 9),
            2,
            6.5,
            8,
            6.5,
            8.0,
            7.25,
            3.0,
            task_seconds=5.5,
            bytes_cached=2_500_000,
            paused_seconds=1.0,
        )
    ]
    assert usage_table(rows).splitlines() == [
        "HOUR              JOB          ITERATIONS  ROWS READ  ROWS WRITTEN  ROWS CACHED  "
        "MB CACHED  SPARK JOBS  TASK S  WALL S  QUEUED S  PAUSED S",
        "2026-11-23 09:00  1/db.t/copy  2           6.5        8             6.5          "
        "2.50       8.0         5.5     7.2     3.0       1.0",
    ]
