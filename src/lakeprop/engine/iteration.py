"""One iteration: read a table's changes once and hand them to every consumer.

A small tail or snapshot goes the native way (:mod:`lakeprop.engine.native`) when the
settings allow and every member can: delta-rs in the driver, no Spark job.
Otherwise the change set is read once and held (:mod:`lakeprop.engine.changeset`)
and fanned out to the members (:mod:`lakeprop.engine.fanout`), each of which
gets the changes after its own watermark. Members that did not get to run get
the iteration's error (:mod:`lakeprop.engine.failures`). One
:class:`~lakeprop.engine.model.IterationResult` records either path.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pyspark.sql import DataFrame, SparkSession

from lakeprop import expectations
from lakeprop.consumers.base import Consumer
from lakeprop.engine import changeset, expect
from lakeprop.engine.changeset import COUNTING_CONFS, ChangeSet, HeldLatest
from lakeprop.engine.failures import fail_the_rest
from lakeprop.engine.fanout import (
    fan_out,
    member_context,
    run_member,
    session_confs,
    small_confs,
)
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    MemberJob,
    MemberResult,
    TableRef,
)
from lakeprop.engine.native import (
    NativePlan,
    NativeReadFailed,
    NativeSettings,
    plan_native,
    run_native,
)
from lakeprop.engine.sparkstats import cached_bytes, group_jobs, task_seconds
from lakeprop.faults import fault_point
from lakeprop.registry import get_consumer_type
from lakeprop.spec import JobKey
from lakeprop.state.history import RuleCount
from lakeprop.storage import Storage
from lakeprop.tables.resolve import TableHandle, Tables

log = logging.getLogger(__name__)


def run_iteration(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    token: CancelToken,
    fan_out: int = 1,
    small_rows: int = 0,
    native: NativeSettings | None = None,
) -> IterationResult:
    """Run one iteration in the calling (worker) thread with its own session.

    Up to ``fan_out`` consumers read the held change set at once, each in a
    session of its own (its Delta transaction confs stay apart) and in the
    iteration's job group (threads inherit it), so that cancelling the
    iteration reaches every consumer's Spark jobs. With at most ``small_rows``
    rows read, the consumers' sessions plan without adaptive execution
    (:func:`~lakeprop.engine.fanout.small_confs`) and a replica's MERGE reads
    the change set without copying it (:meth:`ConsumerContext.merging_changes`).
    """
    result = IterationResult(plan=plan, kind=plan.kind, started_at=time.time())
    source = tables.handle(plan.table.database, plan.table.table, spark)
    try:
        where = plan_native(spark, plan, jobs, tables, native) if native is not None else None
        if isinstance(where, NativePlan):
            assert native is not None
            try:
                run_native(spark, plan, jobs, tables, token, native, where, result)
            except NativeReadFailed as exc:
                where = f"delta-rs could not read the changes: {exc}"
        if not isinstance(where, NativePlan):
            log.debug("iteration %s runs on Spark: %s", plan.iteration_id, where)
            if where is not None:
                result.path_note = where
            storage = native.storage if native is not None and native.enabled else None
            _on_spark(
                spark, plan, jobs, source, tables, token, fan_out, small_rows, result, storage
            )
    except Exception as exc:
        fail_the_rest(result, jobs, source, exc, token)
    finally:
        result.canceled = token.cancelled
        result.ended_at = time.time()
        jobs_run = group_jobs(spark, plan.iteration_id)
        result.spark_jobs = len(jobs_run)
        seconds = task_seconds(spark, jobs_run)
        if result.path == "native":
            # the driver did the work: its time is what the iteration cost (usage, budgets)
            seconds = (seconds or 0.0) + result.ended_at - result.started_at
        result.task_seconds = seconds
    return result


def _on_spark(
    spark: SparkSession,
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    source: TableHandle,
    tables: Tables,
    token: CancelToken,
    threads: int,
    small_rows: int,
    result: IterationResult,
    storage: Storage | None,
) -> None:
    """The Spark path: the change set read and held, then fanned out, then released.
    With ``storage`` (the native path is on), consumers may read a table's log in
    the driver with delta-rs where that saves a Spark job."""
    held: ChangeSet | None = None
    try:
        with session_confs(spark, COUNTING_CONFS):
            tallies = _tallies(plan, jobs)
            counting = [c for tally in tallies.values() for c in tally.columns()]
            held = changeset.read(source, plan, result, token, _key_columns(jobs), counting)
            if tallies and held.tallied is None:
                _TALLY_FAILED[plan.table] = time.monotonic()
        result.bytes_cached = cached_bytes(spark, held.data)
        token.cached_bytes = result.bytes_cached or 0
        fault_point("iteration.before_write")
        small = result.rows_read <= small_rows
        if result.kind is IterationKind.TAIL and not small:
            held.held = HeldLatest(held.data, token)
        consume = functools.partial(
            _consume,
            kind=result.kind,
            plan=plan,
            changes=held,
            small=small,
            tables=tables,
            token=token,
            storage=storage,
            tallies=tallies if held.tallied is not None else {},
        )
        snapshot = result.kind is IterationKind.SNAPSHOT
        fan_out(
            spark,
            jobs,
            consume,
            result,
            threads,
            small_confs(spark) if small else {},
            after_first=(lambda: fault_point("iteration.snapshot")) if snapshot else lambda: None,
        )
        fault_point("iteration.after_writes")
    finally:
        if held is not None:
            result.bytes_cached = (result.bytes_cached or 0) + held.release(spark)


TALLY_PAUSE = 600.0
"""Seconds the tails of a table whose members' rules failed to count with its
change set count them each on their own (a rule that fails on the rows fails its
job at every retry; the others should not pay a failed read each time)."""
_TALLY_FAILED: dict[TableRef, float] = {}
"""When counting the members' rules with a table's change set last failed."""


def _tallies(plan: IterationPlan, jobs: Sequence[MemberJob]) -> dict[JobKey, expect.Tally]:
    """The members' rules, to be counted as a tail's change set is read (by job; none
    for a job without rules, or whose rules cannot be read: it fails on its own;
    none at all for a snapshot, or within :data:`TALLY_PAUSE` of a failure)."""
    if plan.kind is not IterationKind.TAIL:
        return {}
    if time.monotonic() < _TALLY_FAILED.get(plan.table, -math.inf) + TALLY_PAUSE:
        return {}
    found: dict[JobKey, expect.Tally] = {}
    for n, job in enumerate(jobs):
        try:
            rules = expectations.of(job.spec.iteration.consumer.options)
        except Exception as exc:
            log.debug("no rules of job %s to count with the change set: %s", job.key, exc)
            continue
        if rules:
            found[job.key] = expect.Tally(rules, prefix=f"{changeset.TALLY}{n}_")
    return found


def _key_columns(jobs: Sequence[MemberJob]) -> list[str]:
    """The key columns the members' consumer types name (``Consumer.key_columns``),
    each once. A type that cannot say names none: its member fails on its own."""
    columns: list[str] = []
    for job in jobs:
        consumer = job.spec.iteration.consumer
        try:
            named = get_consumer_type(consumer.type).key_columns(consumer.options)
        except Exception as exc:
            log.debug("no key columns of %s for job %s: %s", consumer.type, job.key, exc)
            continue
        columns += [c for c in named if c not in columns]
    return columns


def _consume(
    spark: SparkSession,
    job: MemberJob,
    *,
    kind: IterationKind,
    plan: IterationPlan,
    changes: ChangeSet,
    small: bool,
    tables: Tables,
    token: CancelToken,
    storage: Storage | None,
    tallies: Mapping[JobKey, expect.Tally],
) -> MemberResult:
    """One member's step on Spark: the snapshot, or its slice of the change set,
    through the job's expectations first where it has some (counted as the change
    set was read, where ``tallies`` has the job's rules)."""
    start = job.member.from_version if kind is IterationKind.TAIL else None
    held = changes.held
    context = member_context(
        spark,
        job,
        tables,
        token,
        source_columns=changes.source_columns,
        change_rows=None if start is None else changes.rows_after(start),
        key_bounds=None if start is None else changes.bounds_after(start),
        small=small,
        held_latest=(
            functools.partial(held.after, start) if held is not None and start is not None else None
        ),
        **({} if storage is None else {"storage": storage, "driver_reads": True}),
    )
    rows = changes.data if start is None else changes.after(start)

    rules = expectations.of(context.options)

    def apply(consumer: Consumer, rows: DataFrame, dropped: DataFrame | None = None) -> int:
        if start is None:
            written = consumer.snapshot(rows, plan.to_version)
        else:
            written = consumer.apply_changes(rows, start, plan.to_version)
        aside = [*([dropped] if dropped is not None else []), *context.set_aside]
        if start is None or aside:  # a snapshot empties what an earlier one left
            expect.quarantine(context, aside, start is None, plan.to_version)
        return written

    where = f"iteration {plan.iteration_id}"
    if not rules:
        return run_member(job, context, token, lambda consumer: apply(consumer, rows), where)
    context = replace(context, keeps=expectations.keeping(rules))
    counts: list[RuleCount] = []

    def guarded(consumer: Consumer) -> int:
        source = tables.handle(plan.table.database, plan.table.table, spark)
        shown = get_consumer_type(context.consumer_type).key_columns(context.options)
        tally = tallies.get(job.key)
        found = expect.guard(
            rules,
            rows,
            source=source,
            from_version=start,
            to_version=plan.to_version,
            shown_keys=shown,
            counted=(
                None
                if tally is None
                or start is None
                or changes.tallied is None
                or tally.rules != rules
                or not tally.mergeable(changes.data.schema)
                else tally.over(changes.tallied, start)
            ),
        )
        counts.extend(found.counts)
        if found.kept is None:
            return apply(consumer, rows)
        # the consumer gets the kept rows alone: their count, and no last changes
        # held for the other members (those are of every row)
        kept = replace(context, change_rows=found.kept, held_latest=None)
        return apply(
            get_consumer_type(context.consumer_type).factory(kept), found.rows, found.dropped
        )

    member = run_member(job, context, token, guarded, where)
    member.expectations = counts
    return member


def iteration_work(
    plan: IterationPlan,
    jobs: Sequence[MemberJob],
    tables: Tables,
    fan_out: int = 1,
    small_rows: int = 0,
    native: NativeSettings | None = None,
) -> Callable[[SparkSession, CancelToken], IterationResult]:
    """The scheduler's work for ``plan``: run it with the worker's session."""

    def work(session: SparkSession, token: CancelToken) -> IterationResult:
        return run_iteration(session, plan, jobs, tables, token, fan_out, small_rows, native)

    return work
