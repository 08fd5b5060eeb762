"""The runner: what happens in every micro-batch (``foreachBatch``).

A micro-batch runs when the service has work (:mod:`lakeprop.service.wake`): a
change log message, a commit notice, a finished iteration, or the time the
previous micro-batch named (:meth:`Runner.next_batch_at`).

0. Slot changes, with ``cluster.enabled`` (:mod:`lakeprop.service.handover`):
   revoked slots are drained, lost ones forgotten, gained ones taken over
   (their rows read; their previous writers are fenced after step 3, so their
   first iterations start in this micro-batch).
1. Finished iterations: their history rows are written, which makes their
   jobs' new watermarks durable (a restart rolls the catalog forward from the
   history, and the client reads watermarks there too). The catalog keeps the
   watermarks and statuses in memory, for the flush; only an error is
   committed at once. A job that reads what one of them wrote (a pipeline:
   :mod:`lakeprop.pipeline`) has its table probed at the next tick.
2. The change log: decode each message, record its verdict (requests,
   rejects), apply the valid ones to the catalog. Verdicts are written before
   the catalog so that a replay skips what the catalog holds and keeps the
   verdict a message got the first time.
3. Trigger selection (:mod:`lakeprop.engine.selection`): with commit
   notifications on, only announced tables and those whose sweep is due are
   probed; unchanged tables only mark their jobs fresh (no Spark job), changed
   ones get iterations, which go to the scheduler and run on while this
   micro-batch returns. Their jobs turn pending, then running, in memory only:
   the catalog table is written when something durable changes.
4. Housekeeping on intervals (:mod:`lakeprop.engine.housekeeping`), the flush among it.
5. Bulk operations (:mod:`lakeprop.bulk`): the next few tasks of the running
   ones are applied to the catalog, after their tables say so.
6. One catalog commit of what changed durably (the change log, errors, bulk
   tasks); a tick that changed nothing durable commits nothing. Then the bulk
   tasks applied are marked done.

Only this thread writes the catalog; workers hand their results back.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime

from pyspark.sql import DataFrame

from lakeprop.changelog import BulkCommand, Command, LogRecord
from lakeprop.engine.housekeeping import Housekeeping
from lakeprop.engine.iteration import iteration_work
from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    MemberJob,
    Retry,
)
from lakeprop.engine.native import NativeSettings
from lakeprop.engine.selection import Selected, TriggerSelection, selection_job_group
from lakeprop.engine.watermarks import advance
from lakeprop.faults import fault_point
from lakeprop.service.chains import Chains
from lakeprop.service.handover import DRAIN_WAIT, Handover, HandoverParts
from lakeprop.service.observer import (
    BatchSummary,
    BatchTimings,
    TickSummary,
)
from lakeprop.service.parts import RunnerParts
from lakeprop.service.stopping import BatchGate, quiet_refused_batches
from lakeprop.service.stream import log_records
from lakeprop.service.wake import next_batch_at
from lakeprop.spec import JobRef
from lakeprop.state import shared as shared_state
from lakeprop.state.apply import apply_commands, decode_all, not_in_cluster
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome
from lakeprop.state.status import JobState, joined_marks

log = logging.getLogger(__name__)


class Runner:
    """Applies the change log and drives the iterations, one micro-batch at a time."""

    def __init__(self, parts: RunnerParts) -> None:
        quiet_refused_batches()
        engine = parts.engine
        self.spark = parts.spark
        self.observer = parts.observer
        self.log_empty = parts.log_empty
        self.engine = engine
        self.catalog = parts.catalog
        self.outcomes = parts.outcomes
        self.tables = parts.tables
        self.history = parts.history
        self.scheduler = parts.scheduler
        self.max_message_bytes = parts.max_message_bytes
        self.clock = parts.clock
        self.tenants = parts.tenants
        self.selection = TriggerSelection(
            parts.tables,
            engine.max_versions_per_iteration,
            parts.dirty,
            lambda account: self.tenants.max_rows(account, engine.max_rows_per_iteration),
            engine.identity_check_interval,
        )
        self.usage = parts.usage
        self.bulk = parts.bulk
        self.housekeeping = Housekeeping(
            parts.catalog,
            engine,
            parts.clock,
            parts.usage,
            parts.accounts,
            parts.scheduler.accounts,
            parts.ownership.leads,
        )
        self.native = NativeSettings(engine.small_iterations, engine.native_max_rows, parts.storage)
        """How small tails run natively (:mod:`lakeprop.engine.native`)."""
        self.ownership = parts.ownership
        self.retries: dict[JobRef, Retry] = {}
        self.chains = Chains(
            self.selection, parts.tables, parts.catalog.rows, parts.announce, parts.history
        )
        """The jobs downstream of what finished (:mod:`lakeprop.service.chains`)."""
        self.handover = Handover(
            parts.ownership,
            HandoverParts(
                parts.catalog,
                parts.history,
                parts.outcomes,
                parts.scheduler,
                self.record_results,
                self._forget_retries,
                functools.partial(shared_state.fence, parts.spark),
                min(engine.iteration_timeout, DRAIN_WAIT),
                lambda: self.observer.handing_over(),
            ),
        )
        """The cluster hand-over (:mod:`lakeprop.service.handover`)."""
        self.last_tick: TickSummary | None = None
        self.tick_interval = parts.tick_interval
        self.poll_interval = parts.poll_interval
        self._selected: Selected | None = None
        self._bulk_applied = False
        self.gate = BatchGate(parts.spark, parts.scheduler)
        """One micro-batch at a time, refused while the service stops."""
        self.tables_probed = 0
        """Delta log probes of trigger selection since the start (metrics, tests)."""
        self.tails_recorded = 0
        """Tail iterations whose results were recorded since the start (benchmarks)."""
        self.log_collects = 0
        """Micro-batches whose change log part was collected (a Spark job); the others
        were known empty from the offset log."""

    @property
    def batches(self) -> int:
        """Micro-batches processed (ticks), for waiting on the service without sleeping."""
        return self.gate.batches

    @property
    def timings(self) -> deque[BatchTimings]:
        """Phase timings of the latest micro-batches (benchmarks, metrics)."""
        return self.gate.timings

    def halted(
        self, timeout: float, stopped: Callable[[], bool] = lambda: False
    ) -> AbstractContextManager[bool]:
        """No micro-batch from now on (:meth:`BatchGate.halted`)."""
        return self.gate.halted(timeout, stopped)

    def resume(self) -> None:
        self.gate.resume()

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` callback: steps 0 to 6 of the module docstring."""
        tick = None
        self._bulk_applied = False
        with self.gate.processing(batch_id) as timed:
            with timed("handover"):
                self.hand_over()
            with timed("results"):
                self.record_results()
            with timed("log"):
                self.apply_log(self._log_records(batch, batch_id), batch_id)
            with timed("selection"):
                tick = self.tick() if self.scheduler.started else None
            with timed("fences"):
                self.handover.seal()
                self.observer.verdicts(self.handover.recorded(), replayed=True)
            with timed("housekeeping"):
                self.keep_house()
            with timed("bulk"):
                self.run_bulk()
            with timed("catalog"):
                self.commit()
        self.observer.batch(self.gate.timings[-1], tick)

    def _log_records(self, batch: DataFrame, batch_id: int) -> list[LogRecord]:
        """The micro-batch's change log messages; none collected (no Spark job) when
        the offset log says there are none."""
        if self.log_empty(batch_id):
            return []
        self.log_collects += 1
        return log_records(batch)

    # -- 0. slot changes (cluster.enabled) ---------------------------------------------

    def hand_over(self) -> None:
        """Drain, forget and take over slots (:class:`~lakeprop.service.handover.Handover`)."""
        changed = self.handover.run()
        self.observer.verdicts(self.handover.recorded(), replayed=True)
        if changed is not None:
            self.observer.handover(changed)

    # -- 1. finished iterations ---------------------------------------------------------

    def record_results(self, results: Sequence[IterationResult] | None = None) -> int:
        """Write history, then catalog, for iterations that ended since the last tick."""
        if results is None:
            results = self.scheduler.drain()
        if not results:
            return 0
        results = self.handover.writable(results)
        if not results:
            return 0
        rows = self.catalog.by_id()
        names = {r.job_id: r.job_name for r in rows.values()}
        try:
            self.chains.follow(results)
        except Exception as exc:  # freshness is a report: it never fails the batch
            log.warning("could not follow the chains' origins: %s", exc)
        records = [r.record(names) for r in results]
        if self.ownership.clustered:
            owner_of = self.ownership.owner_of
            records = [replace(r, owner=owner_of(r.database, r.table)) for r in records]
        self.tails_recorded += sum(r.kind is IterationKind.TAIL for r in results)
        self.history.record(records, self.handover.signed())
        fault_point("history.written")
        if self.usage is not None:
            self.usage.recorded(r.ended_at for r in records)
        self.observer.results(results)
        self.chains.feed_downstream(results)
        changed = advance(
            rows,
            results,
            self.retries,
            self.clock(),
            retry_base=self.engine.retry_base,
            retry_cap=self.engine.retry_max,
        )
        # an error (or its end) is committed now; a watermark is durable in the history
        errors = {
            ref: row
            for ref, row in changed.items()
            if JobState.ERROR in (row.job_state, rows[ref].job_state)
        }
        self.catalog.stage(errors)
        self.catalog.remember(
            (row for ref, row in changed.items() if ref not in errors), progress=True
        )
        self.chains.announce(results)  # last: a hint, after everything recorded
        return len(results)

    # -- 2. the change log --------------------------------------------------------------

    def apply_log(self, records: Sequence[LogRecord], batch_id: int) -> BatchSummary:
        if not records:
            return BatchSummary(batch_id, 0, 0, 0, 0)
        self.tables.forget()
        commands, verdicts = decode_all(records, self.max_message_bytes)
        fault_point("batch.decoded")
        recorded = self.outcomes.recorded(records)
        result = apply_commands(
            self.catalog.rows(),
            [c for c in commands if isinstance(c, Command)],
            self.tables.check,
            recorded,
            self.tenants,
            one_partition=self.ownership.clustered,  # one order for the graph (decision 0012)
        )
        verdicts += result.verdicts
        bulk = [c for c in commands if isinstance(c, BulkCommand)]
        if bulk and self.ownership.clustered:
            verdicts += [not_in_cluster(c) for c in bulk]
        elif bulk and self.bulk is not None:  # after the job messages of the batch
            rows = {**self.catalog.by_id(), **result.upserts}.values()
            verdicts += self.bulk.accept(bulk, rows, self.tenants, recorded)
        ours = self.handover.ours(verdicts)
        told = self.outcomes.maybe_recorded(ours, recorded)
        self.outcomes.record(ours, batch_id)
        fault_point("batch.recorded")  # verdicts written, the catalog not yet
        self.observer.verdicts([v for v in ours if v.coordinates not in told])
        self.observer.verdicts([v for v in ours if v.coordinates in told], replayed=True)
        self.catalog.stage(result.upserts)
        for row_id in result.upserts:
            self.retries.pop(row_id, None)  # an update repairs; a drop forgets
        if result.cancel:
            self.scheduler.cancel(result.cancel, "job dropped or re-specified")
        summary = BatchSummary.of(batch_id, len(records), verdicts)
        log.info("batch %d: %s", batch_id, summary)
        for v in verdicts:
            if v.outcome is Outcome.REJECTED:
                log.warning("rejected %s: %s", v.record.coordinates, v.detail)
        return summary

    # -- 3. trigger selection -----------------------------------------------------------

    def tick(self) -> TickSummary:
        """Select the due iterations and submit them."""
        now = self.clock()
        changed = self._running_now()
        rows = {**self.catalog.by_id(), **changed}
        served = self.handover.served(rows)
        with selection_job_group(self.spark):
            selected = self.selection.select(served, self.scheduler.in_flight(), self.retries, now)
        self.tables_probed += selected.probed
        self._selected = selected
        changed.update(selected.failed)
        for plan in selected.plans:
            self._submit(plan, rows)
            for member in plan.members:
                row = changed.get(member.ref) or rows[member.ref]
                changed[member.ref] = replace(row, job_state=JobState.PENDING)
        self._stage(changed)
        stamp = datetime.fromtimestamp(now)
        self.catalog.remember(
            replace(rows[ref], watermark_ts=stamp) for ref in selected.fresh if ref not in changed
        )
        self.last_tick = TickSummary(
            selected.probed, selected.changed_tables, len(selected.plans), len(selected.fresh)
        )
        log.debug("tick: %s", self.last_tick)
        return self.last_tick

    def _forget_retries(self, refs: Iterable[JobRef]) -> None:
        for ref in refs:
            self.retries.pop(ref, None)

    def _running_now(self) -> dict[JobRef, CatalogRow]:
        """Rows of pending jobs whose iteration a worker has started."""
        rows = self.catalog.by_id()
        return {
            ref: replace(rows[ref], job_state=JobState.RUNNING)
            for ref in self.scheduler.running()
            if ref in rows and rows[ref].job_state == JobState.PENDING
        }

    def _stage(self, changed: dict[JobRef, CatalogRow]) -> None:
        """Durable changes go to the next commit; a row that only turned pending or
        running is kept in memory (written with its next durable change, or by the
        flush): not worth a Delta commit each."""
        rows = self.catalog.by_id()
        transient = {
            ref: row
            for ref, row in changed.items()
            if row.job_state.transient and row == replace(rows[ref], job_state=row.job_state)
        }
        self.catalog.stage({ref: row for ref, row in changed.items() if ref not in transient})
        self.catalog.remember(transient.values())

    def _submit(self, plan: IterationPlan, rows: dict[JobRef, CatalogRow]) -> None:
        jobs = [
            MemberJob(
                m,
                rows[m.ref].key,
                self.selection.spec(rows[m.ref]),
                joined_marks(rows[m.ref].job_status) if m.from_version is not None else {},
            )
            for m in plan.members
        ]
        self.scheduler.submit(
            plan,
            iteration_work(
                plan,
                jobs,
                self.tables,
                self.engine.consumer_threads,
                self.engine.small_iteration_rows,
                self.native,
            ),
            {j.member.job_id: j.spec.iteration.consumer.type for j in jobs},
        )
        log.info(
            "iteration %s: %s %s to version %d for job(s) %s",
            plan.iteration_id,
            plan.kind.value,
            plan.table,
            plan.to_version,
            [m.job_id for m in plan.members],
        )

    # -- when the next micro-batch is wanted -----------------------------------------------

    def next_batch_at(self, started: float) -> float:
        """When the micro-batch begun at ``started`` wants the next one, with nothing
        told meanwhile (:func:`~lakeprop.service.wake.next_batch_at`): every tick
        while a table is probed on each (or slots move, or bulk tasks run); else the
        earliest retry, periodic job, sweep or housekeeping. With the scheduler
        stopped, only bulk tasks and slots want ticks: the change log is Spark's to see."""
        every_tick = (
            self.ownership.clustered
            or self._bulk_applied
            or (self.bulk is not None and self.bulk.busy)
        )
        due = []
        if self.scheduler.started:
            selected = self._selected
            every_tick = every_tick or selected is None or selected.every_tick
            due.append(self.housekeeping.next_at(self.clock()))
            if selected is not None:
                due.append(selected.due_at)
        return next_batch_at(started, self.tick_interval, self.poll_interval, every_tick, due)

    # -- 4. housekeeping ----------------------------------------------------------------

    def keep_house(self) -> None:
        """Flush what the catalog holds in memory only, and collect dropped jobs, on
        their intervals (once the scheduler runs)."""
        if not self.scheduler.started:
            return
        for ref in self.housekeeping.run(self.clock()):
            self.selection.forget(ref)
            self.retries.pop(ref, None)

    # -- 5. bulk operations --------------------------------------------------------------

    def run_bulk(self) -> None:
        """Apply the next tasks of the running bulk operations: their tables say so
        first, then the catalog changes are staged for this micro-batch's commit."""
        if self.bulk is None:
            return
        if self.bulk.busy:
            self.tables.forget()  # source checks see the tables as they are now
            result = self.bulk.run(self.catalog.rows(), self.tables.check, self.tenants)
            self._bulk_applied = bool(result.upserts)
            self.catalog.stage(result.upserts)
            for row_id in result.upserts:
                self.retries.pop(row_id, None)
            if result.cancel:
                self.scheduler.cancel(result.cancel, "job changed by a bulk operation")
        if self.bulk.flush():
            fault_point("bulk.written")

    # -- 6. the catalog commit ------------------------------------------------------------

    def commit(self) -> None:
        """One catalog commit of what changed durably, then the bulk tasks applied are done."""
        if self.catalog.commit_staged():
            fault_point("catalog.written")
        if self.bulk is not None:
            if self.bulk.applying:
                fault_point("bulk.applied")
            self.bulk.finish()
