"""Consumers under a seeded random workload: each equals a from-scratch computation."""

from __future__ import annotations

import json
import random

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import (
    SOURCE_SCHEMA,
    cdf_source,
    history,
    latest_version,
    running,
    ticks_pass,
    wait_for_watermark,
)
from devkit.kafka import read_topic
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

AUDIT = "tests.integration.custom_consumers:AuditConsumer"


def random_commits(
    spark: SparkSession, path: str, rng: random.Random, live: set[int], commits: int
) -> None:
    """Inserts, updates and deletes of random rows, one Delta commit each."""
    table = DeltaTable.forPath(spark, path)
    for _ in range(commits):
        op = rng.choice(["insert", "insert", "update", "delete"]) if live else "insert"
        if op == "insert":
            ids = [max(live | {0}) + i + 1 for i in range(rng.randint(1, 6))]
            rows = [(i, f"c{rng.randint(0, 3)}", float(rng.randint(1, 100))) for i in ids]
            spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(
                path
            )
            live.update(ids)
        elif op == "update":
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 4)))
            table.update(
                F.col("id").isin(ids),
                {
                    "name": F.lit(f"c{rng.randint(0, 3)}"),  # moves rows between index values
                    "amount": F.col("amount") + rng.randint(1, 9),
                },
            )
        else:
            ids = rng.sample(sorted(live), k=min(len(live), rng.randint(1, 3)))
            table.delete(F.col("id").isin(ids))
            live.difference_update(ids)


def at(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def expected_audit(spark: SparkSession, path: str, snapshot: int, upto: int) -> DataFrame:
    base = (
        at(spark, path, snapshot)
        .withColumn("_change_type", F.lit("snapshot"))
        .withColumn("_commit_version", F.lit(snapshot).cast("long"))
    )
    if upto == snapshot:
        return base
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", snapshot + 1)
        .option("endingVersion", upto)
        .load(path)
        .where("_change_type != 'update_preimage'")
        .drop("_commit_timestamp")
    )
    return base.unionByName(changes)


@pytest.mark.floor
@pytest.mark.parametrize("seed", [7])
def test_replica_index_and_a_user_consumer_follow_a_random_workload_sharing_one_scan(
    spark: SparkSession, app_config: AppConfig, seed: int
) -> None:
    rng = random.Random(seed)
    path = cdf_source(spark, app_config, "w", "src")
    live: set[int] = set()
    random_commits(spark, path, rng, live, 3)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    consumers = {
        "copy": {"type": "replica", "options": {"primary_key": ["id"]}},
        "by_name": {
            "type": "secondary_index",
            "options": {"columns": ["name"], "primary_key": ["id"]},
        },
        "audit": {"type": AUDIT, "options": {"primary_key": ["id"]}},
    }
    keys = {name: JobKey(1, "w", "src", name) for name in consumers}
    for name, consumer in consumers.items():
        client.register_job(
            keys[name], {"trigger": {"kind": "default"}, "iteration": {"consumer": consumer}}
        )

    with running(spark, app_config) as app:
        for _ in range(3):  # several commits per tick, and across ticks
            random_commits(spark, path, rng, live, 3)
            ticks_pass(app, 1)  # the next burst lands in a later tick
        latest = latest_version(spark, path)
        rows = {
            name: wait_for_watermark(spark, app_config, key, latest) for name, key in keys.items()
        }

    warehouse = app_config.tables.warehouse
    assert_df_equality(
        spark.read.format("delta").load(f"{warehouse}/w/src_copy"),
        at(spark, path, latest),
        ignore_row_order=True,
    )
    assert_df_equality(
        spark.read.format("delta").load(f"{warehouse}/w/src_by_name"),
        at(spark, path, latest).select("name", "id"),
        ignore_row_order=True,
    )
    iterations = history(spark, app_config).collect()
    snapshot_version = next(
        r["to_version"]
        for r in iterations
        if r["kind"] == "snapshot" and r["members"][0]["job_name"] == "audit"
    )
    assert_df_equality(
        spark.read.format("delta").load(f"{warehouse}/w/src_audit"),
        expected_audit(spark, path, snapshot_version, latest),
        ignore_row_order=True,
        ignore_column_order=True,
    )
    shared = [
        r
        for r in iterations
        if r["kind"] == "tail" and {m["job_name"] for m in r["members"]} == set(consumers)
    ]
    assert shared and all(r["source_scans"] == 1 for r in shared)
    assert all(row["job_state"] == "completed" for row in rows.values())


def read_feed(bootstrap: str, topic: str) -> list[tuple[int, dict, dict]]:
    """Every message of a change feed topic: (partition, key, value), in partition order."""
    messages = read_topic(bootstrap, topic)
    return [(p, json.loads(k) if k is not None else None, json.loads(v)) for p, k, v in messages]


