"""Bulk operations as values: the selector, the states, the rows of the two tables.

A bulk operation (a batch job, as in a batch scheduler) applies one operation to every job a
selector matches. It is one row of ``bulk_operations`` and one row per matched
job in ``bulk_tasks``. A task moves through these states::

    pending ──> running ──> success ──(rollback)──> rollback_pending
       │  ▲        │                                     │
       │  └─ retry_pending (a temporary error)            ▼
       │           └──> fail                      rollback_running ──> rollback_success
       └──> cancel (cancelled before it started)                   └─> rollback_fail

and the operation's state follows from its tasks' (:func:`bulk_state`). Pure:
no Spark here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum
from fnmatch import fnmatchcase
from typing import Any

from lakeprop.changelog import BulkCommand, spec_update_of
from lakeprop.errors import ErrorCode, InvalidMessageError
from lakeprop.identifiers import validate_identifier
from lakeprop.spec import JobKey, canonical_json
from lakeprop.state.schema import Int32, row_tuple
from lakeprop.state.status import JobState


class BulkOp(str, Enum):
    """What a bulk operation does to each matched job."""

    PAUSE = "pause"
    RESUME = "resume"
    RESYNC = "resync"
    UPDATE_SPEC = "update_spec"
    UNREGISTER = "unregister"


class TaskState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAIL = "fail"
    RETRY_PENDING = "retry_pending"
    CANCEL = "cancel"
    ROLLBACK_PENDING = "rollback_pending"
    ROLLBACK_RUNNING = "rollback_running"
    ROLLBACK_SUCCESS = "rollback_success"
    ROLLBACK_FAIL = "rollback_fail"

    @property
    def ready(self) -> bool:
        """Waiting for a worker."""
        return self in (TaskState.PENDING, TaskState.RETRY_PENDING, TaskState.ROLLBACK_PENDING)

    @property
    def terminal(self) -> bool:
        return self in (
            TaskState.SUCCESS,
            TaskState.FAIL,
            TaskState.CANCEL,
            TaskState.ROLLBACK_SUCCESS,
            TaskState.ROLLBACK_FAIL,
        )

    @property
    def rollback(self) -> bool:
        return self.value.startswith("rollback_")


class BulkState(str, Enum):
    RUNNING = "running"
    SUCCESS = "success"
    PARTIAL_FAIL = "partial_fail"
    FAIL = "fail"
    CANCEL = "cancel"
    ROLLBACK_RUNNING = "rollback_running"
    ROLLBACK_SUCCESS = "rollback_success"
    ROLLBACK_FAIL = "rollback_fail"

    @property
    def terminal(self) -> bool:
        return self not in (BulkState.RUNNING, BulkState.ROLLBACK_RUNNING)

    @property
    def rollback(self) -> bool:
        return self.value.startswith("rollback_")


SELECTOR_FIELDS = ("database", "table", "job_name", "consumer_type", "state", "jobs")


@dataclass(frozen=True)
class Selector:
    """Which jobs of one account a bulk operation applies to: every field given
    must match (``database``, ``table`` and ``job_name`` are glob patterns,
    ``jobs`` an explicit list of ``{"database", "table", "name"}``)."""

    account_id: int
    database: str | None = None
    table: str | None = None
    job_name: str | None = None
    consumer_type: str | None = None
    state: JobState | None = None
    jobs: tuple[tuple[str, str, str], ...] | None = None

    @classmethod
    def from_json(cls, account_id: int, value: object) -> Selector:
        if not isinstance(value, dict):
            raise InvalidMessageError("bulk selector must be a JSON object")
        unknown = sorted(set(value) - set(SELECTOR_FIELDS))
        if unknown:
            raise InvalidMessageError(
                f"bulk selector has unknown field(s) {unknown}; it takes {list(SELECTOR_FIELDS)}"
            )
        for name in ("database", "table", "job_name", "consumer_type"):
            if name in value and (not isinstance(value[name], str) or not value[name]):
                raise InvalidMessageError(f"bulk selector {name} must be a non-empty string")
        state = value.get("state")
        if state is not None:
            try:
                state = JobState(state)
            except ValueError:
                raise InvalidMessageError(
                    f"bulk selector state {state!r} is not one of {[s.value for s in JobState]}"
                ) from None
        return cls(
            account_id,
            value.get("database"),
            value.get("table"),
            value.get("job_name"),
            value.get("consumer_type"),
            state,
            _job_list(value["jobs"]) if "jobs" in value else None,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            name: getattr(self, name)
            for name in ("database", "table", "job_name", "consumer_type")
            if getattr(self, name) is not None
        }
        if self.state is not None:
            out["state"] = self.state.value
        if self.jobs is not None:
            out["jobs"] = [{"database": d, "table": t, "name": n} for d, t, n in self.jobs]
        return out

    def matches(self, key: JobKey, consumer_type: str, state: JobState) -> bool:
        return (
            key.account_id == self.account_id
            and _like(self.database, key.database)
            and _like(self.table, key.table)
            and _like(self.job_name, key.job_name)
            and self.consumer_type in (None, consumer_type)
            and self.state in (None, state)
            and (self.jobs is None or (key.database, key.table, key.job_name) in set(self.jobs))
        )


def _like(pattern: str | None, value: str) -> bool:
    return pattern is None or fnmatchcase(value, pattern)


def _job_list(value: object) -> tuple[tuple[str, str, str], ...]:
    if not isinstance(value, list) or not value:
        raise InvalidMessageError("bulk selector jobs must be a non-empty list of jobs")
    jobs = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"database", "table", "name"}:
            raise InvalidMessageError(
                'bulk selector jobs are objects {"database": ..., "table": ..., "name": ...}'
            )
        for name in ("database", "table", "name"):
            validate_identifier(item[name], f"bulk selector jobs[].{name}")
        jobs.append((item["database"], item["table"], item["name"]))
    return tuple(jobs)


def parse_bulk_op(value: object) -> BulkOp:
    try:
        return BulkOp(value)
    except ValueError:
        raise InvalidMessageError(
            f"unknown bulk operation {value!r}; expected one of {[o.value for o in BulkOp]}",
            ErrorCode.UNKNOWN_OPERATION,
        ) from None


@dataclass(frozen=True)
class BulkRequest:
    """What a new bulk operation asks: its selector, operation and parameters."""

    selector: Selector
    operation: BulkOp
    params: dict[str, Any]
    """update_spec: ``{"spec": <partial spec>, "interrupt": bool}``; others: none."""

    @classmethod
    def of(cls, command: BulkCommand) -> BulkRequest:
        """The request a bulk message carries, or InvalidMessageError saying what is wrong."""
        body = command.body
        operation = parse_bulk_op(body.get("operation"))
        params: dict[str, Any] = {}
        if operation is BulkOp.UPDATE_SPEC:
            spec, interrupt = spec_update_of(body)
            params = {"spec": spec, "interrupt": interrupt}
        elif "spec" in body or "interrupt" in body:
            raise InvalidMessageError(f"a bulk {operation.value} takes no spec nor interrupt")
        return cls(Selector.from_json(command.account_id, body.get("selector")), operation, params)


def image(job_id: int, job_spec: str, state: JobState, live: bool) -> str:
    """What a task changes of a job, as canonical JSON: the before- and after-image
    of the task (rollback restores the first; recovery compares with the second)."""
    return canonical_json(
        {"job_id": job_id, "job_spec": job_spec, "paused": state == JobState.PAUSED, "live": live}
    )


@dataclass(frozen=True)
class BulkTask:
    """One matched job of a bulk operation (a ``bulk_tasks`` row, in its column order)."""

    bulk_id: str
    task_no: Int32
    account_id: int
    database: str
    table: str
    job_name: str
    job_id: int
    state: TaskState
    attempts: Int32
    before: str | None
    """The job before the task ran (:func:`image`)."""
    after: str | None
    """The job after the task (or its rollback) ran, while it runs."""
    detail: str
    updated_at: datetime

    @property
    def key(self) -> JobKey:
        return JobKey(self.account_id, self.database, self.table, self.job_name)

    def before_image(self) -> dict[str, Any]:
        return json.loads(self.before) if self.before else {}

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> BulkTask:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["state"] = TaskState(values["state"])
        return cls(**values)


@dataclass(frozen=True)
class BulkOperation:
    """One bulk request (a ``bulk_operations`` row, in its column order)."""

    bulk_id: str
    account_id: int
    operation: BulkOp
    selector: str
    """The selector as canonical JSON."""
    params: str
    """The operation's parameters as canonical JSON (update_spec: spec, interrupt)."""
    state: BulkState
    tasks: Int32
    created_at: datetime
    updated_at: datetime
    log_topic: str
    log_partition: Int32
    log_offset: int
    """Where the request came from in the change log."""

    def params_json(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.params)
        return result

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | Any) -> BulkOperation:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["operation"] = BulkOp(values["operation"])
        values["state"] = BulkState(values["state"])
        return cls(**values)


