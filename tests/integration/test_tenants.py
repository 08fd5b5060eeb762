"""Tenants on the real broker and Delta: quotas, scopes and foreign targets are
rejected into ``rejects`` with their reasons while the rest applies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from lakeprop.changelog import ensure_topic
from lakeprop.client.api import LakepropClient
from lakeprop.config import AccountConfig, AppConfig, TenantsConfig
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey
from tests.integration.helpers import catalog_df, make_source, run_once, table

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
            accounts={"5": AccountConfig(max_live_jobs=1, databases=("shop", "shop_*"))}
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
