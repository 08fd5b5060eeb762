"""The propagation service, wired: state tables, runner and the streaming query."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from lakeprop.catalog import JobCatalog, JobState
from lakeprop.config import AppConfig
from lakeprop.history import IterationHistory
from lakeprop.lock import CheckpointLock
from lakeprop.outcomes import OutcomeTables
from lakeprop.runner import Runner
from lakeprop.scheduler import Scheduler
from lakeprop.state import CATALOG_TABLE, HISTORY_TABLE, REJECTS_TABLE, REQUESTS_TABLE
from lakeprop.stream import start_query
from lakeprop.tables import Tables

log = logging.getLogger(__name__)


class PropagationApp:
    """One instance per process: owns the catalog in memory and the query."""

    def __init__(self, spark: SparkSession, config: AppConfig) -> None:
        self.spark = spark
        self.config = config
        self.catalog = JobCatalog(spark, config.state.table_path(CATALOG_TABLE))
        self.outcomes = OutcomeTables(
            spark,
            config.state.table_path(REQUESTS_TABLE),
            config.state.table_path(REJECTS_TABLE),
        )
        self.history = IterationHistory(spark, config.state.table_path(HISTORY_TABLE))
        self.scheduler: Scheduler | None = None
        self.lock = CheckpointLock(spark, config.state.checkpoint_location)
        self._locked = False
        self.runner = Runner(
            spark,
            config.engine,
            self.catalog,
            self.outcomes,
            Tables(spark, config.tables),
            self.history,
            None,
            config.kafka.max_message_bytes,
        )

    def prepare(self) -> None:
        """Create the state tables, load the catalog, roll it forward from the history."""
        self.catalog.ensure()
        self.outcomes.ensure()
        self.history.ensure()
        self.catalog.load()
        self.roll_forward()

    def roll_forward(self) -> int:
        """Advance watermarks the consumers already reached (crash after the history write).

        A successful iteration's history row is written after its consumers'
        writes and before the catalog update; a crash between the last two leaves
        the catalog behind the data, and this puts it level again.
        """
        reached = self.history.latest_success()
        rows = {}
        for row in self.catalog.rows():
            done = reached.get(row.job_id)
            if row.is_live and done and (row.watermark is None or done[0] > row.watermark):
                rows[row.row_id] = replace(
                    row, watermark=done[0], watermark_ts=done[1], job_state=JobState.COMPLETED.value
                )
        self.catalog.commit(rows)
        if rows:
            log.info("rolled %d job watermark(s) forward from the iteration history", len(rows))
        return len(rows)

    def start(self, *, available_now: bool = False) -> StreamingQuery:
        if self.config.kafka.create_topic:
            from lakeprop.client import ensure_topic  # needs confluent-kafka

            ensure_topic(self.config.kafka)
        if not self._locked:
            self.lock.acquire()  # before any state is touched
            self._locked = True
        self.prepare()
        engine = self.config.engine
        if engine.enabled and self.scheduler is None:
            self.scheduler = Scheduler(self.spark, engine.workers, engine.iteration_timeout)
            self.runner.scheduler = self.scheduler
        query = start_query(
            self.spark, self.config, self.runner.process_batch, available_now=available_now
        )
        log.info(
            "query %s started: topic %s on %s, tick every %ss, checkpoint %s",
            self.config.query_name,
            self.config.kafka.topic,
            self.config.kafka.bootstrap_servers,
            self.config.tick_interval,
            self.config.state.checkpoint_location,
        )
        return query

    def run_until(
        self, stop: threading.Event, poll_seconds: int = 1, drain_seconds: float = 120.0
    ) -> None:
        """Run the query until ``stop`` is set (a signal) or the query fails.

        On stop it waits for the micro-batch in progress to finish before stopping
        the query. Stopping in the middle of one would also be safe (Delta commits
        are atomic and a replayed batch changes nothing) but costs a replay.
        """
        query = self.start()
        try:
            while not stop.is_set() and query.isActive:
                query.awaitTermination(poll_seconds)
        finally:
            deadline = time.monotonic() + drain_seconds
            while self.runner.busy and query.isActive and time.monotonic() < deadline:
                time.sleep(0.1)
            if query.isActive:
                log.info("stopping query %s", self.config.query_name)
                query.stop()
            self.shutdown()
        exception = query.exception()
        if exception is not None and not stop.is_set():
            raise RuntimeError(f"query {self.config.query_name} failed: {exception}")

    def shutdown(self) -> None:
        """Cancel running iterations, record what finished, stop the workers, unlock.

        Call it once the query has stopped.
        """
        if self.scheduler is not None:
            results = self.scheduler.shutdown()
            self.runner.scheduler = None
            self.scheduler = None
            self.runner.record_results(results)
            self.catalog.commit_staged()
        if self._locked:
            self.lock.release()
            self._locked = False
