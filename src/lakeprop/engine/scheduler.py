"""The scheduler: a pool of workers running iterations as concurrent Spark jobs.

* Each worker is a thread with its own SparkSession (``newSession``: SQL confs
  such as Delta's transaction ids stay apart) and its own FAIR pool.
* The queue is ordered by priority (higher first), then by arrival.
* A table is a path (TiCDC's per-key serial processing): its tail iterations run one at a time, in
  order; initial-sync snapshots of new jobs run beside them. Different tables
  run in parallel, up to the worker count.
* Every iteration runs in a Spark job group, so cancelling it (timeout,
  unregister, update_spec with interrupt, shutdown) really stops its Spark jobs,
  instead of only freeing the worker as TiDB's materialized-view scheduler does.

The scheduler knows nothing of triggers, the catalog or consumers: it runs the
callables it is given and hands their results back through :meth:`drain`.
Which queued task runs next is a pure policy (:mod:`lakeprop.engine.policy`);
this module is the mechanism around it: threads, sessions, job groups and the
watchdog. It is built idle; :meth:`Scheduler.start` starts the workers and
:meth:`Scheduler.shutdown` stops them (a later ``start`` begins again).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from lakeprop.engine.model import (
    CancelToken,
    IterationPlan,
    IterationResult,
    MemberResult,
    TableRef,
)
from lakeprop.engine.policy import Load, Policy, priority_first
from lakeprop.errors import ErrorCode, TemporaryError
from lakeprop.spec import JobRef

log = logging.getLogger(__name__)

Work = Callable[[SparkSession, CancelToken], IterationResult]

SHUTTING_DOWN = "service shutting down"


@dataclass(frozen=True)
class AccountLoad:
    """One account's share of the scheduler right now (metrics, status)."""

    queued: int
    running: int
    cached_rows: int
    paused_since: float | None
    waiting_since: float | None = None
    """When its oldest queued iteration was planned (None: nothing queued)."""
    cached_bytes: int = 0
    """Bytes its running iterations hold in Spark's cache."""


@dataclass
class _Task:
    plan: IterationPlan
    work: Work
    consumer_types: dict[int, str]
    seq: int
    token: CancelToken = field(default_factory=CancelToken)
    started_at: float | None = None


