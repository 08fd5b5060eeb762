"""The runner: what happens in every micro-batch (``foreachBatch``), every tick.

1. Finished iterations: their history rows are written, which makes their
   jobs' new watermarks durable (a restart rolls the catalog forward from the
   history, and the client reads watermarks there too). The catalog keeps the
   watermarks and statuses in memory, for the flush; only an error is
   committed at once.
2. The change log: decode each message, record its verdict (requests,
   rejects), apply the valid ones to the catalog. Verdicts are written before
   the catalog so that a replay skips what the catalog holds and keeps the
   verdict a message got the first time.
3. Trigger selection (:mod:`lakeprop.engine.selection`): with commit
   notifications on, only announced tables and those whose sweep is due are
   probed; unchanged tables only
   mark their jobs fresh (no Spark job), changed ones get iterations, which go
   to the scheduler and run on while this micro-batch returns. Their jobs turn
   pending, then running, in memory only: the catalog table is written when
   something durable changes.
4. Housekeeping on intervals (:mod:`lakeprop.engine.housekeeping`), among it
   the flush of what the catalog holds in memory only.
5. Bulk operations (:mod:`lakeprop.bulk`): the next few tasks of the running
   ones are applied to the catalog, after their tables say so.
6. One catalog commit of what changed durably (the change log, errors, bulk
   tasks); a tick that changed nothing durable commits nothing. Then the bulk
   tasks applied are marked done.

Only this thread writes the catalog; workers hand their results back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession

from lakeprop.bulk.executor import BulkExecutor
from lakeprop.changelog import BulkCommand, Command, LogRecord, best_effort_request_id, decode
from lakeprop.config import EngineConfig
from lakeprop.engine.dirty import DirtyTables
from lakeprop.engine.housekeeping import Housekeeping
from lakeprop.engine.iteration import iteration_work
from lakeprop.engine.model import IterationKind, IterationPlan, IterationResult, MemberJob, Retry
from lakeprop.engine.native import NativeSettings
from lakeprop.engine.ownership import SoleOwner
from lakeprop.engine.scheduler import SHUTTING_DOWN, Scheduler
from lakeprop.engine.selection import TriggerSelection
from lakeprop.engine.takeover import take_over
from lakeprop.engine.watermarks import advance
from lakeprop.errors import ErrorCode, InvalidMessageError
from lakeprop.faults import fault_point
from lakeprop.membership.group import Claim
from lakeprop.service.observer import (
    BatchSummary,
    BatchTimings,
    RunnerObserver,
    TickSummary,
    Unobserved,
)
from lakeprop.service.stopping import (
    REFUSAL_WAIT,
    await_stop_interrupt,
    quiet_refused_batches,
    refusal,
)
from lakeprop.service.stream import log_records
from lakeprop.spec import JobRef
from lakeprop.state import shared as shared_state
from lakeprop.state.accounts import AccountsTable
from lakeprop.state.apply import apply_commands
from lakeprop.state.catalog import CatalogRow, JobCatalog
from lakeprop.state.history import IterationHistory, rolled_forward
from lakeprop.state.outcomes import Outcome, OutcomeTables, Verdict
from lakeprop.state.status import JobState
from lakeprop.state.usage import UsageTable
from lakeprop.tables.resolve import Tables
from lakeprop.tenants import Tenants

log = logging.getLogger(__name__)

SELECTION_JOB_GROUP = "lakeprop-trigger-selection"
"""Job group of the selection phase: it must never launch a Spark job."""
DRAIN_WAIT = 60.0
"""Seconds a slot being given up waits for its cancelled iterations to end (the
rebalance waits for the drain; Kafka drops a member that keeps it past
``max.poll.interval.ms``, 300 s)."""
UNRECORDED_PER_SLOT = 10_000
"""Verdicts kept per slot served elsewhere (see :attr:`Runner.unrecorded`)."""


def _not_in_cluster(command: BulkCommand) -> Verdict:
    return Verdict(
        record=command.record,
        outcome=Outcome.REJECTED,
        request_id=command.request_id,
        op=command.op.value,
        error_code=ErrorCode.BULK_IN_CLUSTER,
        detail="bulk operations are not run by a service with cluster.enabled; "
        "send one change log message per job instead",
    )


def decode_all(
    records: Sequence[LogRecord], max_bytes: int
) -> tuple[list[Command | BulkCommand], list[Verdict]]:
    """Decode every record; invalid ones become rejected verdicts."""
    commands: list[Command | BulkCommand] = []
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


@dataclass(frozen=True)
class RunnerParts:
    """What a runner works with: the worker session, the engine's settings, the
    state tables, the tables, the scheduler, and the parts a service may leave
    out (notifications, tenants, usage, accounts, bulk operations, an observer)."""

    spark: SparkSession
    engine: EngineConfig
    catalog: JobCatalog
    outcomes: OutcomeTables
    tables: Tables
    history: IterationHistory
    scheduler: Scheduler
    max_message_bytes: int
    clock: Callable[[], float] = time.time
    dirty: DirtyTables | None = None
    """Tables announced by commit notifications (None: notifications off)."""
    tenants: Tenants = field(default_factory=Tenants)
    usage: UsageTable | None = None
    accounts: AccountsTable | None = None
    bulk: BulkExecutor | None = None
    observer: RunnerObserver = field(default_factory=Unobserved)
    log_empty: Callable[[int], bool] = lambda _batch_id: False
    """Whether a micro-batch is known to hold no change log record (then it is not
    collected: no Spark job); see :class:`~lakeprop.service.stream.ChangelogOffsets`."""
    ownership: SoleOwner = field(default_factory=SoleOwner)
    """Which tables this instance serves (all of them, unless ``cluster.enabled``)."""


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
        self.native = NativeSettings(
            engine.small_iterations, engine.native_max_rows, engine.native_storage_options
        )
        """How small tails run natively (:mod:`lakeprop.engine.native`)."""
        self.ownership = parts.ownership
        self.unrecorded: dict[int, deque[Verdict]] = {}
        """Per slot served elsewhere: verdicts of this instance's reading of the log,
        recorded if it takes the slot over before the owner did (bounded)."""
        self.retries: dict[JobRef, Retry] = {}
        self.last_tick: TickSummary | None = None
        self.batches = 0
        """Micro-batches processed (ticks), for waiting on the service without sleeping."""
        self.tables_probed = 0
        """Delta log probes of trigger selection since the start (metrics, tests)."""
        self.tails_recorded = 0
        """Tail iterations whose results were recorded since the start (benchmarks)."""
        self.log_collects = 0
        """Micro-batches whose change log part was collected (a Spark job); the others
        were known empty from the offset log."""
        self.timings: deque[BatchTimings] = deque(maxlen=10_000)
        """Phase timings of the latest micro-batches (benchmarks, metrics)."""
        self._batch_lock = threading.Lock()
        self._halted = False
        self.refusal_wait = REFUSAL_WAIT
        """Seconds a micro-batch refused while halted waits for the query's stop."""
        self._stopped: Callable[[], bool] = lambda: False

    @contextmanager
    def halted(self, timeout: float, stopped: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """Cancel the iterations, wait (up to ``timeout``) for the micro-batch in
        progress, and refuse new ones.

        Yields whether it got in between micro-batches. Stopping the query inside
        this block does not interrupt a micro-batch half way (a Delta commit cut
        off by the interrupt). A batch that arrives meanwhile is refused before
        doing anything: it waits (up to :attr:`refusal_wait`) for the stop, which
        ``stopped`` reports, then fails, so its offsets are not committed and a
        restart replays it. Failed by the stop's interrupt, it ends the query as
        stopped; with no stop, the query fails. :meth:`resume` lets batches in
        again.
        """
        self._halted = True
        self._stopped = stopped
        # The micro-batch in progress may wait for cores that iterations hold.
        self.scheduler.cancel_all(SHUTTING_DOWN)
        between = self._batch_lock.acquire(timeout=timeout)
        try:
            yield between
        finally:
            if between:
                self._batch_lock.release()

    def resume(self) -> None:
        self._halted = False
        self._stopped = lambda: False

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` callback."""
        tick = None
        with self._processing(batch_id) as timed:
            with timed("handover"):
                self.hand_over()
            with timed("results"):
                self.record_results()
            with timed("log"):
                records = [] if self.log_empty(batch_id) else self._collect(batch)
                self.apply_log(records, batch_id)
            with timed("selection"):
                if self.scheduler.started:
                    tick = self.tick()
            with timed("housekeeping"):
                if self.scheduler.started:
                    self.keep_house()
            with timed("bulk"):
                self.run_bulk()
            with timed("catalog"):
                if self.catalog.commit_staged():
                    fault_point("catalog.written")
                if self.bulk is not None:
                    if self.bulk.applying:
                        fault_point("bulk.applied")
                    self.bulk.finish()
            self.batches += 1
        self.observer.batch(self.timings[-1], tick)

    def _collect(self, batch: DataFrame) -> list[LogRecord]:
        self.log_collects += 1
        return log_records(batch)

    @contextmanager
    def _processing(self, batch_id: int) -> Iterator[Callable[[str], AbstractContextManager[None]]]:
        """Runs one micro-batch at a time (none while halted) and times its phases."""
        timings = BatchTimings(batch_id)

        @contextmanager
        def timed(phase: str) -> Iterator[None]:
            started = time.perf_counter()
            try:
                yield
            finally:
                timings.phases[phase] = time.perf_counter() - started

        # Never wait for the lock: a callback blocked in Python cannot be interrupted
        # by query.stop(), which would then wait for it forever (a refused batch
        # waits in the JVM instead). Micro-batches of one query never overlap, so
        # the lock is only ever taken by halted().
        if self._halted or not self._batch_lock.acquire(blocking=False):
            log.info(
                "micro-batch %d arrived while the query stops: refused, a restart replays it",
                batch_id,
            )
            interrupt = await_stop_interrupt(self.spark, self.refusal_wait, self._stopped)
            raise refusal(batch_id, interrupt)
        try:
            yield timed
        finally:
            self._batch_lock.release()
            self.timings.append(timings)
            log.debug("batch %d: %s", batch_id, timings)

    # -- 1. finished iterations ---------------------------------------------------------

    def record_results(self, results: Sequence[IterationResult] | None = None) -> int:
        """Write history, then catalog, for iterations that ended since the last tick."""
        if results is None:
            results = self.scheduler.drain()
        if not results:
            return 0
        results = self._writable_results(results)
        if not results:
            return 0
        rows = self.catalog.by_id()
        names = {r.job_id: r.job_name for r in rows.values()}
        records = [r.record(names) for r in results]
        if self.ownership.clustered:
            owner_of = self.ownership.owner_of
            records = [replace(r, owner=owner_of(r.database, r.table)) for r in records]
        self.tails_recorded += sum(r.kind is IterationKind.TAIL for r in results)
        self.history.record(records, self._signed())
        fault_point("history.written")
        if self.usage is not None:
            self.usage.recorded(r.ended_at for r in records)
        self.observer.results(results)
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
        return len(results)

    def _writable_results(self, results: Sequence[IterationResult]) -> list[IterationResult]:
        """The results this instance may record: those of the tables it still owns.

        An iteration whose table moved away meanwhile is not recorded: its sink
        writes are idempotent and replay-tolerant, and the new owner starts from
        the last durable watermark.
        """
        kept = [
            r
            for r in results
            if self.ownership.may_write(r.plan.table.database, r.plan.table.table)
        ]
        if len(kept) < len(results):
            dropped = next(r for r in results if r not in kept)
            table = dropped.plan.table
            log.warning(
                "%d iteration result(s) not recorded: their tables moved to another instance "
                "(%s.%s %s)",
                len(results) - len(kept),
                table.database,
                table.table,
                self.ownership.explain(table.database, table.table),
            )
        return kept

    def _signed(self) -> shared_state.Signed | None:
        signature = self.ownership.sign()
        if signature is None:
            return None
        return shared_state.Signed(signature.app_id, signature.version, signature.owner)

    # -- 0. ownership (cluster.enabled) ---------------------------------------------------

    def hand_over(self) -> None:
        """Act on slot changes: drain the slots being revoked, forget lost ones, take
        over gained ones. Nothing happens with one instance."""
        pending = self.ownership.pending()
        if not pending:
            return
        if pending.lost:
            refs = self._refs_in(pending.lost)
            self.scheduler.cancel(refs, "its table moved to another instance")
        if pending.revoking:
            self._drain(pending.revoking)
        if pending.gained:
            self._take_over(pending.gained)
        self.observer.handover(pending)

    def _refs_in(self, slots: frozenset[int] | set[int]) -> set[JobRef]:
        slot = self.ownership.slot
        return {
            ref
            for ref, row in self.catalog.by_id().items()
            if slot(row.database, row.table) in slots
        }

    def _drain(self, slots: frozenset[int]) -> None:
        """Stop the iterations of ``slots``, record what they did, write their rows."""
        refs = self._refs_in(slots)
        self.scheduler.cancel(refs, "its table moves to another instance")
        if not self.scheduler.wait_ended(refs, min(self.engine.iteration_timeout, DRAIN_WAIT)):
            log.warning("iterations of slot(s) %s did not end; handing over anyway", sorted(slots))
        self.record_results()
        self.catalog.flush()
        self.ownership.drained(slots)
        log.info("drained slot(s) %s: %d job(s) handed over", sorted(slots), len(refs))

    def _take_over(self, claims: Mapping[int, Claim]) -> None:
        """Fence the writers that held the claimed slots before, then take their jobs'
        rows as the tables hold them (:mod:`lakeprop.engine.takeover`), rolled
        forward from the history, and record verdicts the previous owner did not."""
        ownership = self.ownership
        slots = set(claims)
        fenced = [
            shared_state.Signed(f.app_id, f.version) for f in ownership.fenced(claims.values())
        ]
        for path in (self.history.path, self.catalog.path):
            shared_state.fence(self.spark, path, fenced)

        def ours(row: CatalogRow) -> bool:
            return ownership.slot(row.database, row.table) in slots

        durable = self.catalog.durable_rows(ours)
        decided = take_over([r for r in self.catalog.rows() if ours(r)], durable)
        reached = self.history.latest_success()
        durable_rows = [rolled_forward(r, reached) or r for r in decided.durable]
        ahead = [rolled_forward(r, reached) or r for r in decided.ahead]
        # rewrite them all under the new owner's stamp (status shows the owner)
        self.catalog.adopt(durable_rows, ahead, decided.gone)
        self.catalog.stage({r.row_id: r for r in durable_rows})
        for ref in [r.row_id for r in (*durable_rows, *ahead)]:
            self.retries.pop(ref, None)
        verdicts = [v for s in slots for v in self.unrecorded.pop(s, ())]
        if verdicts:
            self.outcomes.record(verdicts, -1)
        ownership.adopt(slots)
        log.info(
            "took over slot(s) %s: %d job(s), %d writer(s) fenced",
            sorted(slots),
            len(durable_rows) + len(ahead),
            len(fenced),
        )

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
        )
        verdicts += result.verdicts
        bulk = [c for c in commands if isinstance(c, BulkCommand)]
        if bulk and self.ownership.clustered:
            verdicts += [_not_in_cluster(c) for c in bulk]
        elif bulk and self.bulk is not None:  # after the job messages of the batch
            rows = {**self.catalog.by_id(), **result.upserts}.values()
            verdicts += self.bulk.accept(bulk, rows, self.tenants, recorded)
        self.outcomes.record(self._ours(verdicts), batch_id)
        self.observer.verdicts(verdicts)
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

    def _ours(self, verdicts: list[Verdict]) -> list[Verdict]:
        """The verdicts this instance records: those of the tables it serves. The
        others' are kept a while, in case it takes their slot over first."""
        ownership = self.ownership
        if not ownership.clustered:
            return verdicts
        ours = []
        for verdict in verdicts:
            slot = (
                ownership.slot(verdict.key.database, verdict.key.table)
                if verdict.key is not None
                else verdict.record.partition % ownership.slots
            )
            if ownership.writes_slot(slot):
                ours.append(verdict)
            else:
                self.unrecorded.setdefault(slot, deque(maxlen=UNRECORDED_PER_SLOT)).append(verdict)
        return ours

    # -- 3. trigger selection -----------------------------------------------------------

    def tick(self) -> TickSummary:
        """Select the due iterations and submit them."""
        now = self.clock()
        changed = self._running_now()
        rows = {**self.catalog.by_id(), **changed}
        served = self._served(rows)
        with _selection_job_group(self.spark):
            selected = self.selection.select(served, self.scheduler.in_flight(), self.retries, now)
        self.tables_probed += selected.probed
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

    def _served(self, rows: Mapping[JobRef, CatalogRow]) -> Mapping[JobRef, CatalogRow]:
        """The rows of the tables this instance serves (all of them with one instance)."""
        if not self.ownership.clustered:
            return rows
        serves = self.ownership.serves
        tables = {(r.database, r.table) for r in rows.values()}
        served = {t for t in tables if serves(*t)}
        return {ref: r for ref, r in rows.items() if (r.database, r.table) in served}

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
            MemberJob(m, rows[m.ref].key, self.selection.spec(rows[m.ref])) for m in plan.members
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

    # -- 4. housekeeping ----------------------------------------------------------------

    def keep_house(self) -> None:
        """Flush what the catalog holds in memory only, and collect dropped jobs, on
        their intervals."""
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
            self.catalog.stage(result.upserts)
            for row_id in result.upserts:
                self.retries.pop(row_id, None)
            if result.cancel:
                self.scheduler.cancel(result.cancel, "job changed by a bulk operation")
        if self.bulk.flush():
            fault_point("bulk.written")


@contextmanager
def _selection_job_group(spark: SparkSession) -> Iterator[None]:
    """Run selection in its own job group: it must never launch a Spark job."""
    context = spark.sparkContext
    context.setJobGroup(SELECTION_JOB_GROUP, "lakeprop trigger selection")
    try:
        yield
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
