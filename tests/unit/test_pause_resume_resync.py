"""Pause, resume and resync: their catalog semantics, without Spark."""

from __future__ import annotations

from dataclasses import replace

from lakeprop.changelog import Command, Operation, decode, encode
from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberResult,
    TableRef,
)
from lakeprop.engine.watermarks import advance
from lakeprop.state.apply import apply_commands
from lakeprop.state.history import consumer_digest, rolled_forward
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome
from lakeprop.state.status import JobState
from tests.unit.test_catalog_apply import KEY, check_ok, rec, register


def op(operation: Operation, offset: int) -> Command:
    return Command(operation, f"r{offset}", KEY, rec(offset))


def synced() -> CatalogRow:
    (row,) = apply_commands([], [register(1)], check_ok).upserts.values()
    return replace(row, watermark=4)


def details(result: object) -> list[tuple[Outcome, str]]:
    return [(v.outcome, v.detail) for v in result.verdicts]  # type: ignore[attr-defined]


def test_each_operation_travels_in_the_change_log() -> None:
    for operation in (Operation.PAUSE, Operation.RESUME, Operation.RESYNC):
        rid, key, value = encode(operation, KEY)
        command = decode(replace(rec(3), key=key, value=value), 1 << 20)
        assert (command.op, command.key, command.request_id) == (operation, KEY, rid)


def test_pause_keeps_the_watermark_stops_the_iteration_and_resume_lifts_it() -> None:
    row = synced()
    paused = apply_commands([row], [op(Operation.PAUSE, 2)], check_ok)
    assert paused.cancel == {row.row_id}
    (after,) = paused.upserts.values()
    assert (after.job_state, after.watermark) == (JobState.PAUSED, 4)
    again = apply_commands([after], [op(Operation.PAUSE, 3)], check_ok)
    assert (again.upserts, details(again)) == ({}, [(Outcome.APPLIED, "already paused")])

    resumed = apply_commands([after], [op(Operation.RESUME, 4)], check_ok)
    (back,) = resumed.upserts.values()
    assert (back.job_state, back.watermark, resumed.cancel) == (JobState.COMPLETED, 4, set())
    idle = apply_commands([row], [op(Operation.RESUME, 5)], check_ok)
    assert (idle.upserts, details(idle)) == ({}, [(Outcome.APPLIED, "not paused")])


def test_resync_is_a_new_consumer_generation_that_no_earlier_progress_counts_for() -> None:
    row = replace(synced(), job_state=JobState.ERROR)
    result = apply_commands([row], [op(Operation.RESYNC, 2)], check_ok)
    (after,) = result.upserts.values()
    assert (after.watermark, after.job_state, result.cancel) == (
        None,
        JobState.COMPLETED,
        {row.row_id},
    )
    assert after.spec().iteration.consumer.generation == 1
    assert after.consumer_spec() != row.consumer_spec()
    # after a restart the history's earlier successes do not bring the watermark back
    reached = {(row.job_id, consumer_digest(row.consumer_spec())): (4, rec(0).timestamp)}
    cleared_only = rolled_forward(replace(row, watermark=None), reached)
    assert cleared_only is not None and cleared_only.watermark == 4  # what the bump prevents
    assert rolled_forward(after, reached) is None
    # a paused job resyncs on resume: it stays paused
    paused = replace(synced(), job_state=JobState.PAUSED)
    (still,) = apply_commands([paused], [op(Operation.RESYNC, 3)], check_ok).upserts.values()
    assert (still.job_state, still.watermark) == (JobState.PAUSED, None)


def test_operations_on_no_live_job_are_not_found() -> None:
    result = apply_commands(
        [], [op(o, 1) for o in (Operation.PAUSE, Operation.RESUME, Operation.RESYNC)], check_ok
    )
    assert [v.outcome for v in result.verdicts] == [Outcome.NOT_FOUND] * 3


def test_a_job_paused_while_its_iteration_ran_keeps_its_progress_and_stays_paused() -> None:
    row = replace(synced(), job_state=JobState.PAUSED)
    plan = IterationPlan(
        TableRef(1, "db", "t"), IterationKind.TAIL, 6, (Member(row.row_id, row.job_id, 4),), 0, 0.0
    )
    result = IterationResult(plan=plan, kind=IterationKind.TAIL, started_at=0.0)
    result.members.append(MemberResult(row.row_id, row.job_id, "replica"))
    (after,) = advance({row.row_id: row}, [result], {}, 1.0, retry_base=1, retry_cap=2).values()
    assert (after.job_state, after.watermark) == (JobState.PAUSED, 6)
