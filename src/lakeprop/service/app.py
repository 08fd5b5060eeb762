"""The propagation service, wired: state tables, runner and the streaming query."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from lakeprop.bulk.executor import BulkExecutor
from lakeprop.bulk.tables import BulkTables
from lakeprop.config import AppConfig
from lakeprop.engine.dirty import DirtyTables
from lakeprop.engine.ownership import SlotOwner, SoleOwner
from lakeprop.engine.policy import FairShare
from lakeprop.engine.retry import retry_delay
from lakeprop.engine.scheduler import Scheduler
from lakeprop.errors import ErrorCode, PermanentError, TemporaryError
from lakeprop.kafka import partitions
from lakeprop.membership.group import Seat
from lakeprop.notifications import CommitNotice
from lakeprop.service.carry_over import carry_over, starting_offsets
from lakeprop.service.events import EventLog
from lakeprop.service.lock import CheckpointLock
from lakeprop.service.notices import NoticeListener, NoticePublisher
from lakeprop.service.observer import Observers, RunnerObserver, Unobserved
from lakeprop.service.parts import RunnerParts
from lakeprop.service.runner import Runner
from lakeprop.service.stream import ChangelogOffsets, Offsets, start_query
from lakeprop.service.wake import Waker, wake_topic
from lakeprop.spec import JobRef
from lakeprop.state.accounts import AccountsTable
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.catalog_table import RowScope, SharedWrites
from lakeprop.state.events import EventTable
from lakeprop.state.history import IterationHistory, rolled_forward
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import OutcomeTables
from lakeprop.state.shared import Signed
from lakeprop.state.store import (
    ACCOUNTS_TABLE,
    BULK_OPERATIONS_TABLE,
    BULK_TASKS_TABLE,
    CATALOG_TABLE,
    EVENTS_TABLE,
    HISTORY_TABLE,
    REJECTS_TABLE,
    REQUESTS_TABLE,
    USAGE_TABLE,
)
from lakeprop.state.usage import UsageTable
from lakeprop.tables.hadoop import FilesFor
from lakeprop.tables.resolve import Tables
from lakeprop.tables.stores import check_storage, session_storage, written_locations
from lakeprop.tenants import Tenants

if TYPE_CHECKING:
    from lakeprop.service.metrics import Metrics

log = logging.getLogger(__name__)


def _all(pool: ThreadPoolExecutor, *steps: Callable[[], object]) -> None:
    """Run ``steps`` on ``pool`` and wait for them all; the first failure is raised."""
    for future in [pool.submit(step) for step in steps]:
        future.result()


def instance_config(config: AppConfig) -> AppConfig:
    """With ``cluster.enabled``, each instance reads the change log into a checkpoint of
    its own, ``<state.checkpoint_location>/<instance id>``; the state is shared."""
    if not config.cluster.enabled:
        return config
    checkpoint = f"{config.state.checkpoint_location.rstrip('/')}/{config.cluster.instance()}"
    return replace(config, state=replace(config.state, checkpoint_location=checkpoint))


class PropagationApp:
    """One instance per process: owns the catalog in memory and the query."""

    def __init__(self, spark: SparkSession, config: AppConfig) -> None:
        config = instance_config(config)
        self.spark = spark
        self.config = config
        self.storage = session_storage(spark, config)
        self.native_off = check_storage(
            spark,
            self.storage,
            written_locations(spark, config),
            cluster=config.cluster.enabled,
        )
        """Where the native path is off: commits there do not exclude delta-rs."""
        self.seat: Seat | None = None
        self.ownership: SoleOwner = SoleOwner()
        shared: SharedWrites | None = None
        if config.cluster.enabled:
            self.seat = Seat(config.kafka, config.cluster, status=self._status)
            self.ownership = owner = SlotOwner(
                self.seat, min(config.engine.iteration_timeout, 120.0)
            )
            shared = SharedWrites(
                scope=self._scope,
                owner=lambda row: owner.owner_of(row.database, row.table) or "",
                sign=self._sign,
            )
        self.catalog = JobCatalog(
            spark,
            config.state.table_path(CATALOG_TABLE),
            shared,
            slots=config.cluster.slots if config.cluster.enabled else None,
            merge_from=config.state.catalog_merge_from,
        )
        if self.seat is not None:
            self.seat.era_of = self.catalog.era
        self.outcomes = OutcomeTables(
            spark,
            config.state.table_path(REQUESTS_TABLE),
            config.state.table_path(REJECTS_TABLE),
            shared=shared is not None,
        )
        self.history = IterationHistory(spark, config.state.table_path(HISTORY_TABLE))
        self.usage = UsageTable(
            spark,
            config.state.table_path(USAGE_TABLE),
            config.state.table_path(HISTORY_TABLE),
            shared=config.cluster.enabled,
        )
        engine = config.engine
        self.bulk_tables = BulkTables(
            spark,
            config.state.table_path(BULK_OPERATIONS_TABLE),
            config.state.table_path(BULK_TASKS_TABLE),
        )
        self.bulk = BulkExecutor(
            self.bulk_tables, engine.bulk_tasks_per_tick, engine.bulk_task_attempts
        )
        tables = Tables(spark, config.tables)
        self.tenants = Tenants(
            config.tenants,
            reserved=lambda database, table: tables.within(
                database, table, config.state.location, config.state.checkpoint_location
            ),
        )
        self.waker = Waker(config.kafka, wake_topic(config), config.tick_interval)
        """Wakes the query when there is work (:mod:`lakeprop.service.wake`)."""
        self.scheduler = Scheduler(
            spark,
            engine.workers,
            engine.iteration_timeout,
            policy=FairShare(self.tenants.weight, self.tenants.max_concurrent, self.tenants.budget),
            on_done=self.waker.nudge,
        )
        self.query_failures = 0
        """Failed runs of the query that ``run_until`` restarted (or gave up on)."""
        self.lock = CheckpointLock(
            spark,
            config.state.checkpoint_location,
            ttl=config.state.lease_ttl,
            wait=config.state.lock_wait,
        )
        if not self.lock.local:  # a crashed holder's lease is stale only after its ttl
            self.lock.wait = max(self.lock.wait, config.state.lease_ttl * 1.25)
        self._locked = False
        notifications = config.notifications
        self.dirty = DirtyTables(notifications.sweep_interval) if notifications.enabled else None
        self.notices = (
            NoticeListener(config.kafka, notifications.topic, self._announce)
            if notifications.enabled
            else None
        )
        self.publisher = (
            NoticePublisher(config.kafka, notifications.topic)
            if notifications.enabled and config.cluster.enabled
            else None
        )
        """The service's own commits to tables other jobs read, told to the other
        instances (one instance feeds its own downstream jobs directly)."""
        self.metrics = self._metrics()
        self.events = self._events()
        self.offsets = ChangelogOffsets(
            FilesFor(spark)(config.state.checkpoint_location),
            config.state.checkpoint_location,
            config.kafka.topic,
        )
        self.runner = Runner(
            RunnerParts(
                spark,
                config.engine,
                self.catalog,
                self.outcomes,
                tables,
                self.history,
                self.scheduler,
                config.kafka.max_message_bytes,
                dirty=self.dirty,
                tenants=self.tenants,
                usage=self.usage,
                accounts=AccountsTable(spark, config.state.table_path(ACCOUNTS_TABLE)),
                bulk=self.bulk,
                observer=self._observer(),
                log_empty=self.offsets.empty,
                ownership=self.ownership,
                announce=self.publisher.publish if self.publisher is not None else None,
                storage=self.storage,
                tick_interval=config.tick_interval,
                poll_interval=config.poll,
            )
        )
        if self.metrics is not None:
            selection = self.runner.selection
            self.metrics.watch_jobs(self._served_rows, selection.latest.get, selection.commit_time)
            self.metrics.watch_accounts(self.scheduler.accounts)
            if isinstance(self.ownership, SlotOwner):
                self.metrics.watch_cluster(self.ownership, self.catalog.rows)

    def _observer(self) -> RunnerObserver:
        """Who is told what each micro-batch did: the metrics, the event table."""
        observers: list[RunnerObserver] = []
        if self.metrics is not None:
            observers.append(self.metrics.reported)
        if self.events is not None:
            observers.append(self.events)
        return Observers(*observers) if observers else Unobserved()

    def _events(self) -> EventLog | None:
        """The event table's writer, when configured (on by default)."""
        config = self.config
        if not config.events.enabled:
            return None
        return EventLog(
            EventTable(self.spark, config.state.table_path(EVENTS_TABLE)),
            config.events.flush_interval,
            instance=config.cluster.instance() if config.cluster.enabled else None,
            retention=config.events.retention,
            leads=self.ownership.leads,
        )

    def _metrics(self) -> Metrics | None:
        """The Prometheus metrics, when configured (the package is imported only then)."""
        if not self.config.metrics.enabled:
            return None
        from lakeprop.service.metrics import Metrics

        return Metrics(self.spark, self.config.metrics, self.config.query_name)

    def _served_rows(self) -> Mapping[JobRef, CatalogRow]:
        """The jobs whose metrics this instance exports: those of the tables it serves
        (every job with one instance; the others' owners export theirs)."""
        rows = self.catalog.by_id()
        if not self.ownership.clustered:
            return rows
        serves = self.ownership.serves
        return {ref: row for ref, row in rows.items() if serves(row.database, row.table)}

    def _scope(self, row: CatalogRow) -> RowScope:
        """Whether this instance writes ``row`` now (``cluster.enabled``)."""
        if self.ownership.may_write(row.database, row.table):
            return RowScope.WRITE
        assert self.seat is not None
        if self.ownership.slot(row.database, row.table) in self.seat.assigned():
            return RowScope.DEFER
        return RowScope.SKIP

    def _sign(self) -> Signed:
        signature = self.ownership.sign()
        assert signature is not None
        return Signed(signature.app_id, signature.version)

    def _status(self) -> dict[str, object]:
        """What this instance publishes to the membership status topic."""
        rows = list(self.catalog.rows())
        tables = sorted({(r.database, r.table) for r in rows if r.is_live})
        served = [f"{d}.{t}" for d, t in tables if self.ownership.serves(d, t)]
        return {
            "tables": served,
            "jobs": sum(
                1 for r in rows if r.is_live and self.ownership.serves(r.database, r.table)
            ),
            "batches": self.runner.batches,
            "lag": self._lag(),
        }

    def _lag(self) -> int | None:
        """Change log messages this instance has not read yet (None: not known)."""
        read = self.offsets.latest
        if read is None or self.seat is None:
            return None
        ends = self.seat.end_offsets(self.config.kafka.topic, read)
        return sum(max(0, ends[p] - read[p]) for p in read)

    @property
    def ticks(self) -> int:
        """Micro-batches run, plus tick intervals that passed with nothing due: how
        tests and benchmarks wait for the service to have looked (and done nothing)."""
        return self.runner.batches + self.waker.quiet_ticks

    def _announce(self, notice: CommitNotice) -> None:
        assert self.dirty is not None
        table = (notice.database, notice.table)
        self.dirty.announce(table, notice.version, time.time())
        if table in self.runner.selection.watched:
            self.waker.nudge()

    def _process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` callback: the runner's micro-batch, told to the waker."""
        started = time.time()
        self.waker.batch_started()
        wanted_at = started + self.config.tick_interval
        try:
            self.runner.process_batch(batch, batch_id)
            wanted_at = self.runner.next_batch_at(started)
        finally:
            self.waker.batch_ended(wanted_at)

    def _starting_offsets(self) -> Offsets | None:
        """Where the change log is read from when a checkpoint of the tick source was
        carried over (:mod:`lakeprop.service.carry_over`); None otherwise."""
        checkpoint = self.config.state.checkpoint_location
        topic = self.config.kafka.topic
        carried = carry_over(FilesFor(self.spark)(checkpoint), checkpoint, topic)
        if carried is None:
            return None
        return starting_offsets(carried, partitions(self.config.kafka, topic))

    def prepare(self) -> None:
        """Create the state tables, load the catalog, roll it forward from the history,
        bring the usage table level with the history, and settle the bulk tasks a
        stop left running.

        The tables are independent until the roll-forward: they are created and
        read at once (tables created now are empty and not read at all).
        """
        with ThreadPoolExecutor(3, "lakeprop-prepare") as pool:
            _all(
                pool,
                self.catalog.ensure,
                self.outcomes.ensure,
                self.history.ensure,
                self.usage.ensure,
                self.bulk_tables.ensure,
                *([] if self.events is None else [self.events.table.ensure]),
            )
            _all(pool, self.catalog.load, self.outcomes.load)
        self.roll_forward()
        if not self.history.is_new and not self.ownership.clustered:
            self.usage.catch_up()  # with several instances, the leader's refresh does
        self.bulk.load(self.catalog.by_id())
        if self.events is not None:
            self.events.start()  # its table exists now

    def roll_forward(self) -> int:
        """Advance watermarks the consumers already reached, as the history records.

        A successful iteration's history row is written after its consumers'
        writes; the catalog table catches up on the flush, so after a crash it
        is behind the data, and this puts it level again.
        """
        reached = self.history.latest_success()
        rows = {}
        for row in self.catalog.rows():
            ahead = rolled_forward(row, reached)
            if ahead is not None:
                rows[row.row_id] = ahead
        self.catalog.commit(rows)
        if rows:
            log.info("rolled %d job watermark(s) forward from the iteration history", len(rows))
        return len(rows)

    def start(self, *, available_now: bool = False) -> StreamingQuery:
        if self.config.kafka.create_topic:
            from lakeprop.changelog import ensure_topic

            ensure_topic(self.config.kafka)
        if not self._locked:
            self.lock.acquire()  # before any state is touched
            self._locked = True
        self.prepare()
        starting = self._starting_offsets()
        if self.seat is not None:
            self.ownership.resume()
            self.seat.start()  # slots arrive asynchronously: each micro-batch takes them over
        if self.notices is not None and self.dirty is not None:
            # notices sent while it was stopped are lost: the first tick probes every table
            self.dirty.reset()
            self.notices.start()
        self.runner.resume()
        if self.metrics is not None:
            self.metrics.start()
        if self.config.engine.enabled:
            self.scheduler.start()
        if available_now:
            self.waker.wake_once()  # at least one micro-batch, even with nothing in the log
        else:
            self.waker.start()
        query = start_query(
            self.spark,
            self.config,
            self._process_batch,
            self.waker.topic,
            available_now=available_now,
            starting=starting,
        )
        log.info(
            "query %s started: topic %s on %s, woken through %s, tick every %ss, polling "
            "every %ss, checkpoint %s",
            self.config.query_name,
            self.config.kafka.topic,
            self.config.kafka.bootstrap_servers,
            self.waker.topic,
            self.config.tick_interval,
            self.config.poll,
            self.config.state.checkpoint_location,
        )
        return query

    def run_until(
        self, stop: threading.Event, poll_seconds: int = 1, drain_seconds: float = 120.0
    ) -> None:
        """Run the query until ``stop`` is set (a signal), restarting it when it fails.

        On stop it waits for the micro-batch in progress to finish before stopping
        the query. Stopping in the middle of one would also be safe (Delta commits
        are atomic and a replayed batch changes nothing) but costs a replay.

        A failed query (the broker gone for longer than the Kafka source retries,
        storage trouble) is restarted on its checkpoint after a backoff of
        ``engine.retry_base`` doubling up to ``engine.retry_max``; after
        ``engine.max_query_restarts`` failures in a row the service gives up and
        raises. A query that ran for ``engine.retry_max`` counts as recovered.
        """
        engine = self.config.engine
        failures = 0
        while not stop.is_set():
            started = time.monotonic()
            error = self._run_once_until(stop, poll_seconds, drain_seconds)
            if error is None or stop.is_set():
                return
            self.query_failures += 1
            failures = 1 if time.monotonic() - started >= engine.retry_max else failures + 1
            if failures > engine.max_query_restarts:
                raise PermanentError(
                    f"query {self.config.query_name} failed {failures} times in a row; "
                    f"last error: {error}",
                    ErrorCode.QUERY_FAILED,
                )
            delay = retry_delay(failures, engine.retry_base, engine.retry_max)
            log.error(
                "query %s failed (%s); restarting on its checkpoint in %.0fs (failure %d of at "
                "most %d in a row)",
                self.config.query_name,
                error,
                delay,
                failures,
                engine.max_query_restarts,
            )
            stop.wait(delay)

    def _run_once_until(
        self, stop: threading.Event, poll_seconds: int, drain_seconds: float
    ) -> str | None:
        """Start the query and run it until ``stop`` or a failure; the failure, or None."""
        try:
            query = self.start()
        except TemporaryError as exc:  # the broker is not reachable yet
            self.shutdown()
            return str(exc)
        try:
            while not stop.is_set() and query.isActive:
                try:
                    query.awaitTermination(poll_seconds)
                except StreamingQueryException:
                    break
        finally:
            self.stop_query(query, drain_seconds)
            self.shutdown()
        exception = query.exception()
        if exception is None:
            return None
        lines = str(exception).strip().splitlines()
        return lines[0][:500] if lines else type(exception).__name__

    def _write_catalog(self) -> None:
        self.catalog.commit_staged()
        self.catalog.flush()

    def stop_query(self, query: StreamingQuery, timeout: float = 120.0) -> None:
        """Stop the query between micro-batches: the one in progress finishes first
        (for at most ``timeout`` seconds, then the query is stopped regardless)."""
        if not query.isActive:
            return
        log.info("stopping query %s", self.config.query_name)
        with self.runner.halted(timeout, lambda: not query.isActive) as between_batches:
            if not between_batches:
                log.warning(
                    "a micro-batch still runs after %.0fs; stopping query %s regardless",
                    timeout,
                    self.config.query_name,
                )
            query.stop()

    def shutdown(self) -> None:
        """Cancel running iterations, record what finished, stop the workers, unlock.

        Call it once the query has stopped. What finished is in the history by
        then; the catalog, usage and accounts tables are then brought level with
        it at once, as none of the three reads another (a crash in between
        leaves each to its own catch-up at the next start).
        """
        if self.scheduler.started:
            self.runner.record_results(self.scheduler.shutdown())
            with ThreadPoolExecutor(3, "lakeprop-shutdown") as pool:
                _all(
                    pool,
                    self._write_catalog,  # the table shows where every job stopped
                    self.usage.refresh,
                    lambda: self.runner.housekeeping.publish_accounts(self.runner.clock()),
                )
        if self.events is not None:
            self.events.close()
        if self.seat is not None:
            self.ownership.stop()
            self.seat.stop()  # leave the group: the others take the slots over now
        if self.notices is not None:
            self.notices.stop()
        if self.publisher is not None:
            self.publisher.stop()
        self.waker.stop()
        if self.metrics is not None:
            self.metrics.stop()
        if self._locked:
            self.lock.release()
            self._locked = False
