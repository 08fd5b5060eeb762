"""aggregate_view min/max when several commits fall into one range (the consumer alone).

The cases where the old extreme says nothing: a group with no view row yet, and
a group whose values were all NULL, each with a value inserted and removed
again inside the range.
"""

from __future__ import annotations

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.harness import cdf_source
from lakeprop.config import AppConfig
from lakeprop.consumers.aggregate_view import AggregateViewConsumer
from lakeprop.consumers.base import ConsumerContext
from lakeprop.spec import JobKey
from lakeprop.tables.resolve import Tables

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCHEMA = "g STRING, v INT"
OPTIONS = {
    "group_by": ["g"],
    "aggregates": [
        {"fn": "min", "column": "v", "as": "low"},
        {"fn": "max", "column": "v", "as": "high"},
        {"fn": "count", "as": "n"},
    ],
}


def consumer(spark: SparkSession, config: AppConfig) -> AggregateViewConsumer:
    tables = Tables(spark, config.tables)
    session = spark.newSession()
    return AggregateViewConsumer(
        ConsumerContext(
            spark=session,
            key=JobKey(1, "x", "src", "ext"),
            job_id=3,
            consumer_type="aggregate_view",
            options=AggregateViewConsumer.validate_options(OPTIONS),
            source_columns=("g", "v"),
            locate=lambda d, t: tables.handle(d, t, session),
            cancelled=lambda: False,
        )
    )


def changes(spark: SparkSession, path: str, start: int, end: int) -> DataFrame:
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start + 1)
        .option("endingVersion", end)
        .load(path)
    )


def assert_view_at(spark: SparkSession, config: AppConfig, path: str, version: int) -> None:
    source = spark.read.format("delta").option("versionAsOf", version).load(path)
    expected = source.groupBy("g").agg(
        F.min("v").alias("low"), F.max("v").alias("high"), F.count(F.lit(1)).alias("n")
    )
    view = spark.read.format("delta").load(f"{config.tables.warehouse}/x/src_ext")
    assert_df_equality(
        view.select("g", "low", "high", "n"), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_extremes_inserted_and_removed_inside_one_range_do_not_stay_in_the_view(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "x", "src", SCHEMA)  # version 0, empty
    table = DeltaTable.forPath(spark, path)

    def append(rows: list[tuple[str, int | None]]) -> None:
        spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(path)

    view = consumer(spark, app_config)
    view.snapshot(spark.read.format("delta").option("versionAsOf", 0).load(path), 0)

    # groups p and m have no view row yet; their extremes come and go inside (0, 2]
    append([("p", 10), ("p", 20), ("m", 5), ("m", 50), ("q", None)])  # 1
    table.delete("(g = 'p' AND v = 20) OR (g = 'm' AND v = 5)")  # 2
    view.apply_changes(changes(spark, path, 0, 2), 0, 2)
    assert_view_at(spark, app_config, path, 2)  # p max 10, m min 50, q NULL

    append([("p", 15), ("m", 40)])  # 3
    view.apply_changes(changes(spark, path, 2, 3), 2, 3)
    assert_view_at(spark, app_config, path, 3)  # p max 15, m min 40

    # group q holds only NULLs: a value inserted and updated away inside (3, 5]
    append([("q", 7)])  # 4
    table.update("g = 'q' AND v = 7", {"v": F.lit(None).cast("int")})  # 5
    view.apply_changes(changes(spark, path, 3, 5), 3, 5)
    assert_view_at(spark, app_config, path, 5)  # q NULL, NULL, 3 rows
