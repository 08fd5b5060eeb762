"""Every metric the service exports, defined once (:data:`METRICS`): the collectors
read their names, help and labels from here, and the docs' metrics reference is
generated from it."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
    MetricDef(
        "lakeprop_pipeline_freshness_seconds",
        "gauge",
        "For a job reading another job's target: seconds from the commit to its chain's "
        "first table to the end of its last write that reflects it",
        JOB_LABELS,
    ),
    MetricDef(
        "lakeprop_expectation_failed_rows",
        "counter",
        "Rows (a unique rule: keys) that broke a job's expectation",
        ("account", "database", "table", "job", "expectation", "action"),
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
        "lakeprop_state_write_conflicts",
        "counter",
        "Writes to a shared state table (catalog, catalog_layout, iterations, requests, "
        "rejects, fence) that Delta refused because another instance committed first, "
        "each done again",
        ("table",),
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


def counter(name: str, registry: CollectorRegistry) -> Counter:
    d = _DEFS[name]
    return Counter(d.name, d.help, d.labels, registry=registry)


def gauge(name: str, registry: CollectorRegistry) -> Gauge:
    d = _DEFS[name]
    return Gauge(d.name, d.help, d.labels, registry=registry)


def histogram(name: str, registry: CollectorRegistry) -> Histogram:
    d = _DEFS[name]
    return Histogram(d.name, d.help, d.labels, registry=registry, buckets=_SECONDS)


def family(name: str) -> GaugeMetricFamily:
    d = _DEFS[name]
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


def counter_family(name: str) -> CounterMetricFamily:
    """A counter read at scrape time."""
    d = _DEFS[name]
    return CounterMetricFamily(d.name, d.help, labels=d.labels)


def value_of(name: str, value: float) -> GaugeMetricFamily:
    """A gauge without labels, at ``value``."""
    d = _DEFS[name]
    return GaugeMetricFamily(d.name, d.help, value=value)
