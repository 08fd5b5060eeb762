"""Bulk operations without Spark: decoding, selectors, the task state machine,
cancel, rollback, de-duplication and recovery after a crash."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from lakeprop.bulk.executor import BulkExecutor
from lakeprop.bulk.model import (
    BulkOp,
    BulkOperation,
    BulkRequest,
    BulkState,
    BulkTask,
    Selector,
    TaskState,
    bulk_state,
)
from lakeprop.bulk.plan import reregistered_job_id
from lakeprop.changelog import BulkCommand, LogRecord, Operation, decode, encode_bulk
from lakeprop.config import TenantsConfig
from lakeprop.errors import ErrorCode, TemporaryError
from lakeprop.spec import JobKey, JobRef, JobSpec
from lakeprop.state.apply import apply_commands, decode_all
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome, RecordedVerdict, Verdict
from lakeprop.state.status import JobState
from lakeprop.tenants import Tenants
from tests.unit.test_catalog_apply import check_ok, register

T0 = datetime(2026, 11, 24, 9, 0, 0)


def spec(consumer: str = "replica") -> JobSpec:
    options: dict[str, Any] = {"primary_key": ["id"]}
    if consumer == "secondary_index":
        options["columns"] = ["g"]
    return JobSpec.from_json(
        {
            "trigger": {"kind": "default"},
            "iteration": {"consumer": {"type": consumer, "options": options}},
        }
    )


def catalog(n: int = 6) -> dict[JobRef, CatalogRow]:
    """Jobs copy_0.. of account 7 on sales.orders (the last is a secondary index), and
    one of account 8."""
    commands = [
        register(i, JobKey(7, "sales", "orders", f"copy_{i}"), spec()) for i in range(n - 1)
    ]
    commands.append(register(n - 1, JobKey(7, "sales", "orders", "by_g"), spec("secondary_index")))
    commands.append(register(n, JobKey(8, "sales", "orders", "copy_0"), spec()))
    return dict(apply_commands([], commands, check_ok).upserts)


def message(
    op: Operation, offset: int, account: int = 7, bulk_id: str | None = None, **kw: Any
) -> BulkCommand:
    _, key, value = encode_bulk(op, account, bulk_id, **kw)
    record = LogRecord("log", 1, offset, T0 + timedelta(seconds=offset), key, value)
    command = decode(record, 1 << 20)
    assert isinstance(command, BulkCommand)
    return command


def bulk(offset: int, operation: BulkOp, bulk_id: str = "b1", **selector: Any) -> BulkCommand:
    spec_update = selector.pop("spec", None)
    return message(
        Operation.BULK,
        offset,
        bulk_id=bulk_id,
        selector=selector,
        operation=operation.value,
        spec=spec_update,
    )


class MemoryStore:
    """The two tables as dictionaries, and what each write held."""

    def __init__(self) -> None:
        self.operations_by_id: dict[str, BulkOperation] = {}
        self.tasks_by_id: dict[tuple[str, int], BulkTask] = {}
        self.writes: list[tuple[list[str], list[tuple[int, str]]]] = []

    def operations(self, bulk_id: str | None = None) -> list[BulkOperation]:
        return [o for o in self.operations_by_id.values() if bulk_id in (None, o.bulk_id)]

    def tasks(self, bulk_ids: Iterable[str]) -> list[BulkTask]:
        ids = set(bulk_ids)
        return sorted(
            (t for t in self.tasks_by_id.values() if t.bulk_id in ids),
            key=lambda t: (t.bulk_id, t.task_no),
        )

    def write(self, operations: Sequence[BulkOperation], tasks: Sequence[BulkTask]) -> None:
        for t in tasks:
            self.tasks_by_id[(t.bulk_id, t.task_no)] = t
        for o in operations:
            self.operations_by_id[o.bulk_id] = o
        self.writes.append(
            ([o.state.value for o in operations], [(t.task_no, t.state.value) for t in tasks])
        )


class Service:
    """The executor driven as the runner drives it, over catalog rows in memory."""

    def __init__(self, rows: dict[JobRef, CatalogRow], per_tick: int = 100, **tenants: Any) -> None:
        self.rows = rows
        self.store = MemoryStore()
        self.tenants = Tenants(TenantsConfig(**tenants))
        self.check = check_ok
        self.executor = BulkExecutor(self.store, per_tick, attempts=2, clock=lambda: T0)
        self.executor.load(self.rows)

    def send(self, *commands: BulkCommand) -> list[Verdict]:
        verdicts = self.executor.accept(commands, self.rows.values(), self.tenants, {})
        self.executor.flush()
        return verdicts

    def tick(
        self, *, crash_before_catalog: bool = False, crash_after_catalog: bool = False
    ) -> None:
        result = self.executor.run(list(self.rows.values()), self.check, self.tenants)
        self.executor.flush()
        if crash_before_catalog:
            return self.restart()
        self.rows.update(result.upserts)
        if crash_after_catalog:
            return self.restart()
        self.executor.finish()
        return None

    def restart(self) -> None:
        self.executor = BulkExecutor(self.store, self.executor.tasks_per_tick, 2, lambda: T0)
        self.executor.load(self.rows)

    def drain(self) -> None:
        for _ in range(100):
            if not self.executor.busy:
                return
            self.tick()
        raise AssertionError("the bulk operation did not end")

    def states(self, bulk_id: str = "b1") -> list[str]:
        return [t.state.value for t in self.store.tasks([bulk_id])]

    def operation(self, bulk_id: str = "b1") -> BulkState:
        return self.store.operations_by_id[bulk_id].state

    def live(self, account: int = 7) -> dict[str, CatalogRow]:
        return {r.job_name: r for r in self.rows.values() if r.is_live and r.account_id == account}


def verdicts_of(verdicts: Sequence[Verdict]) -> list[tuple[Outcome, int, str]]:
    return [(v.outcome, v.error_code, v.detail) for v in verdicts]


# -- decoding --------------------------------------------------------------------------


def test_a_bulk_request_travels_in_the_change_log() -> None:
    command = bulk(
        3,
        BulkOp.UPDATE_SPEC,
        database="sales",
        job_name="copy_*",
        spec={"iteration": {"priority": 3}},
    )
    assert (command.op, command.account_id, command.bulk_id) == (Operation.BULK, 7, "b1")
    request = BulkRequest.of(command)
    assert request == BulkRequest(
        Selector(7, database="sales", job_name="copy_*"),
        BulkOp.UPDATE_SPEC,
        {"spec": {"iteration": {"priority": 3}}, "interrupt": False},
    )
    cancel = message(Operation.BULK_CANCEL, 4, bulk_id="b1")
    assert (cancel.op, cancel.bulk_id, cancel.record.key) == (
        Operation.BULK_CANCEL,
        "b1",
        b"bulk/7/b1",
    )


BASE = {"version": 1, "op": "bulk", "request_id": "b1", "account_id": 7, "selector": {}}


@pytest.mark.parametrize(
    ("value", "key", "reason", "code"),
    [
        (
            {**BASE, "operation": "explode"},
            b"bulk/7/b1",
            "unknown bulk operation 'explode'; expected one of",
            ErrorCode.UNKNOWN_OPERATION,
        ),
        (
            {**BASE, "operation": "pause", "selector": {"color": "red"}},
            b"bulk/7/b1",
            "bulk selector has unknown field(s) ['color']",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "operation": "pause", "selector": {"state": "sleepy"}},
            b"bulk/7/b1",
            "bulk selector state 'sleepy' is not one of",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "operation": "pause", "selector": {"jobs": [{"database": "a"}]}},
            b"bulk/7/b1",
            'bulk selector jobs are objects {"database": ..., "table": ..., "name": ...}',
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "operation": "update_spec"},
            b"bulk/7/b1",
            "update_spec message needs a 'spec' object",
            ErrorCode.INVALID_SPEC,
        ),
        (
            {**BASE, "operation": "pause", "spec": {}},
            b"bulk/7/b1",
            "a bulk pause takes no spec nor interrupt",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "operation": "pause"},
            b"bulk/7/other",
            "message key 'bulk/7/other' does not match the bulk key 'bulk/7/b1'",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "op": "bulk_rollback"},
            b"bulk/7/b1",
            "bulk_rollback message has unknown field(s) ['selector']",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {"version": 1, "op": "bulk_cancel", "request_id": "c", "account_id": 7},
            b"bulk/7/b1",
            "bulk_cancel message needs the bulk_id it applies to",
            ErrorCode.INVALID_MESSAGE,
        ),
        (
            {**BASE, "account_id": "7", "operation": "pause"},
            b"bulk/7/b1",
            "bulk message needs an integer account_id",
            ErrorCode.INVALID_MESSAGE,
        ),
    ],
)
def test_a_bad_bulk_message_is_rejected_with_its_reason(
    value: dict[str, Any], key: bytes, reason: str, code: int
) -> None:
    """As the runner does: a message that does not decode is rejected there, a body
    that does not make a request is rejected when the service applies it."""
    record = LogRecord("log", 0, 1, T0, key, json.dumps(value).encode())
    commands, verdicts = decode_all([record], 1 << 20)
    service = Service(catalog())
    verdicts += service.send(*[c for c in commands if isinstance(c, BulkCommand)])
    ((outcome, error, detail),) = verdicts_of(verdicts)
    assert (outcome, error) == (Outcome.REJECTED, code)
    assert detail.startswith(reason), detail
    assert service.store.operations() == []


def test_a_selector_matches_every_field_it_names() -> None:
    key = JobKey(7, "sales", "orders", "copy_1")
    assert Selector(7).matches(key, "replica", JobState.COMPLETED)
    assert Selector(7, database="sal*", job_name="copy_?").matches(key, "replica", JobState.PAUSED)
    assert not Selector(8).matches(key, "replica", JobState.COMPLETED)
    assert not Selector(7, consumer_type="aggregate_view").matches(
        key, "replica", JobState.COMPLETED
    )
    assert not Selector(7, state=JobState.PAUSED).matches(key, "replica", JobState.COMPLETED)
    assert Selector(7, jobs=(("sales", "orders", "copy_1"),)).matches(
        key, "replica", JobState.ERROR
    )
    assert not Selector(7, jobs=(("sales", "orders", "copy_2"),)).matches(
        key, "replica", JobState.ERROR
    )


# -- the state machine -----------------------------------------------------------------


def test_a_bulk_update_runs_its_tasks_a_few_per_tick_and_ends_in_success() -> None:
    service = Service(catalog(), per_tick=2)
    verdicts = service.send(
        bulk(10, BulkOp.UPDATE_SPEC, job_name="copy_*", spec={"iteration": {"priority": 9}})
    )
    assert verdicts_of(verdicts) == [(Outcome.APPLIED, 0, "bulk update_spec of 5 job(s) accepted")]
    assert service.states() == ["pending"] * 5 and service.operation() is BulkState.RUNNING
    service.tick()
    assert service.states() == ["success", "success", "pending", "pending", "pending"]
    service.drain()
    assert service.operation() is BulkState.SUCCESS
    live = service.live()
    assert {n: r.spec().iteration.priority for n, r in live.items()} == {
        **{f"copy_{i}": 9 for i in range(5)},
        "by_g": 0,
    }
    # a task keeps the row's own log coordinates: a later job message still applies
    assert all(r.log_offset == int(n[-1]) for n, r in live.items() if n.startswith("copy_"))


def test_tasks_that_fail_make_a_partial_fail_and_rollback_restores_every_spec_byte_for_byte() -> (
    None
):
    service = Service(catalog())
    before = {n: r.job_spec for n, r in service.live().items()}
    # "columns" is not an option of a replica: the replicas fail, the index succeeds
    service.send(
        bulk(
            10,
            BulkOp.UPDATE_SPEC,
            spec={"iteration": {"consumer": {"options": {"columns": ["v"]}}}},
        )
    )
    service.drain()
    assert service.operation() is BulkState.PARTIAL_FAIL
    assert service.states() == ["success"] + ["fail"] * 5  # by_g sorts first
    (failed, *_) = [t for t in service.store.tasks(["b1"]) if t.state is TaskState.FAIL]
    assert "columns" in failed.detail
    assert service.live()["by_g"].job_spec != before["by_g"]

    verdicts = service.send(message(Operation.BULK_ROLLBACK, 11, bulk_id="b1"))
    assert verdicts_of(verdicts) == [(Outcome.APPLIED, 0, "rollback of 1 task(s) accepted")]
    assert service.operation() is BulkState.ROLLBACK_RUNNING
    service.drain()
    assert service.operation() is BulkState.ROLLBACK_SUCCESS
    assert service.states() == ["rollback_success"] + ["fail"] * 5
    assert {n: r.job_spec for n, r in service.live().items()} == before


def test_rollback_of_pause_resume_and_unregister_restores_state_and_jobs() -> None:
    rows = catalog()
    paused = next(r for r in rows.values() if r.job_name == "copy_0")
    rows[paused.row_id] = replace(paused, job_state=JobState.PAUSED)
    service = Service(rows)
    service.send(bulk(10, BulkOp.PAUSE, "p", job_name="copy_*"))
    service.drain()
    assert service.states("p") == ["success"] * 5
    assert {r.job_state for n, r in service.live().items() if n != "by_g"} == {JobState.PAUSED}
    service.send(message(Operation.BULK_ROLLBACK, 11, bulk_id="p"))
    service.drain()
    states = {n: r.job_state for n, r in service.live().items()}
    assert states == {
        "copy_0": JobState.PAUSED,
        **{f"copy_{i}": JobState.COMPLETED for i in range(1, 5)},
        "by_g": JobState.COMPLETED,
    }

    before = {n: (r.job_spec, r.job_state) for n, r in service.live().items()}
    service.send(bulk(12, BulkOp.UNREGISTER, "u", job_name="copy_[01]"))
    service.drain()
    assert sorted(service.live()) == ["by_g", "copy_2", "copy_3", "copy_4"]
    service.send(message(Operation.BULK_ROLLBACK, 13, bulk_id="u"))
    service.drain()
    assert service.operation("u") is BulkState.ROLLBACK_SUCCESS
    live = service.live()
    assert {n: (r.job_spec, r.job_state) for n, r in live.items()} == before
    tasks = service.store.tasks(["u"])
    assert {live[t.job_name].job_id for t in tasks} == {reregistered_job_id(t) for t in tasks}


def test_cancel_stops_the_tasks_not_started_and_leaves_their_jobs_alone() -> None:
    service = Service(catalog(), per_tick=2)
    service.send(bulk(10, BulkOp.RESYNC, job_name="copy_*"))
    service.tick()
    verdicts = service.send(message(Operation.BULK_CANCEL, 11, bulk_id="b1"))
    assert verdicts_of(verdicts) == [(Outcome.APPLIED, 0, "cancelled: 3 task(s) had not started")]
    service.drain()
    assert service.states() == ["success", "success", "cancel", "cancel", "cancel"]
    assert service.operation() is BulkState.CANCEL
    generations = {n: r.spec().iteration.consumer.generation for n, r in service.live().items()}
    assert generations == {
        "copy_0": 1,
        "copy_1": 1,
        "copy_2": 0,
        "copy_3": 0,
        "copy_4": 0,
        "by_g": 0,
    }
    # a cancelled operation can be rolled back (a resync has nothing to undo)
    service.send(message(Operation.BULK_ROLLBACK, 12, bulk_id="b1"))
    service.drain()
    assert service.operation() is BulkState.ROLLBACK_SUCCESS


def test_bad_bulk_requests_get_a_clear_verdict() -> None:
    service = Service(catalog(), max_live_jobs=10, accounts={"7": {"max_live_jobs": 3}})
    verdicts = service.send(
        bulk(10, BulkOp.PAUSE, "none", job_name="nothing_*"),
        bulk(11, BulkOp.PAUSE, "big"),
        message(Operation.BULK_ROLLBACK, 12, bulk_id="nobody"),
        message(Operation.BULK_CANCEL, 13, account=8, bulk_id="nobody"),
    )
    assert verdicts_of(verdicts) == [
        (
            Outcome.REJECTED,
            ErrorCode.BULK_MATCHES_NOTHING,
            "selector {'job_name': 'nothing_*'} matches no live job of account 7",
        ),
        (
            Outcome.REJECTED,
            ErrorCode.QUOTA_EXCEEDED,
            "bulk operation over 6 jobs exceeds account 7's job quota (max_live_jobs = 3)",
        ),
        (Outcome.REJECTED, ErrorCode.BULK_NOT_FOUND, "no bulk operation 'nobody' of account 7"),
        (Outcome.REJECTED, ErrorCode.BULK_NOT_FOUND, "no bulk operation 'nobody' of account 8"),
    ]
    assert service.store.operations() == []


def test_the_same_bulk_id_again_is_answered_already_exists_and_a_replay_changes_nothing() -> None:
    service = Service(catalog(), per_tick=1)
    first = bulk(10, BulkOp.PAUSE, job_name="copy_*")
    service.send(first)
    service.tick()
    verdicts = service.send(bulk(20, BulkOp.PAUSE, job_name="copy_*"))
    assert verdicts_of(verdicts) == [
        (
            Outcome.ALREADY_EXISTS,
            0,
            "bulk operation b1 was requested already (state running); "
            "a request id names one bulk operation",
        )
    ]
    # the same message again (a replayed micro-batch): no second set of tasks
    replayed = {("log", 1, 10): RecordedVerdict(Outcome.APPLIED, None, None)}
    assert service.executor.accept([first], service.rows.values(), service.tenants, replayed) == []
    assert service.states() == ["success", "pending", "pending", "pending", "pending"]
    rollback = message(Operation.BULK_ROLLBACK, 21, bulk_id="b1")
    assert verdicts_of(service.send(rollback)) == [
        (
            Outcome.REJECTED,
            ErrorCode.BULK_WRONG_STATE,
            "bulk operation b1 is still running: cancel it, or wait for it to end, "
            "before rolling it back",
        )
    ]


@pytest.mark.parametrize("crash", ["crash_before_catalog", "crash_after_catalog"])
def test_a_crash_around_the_catalog_commit_applies_no_task_twice_and_loses_none(crash: str) -> None:
    service = Service(catalog(), per_tick=2)
    service.send(bulk(10, BulkOp.RESYNC, job_name="copy_*"))
    service.tick(**{crash: True})  # the first two tasks were written running, then a crash
    service.drain()
    assert service.operation() is BulkState.SUCCESS
    generations = {n: r.spec().iteration.consumer.generation for n, r in service.live().items()}
    assert generations == {**{f"copy_{i}": 1 for i in range(5)}, "by_g": 0}
    details = [t.detail for t in service.store.tasks(["b1"])[:2]]
    found = crash == "crash_after_catalog"
    assert all(d.endswith("(found applied)") == found for d in details), details


def test_a_temporary_error_is_retried_then_fails() -> None:
    service = Service(catalog())

    def flaky(key: JobKey, job_spec: JobSpec) -> str:
        raise TemporaryError("storage unreachable")

    service.check = flaky
    service.send(
        bulk(10, BulkOp.UPDATE_SPEC, job_name="copy_0", spec={"iteration": {"priority": 1}})
    )
    service.tick()
    assert service.states() == ["retry_pending"]
    service.tick()
    assert service.states() == ["fail"] and service.operation() is BulkState.FAIL
    (task,) = service.store.tasks(["b1"])
    assert (task.attempts, task.detail) == (2, "storage unreachable")


def test_the_operation_state_follows_its_tasks() -> None:
    def tasks(*states: TaskState) -> list[BulkTask]:
        return [
            BulkTask("b", i, 7, "d", "t", f"j{i}", i, s, 0, None, None, "", T0)
            for i, s in enumerate(states)
        ]

    S = TaskState
    assert bulk_state(BulkState.RUNNING, tasks(S.SUCCESS, S.PENDING)) is BulkState.RUNNING
    assert bulk_state(BulkState.RUNNING, tasks(S.SUCCESS, S.SUCCESS)) is BulkState.SUCCESS
    assert bulk_state(BulkState.RUNNING, tasks(S.FAIL, S.FAIL)) is BulkState.FAIL
    assert bulk_state(BulkState.RUNNING, tasks(S.SUCCESS, S.FAIL)) is BulkState.PARTIAL_FAIL
    assert bulk_state(BulkState.CANCEL, tasks(S.SUCCESS, S.CANCEL)) is BulkState.CANCEL
    assert (
        bulk_state(BulkState.ROLLBACK_RUNNING, tasks(S.ROLLBACK_SUCCESS, S.ROLLBACK_FAIL))
        is BulkState.ROLLBACK_FAIL
    )
    assert (
        bulk_state(BulkState.ROLLBACK_RUNNING, tasks(S.ROLLBACK_SUCCESS, S.FAIL))
        is BulkState.ROLLBACK_SUCCESS
    )
