"""The propagation service, wired: state tables, runner and the streaming query."""

from __future__ import annotations

import logging
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from lakeprop.catalog import JobCatalog
from lakeprop.config import AppConfig
from lakeprop.outcomes import OutcomeTables
from lakeprop.runner import Runner
from lakeprop.sources import SourceTables
from lakeprop.state import CATALOG_TABLE, REJECTS_TABLE, REQUESTS_TABLE
from lakeprop.stream import start_query

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
        self.runner = Runner(
            self.catalog,
            self.outcomes,
            SourceTables(spark, config.tables),
            config.kafka.max_message_bytes,
        )

    def prepare(self) -> None:
        """Create the state tables if needed and load the catalog into memory."""
        self.catalog.ensure()
        self.outcomes.ensure()
        self.catalog.load()

    def start(self, *, available_now: bool = False) -> StreamingQuery:
        if self.config.kafka.create_topic:
            from lakeprop.client import ensure_topic  # needs confluent-kafka

            ensure_topic(self.config.kafka)
        self.prepare()
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
        exception = query.exception()
        if exception is not None and not stop.is_set():
            raise RuntimeError(f"query {self.config.query_name} failed: {exception}")
