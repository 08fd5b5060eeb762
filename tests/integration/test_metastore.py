"""Sources and targets by metastore name: ``tables.resolution = "metastore"``.

The tests' session has an embedded Hive metastore (Derby, as ``enableHiveSupport``
gives) with Delta's catalog, so jobs name tables ``database.table`` as they do on
a cluster that shares a Hive metastore or on Unity Catalog. The workloads are
those of the path-based tests; every sink is compared whole.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import replace

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import running, wait_for_watermark
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, TablesConfig
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey
from tests.integration.test_recovery import wait_for_error

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONSUMERS = {
    "copy": {"type": "replica", "options": {"primary_key": ["id"]}},
    "by_name": {"type": "secondary_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
    "totals": {
        "type": "aggregate_view",
        "options": {"group_by": ["name"], "aggregates": aggregates_of("amount")},
    },
}


def create_source(spark: SparkSession, name: str) -> None:
    spark.sql(
        f"CREATE TABLE {name} (id INT, name STRING, amount DOUBLE) USING delta "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )


def named_commits(spark: SparkSession, name: str, rng: random.Random, live: set[int]) -> None:
    """An insert, an update that moves rows between names, and a delete: SQL by name."""
    first = max(live | {0}) + 1
    ids = range(first, first + rng.randint(2, 5))
    values = ", ".join(f"({i}, 'n{rng.randint(0, 2)}', {rng.randint(1, 99)}.0)" for i in ids)
    spark.sql(f"INSERT INTO {name} VALUES {values}")
    live.update(ids)
    moved = ", ".join(str(i) for i in rng.sample(sorted(live), k=2))
    spark.sql(
        f"UPDATE {name} SET name = 'n{rng.randint(0, 2)}', amount = amount + 1 "
        f"WHERE id IN ({moved})"
    )
    gone = rng.choice(sorted(live))
    spark.sql(f"DELETE FROM {name} WHERE id = {gone}")
    live.discard(gone)


def version_of(spark: SparkSession, name: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()["version"])  # type: ignore[index]


def at(spark: SparkSession, name: str, version: int) -> DataFrame:
    return spark.read.option("versionAsOf", version).table(name)


@pytest.fixture
def database(spark: SparkSession) -> str:
    """A metastore database of the test's own."""
    name = f"sales_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {name}")
    return name


def test_replica_index_and_aggregate_follow_a_metastore_source_and_a_re_created_one_is_found(
    spark: SparkSession, app_config: AppConfig, database: str
) -> None:
    config = replace(app_config, tables=TablesConfig(resolution="metastore"))
    source = f"{database}.orders"
    create_source(spark, source)
    rng = random.Random(5)
    live: set[int] = set()
    named_commits(spark, source, rng, live)
    client = LakepropClient(config.kafka, config.state, spark)
    keys = {name: JobKey(1, database, "orders", name) for name in CONSUMERS}
    for name, consumer in CONSUMERS.items():
        client.register_job(
            keys[name], {"trigger": {"kind": "default"}, "iteration": {"consumer": consumer}}
        )

    with running(spark, config):
        for key in keys.values():
            wait_for_watermark(spark, config, key, version_of(spark, source))
        named_commits(spark, source, rng, live)
        latest = version_of(spark, source)
        for key in keys.values():
            wait_for_watermark(spark, config, key, latest)

    assert_df_equality(
        spark.table(f"{database}.orders_copy"), at(spark, source, latest), ignore_row_order=True
    )
    assert_df_equality(
        spark.table(f"{database}.orders_by_name"),
        at(spark, source, latest).select("name", "id"),
        ignore_row_order=True,
    )
    assert_df_equality(
        spark.table(f"{database}.orders_totals").select("name", *AGGREGATE_COLUMNS),
        aggregated(at(spark, source, latest), ["name"], "amount"),
        ignore_row_order=True,
        ignore_nullable=True,
    )

    # Dropped and created again under the same name while the service is down:
    # a new table id at the same location. The jobs must not read it as theirs.
    spark.sql(f"DROP TABLE {source}")
    create_source(spark, source)
    live.clear()
    named_commits(spark, source, rng, live)
    with running(spark, config):
        replaced = wait_for_error(spark, config, keys["copy"], ErrorCode.SOURCE_REPLACED)
        assert "replaced by a new table" in replaced and "re-register" in replaced
        client.unregister_job(keys["copy"])
        client.register_job(
            keys["copy"],
            {"trigger": {"kind": "default"}, "iteration": {"consumer": CONSUMERS["copy"]}},
        )
        latest = version_of(spark, source)
        wait_for_watermark(spark, config, keys["copy"], latest)

    assert_df_equality(
        spark.table(f"{database}.orders_copy"), at(spark, source, latest), ignore_row_order=True
    )
