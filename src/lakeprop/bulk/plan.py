"""From a bulk request to tasks, and from a task to catalog commands (pure).

:func:`expand` matches the selector against the live jobs; each match is one
task. :func:`task_commands` gives the change log command a task applies, the
same command a single message would carry, and :func:`rollback_commands` the
one that undoes it from the task's before-image.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from lakeprop.bulk.model import (
    BulkOp,
    BulkOperation,
    BulkRequest,
    BulkState,
    BulkTask,
    Selector,
    TaskState,
)
from lakeprop.changelog import BulkCommand, Command, LogRecord, Operation
from lakeprop.spec import JobSpec, canonical_json
from lakeprop.state.job_row import CatalogRow

_FORWARD = {
    BulkOp.PAUSE: Operation.PAUSE,
    BulkOp.RESUME: Operation.RESUME,
    BulkOp.RESYNC: Operation.RESYNC,
    BulkOp.UPDATE_SPEC: Operation.UPDATE_SPEC,
    BulkOp.UNREGISTER: Operation.UNREGISTER,
}


def matching(selector: Selector, rows: Iterable[CatalogRow]) -> list[CatalogRow]:
    """The live jobs the selector matches, in key order."""
    found = [
        r
        for r in rows
        if r.is_live and selector.matches(r.key, r.spec().iteration.consumer.type, r.job_state)
    ]
    return sorted(found, key=lambda r: (r.database, r.table, r.job_name))


def expand(
    command: BulkCommand, request: BulkRequest, jobs: Iterable[CatalogRow], now: datetime
) -> tuple[BulkOperation, list[BulkTask]]:
    """The bulk operation (running) and one pending task per job."""
    tasks = [
        BulkTask(
            bulk_id=command.bulk_id,
            task_no=n,
            account_id=row.account_id,
            database=row.database,
            table=row.table,
            job_name=row.job_name,
            job_id=row.job_id,
            state=TaskState.PENDING,
            attempts=0,
            before=None,
            after=None,
            detail="",
            updated_at=now,
        )
        for n, row in enumerate(jobs)
    ]
    operation = BulkOperation(
        bulk_id=command.bulk_id,
        account_id=command.account_id,
        operation=request.operation,
        selector=canonical_json(request.selector.to_json()),
        params=canonical_json(request.params),
        state=BulkState.RUNNING,
        tasks=len(tasks),
        created_at=command.record.timestamp,
        updated_at=now,
        log_topic=command.record.topic,
        log_partition=command.record.partition,
        log_offset=command.record.offset,
    )
    return operation, tasks


def task_id(task: BulkTask) -> str:
    return f"{task.bulk_id}#{task.task_no}"


def record_of(operation: BulkOperation, now: datetime) -> LogRecord:
    """The coordinates a task's commands carry: its bulk request's, at ``now``."""
    return LogRecord(
        operation.log_topic, operation.log_partition, operation.log_offset, now, None, None
    )


def task_commands(operation: BulkOperation, task: BulkTask, record: LogRecord) -> list[Command]:
    """What the task does: the command a single message of the operation carries."""
    params = operation.params_json()
    return [
        Command(
            op=_FORWARD[operation.operation],
            request_id=task_id(task),
            key=task.key,
            record=record,
            spec_update=params.get("spec"),
            interrupt=bool(params.get("interrupt", False)),
            task=task_id(task),
        )
    ]


def reregistered_job_id(task: BulkTask) -> int:
    """The job id a rollback of an unregister gives the job again: derived from the
    task, so a rollback replayed after a crash gives the same one, and above the
    ids of registers (partition << 40 | offset), so it meets none of them."""
    digest = hashlib.sha256(task_id(task).encode()).digest()
    return (1 << 62) | (int.from_bytes(digest[:8], "big") & ((1 << 62) - 1))


def rollback_commands(operation: BulkOperation, task: BulkTask, record: LogRecord) -> list[Command]:
    """What undoes a successful task, from its before-image: the previous spec, the
    previous paused or running state, a register again (with the previous spec,
    paused again if it was). A resync has nothing to undo: none."""
    before = task.before_image()
    paused = bool(before.get("paused"))
    spec = JobSpec.from_json(json.loads(before["job_spec"])) if "job_spec" in before else None
    base = Command(Operation.RESUME, task_id(task), task.key, record, task=task_id(task))
    undo = {
        BulkOp.PAUSE: [_pause_or_resume(base, paused)],
        BulkOp.RESUME: [_pause_or_resume(base, paused)],
        BulkOp.RESYNC: [],
        BulkOp.UPDATE_SPEC: [_with(base, Operation.UPDATE_SPEC, spec=spec)],
        BulkOp.UNREGISTER: [
            _with(base, Operation.REGISTER, spec=spec, job_id=reregistered_job_id(task)),
            *([_with(base, Operation.PAUSE)] if paused else []),
        ],
    }
    return undo[operation.operation]


def _pause_or_resume(base: Command, paused: bool) -> Command:
    return _with(base, Operation.PAUSE if paused else Operation.RESUME)


def _with(base: Command, op: Operation, **changes: object) -> Command:
    return replace(base, op=op, **changes)  # type: ignore[arg-type]
