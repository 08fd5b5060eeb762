"""Bulk operations on the real broker and Delta: 200 jobs updated with a few
failures, rolled back byte for byte; a cancel in the middle; the CLI verbs with
their progress display."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.harness import (
    catalog_df,
    cli_settings,
    make_source,
    run_once,
    running,
    snapshot,
    table,
    watches,
)
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.bulk.model import BulkState, TaskState
from lakeprop.changelog import ensure_topic
from lakeprop.client.api import LakepropClient, Receipt
from lakeprop.config import AppConfig
from lakeprop.spec import JobKey, JobSpec, merge_spec
from lakeprop.state import store as state

pytestmark = pytest.mark.integration

REPLICA = {
    "trigger": {"kind": "default"},
    "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
}


def catalog_only(config: AppConfig, per_tick: int) -> AppConfig:
    """No iterations (the bulk operations are catalog work), ``per_tick`` tasks a tick."""
    return replace(
        config, engine=replace(config.engine, enabled=False, bulk_tasks_per_tick=per_tick)
    )


def jobs(spark: SparkSession, config: AppConfig) -> DataFrame:
    """The live jobs: key, id, spec text and state (what a bulk operation changes)."""
    return (
        catalog_df(spark, config)
        .where(F.col("drop_at").isNull())
        .select("account_id", "database", "table", "job_name", "job_id", "job_spec", "job_state")
    )


def wait_applied(spark: SparkSession, config: AppConfig, receipts: list[Receipt]) -> None:
    """Every message applied, and the catalog commit of its micro-batch written (the
    verdicts are written first)."""
    ids = [r.request_id for r in receipts]

    def applied() -> None:
        outcomes = (
            table(spark, config, state.REQUESTS_TABLE)
            .where(F.col("request_id").isin(ids))
            .groupBy("outcome")
            .count()
            .collect()
        )
        assert {r["outcome"]: r["count"] for r in outcomes} == {"applied": len(ids)}
        assert jobs(spark, config).count() == len(ids)

    assert_eventually(
        applied,
        timeout=120,
        interval=0.25,
        changes=watches(spark, config, state.REQUESTS_TABLE, state.CATALOG_TABLE),
    )


def test_a_bulk_update_of_200_jobs_with_failures_is_partial_fail_and_rollback_restores_specs(
    spark: SparkSession, app_config: AppConfig
) -> None:
    config = catalog_only(app_config, per_tick=100)
    make_source(spark, config, "shop", "items")
    # a source without the column the update names: its jobs' tasks fail
    spark.createDataFrame([(1, 1.0)], "id INT, amount DOUBLE").write.format("delta").save(
        f"{config.tables.warehouse}/shop/thin"
    )
    ensure_topic(config.kafka)
    client = LakepropClient(config.kafka, config.state, spark)
    keys = [JobKey(3, "shop", "items", f"copy_{i:03d}") for i in range(196)]
    keys += [JobKey(3, "shop", "thin", f"copy_{i:03d}") for i in range(4)]
    registered = client.register_jobs([(k, REPLICA) for k in keys])
    update = {"iteration": {"consumer": {"options": {"primary_key": ["id", "name"]}}}}

    with running(spark, config):
        wait_applied(spark, config, registered)
        before = jobs(spark, config)
        before_lines = snapshot(before)
        receipt = client.bulk(3, "update_spec", database="shop", job_name="copy_*", spec=update)
        seen: list[Any] = []
        status = client.wait_for_bulk(receipt.request_id, timeout=180, progress=seen.append)

        assert status.operation.state is BulkState.PARTIAL_FAIL
        assert [(t.table, t.job_name, t.state) for t in status.tasks] == [
            ("items", f"copy_{i:03d}", TaskState.SUCCESS) for i in range(196)
        ] + [("thin", f"copy_{i:03d}", TaskState.FAIL) for i in range(4)]
        thin = f"{config.tables.warehouse}/shop/thin"
        assert {t.detail for t in status.tasks[196:]} == {
            f"source shop.thin ({thin}) has no column(s) ['name'] named by the replica "
            "consumer; its columns are ['id', 'amount']"
        }
        # progress only goes forward (100 tasks a tick), and ends with all 200 done
        done = [s.done for s in seen]
        assert done == sorted(done) and done[-1] == 200, done
        updated = JobSpec.from_json(merge_spec(REPLICA, update)).canonical()
        expected = before.withColumn(
            "job_spec",
            F.when(F.col("table") == "items", F.lit(updated)).otherwise(F.col("job_spec")),
        )
        assert snapshot(jobs(spark, config)) == snapshot(expected)

        rollback = client.rollback_bulk(3, receipt.request_id)
        assert client.wait_for_outcome(rollback, timeout=60)["outcome"] == "applied"
        status = client.wait_for_bulk(receipt.request_id, timeout=180, rollback=True)
        assert status.operation.state is BulkState.ROLLBACK_SUCCESS
        assert [t.state for t in status.tasks] == [TaskState.ROLLBACK_SUCCESS] * 196 + [
            TaskState.FAIL
        ] * 4
        assert snapshot(jobs(spark, config)) == before_lines  # every spec, byte for byte

        again = client.bulk(3, "pause", database="shop", bulk_id=receipt.request_id)
        outcome = client.wait_for_outcome(again, timeout=60)
        assert (outcome["outcome"], outcome["detail"]) == (
            "already_exists",
            f"bulk operation {receipt.request_id} was requested already (state "
            "rollback_success); a request id names one bulk operation",
        )


def test_a_cancel_in_the_middle_stops_the_tasks_not_started_through_the_cli(
    spark: SparkSession,
    app_config: AppConfig,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = catalog_only(app_config, per_tick=5)
    make_source(spark, config, "shop", "items")
    ensure_topic(config.kafka)
    client = LakepropClient(config.kafka, config.state, spark)
    keys = [JobKey(3, "shop", "items", f"copy_{i:02d}") for i in range(12)]
    client.register_jobs([(k, REPLICA) for k in keys])
    client.register_job(JobKey(3, "shop", "items", "other"), REPLICA)
    run_once(spark, config)  # one micro-batch: the registers
    base = [*cli_settings(config), "bulk"]
    selector = ["--account", "3", "--database", "shop", "--job", "copy_*", "--id", "p1"]

    assert cli.main([*base, "pause", *selector]) == 0
    run_once(spark, config)  # the request, and its first 5 tasks
    assert cli.main([*base, "cancel", "p1", "--account", "3"]) == 0
    run_once(spark, config)  # the cancel: the other 7 never run
    capsys.readouterr()

    assert cli.main([*base, "status", "p1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("bulk p1 (pause): cancel, 12/12 tasks done, 0 failed [7 cancel, 5 success]")
    assert [line.split()[3] for line in lines[2:]] == ["success"] * 5 + ["cancel"] * 7
    states = {r["job_name"]: r["job_state"] for r in jobs(spark, config).collect()}
    assert states == {
        **{f"copy_{i:02d}": "paused" for i in range(5)},
        **{f"copy_{i:02d}": "completed" for i in range(5, 12)},
        "other": "completed",
    }

    # the rollback, waited for with its progress on stderr and the tasks on stdout
    with running(spark, config):
        assert cli.main([*base, "rollback", "p1", "--account", "3", "--wait"]) == 0
    out, err = capsys.readouterr()
    receipt = json.loads(out[: out.index("}") + 1])
    assert receipt["request_id"] != "p1"
    assert err.splitlines()[-1] == (
        "bulk p1 (pause): rollback_success, 12/12 tasks done, 0 failed "
        "[7 cancel, 5 rollback_success]"
    )
    assert out.splitlines()[-13].startswith("TASK  JOB")
    assert {r["job_state"] for r in jobs(spark, config).collect()} == {"completed"}

    # a rollback of an unknown operation lands in rejects with its reason
    unknown = client.rollback_bulk(3, "nope")
    run_once(spark, config)
    rejects = table(spark, config, state.REJECTS_TABLE).collect()
    assert [(r["offset"], r["error_code"], r["reason"]) for r in rejects] == [
        (unknown.offset, 10601, "no bulk operation 'nope' of account 3")
    ]
