"""The metrics endpoint, scraped over HTTP while the service runs a known workload."""

from __future__ import annotations

import urllib.request
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from devkit.harness import latest_version, running, wait_for_watermark
from devkit.kafka import produce_raw
from devkit.waiting import assert_eventually
from lakeprop.config import AppConfig, MetricsConfig
from lakeprop.errors import ErrorCode
from lakeprop.service.app import PropagationApp
from tests.integration.test_engine import one_replica

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: PropagationApp) -> Samples:
    """Every sample of one real HTTP scrape of the service's endpoint."""
    assert app.metrics is not None
    url = f"http://127.0.0.1:{app.metrics.server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_the_endpoint_reports_exact_jobs_iterations_rows_and_verdicts(
    spark: SparkSession, app_config: AppConfig
) -> None:
    app_config = replace(app_config, metrics=MetricsConfig(enabled=True, host="127.0.0.1", port=0))
    path, config, key, _ = one_replica(spark, app_config, "metered")
    produce_raw(config.kafka.bootstrap_servers, config.kafka.topic, [(b"k", b"{not json")])
    job = {"account": "1", "database": "shop", "table": "metered", "job": "copy"}
    with running(spark, config) as app:
        job["job_id"] = str(wait_for_watermark(spark, config, key, 0)["job_id"])
        for rows in ([(1, "a", 1.0), (2, "b", 2.0), (3, "c", 3.0)], [(4, "d", 4.0)]):
            spark.createDataFrame(rows, "id INT, name STRING, amount DOUBLE").write.format(
                "delta"
            ).mode("append").save(path)
            wait_for_watermark(spark, config, key, latest_version(spark, path))

        def reported() -> Samples:
            samples = scrape(app)
            tails = {"kind": "tail", "outcome": "success"}
            assert value(samples, "lakeprop_iteration_seconds_count", **tails) == 2
            return samples

        samples = assert_eventually(reported, timeout=30, interval=0.2)
        # both messages came in the first micro-batch: no other tick collected the log
        assert app.runner.log_collects == 1
    expected = [
        ("lakeprop_verdicts_total", {"outcome": "applied"}, 1),
        ("lakeprop_verdicts_total", {"outcome": "rejected"}, 1),
        ("lakeprop_rejects_total", {"code": str(int(ErrorCode.INVALID_MESSAGE))}, 1),
        ("lakeprop_jobs", {"state": "completed"}, 1),
        ("lakeprop_jobs", {"state": "error"}, 0),
        ("lakeprop_job_state", {**job, "state": "completed"}, 1),
        ("lakeprop_job_watermark", job, 2),
        ("lakeprop_job_lag_versions", job, 0),
        ("lakeprop_job_lag_seconds", job, 0),
        # the snapshot of the empty version 0, then one tail per commit
        ("lakeprop_iteration_seconds_count", {"kind": "snapshot", "outcome": "success"}, 1),
        ("lakeprop_iteration_seconds_count", {"kind": "tail", "outcome": "success"}, 2),
        ("lakeprop_iteration_rows_read_total", {"kind": "tail"}, 4),
        ("lakeprop_consumer_rows_written_total", {"consumer": "replica"}, 4),
        ("lakeprop_selection_spark_jobs_total", {}, 0),
    ]
    actual = [(name, labels, value(samples, name, **labels)) for name, labels, _ in expected]
    assert actual == expected
    assert value(samples, "lakeprop_ticks_total") >= 3
    assert value(samples, "lakeprop_tables_changed_total") >= 2
    assert value(samples, "lakeprop_query_batches_total") >= 3
    assert value(samples, "lakeprop_tick_phase_seconds_count", phase="selection") >= 3
    # Spark's own split of the latest micro-batch: the foreachBatch is its addBatch
    assert value(samples, "lakeprop_query_phase_seconds", phase="addBatch") > 0
    assert value(samples, "lakeprop_query_phase_seconds", phase="triggerExecution") >= value(
        samples, "lakeprop_query_phase_seconds", phase="addBatch"
    )
