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
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from lakeprop.config import MetricsConfig
from lakeprop.engine.model import IterationResult, TableRef
from lakeprop.engine.ownership import SlotChanges, SlotOwner
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.service.observer import BatchTimings, TickSummary
from lakeprop.service.runner import SELECTION_JOB_GROUP
from lakeprop.state.catalog import CatalogRow
from lakeprop.state.outcomes import Outcome, Verdict
from lakeprop.state.status import JobState

log = logging.getLogger(__name__)

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
JOB_LABELS = ("account", "database", "table", "job", "job_id")


@dataclass(frozen=True)
class MetricDef:
    """One metric: its name (a counter's without the ``_total`` Prometheus adds),
    kind, labels and help text."""

    name: str
    kind: str
    """``counter``, ``gauge`` or ``histogram``."""
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exported(self) -> str:
        """The name a scrape shows (counters get ``_total``)."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


METRICS: tuple[MetricDef, ...] = (
    # jobs and accounts, read at scrape time
    MetricDef("lakeprop_jobs", "gauge", "Live jobs, by state", ("state",)),
    MetricDef(
        "lakeprop_job_state", "gauge", "1 for the job's current state", (*JOB_LABELS, "state")
    ),
    MetricDef(
        "lakeprop_job_watermark", "gauge", "Source version the job has consumed up to", JOB_LABELS
    ),
    MetricDef(
        "lakeprop_job_lag_versions",
        "gauge",
        "Source versions committed after the job's watermark, as of the latest probe",
        JOB_LABELS,
    ),
    MetricDef(
        "lakeprop_job_lag_seconds",
        "gauge",
        "Age of the oldest source commit the job has not consumed (0 when in step)",
        JOB_LABELS,
    ),
    MetricDef(
        "lakeprop_account_iterations_queued",
        "gauge",
        "Iterations waiting for a worker",
        ("account",),
    ),
    MetricDef("lakeprop_account_iterations_running", "gauge", "Iterations running", ("account",)),
    MetricDef(
        "lakeprop_account_rows_in_flight",
        "gauge",
        "Rows the account's running iterations hold cached",
        ("account",),
    ),
    MetricDef(
        "lakeprop_account_bytes_in_flight",
        "gauge",
        "Bytes the account's running iterations hold in Spark's cache",
        ("account",),
    ),
    MetricDef(
        "lakeprop_account_paused_since_seconds",
        "gauge",
        "Unix time since which backpressure holds the account's new iterations (0: not)",
        ("account",),
    ),
    # iterations
    MetricDef("lakeprop_iteration_seconds", "histogram", "Iteration duration", ("kind", "outcome")),
    MetricDef(
        "lakeprop_iteration_queue_wait_seconds",
        "histogram",
        "From planned to a worker starting it",
        ("kind",),
    ),
    MetricDef(
        "lakeprop_iteration_rows_read",
        "counter",
        "Change (tail) or source (snapshot) rows read",
        ("kind",),
    ),
    MetricDef("lakeprop_consumer_rows_written", "counter", "Rows consumers wrote", ("consumer",)),
    MetricDef(
        "lakeprop_iteration_spark_jobs", "counter", "Spark jobs iterations launched", ("kind",)
    ),
    MetricDef(
        "lakeprop_job_errors",
        "counter",
        "Failed consumer runs of iterations, by error code",
        ("code",),
    ),
    # ticks
    MetricDef("lakeprop_ticks", "counter", "Micro-batches processed"),
    MetricDef(
        "lakeprop_tick_phase_seconds",
        "histogram",
        "Seconds one micro-batch spent in each phase",
        ("phase",),
    ),
    MetricDef("lakeprop_tables_probed", "counter", "Source tables probed by trigger selection"),
    MetricDef("lakeprop_tables_changed", "counter", "Probed tables found changed"),
    MetricDef(
        "lakeprop_selection_spark_jobs",
        "counter",
        "Spark jobs trigger selection launched: it never should, so alert on any",
    ),
    # the change log
    MetricDef("lakeprop_verdicts", "counter", "Change-log messages given a verdict", ("outcome",)),
    MetricDef(
        "lakeprop_rejects", "counter", "Change-log messages rejected, by error code", ("code",)
    ),
    # the streaming query
    MetricDef("lakeprop_query_batches", "counter", "Micro-batches the query reported"),
    MetricDef("lakeprop_query_input_rows", "counter", "Change-log messages the query read"),
    MetricDef(
        "lakeprop_query_last_batch_seconds", "gauge", "Duration of the query's latest micro-batch"
    ),
    MetricDef(
        "lakeprop_query_input_rows_per_second",
        "gauge",
        "Input rate of the query's latest micro-batch",
    ),
    MetricDef("lakeprop_query_last_batch_id", "gauge", "Id of the query's latest micro-batch"),
    MetricDef(
        "lakeprop_query_phase_seconds",
        "gauge",
        "Spark's own split of the latest micro-batch (its progress' durationMs): "
        "latestOffset, queryPlanning, addBatch (the foreachBatch), walCommit, ...",
        ("phase",),
    ),
    # several instances (``cluster.enabled``); each instance serves its own endpoint
    MetricDef(
        "lakeprop_cluster_member",
        "gauge",
        "1, labelled with this instance's id in the group",
        ("member",),
    ),
    MetricDef(
        "lakeprop_cluster_slots",
        "gauge",
        "Ownership slots the group assigned to this instance (assigned), and those whose "
        "tables it serves now (served)",
        ("state",),
    ),
    MetricDef("lakeprop_cluster_tables_served", "gauge", "Source tables this instance serves"),
    MetricDef("lakeprop_cluster_jobs_served", "gauge", "Live jobs of the tables it serves"),
    MetricDef(
        "lakeprop_cluster_self_fenced",
        "gauge",
        "1 while the instance fences itself after a pause, until the coordinator vouches "
        "for it again",
    ),
    MetricDef(
        "lakeprop_cluster_leader",
        "gauge",
        "1 when it holds slot 0 and does the cluster-wide chores (usage, accounts)",
    ),
    MetricDef(
        "lakeprop_cluster_slot_handovers",
        "counter",
        "Slots this instance took over (gained), drained and gave up (revoked), or lost "
        "without a drain (lost)",
        ("direction",),
    ),
)
"""Every metric the service exports."""

_DEFS = {m.name: m for m in METRICS}


def _counter(name: str, registry: CollectorRegistry) -> Counter:
    d = _DEFS[name]
    return Counter(d.name, d.help, d.labels, registry=registry)


def _gauge(name: str, registry: CollectorRegistry) -> Gauge:
    d = _DEFS[name]
    return Gauge(d.name, d.help, d.labels, registry=registry)


def _histogram(name: str, registry: CollectorRegistry) -> Histogram:
    d = _DEFS[name]
    return Histogram(d.name, d.help, d.labels, registry=registry, buckets=_SECONDS)


def _family(name: str) -> GaugeMetricFamily:
    d = _DEFS[name]
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def _value(name: str, value: float) -> GaugeMetricFamily:
    """A gauge without labels, at ``value``."""
    d = _DEFS[name]
    return GaugeMetricFamily(d.name, d.help, value=value)


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
        self.ticks = _counter("lakeprop_ticks", registry)
        self.tick_phase = _histogram("lakeprop_tick_phase_seconds", registry)
        self.tables_probed = _counter("lakeprop_tables_probed", registry)
        self.tables_changed = _counter("lakeprop_tables_changed", registry)
        self.selection_spark_jobs = _counter("lakeprop_selection_spark_jobs", registry)
        # per iteration
        self.iteration_seconds = _histogram("lakeprop_iteration_seconds", registry)
        self.queue_wait = _histogram("lakeprop_iteration_queue_wait_seconds", registry)
        self.rows_read = _counter("lakeprop_iteration_rows_read", registry)
        self.rows_written = _counter("lakeprop_consumer_rows_written", registry)
        self.iteration_spark_jobs = _counter("lakeprop_iteration_spark_jobs", registry)
        self.job_errors = _counter("lakeprop_job_errors", registry)
        # the change log
        self.verdicts_total = _counter("lakeprop_verdicts", registry)
        self.rejects = _counter("lakeprop_rejects", registry)
        # several instances
        self.handovers = _counter("lakeprop_cluster_slot_handovers", registry)
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

    def verdicts(self, verdicts: Sequence[Verdict]) -> None:
        for verdict in verdicts:
            self.verdicts_total.labels(verdict.outcome.value).inc()
            if verdict.outcome is Outcome.REJECTED:
                self.rejects.labels(str(verdict.error_code)).inc()

    def handover(self, handover: SlotChanges) -> None:
        for direction, slots in (
            ("gained", len(handover.gained)),
            ("revoked", len(handover.revoking)),
            ("lost", len(handover.lost)),
        ):
            if slots:
                self.handovers.labels(direction).inc(slots)


class ClusterGauges(Collector):
    """This instance's place in the group, at scrape time: its slots, the tables and
    jobs it serves, whether it fences itself, whether it leads."""

    def __init__(self, owner: SlotOwner, rows: Callable[[], Iterable[CatalogRow]]) -> None:
        self._owner = owner
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        owner, seat = self._owner, self._owner.seat
        served = owner.served()
        slots = _family("lakeprop_cluster_slots")
        slots.add_metric(["assigned"], len(seat.assigned()))
        slots.add_metric(["served"], len(served))
        live = [r for r in self._rows() if r.is_live and owner.slot(r.database, r.table) in served]
        member = _family("lakeprop_cluster_member")
        member.add_metric([owner.instance or ""], 1)
        yield member
        yield slots
        yield _value("lakeprop_cluster_tables_served", len({(r.database, r.table) for r in live}))
        yield _value("lakeprop_cluster_jobs_served", len(live))
        yield _value("lakeprop_cluster_self_fenced", 0 if seat.vouched else 1)
        yield _value("lakeprop_cluster_leader", 1 if owner.leads() else 0)


class AccountGauges(Collector):
    """Per account, at scrape time: iterations queued and running, rows and bytes in
    flight, and backpressure (since when paused; 0 when not)."""

    def __init__(self, accounts: Callable[[], Mapping[int, AccountLoad]]) -> None:
        self._accounts = accounts

    def collect(self) -> Iterator[Metric]:
        families = {
            "queued": _family("lakeprop_account_iterations_queued"),
            "running": _family("lakeprop_account_iterations_running"),
            "cached": _family("lakeprop_account_rows_in_flight"),
            "bytes": _family("lakeprop_account_bytes_in_flight"),
            "paused": _family("lakeprop_account_paused_since_seconds"),
        }
        for account, load in self._accounts().items():
            label = [str(account)]
            families["queued"].add_metric(label, load.queued)
            families["running"].add_metric(label, load.running)
            families["cached"].add_metric(label, load.cached_rows)
            families["bytes"].add_metric(label, load.cached_bytes)
            families["paused"].add_metric(label, load.paused_since or 0.0)
        yield from families.values()


class JobGauges(Collector):
    """Per job, at scrape time: watermark, lag (versions and seconds) and state."""

    def __init__(
        self,
        rows: Callable[[], Mapping[Any, CatalogRow]],
        latest: Callable[[TableRef], int | None],
        commit_time: Callable[[TableRef, int], float | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rows = rows
        self._latest = latest
        self._commit_time = commit_time
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        watermark = _family("lakeprop_job_watermark")
        lag = _family("lakeprop_job_lag_versions")
        lag_seconds = _family("lakeprop_job_lag_seconds")
        state = _family("lakeprop_job_state")
        jobs = _family("lakeprop_jobs")
        by_state = dict.fromkeys((s.value for s in JobState), 0)
        now = self._clock()
        for row in list(self._rows().values()):
            if not row.is_live:
                continue
            labels = [
                str(row.account_id),
                row.database,
                row.table,
                row.job_name,
                str(row.job_id),
            ]
            by_state[row.job_state.value] += 1
            state.add_metric([*labels, row.job_state.value], 1)
            if row.watermark is None:
                continue
            watermark.add_metric(labels, row.watermark)
            table = TableRef(row.account_id, row.database, row.table)
            latest = self._latest(table)
            if latest is None:
                continue
            behind = max(0, latest - row.watermark)
            lag.add_metric(labels, behind)
            oldest = self._commit_time(table, row.watermark + 1) if behind else None
            lag_seconds.add_metric(labels, 0.0 if oldest is None else max(0.0, now - oldest))
        for name, count in by_state.items():
            jobs.add_metric([name], count)
        yield from (watermark, lag, lag_seconds, state, jobs)


class QueryProgress(StreamingQueryListener):
    """The streaming query's progress events, as metrics (method names are Spark's)."""

    def __init__(self, registry: CollectorRegistry, query_name: str) -> None:
        self.query_name = query_name
        self.batches = _counter("lakeprop_query_batches", registry)
        self.input_rows = _counter("lakeprop_query_input_rows", registry)
        self.batch_seconds = _gauge("lakeprop_query_last_batch_seconds", registry)
        self.input_rate = _gauge("lakeprop_query_input_rows_per_second", registry)
        self.batch_id = _gauge("lakeprop_query_last_batch_id", registry)
        self.phase_seconds = _gauge("lakeprop_query_phase_seconds", registry)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        self.batches.inc()
        self.input_rows.inc(progress.numInputRows)
        self.batch_seconds.set(progress.batchDuration / 1000.0)
        self.input_rate.set(progress.inputRowsPerSecond or 0.0)
        self.batch_id.set(progress.batchId)
        for phase, millis in (progress.durationMs or {}).items():
            self.phase_seconds.labels(phase).set(millis / 1000.0)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


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
