"""Iteration results -> watermarks, states and retries, without Spark."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime

from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberResult,
    Retry,
    TableRef,
)
from lakeprop.engine.watermarks import advance
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobSpec
from lakeprop.state.history import consumer_digest, rolled_forward
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import EMPTY_STATUS, JobState

SPEC = JobSpec.from_json(
    {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
)
ROW = CatalogRow(
    1,
    "db",
    "t",
    "j",
    7,
    "tid",
    SPEC.canonical(),
    JobState.PENDING,
    3,
    None,
    EMPTY_STATUS,
    datetime(2026, 1, 1),
    None,
    None,
    0,
    1,
)
REF = ROW.row_id
CONSUMER = SPEC.iteration.consumer.canonical()


def result(
    code: int = 0, to: int = 6, kind: IterationKind = IterationKind.TAIL, consumer: str = CONSUMER
) -> IterationResult:
    plan = IterationPlan(TableRef(1, "db", "t"), kind, to, (Member(REF, 7, 3),), 0, 100.0)
    member = MemberResult(REF, 7, "replica", 4, code, "boom" if code else "", consumer)
    return IterationResult(plan, kind, 100.0, 101.0, 10, 1, "", [member])


def run(res: IterationResult, retries: dict | None = None, row: CatalogRow = ROW):
    retries = {} if retries is None else retries
    return advance({REF: row}, [res], retries, 200.0, retry_base=5, retry_cap=300), retries


def test_success_moves_the_watermark_and_clears_the_retry() -> None:
    changed, retries = run(result(), {REF: Retry(2, 150.0)})
    row = changed[REF]
    assert (row.watermark, row.job_state, row.watermark_ts) == (
        6,
        "completed",
        datetime.fromtimestamp(100.0),
    )
    status = json.loads(row.job_status)
    assert (status["from_version"], status["to_version"], status["error_code"]) == (3, 6, 0)
    assert status["consumers"] == [
        {"type": "replica", "rows_written": 4, "error_code": 0, "error_msg": ""}
    ]
    assert retries == {}


def test_temporary_failure_backs_off_and_keeps_the_watermark() -> None:
    changed, retries = run(result(code=ErrorCode.CONSUMER_ERROR))
    assert (changed[REF].watermark, changed[REF].job_state) == (3, JobState.PENDING.value)
    assert retries[REF] == Retry(1, 205.0)
    changed, retries = run(result(code=ErrorCode.ITERATION_TIMEOUT), retries)
    assert retries[REF] == Retry(2, 210.0)
    assert json.loads(changed[REF].job_status)["retry"]["attempts"] == 2


def test_permanent_failure_stops_the_job() -> None:
    changed, retries = run(result(code=ErrorCode.TARGET_MISSING), {REF: Retry(1, 0)})
    assert changed[REF].job_state == JobState.ERROR.value
    assert json.loads(changed[REF].job_status)["error_code"] == ErrorCode.TARGET_MISSING
    assert retries == {}


def test_cancel_leaves_the_job_canceled_without_backoff() -> None:
    changed, retries = run(result(code=ErrorCode.ITERATION_CANCELED))
    assert changed[REF].job_state == JobState.CANCELED.value and retries == {}


def test_results_of_dropped_or_respecified_jobs_are_ignored() -> None:
    assert run(result(), row=replace(ROW, drop_at=datetime(2026, 1, 2)))[0] == {}
    assert run(result(consumer='{"other":1}'))[0] == {}
    assert run(result(to=2))[0] == {}  # older than the watermark already held


# -- the history's watermarks ------------------------------------------------------------

DIGEST = consumer_digest(CONSUMER)
WHEN = datetime(2026, 1, 2)


def test_the_history_rolls_a_row_forward_to_what_its_consumer_reached() -> None:
    ahead = rolled_forward(ROW, {(7, DIGEST): (9, WHEN)})
    assert ahead == replace(ROW, watermark=9, watermark_ts=WHEN, job_state=JobState.COMPLETED)


def test_progress_of_an_earlier_consumer_of_the_job_does_not_count() -> None:
    assert rolled_forward(ROW, {(7, consumer_digest("{}")): (9, WHEN)}) is None
    assert rolled_forward(ROW, {(8, DIGEST): (9, WHEN)}) is None  # another job


def test_history_rows_without_a_digest_count_for_the_job() -> None:
    assert rolled_forward(ROW, {(7, None): (4, WHEN)}) is not None


def test_a_row_level_with_or_ahead_of_the_history_or_dropped_stays() -> None:
    assert rolled_forward(ROW, {(7, DIGEST): (3, WHEN)}) is None
    assert rolled_forward(ROW, {(7, DIGEST): (2, WHEN)}) is None
    assert rolled_forward(replace(ROW, drop_at=WHEN), {(7, DIGEST): (9, WHEN)}) is None
    fresh = replace(ROW, watermark=None)  # registered, not synced yet
    assert rolled_forward(fresh, {(7, DIGEST): (0, WHEN)}) == replace(
        fresh, watermark=0, watermark_ts=WHEN, job_state=JobState.COMPLETED
    )
