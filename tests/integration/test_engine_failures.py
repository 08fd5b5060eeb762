"""Retries, permanent errors, timeouts and resyncs, with real Spark jobs."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import replace

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.harness import (
    SOURCE_SCHEMA,
    cdf_source,
    history,
    job_row,
    latest_version,
    running,
    ticks_pass,
    wait_for_watermark,
    watches,
)
from devkit.waiting import assert_eventually
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.consumers import ConsumerType, consumer_type_names, register_consumer_type
from lakeprop.consumers.base import Consumer
from lakeprop.errors import ErrorCode, PermanentError, TemporaryError
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

CALLS: Counter[int] = Counter()
_LOCK = threading.Lock()


class FlakyConsumer(Consumer):
    """Fails twice with a temporary error, then succeeds (writes nothing)."""

    def _call(self) -> int:
        with _LOCK:
            CALLS[self.context.job_id] += 1
            n = CALLS[self.context.job_id]
        if n <= 2:
            raise TemporaryError(f"flaky failure {n}")
        return 0

    def snapshot(self, rows: DataFrame, version: int) -> int:
        return self._call()

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        return self._call()


class BrokenConsumer(Consumer):
    def snapshot(self, rows: DataFrame, version: int) -> int:
        raise PermanentError("the target schema is incompatible", ErrorCode.CONSUMER_FAILED)

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        raise AssertionError("never reached")


class SleepyConsumer(Consumer):
    """Runs a Spark job that would take a minute."""

    def snapshot(self, rows: DataFrame, version: int) -> int:
        self.context.spark.sparkContext.parallelize(range(2), 2).foreach(lambda _: time.sleep(60))
        return 0

    def apply_changes(self, changes: DataFrame, from_version: int, to_version: int) -> int:
        return self.snapshot(changes, to_version)


for _name, _cls in (
    ("flaky", FlakyConsumer),
    ("broken", BrokenConsumer),
    ("sleepy", SleepyConsumer),
):
    if _name not in consumer_type_names():
        register_consumer_type(ConsumerType(_name, lambda o: dict(o), lambda o: [], _cls))


def spec(consumer: str, **options: object) -> dict:
    return {
        "trigger": {"kind": "greedy"},
        "iteration": {"consumer": {"type": consumer, "options": options}},
    }


def member_outcomes(spark: SparkSession, config: AppConfig, job_id: int) -> list[tuple]:
    rows = history(spark, config).orderBy("started_at").collect()
    return [
        (r["started_at"].timestamp(), m["error_code"])
        for r in rows
        for m in r["members"]
        if m["job_id"] == job_id
    ]


def test_a_temporary_failure_is_retried_with_backoff_and_a_permanent_one_stops_the_job(
    spark: SparkSession, app_config: AppConfig
) -> None:
    cdf_source(spark, app_config, "s", "t")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    flaky, broken = JobKey(1, "s", "t", "flaky"), JobKey(1, "s", "t", "broken")
    client.register_job(flaky, spec("flaky"))
    client.register_job(broken, spec("broken"))
    with running(spark, app_config) as app:
        wait_for_watermark(spark, app_config, flaky, 0)

        def broken_in_error() -> dict:
            r = job_row(spark, app_config, broken)
            assert r["job_state"] == "error"
            return r

        failed = assert_eventually(broken_in_error, changes=watches(spark, app_config, "catalog"))
        ticks_pass(app)  # a failed job is not retried
        assert len(member_outcomes(spark, app_config, failed["job_id"])) == 1

        # an update of the spec repairs it
        client.update_job_spec(
            broken,
            {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}},
        )
        wait_for_watermark(spark, app_config, broken, 0)

    row = job_row(spark, app_config, flaky)  # the status, as the shutdown flushed it
    attempts = member_outcomes(spark, app_config, row["job_id"])
    assert [code for _, code in attempts] == [ErrorCode.UNKNOWN_TEMPORARY] * 2 + [0]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.5 and gaps[1] >= 1.0, gaps  # retry_base 0.5 s, doubling
    assert '"error_code":0' in row["job_status"]
    assert '"error_code":10400' in failed["job_status"]
    assert "the target schema is incompatible" in failed["job_status"]


def test_a_timeout_really_cancels_the_running_iteration_and_unregister_stops_the_job(
    spark: SparkSession, app_config: AppConfig
) -> None:
    config = replace(app_config, engine=replace(app_config.engine, iteration_timeout=3.0))
    cdf_source(spark, config, "s", "slow")
    client = LakepropClient(config.kafka, config.state, spark)
    key = JobKey(1, "s", "slow", "sleepy")
    client.register_job(key, spec("sleepy"))
    with running(spark, config) as app:

        def timed_out() -> list:
            rows = [r for r in history(spark, config).collect() if r["error_code"] == 300]
            assert rows
            return rows

        (first, *_) = assert_eventually(
            timed_out, timeout=60, changes=watches(spark, config, "iterations")
        )
        assert (first["ended_at"] - first["started_at"]).total_seconds() < 20  # not 60 s
        assert "timed out after 3s" in first["error_msg"]
        assert job_row(spark, config, key)["job_state"] in ("pending", "running")

        # applied before anything is checked: until then a retry of the timed-out
        # iteration may still start (the job is in its backoff, nothing in flight)
        client.wait_for_outcome(client.unregister_job(key))

        def nothing_in_flight() -> None:
            assert app.scheduler is not None and app.scheduler.in_flight() == set()

        assert_eventually(nothing_in_flight, timeout=30)
        # the micro-batch that drained the cancelled iteration appends it to the
        # history after the drain: count once that micro-batch has ended
        ticks_pass(app, 1)
        tracker = spark.sparkContext.statusTracker()
        for iteration in {r["iteration_id"] for r in history(spark, config).collect()}:
            # the iterations' Spark jobs were cancelled, not left running
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(iteration)]
            assert not [j for j in jobs if j is not None and j.status == "RUNNING"], iteration
        count = history(spark, config).count()
        ticks_pass(app)
        assert history(spark, config).count() == count  # a dropped job does not run again


def test_a_vacuumed_range_falls_back_to_a_full_resync(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "s", "vac")
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(10)], SOURCE_SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    key = JobKey(1, "s", "vac", "copy")
    client.register_job(
        key,
        {
            "trigger": {"kind": "default"},
            "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
        },
    )
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, 1)

    table = DeltaTable.forPath(spark, path)
    table.update("id < 5", {"name": "'changed'"})
    table.delete("id = 9")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        table.vacuum(0.0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    latest = latest_version(spark, path)

    with running(spark, app_config):
        wait_for_watermark(spark, app_config, key, latest)
    row = job_row(spark, app_config, key)  # the status, as the shutdown flushed it
    assert_df_equality(
        spark.read.format("delta").load(f"{app_config.tables.warehouse}/s/vac_copy"),
        spark.read.format("delta").load(path),
        ignore_row_order=True,
    )
    assert "no longer readable, resynced from a snapshot" in row["job_status"]
    last = history(spark, app_config).orderBy("ended_at").collect()[-1]
    assert (last["kind"], last["to_version"], last["outcome"]) == ("snapshot", latest, "success")
    assert "resynced from a snapshot" in last["resync_reason"]


def test_shutdown_cancels_running_iterations_and_records_them(
    spark: SparkSession, app_config: AppConfig
) -> None:
    cdf_source(spark, app_config, "s", "stop")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    key = JobKey(1, "s", "stop", "sleepy")
    client.register_job(key, spec("sleepy"))
    with running(spark, app_config) as app:

        def iteration_running() -> None:
            assert app.scheduler is not None and app.scheduler.running()

        assert_eventually(iteration_running, timeout=60)
        started = time.monotonic()
    assert time.monotonic() - started < 30  # the one-minute Spark job was cancelled
    row = job_row(spark, app_config, key)
    assert (row["job_state"], row["watermark"]) == ("canceled", None)
    (recorded,) = history(spark, app_config).collect()
    assert (recorded["outcome"], recorded["error_code"]) == ("canceled", 301)
    assert "shutting down" in recorded["error_msg"]
