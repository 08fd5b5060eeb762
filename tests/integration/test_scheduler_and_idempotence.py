"""Scheduler ordering and idempotent consumer writes, on the real Spark session."""

from __future__ import annotations

import threading
import time

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from lakeprop.config import AppConfig
from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.replica import ReplicaConsumer
from lakeprop.consumers.secondary_index import SecondaryIndexConsumer
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    TableRef,
)
from lakeprop.engine.scheduler import Scheduler
from lakeprop.spec import JobKey
from lakeprop.tables.resolve import Tables
from tests.integration.helpers import SOURCE_SCHEMA, cdf_source, latest_version

pytestmark = pytest.mark.integration


def plan(table: str, priority: int, kind: IterationKind = IterationKind.TAIL) -> IterationPlan:
    return IterationPlan(
        TableRef(1, "db", table), kind, 1, (Member(table, 1, 0),), priority, time.time()
    )


def test_higher_priority_runs_first_and_a_tables_tails_never_overlap(
    spark: SparkSession,
) -> None:
    order: list[str] = []
    running: set[str] = set()
    overlaps: list[str] = []
    gate = threading.Event()
    blocked = threading.Event()
    lock = threading.Lock()

    def work(name: str, table: str, wait: bool = False):
        def run(session: SparkSession, token: CancelToken) -> IterationResult:
            with lock:
                if table in running:
                    overlaps.append(name)
                running.add(table)
                order.append(name)
            if wait:
                blocked.set()
                gate.wait(30)
            time.sleep(0.2)
            with lock:
                running.discard(table)
            return IterationResult(p, IterationKind.TAIL, 0.0)

        p = plan(table, 0)
        return run

    scheduler = Scheduler(spark, workers=1, timeout_s=60)
    scheduler.start()
    try:
        scheduler.submit(plan("a", 0), work("blocker", "a", wait=True), {})
        assert blocked.wait(30)  # the single worker is now busy
        scheduler.submit(plan("b", 1), work("low", "b"), {})
        scheduler.submit(plan("c", 9), work("high", "c"), {})
        scheduler.submit(plan("b", 5), work("mid-same-table", "b"), {})
        gate.set()
        deadline = time.monotonic() + 30
        while len(order) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        scheduler.shutdown()
    assert order == ["blocker", "high", "mid-same-table", "low"]
    assert overlaps == []


@pytest.mark.parametrize(
    ("consumer_class", "options", "columns"),
    [
        (ReplicaConsumer, {"primary_key": ["id"], "columns": None}, ["id", "name", "amount"]),
        (SecondaryIndexConsumer, {"primary_key": ["id"], "columns": ["name"]}, ["name", "id"]),
    ],
)
def test_a_replayed_consumer_write_changes_nothing(
    spark: SparkSession,
    app_config: AppConfig,
    consumer_class: type[ReplicaConsumer],
    options: dict,
    columns: list[str],
) -> None:
    path = cdf_source(spark, app_config, "s", "src")
    spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SOURCE_SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    DeltaTable.forPath(spark, path).update("id = 1", {"name": "'A'"})
    tables = Tables(spark, app_config.tables)
    session = spark.newSession()  # as a worker has
    context = ConsumerContext(
        spark=session,
        key=JobKey(1, "s", "src", "copy"),
        job_id=42,
        consumer_type=consumer_class.__name__,
        options={**options, "target_database": None, "target_table": None},
        source_columns=("id", "name", "amount"),
        locate=lambda d, t: tables.handle(d, t, session),
        cancelled=lambda: False,
    )
    consumer = consumer_class(context)
    target = f"{app_config.tables.warehouse}/s/src_copy"
    snapshot = spark.read.format("delta").option("versionAsOf", 0).load(path)
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .option("endingVersion", 2)
        .load(path)
    )

    assert consumer.snapshot(snapshot, 0) == 0
    assert consumer.snapshot(snapshot, 0) == 0
    after_snapshot = latest_version(spark, target)
    assert after_snapshot == 0  # the second snapshot of version 0 was skipped
    assert consumer.apply_changes(changes, 0, 2) == 2
    # replayed after a "crash": Delta skips the MERGE (same app id and version), which
    # reports that it changed no row
    assert consumer.apply_changes(changes, 0, 2) == 0
    assert latest_version(spark, target) == after_snapshot + 1  # one MERGE committed
    assert_df_equality(
        spark.read.format("delta").load(target),
        spark.read.format("delta").load(path).select(*columns),
        ignore_row_order=True,
    )
