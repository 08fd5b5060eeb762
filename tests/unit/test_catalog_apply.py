"""apply_commands: the catalog semantics of ISCP's job log, without Spark."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from lakeprop.changelog import Command, LogRecord, Operation
from lakeprop.errors import SourceTableError, TemporaryError
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands, job_id_for
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome, RecordedVerdict
from lakeprop.state.status import JobState

KEY = JobKey(1, "db", "t", "job")
SPEC = JobSpec.from_json(
    {
        "trigger": {"kind": "periodic", "interval": 60, "share": True},
        "iteration": {
            "priority": 2,
            "consumer": {"type": "replica", "options": {"primary_key": ["id"]}},
        },
    }
)
T0 = datetime(2026, 5, 1, 12, 0, 0)


def rec(offset: int, partition: int = 0) -> LogRecord:
    return LogRecord("log", partition, offset, T0 + timedelta(seconds=offset), None, None)


def register(offset: int, key: JobKey = KEY, spec: JobSpec = SPEC) -> Command:
    return Command(Operation.REGISTER, f"r{offset}", key, rec(offset), spec=spec)


def unregister(offset: int, key: JobKey = KEY) -> Command:
    return Command(Operation.UNREGISTER, f"r{offset}", key, rec(offset))


def update(offset: int, partial: dict[str, object], key: JobKey = KEY) -> Command:
    return Command(Operation.UPDATE_SPEC, f"r{offset}", key, rec(offset), spec_update=partial)


def check_ok(key: JobKey, spec: JobSpec) -> str:
    return f"id-of-{key.table}"


def outcomes(result: object) -> list[tuple[str | None, Outcome]]:
    return [(v.request_id, v.outcome) for v in result.verdicts]  # type: ignore[attr-defined]


def test_register_creates_a_completed_job() -> None:
    result = apply_commands([], [register(5)], check_ok)
    (row,) = result.upserts.values()
    assert row == CatalogRow(
        1,
        "db",
        "t",
        "job",
        job_id_for(rec(5)),
        "id-of-t",
        SPEC.canonical(),
        JobState.COMPLETED.value,
        None,
        None,
        row.job_status,
        T0 + timedelta(seconds=5),
        None,
        None,
        0,
        5,
    )
    assert json.loads(row.job_status)["error_code"] == 0
    assert outcomes(result) == [("r5", Outcome.APPLIED)]


def test_second_register_reports_already_exists() -> None:
    first = apply_commands([], [register(1)], check_ok)
    result = apply_commands(first.upserts.values(), [register(2)], check_ok)
    assert result.upserts == {}
    assert outcomes(result) == [("r2", Outcome.ALREADY_EXISTS)]


def test_unregister_then_register_gets_a_new_id() -> None:
    result = apply_commands([], [register(1), unregister(2), register(3)], check_ok)
    rows = sorted(result.upserts.values(), key=lambda r: r.job_id)
    assert [(r.job_id, r.drop_at, r.log_offset) for r in rows] == [
        (job_id_for(rec(1)), T0 + timedelta(seconds=2), 2),
        (job_id_for(rec(3)), None, 3),
    ]
    assert job_id_for(rec(1, partition=1)) != job_id_for(rec(1, partition=0))


def test_commands_apply_in_log_order_whatever_the_input_order() -> None:
    result = apply_commands([], [register(3), unregister(2), register(1)], check_ok)
    assert outcomes(result) == [
        ("r1", Outcome.APPLIED),
        ("r2", Outcome.APPLIED),
        ("r3", Outcome.APPLIED),
    ]


def test_update_merges_and_revalidates() -> None:
    base = apply_commands([], [register(1)], check_ok).upserts.values()
    result = apply_commands(base, [update(2, {"iteration": {"priority": 9}})], check_ok)
    (row,) = result.upserts.values()
    assert row.spec().iteration.priority == 9
    assert row.spec().trigger == SPEC.trigger
    assert row.log_offset == 2


def test_an_invalid_update_is_rejected_and_changes_nothing() -> None:
    base = list(apply_commands([], [register(1)], check_ok).upserts.values())
    result = apply_commands(base, [update(2, {"trigger": {"kind": "bogus"}})], check_ok)
    assert result.upserts == {}
    (verdict,) = result.verdicts
    assert verdict.outcome is Outcome.REJECTED and "trigger.kind" in verdict.detail


def test_unknown_job_is_not_found() -> None:
    result = apply_commands([], [unregister(1), update(2, {})], check_ok)
    assert outcomes(result) == [("r1", Outcome.NOT_FOUND), ("r2", Outcome.NOT_FOUND)]


def test_a_source_check_failure_rejects_only_that_command() -> None:
    def check(key: JobKey, spec: JobSpec) -> str:
        if key.table == "missing":
            raise SourceTableError("source db.missing does not exist")
        return "id"

    other = JobKey(1, "db", "missing", "job")
    result = apply_commands([], [register(1, other), register(2)], check)
    assert outcomes(result) == [("r1", Outcome.REJECTED), ("r2", Outcome.APPLIED)]
    assert result.verdicts[0].detail == "source db.missing does not exist"


def test_a_temporary_failure_propagates_so_the_batch_is_retried() -> None:
    def check(key: JobKey, spec: JobSpec) -> str:
        raise TemporaryError("storage hiccup")

    with pytest.raises(TemporaryError):
        apply_commands([], [register(1)], check)


def test_commands_already_in_the_catalog_are_skipped() -> None:
    commands = [register(1), update(2, {"iteration": {"priority": 4}}), unregister(3), register(4)]
    first = apply_commands([], commands, check_ok)
    replay = apply_commands(first.upserts.values(), commands, check_ok)
    assert replay.upserts == {} and replay.verdicts == []


def test_a_replay_follows_recorded_verdicts_instead_of_rechecking() -> None:
    def check_fails(key: JobKey, spec: JobSpec) -> str:
        raise SourceTableError("gone now")

    recorded = {
        ("log", 0, 1): RecordedVerdict(Outcome.APPLIED, job_id_for(rec(1)), "id-then"),
        ("log", 0, 2): RecordedVerdict(Outcome.REJECTED, None, None),
    }
    other = JobKey(1, "db", "t", "other")
    result = apply_commands([], [register(1), register(2, other)], check_fails, recorded)
    (row,) = result.upserts.values()
    assert (row.key, row.table_id) == (KEY, "id-then")
    assert outcomes(result) == [("r1", Outcome.APPLIED)]


def test_drops_interrupts_and_new_consumers_cancel_the_jobs_iteration() -> None:
    base = list(apply_commands([], [register(1)], check_ok).upserts.values())
    synced = [replace(base[0], watermark=4)]
    (row_id,) = [r.row_id for r in synced]

    plain = apply_commands(synced, [update(2, {"iteration": {"priority": 3}})], check_ok)
    assert plain.cancel == set() and plain.upserts[row_id].watermark == 4

    interrupt = Command(
        Operation.UPDATE_SPEC,
        "r2",
        KEY,
        rec(2),
        spec_update={"iteration": {"priority": 3}},
        interrupt=True,
    )
    assert apply_commands(synced, [interrupt], check_ok).cancel == {row_id}

    new_consumer = apply_commands(
        synced,
        [update(2, {"iteration": {"consumer": {"options": {"columns": ["id"]}}}})],
        check_ok,
    )
    assert new_consumer.cancel == {row_id}
    assert new_consumer.upserts[row_id].watermark is None  # restarts from a snapshot

    assert apply_commands(synced, [unregister(2)], check_ok).cancel == {row_id}


def test_an_update_repairs_a_job_in_error() -> None:
    base = list(apply_commands([], [register(1)], check_ok).upserts.values())
    failed = [replace(base[0], job_state=JobState.ERROR, watermark=4)]
    result = apply_commands(failed, [update(2, {"iteration": {"priority": 1}})], check_ok)
    (row,) = result.upserts.values()
    assert (row.job_state, row.watermark) == (JobState.COMPLETED.value, 4)
