"""Scheduler ordering and idempotent consumer writes, on the real Spark session."""

from __future__ import annotations

import json
import threading
import time

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from devkit.harness import SOURCE_SCHEMA, cdf_source, cli_settings, latest_version
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.config import AppConfig
from lakeprop.consumers.base import ConsumerContext
from lakeprop.consumers.replica import ReplicaConsumer
from lakeprop.consumers.secondary_index import SecondaryIndexConsumer
from lakeprop.engine.housekeeping import account_rows
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    TableRef,
)
from lakeprop.engine.policy import FairShare
from lakeprop.engine.scheduler import AccountLoad, Scheduler
from lakeprop.spec import JobKey
from lakeprop.state.accounts import AccountsTable
from lakeprop.state.catalog import JobCatalog
from lakeprop.state.store import ACCOUNTS_TABLE, CATALOG_TABLE
from lakeprop.tables.resolve import Tables

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


def test_backpressure_holds_an_accounts_next_iteration_and_the_accounts_table_says_so(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    """Account 1 may hold 1,000 rows in flight: a running iteration holding 900 pauses
    its next one (not account 2's) until it ends; the wait is recorded as paused and
    the published ``accounts`` table shows the pause while it lasts."""
    holding = threading.Event()
    release = threading.Event()
    started: list[str] = []

    def work(name: str, plan_: IterationPlan, hold: int = 0):
        def run(session: SparkSession, token: CancelToken) -> IterationResult:
            result = IterationResult(plan_, IterationKind.TAIL, time.time())
            started.append(name)
            if hold:
                token.cached_rows, token.cached_bytes = hold, hold * 40
                holding.set()
                assert release.wait(60)
                token.cached_rows = token.cached_bytes = 0
            result.ended_at = time.time()
            return result

        return run

    policy = FairShare(lambda _a: 1.0, budget=lambda a: 1000 if a == 1 else 0)
    scheduler = Scheduler(spark, workers=2, timeout_s=60, policy=policy)
    table = AccountsTable(spark, app_config.state.table_path(ACCOUNTS_TABLE))
    JobCatalog(spark, app_config.state.table_path(CATALOG_TABLE)).ensure()  # a service's state
    scheduler.start()
    try:
        big, next_one = _account_plan(1, "big"), _account_plan(1, "next")
        scheduler.submit(big, work("big", big, hold=900), {})
        assert holding.wait(60)
        scheduler.submit(next_one, work("next", next_one), {})
        other = _account_plan(2, "other")
        scheduler.submit(other, work("other", other), {})  # account 2 is not held
        loads = assert_eventually(lambda: _paused(scheduler.accounts()), interval=0.05)
        assert started[:2] == ["big", "other"]
        assert table.publish(account_rows(loads, time.time()))
        published = table.read()
        assert [
            (r.account_id, r.queued, r.running, r.rows_in_flight, r.bytes_in_flight)
            for r in published
        ] == [(1, 1, 1, 900, 36_000)]
        assert published[0].paused_since is not None and published[0].waiting_since is not None
        assert not table.publish(account_rows(loads, time.time() + 5))  # unchanged: no commit
        capsys.readouterr()
        assert cli.main([*cli_settings(app_config), "--json", "accounts"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["account_id"] == 1 and shown["rows_in_flight"] == 900
        assert shown["paused_since"] == str(published[0].paused_since)
        release.set()
        results: list[IterationResult] = []
        assert_eventually(lambda: _collected(results, scheduler.drain(), 3), interval=0.05)
    finally:
        release.set()
        scheduler.shutdown()
    paused = {r.plan.table.table: r.paused_seconds for r in results}
    assert paused["next"] > 0 and paused["big"] == 0 and paused["other"] == 0
    assert started == ["big", "other", "next"]
    assert table.publish(account_rows(scheduler.accounts(), time.time()))  # now empty
    assert table.read() == []


def _account_plan(account: int, table: str) -> IterationPlan:
    return IterationPlan(
        TableRef(account, "db", table),
        IterationKind.TAIL,
        1,
        (Member(table, 1, 0),),
        0,
        time.time(),
    )


def _paused(loads: dict[int, AccountLoad]) -> dict[int, AccountLoad]:
    assert 1 in loads and loads[1].paused_since is not None and 2 not in loads
    return loads


def _collected(into: list[IterationResult], more: list[IterationResult], count: int) -> None:
    into += more
    assert len(into) == count