def bulk_state(current: BulkState, tasks: Sequence[BulkTask]) -> BulkState:
    """The operation's state from its tasks' (a batch scheduler's MaintainBatchStatus).

    Running while a task is not terminal; then success when every task
    succeeded, fail when none did, partial_fail otherwise. A cancelled operation
    stays ``cancel``. A rollback ends ``rollback_fail`` when any task could not
    be rolled back, ``rollback_success`` otherwise.
    """
    if any(not t.state.terminal for t in tasks):
        return current
    if current.rollback:
        failed = any(t.state is TaskState.ROLLBACK_FAIL for t in tasks)
        return BulkState.ROLLBACK_FAIL if failed else BulkState.ROLLBACK_SUCCESS
    if current is BulkState.CANCEL:
        return current
    succeeded = sum(t.state is TaskState.SUCCESS for t in tasks)
    if succeeded == len(tasks):
        return BulkState.SUCCESS
    return BulkState.FAIL if succeeded == 0 else BulkState.PARTIAL_FAIL


def counts(tasks: Iterable[BulkTask]) -> dict[str, int]:
    """Tasks per state (for progress: done / total, failures)."""
    out: dict[str, int] = {}
    for t in tasks:
        out[t.state.value] = out.get(t.state.value, 0) + 1
    return out
