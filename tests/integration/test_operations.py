"""Pause, resume and resync through the change log, on the real broker and Delta:
pause keeps the watermark, resume catches up exactly, resync rebuilds exactly."""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from devkit.harness import (
    cdf_source,
    client_row,
    latest_version,
    running,
    ticks_pass,
    wait_for_watermark,
)
from lakeprop.client.api import LakepropClient, Receipt
from lakeprop.config import AppConfig
from lakeprop.spec import JobKey
from tests.integration.test_recovery import add_rows

pytestmark = pytest.mark.integration


def test_pause_keeps_the_watermark_resume_catches_up_and_resync_rebuilds(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "shop", "orders")
    add_rows(spark, path, range(1, 6))
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    key = JobKey(1, "shop", "orders", "copy")
    client.register_job(
        key,
        {
            "trigger": {"kind": "greedy"},
            "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
        },
    )
    replica = f"{app_config.tables.warehouse}/shop/orders_copy"

    def applied(receipt: Receipt) -> None:
        outcome = client.wait_for_outcome(receipt, timeout=60)
        assert outcome["outcome"] == "applied", outcome

    def replica_equals_source(version: int) -> None:
        assert_df_equality(
            spark.read.format("delta").load(replica),
            spark.read.format("delta").option("versionAsOf", version).load(path),
            ignore_row_order=True,
        )

    with running(spark, app_config) as app:
        wait_for_watermark(spark, app_config, key, 1)
        applied(client.pause_job(key))
        add_rows(spark, path, range(6, 9))
        add_rows(spark, path, range(9, 11))
        ticks_pass(app, 3)
        row = client_row(app_config, spark, key)
        assert (row["job_state"], row["watermark"]) == ("paused", 1)
        replica_equals_source(1)

        applied(client.resume_job(key))
        wait_for_watermark(spark, app_config, key, latest_version(spark, path))
        replica_equals_source(3)

        # the replica damaged behind the service's back: only a rebuild repairs it
        DeltaTable.forPath(spark, replica).delete("id <= 4")
        applied(client.resync_job(key))
        add_rows(spark, path, range(11, 13))
        final = latest_version(spark, path)
        wait_for_watermark(spark, app_config, key, final)
    replica_equals_source(final)
    spec = client.get_job_status(key).spec  # type: ignore[union-attr]
    assert spec["iteration"]["consumer"]["generation"] == 1