def test_the_kafka_changefeed_publishes_every_change_in_version_order_per_key(
    spark: SparkSession, app_config: AppConfig
) -> None:
    rng = random.Random(11)
    path = cdf_source(spark, app_config, "w", "feed")
    live: set[int] = set()
    random_commits(spark, path, rng, live, 2)
    topic = f"{app_config.kafka.topic}.orders"
    key = JobKey(1, "w", "feed", "feed")
    LakepropClient(app_config.kafka, app_config.state, spark).register_job(
        key,
        {
            "trigger": {"kind": "greedy"},
            "iteration": {
                "consumer": {
                    "type": "kafka_changefeed",
                    "options": {
                        "topic": topic,
                        "bootstrap_servers": app_config.kafka.bootstrap_servers,
                        "primary_key": ["id"],
                    },
                }
            },
        },
    )
    with running(spark, app_config) as app:
        for _ in range(3):
            random_commits(spark, path, rng, live, 3)
            ticks_pass(app, 1)  # the next burst lands in a later tick
        latest = latest_version(spark, path)
        wait_for_watermark(spark, app_config, key, latest)

    messages = read_feed(app_config.kafka.bootstrap_servers, topic)
    # one key lives on one partition, and its versions never go backwards there
    partitions: dict[int, set[int]] = {}
    last_version: dict[int, int] = {}
    for partition, msg_key, value in messages:
        assert msg_key == {"id": value["row"]["id"]}
        partitions.setdefault(msg_key["id"], set()).add(partition)
        assert value["version"] >= last_version.get(msg_key["id"], -1)
        last_version[msg_key["id"]] = value["version"]
    assert all(len(p) == 1 for p in partitions.values())

    # de-duplicated on (version, key, op), the feed replays to the source's state
    seen: set[tuple[int, int, str]] = set()
    state: dict[int, tuple] = {}
    for _, msg_key, value in messages:
        dedupe = (value["version"], msg_key["id"], value["op"])
        if dedupe in seen:
            continue
        seen.add(dedupe)
        row = value["row"]
        if value["op"] == "delete":
            state.pop(row["id"], None)
        else:
            state[row["id"]] = (row["id"], row["name"], row["amount"])
    assert_df_equality(
        spark.createDataFrame(list(state.values()), SOURCE_SCHEMA),
        at(spark, path, latest),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert {v["op"] for _, _, v in messages} >= {"snapshot", "insert", "update", "delete"}


def test_an_aggregate_view_equals_the_batch_query_and_ignores_a_replayed_range(
    spark: SparkSession, app_config: AppConfig
) -> None:
    rng = random.Random(23)
    path = cdf_source(spark, app_config, "w", "sales")
    live: set[int] = set()
    random_commits(spark, path, rng, live, 3)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    key = JobKey(1, "w", "sales", "by_name")
    options = {"group_by": ["name"], "aggregates": aggregates_of("amount")}
    client.register_job(
        key,
        {
            "trigger": {"kind": "greedy"},
            "iteration": {"consumer": {"type": "aggregate_view", "options": options}},
        },
    )
    view_path = f"{app_config.tables.warehouse}/w/sales_by_name"
    public = ["name", *AGGREGATE_COLUMNS]

    with running(spark, app_config) as app:
        wait_for_watermark(spark, app_config, key, latest_version(spark, path))
        for _ in range(3):
            random_commits(spark, path, rng, live, 3)
            version = latest_version(spark, path)
            row = wait_for_watermark(spark, app_config, key, version)
            assert_df_equality(
                spark.read.format("delta").load(view_path).select(*public),
                aggregated(at(spark, path, row["watermark"]), ["name"], "amount"),
                ignore_row_order=True,
                ignore_nullable=True,
            )
        job = next(r for r in app.catalog.rows() if r.key == key)

    # a crash between the view's write and the watermark: the range comes again
    from lakeprop.consumers import get_consumer_type
    from lakeprop.consumers.base import ConsumerContext
    from lakeprop.tables.resolve import Tables

    tables = Tables(spark, app_config.tables)
    session = spark.newSession()
    consumer_type = get_consumer_type("aggregate_view")
    context = ConsumerContext(
        spark=session,
        key=key,
        job_id=job.job_id,
        consumer_type="aggregate_view",
        options=consumer_type.validate_options(options),
        source_columns=("id", "name", "amount"),
        locate=lambda d, t: tables.handle(d, t, session),
        cancelled=lambda: False,
    )
    before = sorted(map(str, spark.read.format("delta").load(view_path).collect()))
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 2)
        .option("endingVersion", version)
        .load(path)
    )
    assert consumer_type.factory(context).apply_changes(changes, 1, version) == 0
    assert sorted(map(str, spark.read.format("delta").load(view_path).collect())) == before