class Scheduler:
    """Runs submitted iterations on ``workers`` threads; see the module docstring."""

    def __init__(
        self,
        spark: SparkSession,
        workers: int,
        timeout_s: float,
        policy: Policy[_Task] = priority_first,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        self.spark = spark
        self.on_done = on_done
        """Called (on the thread that ended it) when an iteration's result is ready to
        :meth:`drain`: the service wakes to record it."""
        self.workers = workers
        self.timeout_s = timeout_s
        self.policy = policy
        self._cond = threading.Condition()
        self._queued: list[_Task] = []
        self._running: dict[str, _Task] = {}
        self._busy_tables: set[TableRef] = set()
        self._done: queue.Queue[IterationResult] = queue.Queue()
        self._undrained: dict[str, set[JobRef]] = {}
        """Members of finished iterations whose results were not drained yet: still in
        flight for trigger selection, whose catalog does not show their progress yet."""
        self._seq = itertools.count()
        self._closed = True
        self._generation = 0
        """Counts starts: a worker of an earlier start that outlived its shutdown
        (its Spark job ignored the cancel) finishes its task and leaves."""
        self._threads: list[InheritableThread] = []

    def start(self) -> None:
        """Start the workers and the watchdog (idempotent while running)."""
        with self._cond:
            if not self._closed:
                return
            self._closed = False
            self._generation += 1
        self._threads = [
            InheritableThread(
                target=self._work_loop,
                args=(i, self._generation),
                name=f"lakeprop-worker-{i}",
                daemon=True,
            )
            for i in range(self.workers)
        ]
        watchdog = InheritableThread(target=self._watch, name="lakeprop-watchdog", daemon=True)
        for thread in [*self._threads, watchdog]:
            thread.start()

    @property
    def started(self) -> bool:
        return not self._closed

    # -- producer side ------------------------------------------------------------------

    def submit(self, plan: IterationPlan, work: Work, consumer_types: dict[int, str]) -> None:
        with self._cond:
            if self._closed:
                raise TemporaryError("the scheduler is not running: the service stops")
            self._queued.append(_Task(plan, work, consumer_types, next(self._seq)))
            self._cond.notify_all()

    def in_flight(self) -> set[JobRef]:
        """Refs of every job in a queued, running or finished but undrained iteration."""
        with self._cond:
            tasks = [*self._queued, *self._running.values()]
            refs = {m.ref for t in tasks for m in t.plan.members}
            return refs.union(*self._undrained.values())

    def running(self) -> set[JobRef]:
        """Refs of every job in a running iteration."""
        with self._cond:
            return {m.ref for t in self._running.values() for m in t.plan.members}

    def cancel(self, refs: set[JobRef], reason: str) -> int:
        """Cancel queued and running iterations that include any of these jobs."""
        cancelled = 0
        with self._cond:
            for task in [t for t in self._queued if any(m.ref in refs for m in t.plan.members)]:
                self._queued.remove(task)
                task.token.cancel(reason)
                self._done.put(_cancelled_result(task))
                self.on_done()
                cancelled += 1
            for task in self._running.values():
                if any(m.ref in refs for m in task.plan.members):
                    self._stop(task, reason, ErrorCode.ITERATION_CANCELED)
                    cancelled += 1
        return cancelled

    def wait_ended(self, refs: set[JobRef], timeout: float) -> bool:
        """Wait (up to ``timeout``) until no queued or running iteration includes any of
        ``refs``; whether they all ended."""
        deadline = time.monotonic() + timeout

        def busy() -> bool:
            tasks = [*self._queued, *self._running.values()]
            return any(m.ref in refs for t in tasks for m in t.plan.members)

        with self._cond:
            while busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def drain(self) -> list[IterationResult]:
        """Results of the iterations that ended since the last call."""
        results: list[IterationResult] = []
        with self._cond:
            while True:
                try:
                    result = self._done.get_nowait()
                except queue.Empty:
                    return results
                self._undrained.pop(result.plan.iteration_id, None)
                results.append(result)

    def cancel_all(self, reason: str) -> None:
        """Cancel every queued and running iteration (their Spark jobs too)."""
        with self._cond:
            for task in self._queued:
                task.token.cancel(reason)
                self._done.put(_cancelled_result(task))
                self.on_done()
            self._queued.clear()
            for task in self._running.values():
                self._stop(task, reason, ErrorCode.ITERATION_CANCELED)
            self._cond.notify_all()

    def shutdown(self, timeout: float = 60.0) -> list[IterationResult]:
        """Cancel everything, wait for the workers, return what ended meanwhile."""
        with self._cond:
            self._closed = True
        self.cancel_all(SHUTTING_DOWN)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.drain()

    # -- worker side --------------------------------------------------------------------

    def _next(self) -> _Task | None:
        task = self.policy(self._queued, self._load())
        if task is None:
            return None
        self._queued.remove(task)
        if task.plan.serial:
            self._busy_tables.add(task.plan.table)
        task.started_at = time.monotonic()
        self._running[task.plan.iteration_id] = task
        return task

    def _load(self) -> Load:
        running: dict[int, int] = {}
        cached: dict[int, int] = {}
        for t in self._running.values():
            account = t.plan.table.account_id
            running[account] = running.get(account, 0) + 1
            cached[account] = cached.get(account, 0) + t.token.cached_rows
        return Load(self._busy_tables, running, cached)

    def accounts(self) -> dict[int, AccountLoad]:
        """Per account: iterations queued and running, rows and bytes in flight, since when
        it has been paused by backpressure (None: not paused) and since when its
        oldest queued iteration has waited."""
        with self._cond:
            load = self._load()
            queued: dict[int, int] = {}
            waiting: dict[int, float] = {}
            for t in self._queued:
                account = t.plan.table.account_id
                queued[account] = queued.get(account, 0) + 1
                waiting[account] = min(waiting.get(account, t.plan.planned_at), t.plan.planned_at)
            paused: dict[int, float] = dict(getattr(self.policy, "paused", {}))
            cached_bytes: dict[int, int] = {}
            for t in self._running.values():
                account = t.plan.table.account_id
                cached_bytes[account] = cached_bytes.get(account, 0) + t.token.cached_bytes
        return {
            a: AccountLoad(
                queued.get(a, 0),
                load.running.get(a, 0),
                load.cached_rows.get(a, 0),
                paused.get(a),
                waiting.get(a),
                cached_bytes.get(a, 0),
            )
            for a in sorted({*queued, *load.running, *paused})
        }

    def _work_loop(self, index: int, generation: int) -> None:
        session = self.spark.newSession()
        context = session.sparkContext
        context.setLocalProperty("spark.scheduler.pool", f"lakeprop-{index}")
        while True:
            with self._cond:
                task = None
                while task is None:
                    if self._closed or generation != self._generation:
                        return
                    task = self._next()
                    if task is None:
                        self._cond.wait()
            plan = task.plan
            context.setJobGroup(
                plan.iteration_id,
                f"lakeprop {plan.kind.value} {plan.table}",
                interruptOnCancel=True,
            )
            try:
                result = task.work(session, task.token)
            except Exception as exc:  # the work reports its own errors; this is a bug guard
                log.exception("iteration %s crashed", plan.iteration_id)
                result = _cancelled_result(
                    task, f"iteration crashed: {exc}", ErrorCode.CONSUMER_ERROR
                )
            with self._cond:
                paused_between = getattr(self.policy, "paused_between", None)
                if paused_between is not None:
                    result.paused_seconds = paused_between(
                        plan.table.account_id, plan.planned_at, result.started_at
                    )
                self._running.pop(plan.iteration_id, None)
                if plan.serial:
                    self._busy_tables.discard(plan.table)
                self._undrained[plan.iteration_id] = {m.ref for m in plan.members}
                self._done.put(result)
                self.on_done()
                self._cond.notify_all()

    def _stop(self, task: _Task, reason: str, code: ErrorCode) -> None:
        task.token.cancel(reason, code)
        self.spark.sparkContext.cancelJobGroup(task.plan.iteration_id)

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._cond:
                if self._closed and not self._running:
                    return
                now = time.monotonic()
                for task in list(self._running.values()):
                    started = task.started_at or now
                    if now - started > self.timeout_s and not task.token.cancelled:
                        log.warning(
                            "iteration %s on %s timed out after %.0fs; cancelling",
                            task.plan.iteration_id,
                            task.plan.table,
                            self.timeout_s,
                        )
                        self._stop(
                            task,
                            f"iteration timed out after {self.timeout_s:.0f}s",
                            ErrorCode.ITERATION_TIMEOUT,
                        )


def _cancelled_result(
    task: _Task, reason: str | None = None, code: ErrorCode | None = None
) -> IterationResult:
    now = time.time()
    message = reason or task.token.reason
    error = int(code or task.token.code)
    return IterationResult(
        plan=task.plan,
        kind=task.plan.kind,
        started_at=now,
        ended_at=now,
        canceled=code is None,
        members=[
            MemberResult(m.ref, m.job_id, task.consumer_types.get(m.job_id, ""), 0, error, message)
            for m in task.plan.members
        ],
    )
