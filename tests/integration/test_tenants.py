"""Tenants on the real broker and Delta: quotas, scopes and foreign targets are
rejected into ``rejects`` with their reasons while the rest applies; usage
counts what each account's jobs read and wrote, once."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from devkit.harness import (
    catalog_df,
    cdf_source,
    make_source,
    run_once,
    running,
    table,
    wait_for_watermark,
)
from lakeprop.changelog import ensure_topic
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, TenantsConfig
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey
from lakeprop.state.usage import usage_of
from tests.integration.test_recovery import add_rows

pytestmark = pytest.mark.integration


def replica(**options: Any) -> dict[str, Any]:
    return {
        "trigger": {"kind": "default"},
        "iteration": {
            "consumer": {"type": "replica", "options": {"primary_key": ["id"], **options}}
        },
    }


def test_quota_scope_and_foreign_target_registrations_land_in_rejects_and_the_rest_apply(
    spark: SparkSession, app_config: AppConfig
) -> None:
    config = replace(
        app_config,
        # one partition: the messages apply in the order they are sent
        kafka=replace(app_config.kafka, topic_partitions=1),
        engine=replace(app_config.engine, enabled=False),
        tenants=TenantsConfig(
            accounts={"5": {"max_live_jobs": 1, "databases": ("shop", "shop_*")}}
        ),
    )
    make_source(spark, config, "shop", "items")
    make_source(spark, config, "finance", "ledger")
    ensure_topic(config.kafka)  # before the client's first message creates it
    client = LakepropClient(config.kafka, config.state, spark)
    sent = {
        name: client.register_job(key, spec)
        for name, key, spec in [
            ("copy", JobKey(5, "shop", "items", "copy"), replica()),
            ("second", JobKey(5, "shop", "items", "second"), replica()),
            ("peek", JobKey(5, "finance", "ledger", "peek"), replica()),
            ("steal", JobKey(6, "shop", "items", "steal"), replica(target_table="items_copy")),
            ("own", JobKey(6, "shop", "items", "own"), replica()),
        ]
    }
    client.close()

    run_once(spark, config)

    def at(name: str) -> int:
        return sent[name].offset

    assert_df_equality(
        table(spark, config, "rejects").select("offset", "error_code", "reason"),
        spark.createDataFrame(
            [
                (
                    at("second"),
                    ErrorCode.QUOTA_EXCEEDED.value,
                    "account 5 has 1 live job(s), its quota (max_live_jobs = 1); "
                    "unregister one first",
                ),
                (
                    at("peek"),
                    ErrorCode.OUT_OF_SCOPE.value,
                    "account 5 may not use database 'finance' (its source); "
                    "its scope is ['shop', 'shop_*']",
                ),
                (
                    at("steal"),
                    ErrorCode.TARGET_NOT_ALLOWED.value,
                    "target shop.items_copy belongs to another account "
                    "(a table its jobs read or write)",
                ),
            ],
            "offset LONG, error_code INT, reason STRING",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    jobs = catalog_df(spark, config).select("account_id", "job_name").collect()
    assert sorted(tuple(r) for r in jobs) == [(5, "copy"), (6, "own")]


def test_usage_counts_what_each_accounts_jobs_read_and_wrote_once(
    spark: SparkSession, app_config: AppConfig
) -> None:
    one = cdf_source(spark, app_config, "shop", "orders")
    two = cdf_source(spark, app_config, "books", "ledger")
    add_rows(spark, one, range(1, 6))
    add_rows(spark, two, range(1, 3))
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    keys = {
        "copy": JobKey(1, "shop", "orders", "copy"),
        "by_name": JobKey(1, "shop", "orders", "by_name"),
        "ledger": JobKey(2, "books", "ledger", "copy"),
    }
    index = {"type": "secondary_index", "options": {"columns": ["name"], "primary_key": ["id"]}}
    for name, key in keys.items():
        spec = replica() if name != "by_name" else {**replica(), "iteration": {"consumer": index}}
        client.register_job(key, spec)
    with running(spark, app_config):
        for key in keys.values():
            wait_for_watermark(spark, app_config, key, 1)
        add_rows(spark, one, range(6, 9))  # one tail, shared by account 1's two jobs
        wait_for_watermark(spark, app_config, keys["copy"], 2)
        wait_for_watermark(spark, app_config, keys["by_name"], 2)

    usage = client.usage()
    history = table(spark, app_config, "iterations").collect()
    assert usage == usage_of(history)  # refreshed from the history at shutdown
    # Spark's own figures: each iteration's tasks ran and its rows were cached;
    # no account has a budget here, so none was ever paused
    assert all(r["task_seconds"] > 0 and r["bytes_cached"] > 0 for r in history)
    assert [r["paused_seconds"] for r in history] == [0.0] * len(history)
    written = {(u.account_id, u.job_name): 0 for u in usage}
    read = {1: 0.0, 2: 0.0}
    for u in usage:
        written[(u.account_id, u.job_name)] += u.rows_written
        read[u.account_id] += u.rows_read
    # the snapshots wrote 5 and 2 rows, the tail 3 more to each of account 1's sinks
    assert written == {(1, "copy"): 8, (1, "by_name"): 8, (2, "copy"): 2}
    # two snapshots of 5 rows and one shared read of 3, counted once; 2 rows for account 2
    assert read == {1: 13.0, 2: 2.0}
    assert [u.account_id for u in client.usage(account_id=2)] == [2]
    assert client.usage(since=datetime.now() + timedelta(hours=2)) == []
