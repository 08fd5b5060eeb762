"""The runner: what happens in every micro-batch (``foreachBatch``), every tick.

1. Finished iterations: their history rows are written, then their jobs'
   watermarks, states and statuses (the history is the commit record the
   catalog is rolled forward from after a crash between the two).
2. The change log: decode each message, record its verdict (requests,
   rejects), apply the valid ones to the catalog. Verdicts are written before
   the catalog so that a replay skips what the catalog holds and keeps the
   verdict a message got the first time.
3. Trigger selection: per source table with an eligible job, one metadata
   probe; unchanged tables only mark their jobs fresh (no Spark job), changed
   ones get iterations, which go to the scheduler and run on while this
   micro-batch returns. Their jobs turn pending, then running, in memory only:
   the catalog table is written when something durable changes.
4. Housekeeping on intervals: flush fresh watermark times, garbage-collect
   dropped jobs.

Only this thread writes the catalog; workers hand their results back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession

from lakeprop.changelog import Command, LogRecord, best_effort_request_id, decode
from lakeprop.config import EngineConfig
from lakeprop.engine.iteration import CancelToken, IterationResult, MemberJob, run_iteration
from lakeprop.engine.scheduler import Scheduler
from lakeprop.engine.triggers import (
    IterationPlan,
    JobView,
    TableRef,
    is_eligible,
    plan_table,
    probe_from,
)
from lakeprop.engine.watermarks import Retry, advance
from lakeprop.errors import ErrorCode, InvalidMessageError, SourceTableError
from lakeprop.faults import fault_point
from lakeprop.service.stream import log_records
from lakeprop.spec import JobSpec
from lakeprop.state.catalog import CatalogRow, JobCatalog, JobState, RowId, apply_commands
from lakeprop.state.history import IterationHistory
from lakeprop.state.outcomes import Outcome, OutcomeTables, Verdict
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.resolve import Tables

log = logging.getLogger(__name__)


_TRANSIENT = frozenset({JobState.PENDING.value, JobState.RUNNING.value})

SELECTION_JOB_GROUP = "lakeprop-trigger-selection"
"""Job group of the selection phase: it must never launch a Spark job."""


@dataclass(frozen=True)
class BatchSummary:
    batch_id: int
    messages: int
    applied: int
    rejected: int
    unchanged: int


@dataclass(frozen=True)
class TickSummary:
    tables_probed: int
    tables_changed: int
    iterations: int
    fresh_jobs: int


def decode_all(records: Sequence[LogRecord], max_bytes: int) -> tuple[list[Command], list[Verdict]]:
    """Decode every record; invalid ones become rejected verdicts."""
    commands: list[Command] = []
    rejected: list[Verdict] = []
    for record in records:
        try:
            commands.append(decode(record, max_bytes))
        except InvalidMessageError as exc:
            rejected.append(
                Verdict(
                    record=record,
                    outcome=Outcome.REJECTED,
                    request_id=best_effort_request_id(record.value),
                    error_code=exc.code,
                    detail=str(exc),
                )
            )
    return commands, rejected


class Runner:
    """Applies the change log and drives the iterations, one micro-batch at a time."""

    def __init__(
        self,
        spark: SparkSession,
        engine: EngineConfig,
        catalog: JobCatalog,
        outcomes: OutcomeTables,
        tables: Tables,
        history: IterationHistory,
        scheduler: Scheduler | None,
        max_message_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spark = spark
        self.engine = engine
        self.catalog = catalog
        self.outcomes = outcomes
        self.tables = tables
        self.history = history
        self.scheduler = scheduler
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.probe = DeltaLogProbe(spark)
        self.retries: dict[RowId, Retry] = {}
        self.last_tick: TickSummary | None = None
        self.batches = 0
        """Micro-batches processed (ticks), for waiting on the service without sleeping."""
        self._specs: dict[RowId, tuple[str, JobSpec]] = {}
        self._locations: dict[TableRef, str] = {}
        self._last_flush = clock()
        self._last_gc = 0.0
        self._busy = threading.Event()

    @property
    def busy(self) -> bool:
        """True while a micro-batch is being processed."""
        return self._busy.is_set()

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` callback."""
        self._busy.set()
        started = time.monotonic()
        try:
            finished = self.record_results()
            t1 = time.monotonic()
            self.apply_log(log_records(batch), batch_id)
            t2 = time.monotonic()
            if self.scheduler is not None:
                self.tick()
            t3 = time.monotonic()
            written = self.catalog.commit_staged()
            if written:
                fault_point("catalog.written")
            log.debug(
                "batch %d took %.2fs: %d result(s) %.2fs, log %.2fs, selection %.2fs, "
                "%d catalog row(s) written %.2fs",
                batch_id,
                time.monotonic() - started,
                finished,
                t1 - started,
                t2 - t1,
                t3 - t2,
                written,
                time.monotonic() - t3,
            )
            self.batches += 1
        finally:
            self._busy.clear()

    # -- 1. finished iterations ---------------------------------------------------------

    def record_results(self, results: Sequence[IterationResult] | None = None) -> int:
        """Write history, then catalog, for iterations that ended since the last tick."""
        if results is None:
            results = self.scheduler.drain() if self.scheduler is not None else []
        if not results:
            return 0
        rows = self.catalog.by_id()
        self.history.record(results, {r.job_id: r.job_name for r in rows.values()})
        fault_point("history.written")
        changed = advance(
            rows,
            results,
            self.retries,
            self.clock(),
            retry_base=self.engine.retry_base,
            retry_cap=self.engine.retry_max,
        )
        self.catalog.stage(changed)
        return len(results)

    # -- 2. the change log --------------------------------------------------------------

    def apply_log(self, records: Sequence[LogRecord], batch_id: int) -> BatchSummary:
        if not records:
            return BatchSummary(batch_id, 0, 0, 0, 0)
        self.tables.forget()
        commands, verdicts = decode_all(records, self.max_message_bytes)
        fault_point("batch.decoded")
        result = apply_commands(
            self.catalog.rows(),
            commands,
            self.tables.check,
            self.outcomes.recorded(records),
        )
        verdicts += result.verdicts
        self.outcomes.record(verdicts, batch_id)
        self.catalog.stage(result.upserts)
        for row_id in result.upserts:
            self.retries.pop(row_id, None)  # an update repairs; a drop forgets
        if result.cancel and self.scheduler is not None:
            self.scheduler.cancel(result.cancel, "job dropped or re-specified")
        summary = BatchSummary(
            batch_id=batch_id,
            messages=len(records),
            applied=sum(v.outcome is Outcome.APPLIED for v in verdicts),
            rejected=sum(v.outcome is Outcome.REJECTED for v in verdicts),
            unchanged=sum(
                v.outcome in (Outcome.ALREADY_EXISTS, Outcome.NOT_FOUND) for v in verdicts
            ),
        )
        log.info(
            "batch %d: %d message(s), %d applied, %d rejected, %d unchanged",
            batch_id,
            summary.messages,
            summary.applied,
            summary.rejected,
            summary.unchanged,
        )
        for v in verdicts:
            if v.outcome is Outcome.REJECTED:
                log.warning("rejected %s: %s", v.record.coordinates, v.detail)
        return summary

    # -- 3. trigger selection -----------------------------------------------------------

    def tick(self) -> TickSummary:
        assert self.scheduler is not None
        now = self.clock()
        rows = self.catalog.by_id()
        in_flight = self.scheduler.in_flight()
        changed: dict[RowId, CatalogRow] = {}
        for ref in self.scheduler.running():
            row = rows.get(ref)
            if row is not None and row.job_state == JobState.PENDING.value:
                changed[ref] = replace(row, job_state=JobState.RUNNING.value)

        context = self.spark.sparkContext
        context.setJobGroup(SELECTION_JOB_GROUP, "lakeprop trigger selection")
        try:
            plans, fresh, probed, changed_tables = self._select(rows, in_flight, now, changed)
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]

        for plan in plans:
            self._submit(plan, rows)
            for member in plan.members:
                changed[member.ref] = replace(
                    changed.get(member.ref) or rows[member.ref], job_state=JobState.PENDING.value
                )
        # Queued and running are transient: kept in memory (and written with the
        # next durable change of the row, or by the flush), not worth a Delta
        # commit each; failures found by selection are durable.
        transient = {
            ref: row
            for ref, row in changed.items()
            if row.job_state in _TRANSIENT and row == replace(rows[ref], job_state=row.job_state)
        }
        self.catalog.stage({ref: row for ref, row in changed.items() if ref not in transient})
        self.catalog.remember(transient.values())
        stamp = datetime.fromtimestamp(now)
        self.catalog.remember(
            replace(rows[ref], watermark_ts=stamp) for ref in fresh if ref not in changed
        )
        self._housekeeping(now)
        self.last_tick = TickSummary(probed, changed_tables, len(plans), len(fresh))
        log.debug("tick: %s", self.last_tick)
        return self.last_tick

    def _spec(self, row: CatalogRow) -> JobSpec:
        cached = self._specs.get(row.row_id)
        if cached is None or cached[0] != row.job_spec:
            cached = (row.job_spec, row.spec())
            self._specs[row.row_id] = cached
        return cached[1]

    def _view(self, row: CatalogRow, in_flight: set[object]) -> JobView:
        spec = self._spec(row)
        retry = self.retries.get(row.row_id)
        return JobView(
            ref=row.row_id,
            job_id=row.job_id,
            kind=spec.trigger.kind,
            priority=spec.iteration.priority,
            interval_s=spec.trigger.interval_s,
            share=spec.trigger.share,
            watermark=row.watermark,
            watermark_ts=None if row.watermark_ts is None else row.watermark_ts.timestamp(),
            in_flight=row.row_id in in_flight,
            blocked_until=None if retry is None else retry.not_before,
            failed=row.job_state == JobState.ERROR.value,
        )

    def _location(self, table: TableRef) -> str:
        if table not in self._locations:
            self._locations[table] = self.tables.location(table.database, table.table)
        return self._locations[table]

    def _select(
        self,
        rows: Mapping[RowId, CatalogRow],
        in_flight: set[object],
        now: float,
        changed: dict[RowId, CatalogRow],
    ) -> tuple[list[IterationPlan], list[RowId], int, int]:
        by_table: dict[TableRef, list[JobView]] = {}
        for row in rows.values():
            if row.is_live:
                ref = TableRef(row.account_id, row.database, row.table)
                by_table.setdefault(ref, []).append(
                    self._view(changed.get(row.row_id, row), in_flight)
                )
        plans: list[IterationPlan] = []
        fresh: list[RowId] = []
        probed = changed_tables = 0
        for table, views in by_table.items():
            should, since = probe_from(views, now)
            if not should:
                continue
            probed += 1
            location = self._location(table)
            if since is not None and not self.probe.has_version_after(location, since):
                if not self.probe.has_version(location, since):
                    # the version the jobs stand on is gone: dropped or replaced
                    self._locations.pop(table, None)
                    views = self._same_source(table, views, rows, changed)
                fresh += [v.ref for v in views if is_eligible(v, now)]
                continue
            latest = self.probe.latest_version(location)
            views = self._same_source(table, views, rows, changed, latest)
            if latest is None or not views:
                continue
            changed_tables += 1
            table_plan = plan_table(table, views, latest, now)
            plans += table_plan.iterations
            fresh += table_plan.fresh
        return plans, fresh, probed, changed_tables

    def _same_source(
        self,
        table: TableRef,
        views: Sequence[JobView],
        rows: Mapping[RowId, CatalogRow],
        changed: dict[RowId, CatalogRow],
        latest: int | None = 0,
    ) -> list[JobView]:
        """The views whose jobs still follow the table they were registered on.

        The others go to ``error`` (permanent) with a message saying to
        re-register: their source was dropped, or replaced by a table with a new
        identity (a TRUNCATE-like re-create), whose versions do not continue the
        ones their watermarks count.
        """
        current = None if latest is None else self._table_id(table)
        if current is None:
            message = (
                f"source {table} no longer exists or is not a Delta table; re-register the job"
            )
            self._fail(views, rows, changed, ErrorCode.SOURCE_NOT_DELTA, message)
            return []
        keep = [v for v in views if rows[v.ref].table_id == current]
        for view in views:
            if view not in keep:
                message = (
                    f"source {table} was replaced by a new table (id {current}; the job was "
                    f"registered on id {rows[view.ref].table_id}), so its changes cannot follow "
                    "the job's watermark; re-register the job to sync from the new table"
                )
                self._fail([view], rows, changed, ErrorCode.SOURCE_REPLACED, message)
        return keep

    def _table_id(self, table: TableRef) -> str | None:
        """The source's current identity; None when it does not exist."""
        table_id = self.probe.table_id(self._location(table))
        if table_id is not None:
            return table_id
        self.tables.forget()
        try:  # the first commit file was cleaned up: ask Delta
            return self.tables.describe(table.database, table.table).table_id
        except SourceTableError:
            return None

    def _fail(
        self,
        views: Sequence[JobView],
        rows: Mapping[RowId, CatalogRow],
        changed: dict[RowId, CatalogRow],
        code: ErrorCode,
        message: str,
    ) -> None:
        status = json.dumps(
            {"error_code": int(code), "error_msg": message}, sort_keys=True, separators=(",", ":")
        )
        failed = [v for v in views if not v.in_flight and not v.failed]
        for view in failed:
            changed[view.ref] = replace(
                changed.get(view.ref) or rows[view.ref],
                job_state=JobState.ERROR.value,
                job_status=status,
            )
        if failed:
            log.error("job(s) %s: %s", [rows[v.ref].job_id for v in failed], message)

    def _submit(self, plan: IterationPlan, rows: Mapping[RowId, CatalogRow]) -> None:
        assert self.scheduler is not None
        jobs = [MemberJob(m, rows[m.ref].key, self._spec(rows[m.ref])) for m in plan.members]
        tables = self.tables

        def work(session: SparkSession, token: CancelToken) -> IterationResult:
            source = tables.handle(plan.table.database, plan.table.table, session)
            return run_iteration(
                session,
                plan,
                jobs,
                source,
                lambda database, table: tables.handle(database, table, session),
                token,
            )

        self.scheduler.submit(
            plan, work, {j.member.job_id: j.spec.iteration.consumer.type for j in jobs}
        )
        log.info(
            "iteration %s: %s %s to version %d for job(s) %s",
            plan.iteration_id,
            plan.kind.value,
            plan.table,
            plan.to_version,
            [m.job_id for m in plan.members],
        )

    # -- 4. housekeeping ----------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        if now - self._last_flush >= self.engine.watermark_flush_interval:
            fault_point("watermarks.flush")
            flushed = self.catalog.flush()
            self._last_flush = now
            log.info("flushed the watermark times of %d idle job(s)", flushed)
        if now - self._last_gc >= self.engine.gc_interval:
            self.collect_garbage(now)
            self._last_gc = now

    def collect_garbage(self, now: float) -> int:
        """Remove catalog rows of jobs dropped longer than the retention ago."""
        cutoff = datetime.fromtimestamp(now - self.engine.gc_retention)
        doomed = [
            r.row_id for r in self.catalog.rows() if r.drop_at is not None and r.drop_at < cutoff
        ]
        if doomed:
            fault_point("gc.run")
        self.catalog.delete(doomed)
        for row_id in doomed:
            self._specs.pop(row_id, None)
            self.retries.pop(row_id, None)
        if doomed:
            log.info("garbage-collected %d dropped job(s)", len(doomed))
        return len(doomed)
