"""Prometheus metrics of the running service, served on a port of the driver.

Off unless ``[metrics] enabled = true`` (the cluster and Databricks configs turn
it on). Counters count since the service process started. Per job, the
watermark, the lag behind the source and the state are read from what the
service holds in memory at scrape time, so a scrape costs no Spark job; the
lag in seconds reads one commit file per behind job, cached (commits never
change). Every metric is defined once, in :data:`METRICS`, which the
collectors read their names, help and labels from and the docs' metrics
reference is generated from.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from pyspark.sql import SparkSession

from lakeprop.config import MetricsConfig
from lakeprop.engine.model import IterationResult, TableRef
from lakeprop.engine.ownership import SlotChanges, SlotOwner
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.engine.selection import SELECTION_JOB_GROUP
from lakeprop.service.gauges import AccountGauges, ClusterGauges, JobGauges, QueryProgress
from lakeprop.service.metric_defs import METRICS, counter, gauge, histogram
from lakeprop.service.observer import BatchTimings, TickSummary
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome, Verdict

log = logging.getLogger(__name__)

__all__ = [
    "METRICS",
    "AccountGauges",
    "ClusterGauges",
    "JobGauges",
    "Metrics",
    "MetricsServer",
    "QueryProgress",
    "ServiceMetrics",
]


class ServiceMetrics:
    """The service's metrics, in a registry of their own.

    The runner reports to it (:meth:`batch`, :meth:`results`, :meth:`verdicts`);
    :class:`JobGauges` and :class:`QueryProgress` add what is read at scrape
    time and what the streaming query reports.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        selection_jobs: Callable[[], int] = lambda: 0,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        registry = self.registry
        # per tick
        self.ticks = counter("lakeprop_ticks", registry)
        self.tick_phase = histogram("lakeprop_tick_phase_seconds", registry)
        self.tables_probed = counter("lakeprop_tables_probed", registry)
        self.tables_changed = counter("lakeprop_tables_changed", registry)
        self.selection_spark_jobs = counter("lakeprop_selection_spark_jobs", registry)
        # per iteration
        self.iteration_seconds = histogram("lakeprop_iteration_seconds", registry)
        self.queue_wait = histogram("lakeprop_iteration_queue_wait_seconds", registry)
        self.rows_read = counter("lakeprop_iteration_rows_read", registry)
        self.rows_written = counter("lakeprop_consumer_rows_written", registry)
        self.iteration_spark_jobs = counter("lakeprop_iteration_spark_jobs", registry)
        self.job_errors = counter("lakeprop_job_errors", registry)
        self.expectation_rows = counter("lakeprop_expectation_failed_rows", registry)
        self.freshness = gauge("lakeprop_pipeline_freshness_seconds", registry)
        # the change log
        self.verdicts_total = counter("lakeprop_verdicts", registry)
        self.rejects = counter("lakeprop_rejects", registry)
        # several instances
        self.handovers = counter("lakeprop_cluster_slot_handovers", registry)
        self._selection_jobs = selection_jobs
        """Spark jobs of the selection's job group so far (Spark's status tracker)."""
        self._selection_jobs_seen = selection_jobs()
        for outcome in Outcome:  # every outcome is exported from the start, at 0
            self.verdicts_total.labels(outcome.value)

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None:
        self.ticks.inc()
        for phase, seconds in timings.phases.items():
            self.tick_phase.labels(phase).observe(seconds)
        if tick is not None:
            self.tables_probed.inc(tick.tables_probed)
            self.tables_changed.inc(tick.tables_changed)
        seen = self._selection_jobs()
        if seen > self._selection_jobs_seen:
            self.selection_spark_jobs.inc(seen - self._selection_jobs_seen)
            self._selection_jobs_seen = seen

    def results(self, results: Sequence[IterationResult]) -> None:
        for result in results:
            kind = result.kind.value
            self.iteration_seconds.labels(kind, result.outcome).observe(
                max(0.0, result.ended_at - result.started_at)
            )
            waited = result.started_at - result.plan.planned_at
            self.queue_wait.labels(kind).observe(max(0.0, waited))
            self.rows_read.labels(kind).inc(result.rows_read)
            self.iteration_spark_jobs.labels(kind).inc(result.spark_jobs)
            for member in result.members:
                self.rows_written.labels(member.consumer_type).inc(member.rows_written)
                if not member.ok:
                    self.job_errors.labels(str(member.error_code)).inc()
                key = member.ref[0]
                if member.origin is not None:
                    self.freshness.labels(
                        str(key.account_id),
                        key.database,
                        key.table,
                        key.job_name,
                        str(member.job_id),
                    ).set(max(0.0, result.ended_at - member.origin.at))
                for rule in member.expectations:
                    self.expectation_rows.labels(
                        str(key.account_id),
                        key.database,
                        key.table,
                        key.job_name,
                        rule.name,
                        rule.action,
                    ).inc(rule.failed)

    def verdicts(self, verdicts: Sequence[Verdict], replayed: bool = False) -> None:
        for verdict in verdicts:
            self.verdicts_total.labels(verdict.outcome.value).inc()
            if verdict.outcome is Outcome.REJECTED:
                self.rejects.labels(str(verdict.error_code)).inc()

    def handing_over(self) -> None:
        pass

    def handover(self, handover: SlotChanges) -> None:
        for direction, slots in (
            ("gained", len(handover.gained)),
            ("revoked", len(handover.revoking)),
            ("lost", len(handover.lost)),
        ):
            if slots:
                self.handovers.labels(direction).inc(slots)


class MetricsServer:
    """The HTTP endpoint on ``host:port`` (port 0: a free one, then :attr:`port`)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._server is None:
            self._server, self._thread = start_http_server(
                self.port, addr=self.host, registry=self.registry
            )
            self.port = int(self._server.server_port)
            log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class Metrics:
    """One service's metrics: what its runner reports, its jobs, its query's
    progress, and the endpoint that serves them while the query runs."""

    def __init__(self, spark: SparkSession, config: MetricsConfig, query_name: str) -> None:
        tracker = spark.sparkContext.statusTracker()
        self.spark = spark
        self.reported = ServiceMetrics(
            selection_jobs=lambda: len(tracker.getJobIdsForGroup(SELECTION_JOB_GROUP))
        )
        self.registry = self.reported.registry
        self.progress = QueryProgress(self.registry, query_name)
        self.server = MetricsServer(self.registry, config.host, config.port)
        self._listening = False

    def watch_accounts(self, accounts: Callable[[], Mapping[int, AccountLoad]]) -> None:
        self.registry.register(AccountGauges(accounts))

    def watch_jobs(
        self,
        rows: Callable[[], Mapping[Any, CatalogRow]],
        latest: Callable[[TableRef], int | None],
        commit_time: Callable[[TableRef, int], float | None],
    ) -> None:
        self.registry.register(JobGauges(rows, latest, commit_time))

    def watch_cluster(self, owner: SlotOwner, rows: Callable[[], Iterable[CatalogRow]]) -> None:
        self.registry.register(ClusterGauges(owner, rows))

    def start(self) -> None:
        self.server.start()
        if not self._listening:
            self.spark.streams.addListener(self.progress)
            self._listening = True

    def stop(self) -> None:
        self.server.stop()
        if self._listening:
            self.spark.streams.removeListener(self.progress)
            self._listening = False
