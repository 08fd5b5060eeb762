"""The bulk executor: bulk requests accepted, their tasks run a few per tick.

The runner calls it from the micro-batch, the only thread that writes the
catalog:

1. :meth:`BulkExecutor.accept` with the micro-batch's bulk messages, after its
   job messages: a bulk request becomes an operation and its pending tasks, a
   cancel cancels the tasks not started, a rollback marks the successful tasks
   ``rollback_pending``. Each message gets a verdict (``requests``,
   ``rejects``), written before anything else, as for job messages.
2. :meth:`BulkExecutor.run` takes up to ``engine.bulk_tasks_per_tick`` ready
   tasks and applies their commands through the catalog's own handlers
   (:func:`~lakeprop.state.catalog.apply_tasks`). A task that changes a job is
   written ``running`` with its before- and after-image; one that changes
   nothing ends at once; the catalog changes are staged.
3. :meth:`BulkExecutor.flush` writes the tables; then the runner commits the
   catalog; then :meth:`BulkExecutor.finish` marks the running tasks done and
   settles each operation's state.

So a crash never applies a task twice nor loses one: a task is written
``running`` before the catalog commit that applies it, and at start
(:meth:`BulkExecutor.load`) a running task whose job equals its after-image
was applied (it succeeds), any other was not (it is pending again).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from lakeprop.bulk.model import (
    BulkOp,
    BulkOperation,
    BulkRequest,
    BulkState,
    BulkTask,
    TaskState,
    bulk_state,
    image,
)
from lakeprop.bulk.plan import (
    expand,
    matching,
    record_of,
    rollback_commands,
    task_commands,
    task_id,
)
from lakeprop.changelog import BulkCommand, Command, Operation
from lakeprop.errors import BulkError, ErrorCode, LakepropError, TenantError
from lakeprop.spec import JobRef
from lakeprop.state.apply import ApplyResult, SourceCheck, apply_tasks
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Coordinates, Outcome, RecordedVerdict, Verdict
from lakeprop.tenants import Tenants

log = logging.getLogger(__name__)


class BulkStore(Protocol):
    """Where operations and tasks are kept (:class:`lakeprop.state.bulk.BulkTables`)."""

    def operations(self, bulk_id: str | None = None) -> list[BulkOperation]: ...

    def tasks(self, bulk_ids: Iterable[str]) -> list[BulkTask]: ...

    def write(self, operations: Sequence[BulkOperation], tasks: Sequence[BulkTask]) -> None: ...


_RUNNING = {
    TaskState.RUNNING: TaskState.SUCCESS,
    TaskState.ROLLBACK_RUNNING: TaskState.ROLLBACK_SUCCESS,
}
"""A running task, and the state it ends in once the catalog commit is done."""


def _row_image(row: CatalogRow) -> str:
    return image(row.job_id, row.job_spec, row.job_state, row.is_live)


@dataclass(frozen=True)
class _Planned:
    operation: BulkOperation
    task: BulkTask
    commands: list[Command]

    @property
    def rollback(self) -> bool:
        return self.task.state is TaskState.ROLLBACK_PENDING


class BulkExecutor:
    """Bulk operations in memory (the running ones with their tasks), backed by the
    two tables; see the module's docstring for when each method runs."""

    def __init__(
        self,
        store: BulkStore,
        tasks_per_tick: int = 100,
        attempts: int = 3,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.store = store
        self.tasks_per_tick = tasks_per_tick
        self.attempts = attempts
        self.clock = clock
        self.operations: dict[str, BulkOperation] = {}
        self.tasks: dict[str, list[BulkTask]] = {}
        """Tasks of the operations that are not terminal (others are read on demand)."""
        self._changed_operations: set[str] = set()
        self._changed_tasks: set[tuple[str, int]] = set()

    # -- start ----------------------------------------------------------------------

    def load(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        """Read the operations and the tasks of those still running, and settle the
        tasks a crash left running (from the catalog, ``rows``)."""
        self.operations = {o.bulk_id: o for o in self.store.operations()}
        active = [o.bulk_id for o in self.operations.values() if not o.state.terminal]
        self.tasks = {bulk_id: [] for bulk_id in active}
        for task in self.store.tasks(active):
            self.tasks[task.bulk_id].append(task)
        self._changed_operations.clear()
        self._changed_tasks.clear()
        jobs = {row.job_id: row for row in rows.values()}
        for task in [t for tasks in self.tasks.values() for t in tasks if t.state in _RUNNING]:
            after = json.loads(task.after or "{}")
            row = jobs.get(after.get("job_id", task.job_id))
            if row is not None and _row_image(row) == task.after:
                self._set(task, _RUNNING[task.state], detail=f"{task.detail} (found applied)")
            else:
                ready = TaskState.ROLLBACK_PENDING if task.state.rollback else TaskState.PENDING
                self._set(task, ready, after=None)
        self._settle()
        if self.flush():
            log.info("bulk operations: settled the tasks a stop left running")

    @property
    def applying(self) -> bool:
        """Whether tasks run in this micro-batch (written running, not yet done)."""
        return any(t.state in _RUNNING for tasks in self.tasks.values() for t in tasks)

    @property
    def busy(self) -> bool:
        """Whether some operation has tasks left to run."""
        return any(not o.state.terminal for o in self.operations.values())

    # -- 1. accept --------------------------------------------------------------------

    def accept(
        self,
        commands: Sequence[BulkCommand],
        rows: Iterable[CatalogRow],
        tenants: Tenants,
        recorded: Mapping[Coordinates, RecordedVerdict],
    ) -> list[Verdict]:
        """Apply bulk messages in log order; a verdict for each that has none yet. A
        message with a recorded verdict (a replay) gets no new one, and what it
        did is done again only where the tables lack it."""
        jobs = list(rows)
        verdicts = []
        for cmd in sorted(commands, key=lambda c: (c.record.partition, c.record.offset)):
            prior = recorded.get((cmd.record.topic, cmd.record.partition, cmd.record.offset))
            if prior is not None and prior.outcome is not Outcome.APPLIED:
                continue
            try:
                outcome, detail = _ACCEPT[cmd.op](self, cmd, jobs, tenants)
            except LakepropError as exc:
                if exc.is_temporary:
                    raise
                outcome, detail, code = Outcome.REJECTED, str(exc), exc.code
            else:
                code = 0
            if prior is None:
                verdicts.append(Verdict.of(cmd, outcome, detail, error_code=code))
        return verdicts

    def _create(
        self, cmd: BulkCommand, jobs: Sequence[CatalogRow], tenants: Tenants
    ) -> tuple[Outcome, str]:
        existing = self.operations.get(cmd.bulk_id)
        if existing is not None:
            if (existing.log_partition, existing.log_offset) == (
                cmd.record.partition,
                cmd.record.offset,
            ):
                return Outcome.APPLIED, "bulk operation accepted"  # a replay
            return Outcome.ALREADY_EXISTS, (
                f"bulk operation {cmd.bulk_id} was requested already (state "
                f"{existing.state.value}); a request id names one bulk operation"
            )
        request = BulkRequest.of(cmd)
        matched = matching(request.selector, jobs)
        if not matched:
            raise BulkError(
                f"selector {request.selector.to_json()} matches no live job of account "
                f"{cmd.account_id}",
                ErrorCode.BULK_MATCHES_NOTHING,
            )
        quota = tenants.of(cmd.account_id).max_live_jobs
        if quota and len(matched) > quota:
            raise TenantError(
                f"bulk operation over {len(matched)} jobs exceeds account {cmd.account_id}'s "
                f"job quota (max_live_jobs = {quota})",
                ErrorCode.QUOTA_EXCEEDED,
            )
        operation, tasks = expand(cmd, request, matched, self.clock())
        self.operations[operation.bulk_id] = operation
        self.tasks[operation.bulk_id] = tasks
        self._changed_operations.add(operation.bulk_id)
        self._changed_tasks.update((t.bulk_id, t.task_no) for t in tasks)
        what = f"{request.operation.value} of {len(tasks)} job(s) accepted"
        log.info("bulk %s: %s", cmd.bulk_id, what)
        return Outcome.APPLIED, f"bulk {what}"

    def _operation(self, cmd: BulkCommand) -> BulkOperation:
        operation = self.operations.get(cmd.bulk_id)
        if operation is None or operation.account_id != cmd.account_id:
            raise BulkError(
                f"no bulk operation {cmd.bulk_id!r} of account {cmd.account_id}",
                ErrorCode.BULK_NOT_FOUND,
            )
        return operation

    def _cancel(
        self, cmd: BulkCommand, jobs: Sequence[CatalogRow], tenants: Tenants
    ) -> tuple[Outcome, str]:
        operation = self._operation(cmd)
        if operation.state is BulkState.CANCEL:
            return Outcome.APPLIED, "cancelled already"
        if operation.state is not BulkState.RUNNING:
            raise BulkError(
                f"bulk operation {cmd.bulk_id} is {operation.state.value}: only a running "
                "one can be cancelled",
                ErrorCode.BULK_WRONG_STATE,
            )
        waiting = [t for t in self.tasks[cmd.bulk_id] if t.state.ready]
        for task in waiting:
            self._set(task, TaskState.CANCEL, detail="cancelled before it started")
        self._set_operation(operation, BulkState.CANCEL)
        log.info("bulk %s: cancelled, %d task(s) had not started", cmd.bulk_id, len(waiting))
        return Outcome.APPLIED, f"cancelled: {len(waiting)} task(s) had not started"

    def _rollback(
        self, cmd: BulkCommand, jobs: Sequence[CatalogRow], tenants: Tenants
    ) -> tuple[Outcome, str]:
        operation = self._operation(cmd)
        if operation.state is BulkState.RUNNING:
            raise BulkError(
                f"bulk operation {cmd.bulk_id} is still running: cancel it, or wait for it "
                "to end, before rolling it back",
                ErrorCode.BULK_WRONG_STATE,
            )
        if operation.state.rollback:
            raise BulkError(
                f"bulk operation {cmd.bulk_id} is {operation.state.value} already",
                ErrorCode.BULK_WRONG_STATE,
            )
        tasks = self._tasks_of(operation)
        done = [t for t in tasks if t.state is TaskState.SUCCESS]
        if operation.operation is BulkOp.UNREGISTER:
            quota = tenants.of(cmd.account_id).max_live_jobs
            live = sum(r.is_live and r.account_id == cmd.account_id for r in jobs)
            if quota and live + len(done) > quota:
                raise TenantError(
                    f"rolling back bulk operation {cmd.bulk_id} registers {len(done)} job(s) "
                    f"again: account {cmd.account_id} has {live} live job(s), its quota "
                    f"(max_live_jobs = {quota})",
                    ErrorCode.QUOTA_EXCEEDED,
                )
        for task in done:
            self._set(task, TaskState.ROLLBACK_PENDING, after=None)
        self._set_operation(operation, BulkState.ROLLBACK_RUNNING)
        self._settle()
        log.info("bulk %s: rollback of %d task(s) accepted", cmd.bulk_id, len(done))
        return Outcome.APPLIED, f"rollback of {len(done)} task(s) accepted"

    def _tasks_of(self, operation: BulkOperation) -> list[BulkTask]:
        if operation.bulk_id not in self.tasks:
            self.tasks[operation.bulk_id] = self.store.tasks([operation.bulk_id])
        return self.tasks[operation.bulk_id]

    # -- 2. run -----------------------------------------------------------------------

    def run(self, rows: Sequence[CatalogRow], check: SourceCheck, tenants: Tenants) -> ApplyResult:
        """Apply the next ready tasks; the catalog changes to stage, and the jobs whose
        iterations must stop."""
        planned = self._plan(rows)
        if not planned:
            return ApplyResult()
        commands = [c for p in planned for c in p.commands]
        result = apply_tasks(rows, commands, check, tenants)
        verdicts: dict[str, list[Verdict]] = {}
        for v in result.verdicts:
            verdicts.setdefault(v.request_id or "", []).append(v)
        for p in planned:
            self._record(p, result, verdicts.get(task_id(p.task), []))
        return result

    def _plan(self, rows: Sequence[CatalogRow]) -> list[_Planned]:
        live = {r.key: r for r in rows if r.is_live}
        now = self.clock()
        planned: list[_Planned] = []
        running = sorted(
            (o for o in self.operations.values() if not o.state.terminal),
            key=lambda o: (o.created_at, o.bulk_id),
        )
        for operation in running:
            for task in self.tasks[operation.bulk_id]:
                if len(planned) >= self.tasks_per_tick:
                    return planned
                if not task.state.ready:
                    continue
                record = record_of(operation, now)
                if task.state is TaskState.ROLLBACK_PENDING:
                    planned.append(
                        _Planned(operation, task, rollback_commands(operation, task, record))
                    )
                    continue
                job = live.get(task.key)
                if job is None or job.job_id != task.job_id:
                    self._set(
                        task,
                        TaskState.FAIL,
                        detail=f"job {task.key} (job id {task.job_id}) is no longer live",
                    )
                    continue
                task = self._set(task, task.state, before=_row_image(job))
                planned.append(_Planned(operation, task, task_commands(operation, task, record)))
        return planned

    def _record(self, p: _Planned, result: ApplyResult, verdicts: list[Verdict]) -> None:
        """A task's outcome: running (it changed its job), done, failed, or retried."""
        tid = task_id(p.task)
        if tid in result.temporary:
            attempts = p.task.attempts + 1
            reason = result.temporary[tid]
            if attempts < self.attempts:
                ready = TaskState.ROLLBACK_PENDING if p.rollback else TaskState.RETRY_PENDING
                self._set(p.task, ready, attempts=attempts, detail=f"will retry: {reason}")
            else:
                failed = TaskState.ROLLBACK_FAIL if p.rollback else TaskState.FAIL
                self._set(p.task, failed, attempts=attempts, detail=reason)
            return
        refused = [v for v in verdicts if v.outcome is not Outcome.APPLIED]
        if refused:
            failed = TaskState.ROLLBACK_FAIL if p.rollback else TaskState.FAIL
            self._set(p.task, failed, attempts=p.task.attempts + 1, detail=refused[0].detail)
            return
        detail = "; ".join(v.detail for v in verdicts) or "nothing to undo"
        job_id = next((c.job_id for c in p.commands if c.job_id is not None), p.task.job_id)
        after = result.upserts.get((p.task.key, job_id))
        if after is None:  # nothing changed (paused already, a resync undone): done
            done = TaskState.ROLLBACK_SUCCESS if p.rollback else TaskState.SUCCESS
            self._set(p.task, done, attempts=p.task.attempts + 1, detail=detail)
        else:
            running = TaskState.ROLLBACK_RUNNING if p.rollback else TaskState.RUNNING
            self._set(
                p.task,
                running,
                attempts=p.task.attempts + 1,
                after=_row_image(after),
                detail=detail,
            )

    # -- 3. write, finish -------------------------------------------------------------

    def flush(self) -> bool:
        """Write what changed; whether anything did."""
        if not self._changed_operations and not self._changed_tasks:
            return False
        tasks = [
            t
            for bulk_id, tasks in self.tasks.items()
            for t in tasks
            if (bulk_id, t.task_no) in self._changed_tasks
        ]
        operations = [self.operations[b] for b in sorted(self._changed_operations)]
        self.store.write(operations, tasks)
        self._changed_operations.clear()
        self._changed_tasks.clear()
        for operation in self.operations.values():  # terminal: read again on demand
            if operation.state.terminal:
                self.tasks.pop(operation.bulk_id, None)
        return True

    def finish(self) -> bool:
        """After the catalog commit: running tasks are done; settle the operations and
        write. Whether anything was written."""
        for tasks in self.tasks.values():
            for task in tasks:
                if task.state in _RUNNING:
                    self._set(task, _RUNNING[task.state])
        self._settle()
        return self.flush()

    def _settle(self) -> None:
        for operation in list(self.operations.values()):
            if operation.bulk_id in self.tasks and not operation.state.terminal:
                state = bulk_state(operation.state, self.tasks[operation.bulk_id])
                if state is not operation.state:
                    self._set_operation(operation, state)
                    log.info("bulk %s: %s", operation.bulk_id, state.value)

    def _set(self, task: BulkTask, state: TaskState, **changes: Any) -> BulkTask:
        new = replace(task, state=state, updated_at=self.clock(), **changes)
        self.tasks[task.bulk_id][task.task_no] = new
        self._changed_tasks.add((task.bulk_id, task.task_no))
        return new

    def _set_operation(self, operation: BulkOperation, state: BulkState) -> None:
        self.operations[operation.bulk_id] = replace(
            operation, state=state, updated_at=self.clock()
        )
        self._changed_operations.add(operation.bulk_id)


_Accept = Callable[[BulkExecutor, BulkCommand, Sequence[CatalogRow], Tenants], tuple[Outcome, str]]

_ACCEPT: dict[Operation, _Accept] = {
    Operation.BULK: BulkExecutor._create,
    Operation.BULK_CANCEL: BulkExecutor._cancel,
    Operation.BULK_ROLLBACK: BulkExecutor._rollback,
}
"""What each bulk message does."""
