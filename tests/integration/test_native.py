"""The native path: small tails MERGEd, and small snapshots written, by delta-rs in
the driver, equal to Spark's.

Every version of a replica and a secondary index is compared whole with the source
at the version it records, in both modes (``auto``: native where it can, ``spark``:
never), and of three aggregate views with their query of the source natively; one
target is written by both
paths in turn; each fallback (a target with row tracking, a change set over the
bound, storage delta-rs cannot reach) runs on Spark and ends equal; the running
service records the path each iteration took.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import (
    cdf_source,
    history,
    latest_version,
    running,
    wait_for_watermark,
)
from devkit.iterations import HandDriven, recorded_versions
from devkit.kafka import read_topic
from devkit.workload import SCHEMA, Workload
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, KafkaConfig
from lakeprop.dev.localkafka import LocalKafka
from lakeprop.engine.native import NativeSettings
from lakeprop.kafka import create_topic
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

JOBS = {
    "copy": ({"type": "replica", "options": {"primary_key": ["id"]}}, ["id", "g", "v", "body"]),
    "by_g": (
        {"type": "secondary_index", "options": {"columns": ["g"], "primary_key": ["id"]}},
        ["g", "id"],
    ),
}
VIEWS = {
    "per_g": ["g"],
    "per_g_and_v": ["g", "v"],
    "whole": [],
}
"""Aggregate views of ``v`` (every function): by ``g`` (a NULL group among them), by
two columns, and over the whole table."""


def source_table(spark: SparkSession, warehouse: Path) -> str:
    path = f"{warehouse}/p/src"
    DeltaTable.create(spark).location(path).addColumns(
        spark.createDataFrame([], SCHEMA).schema
    ).property("delta.enableChangeDataFeed", "true").execute()
    return path


def set_property(spark: SparkSession, path: str, name: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({name} = true)")


def at(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


@pytest.mark.parametrize("mode", ["auto", "spark"])
def test_every_version_of_each_table_consumer_equals_its_query_of_the_source_in_both_modes(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    path = source_table(spark, tmp_path)
    workload = Workload(spark, path, seed=8)
    workload.burst(3)
    settings = NativeSettings(mode=mode)
    consumers = {name: consumer for name, (consumer, _) in JOBS.items()}
    views = VIEWS if mode == "auto" else {}  # on Spark: test_every_version's, and others
    for name, group_by in views.items():
        options = {"group_by": group_by, "aggregates": aggregates_of("v")}
        consumers[name] = {"type": "aggregate_view", "options": options}
    drivers = {
        name: HandDriven(
            spark, str(tmp_path), JobKey(1, "p", "src", name), consumer, native=settings
        )
        for name, consumer in consumers.items()
    }
    for driver in drivers.values():
        driver.snapshot(latest_version(spark, path))
    rng = random.Random(4)
    paths = set()
    for step in range(6):
        if step < 5:
            workload.burst(rng.randint(1, 3))
            workload.update()  # rows the targets hold already: updated, then deleted
            workload.delete()
        else:  # the largest value goes: the views take their maximum from the source
            (largest,) = spark.read.format("delta").load(path).agg({"v": "max"}).first() or [0]
            spark.sql(f"DELETE FROM delta.`{path}` WHERE v = {largest}")
        for driver in drivers.values():
            paths.add(driver.tail(latest_version(spark, path)).path)
    assert paths == ({"native"} if mode == "auto" else {"spark"})
    deleted = DeltaTable.forPath(spark, drivers["copy"].path()).history().collect()
    assert any(  # the ranges deleted rows the replica held (Spark and delta-rs name it apart)
        int((r["operationMetrics"] or {}).get(name) or 0)
        for r in deleted
        for name in ("numTargetRowsDeleted", "num_target_rows_deleted")
    )
    for name, driver in drivers.items():
        for sink, source in sorted(recorded_versions(driver.path(), driver.job_id).items()):
            if name in views:
                columns = [*VIEWS[name], *AGGREGATE_COLUMNS]
                expected = aggregated(at(spark, path, source), VIEWS[name], "v")
            else:
                columns = JOBS[name][1]
                expected = at(spark, path, source)
            assert_df_equality(
                driver.read(version=sink).select(*columns),
                expected.select(*columns),
                ignore_row_order=True,
                ignore_nullable=True,
            )


def test_both_paths_write_one_target_in_turn_and_its_feed_shows_every_change(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = source_table(spark, tmp_path)
    workload = Workload(spark, path, seed=2)
    workload.burst(2)
    driver = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "p", "src", "copy"),
        JOBS["copy"][0],
        native=NativeSettings(),
    )
    driver.snapshot(latest_version(spark, path))
    spark.sql(
        f"ALTER TABLE delta.`{driver.path()}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    feed_from = latest_version(spark, driver.path()) + 1
    taken = []
    for native in (True, False, True, False):
        workload.burst(2)
        driver.native = NativeSettings() if native else None
        taken.append(driver.tail(latest_version(spark, path)).path)
        assert_df_equality(
            driver.read().select(*JOBS["copy"][1]),
            spark.read.format("delta").load(path),
            ignore_row_order=True,
            ignore_nullable=True,
        )
    assert taken == ["native", "spark", "native", "spark"]
    # replaying the target's own change feed over its starting state gives the target
    start = {r["id"]: tuple(r) for r in at(spark, driver.path(), feed_from - 1).collect()}
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", feed_from)
        .load(driver.path())
        .where("_change_type != 'update_preimage'")
        .collect()
    )
    for row in sorted(feed, key=lambda r: (r["_commit_version"], r["_change_type"] != "delete")):
        if row["_change_type"] == "delete":
            start.pop(row["id"])
        else:
            start[row["id"]] = (row["id"], row["g"], row["v"], row["body"])
    assert sorted(start.values(), key=str) == sorted(
        (tuple(r) for r in driver.read().select(*JOBS["copy"][1]).collect()), key=str
    )


def test_each_fallback_runs_on_spark_and_ends_equal(spark: SparkSession, tmp_path: Path) -> None:
    # storage delta-rs cannot reach: a Hadoop mount table (viewfs) over the local disk
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    spark.sparkContext._jsc.hadoopConfiguration().set(  # type: ignore[union-attr]
        "fs.viewfs.mounttable.lakeprop-test.link./wh", f"file://{mounted}"
    )
    cases = {
        "row_tracking": (str(tmp_path / "plain"), NativeSettings()),
        "over_the_bound": (str(tmp_path / "bounded"), NativeSettings(max_rows=3)),
        "unreachable": ("viewfs://lakeprop-test/wh", NativeSettings()),
    }
    for name, (warehouse, settings) in cases.items():
        path = source_table(spark, warehouse)  # type: ignore[arg-type]
        workload = Workload(spark, path, seed=1)
        workload.burst(2)
        driver = HandDriven(
            spark, warehouse, JobKey(1, "p", "src", "copy"), JOBS["copy"][0], native=settings
        )
        driver.snapshot(latest_version(spark, path))
        if name == "row_tracking":
            set_property(spark, driver.path(), "delta.enableRowTracking")
        workload.insert(5)  # five change rows: over a bound of three
        assert driver.tail(latest_version(spark, path)).path == "spark", name
        assert_df_equality(
            driver.read().select(*JOBS["copy"][1]),
            spark.read.format("delta").load(path),
            ignore_row_order=True,
            ignore_nullable=True,
        )


def test_a_delete_that_removes_a_file_with_a_deletion_vector_runs_on_spark(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A file whose row 2 a deletion vector took, then a delete of its last row: Delta
    removes the file, and its change feed holds a delete of row 1. delta-rs 1.x reads
    that remove's rows from the vector inverted (row 2 again), so natively the
    replica would keep row 1."""
    path = source_table(spark, tmp_path)
    set_property(spark, path, "delta.enableDeletionVectors")
    driver = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "p", "src", "copy"),
        JOBS["copy"][0],
        native=NativeSettings(),
    )
    spark.createDataFrame([(i, "g", i, "b") for i in range(1, 4)], SCHEMA).coalesce(1).write.format(
        "delta"
    ).mode("append").save(path)
    driver.snapshot(latest_version(spark, path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 2")
    assert driver.tail(latest_version(spark, path)).path == "native"  # a vector: delta-rs reads it
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id IN (1, 3)")
    tail = driver.tail(latest_version(spark, path))
    assert_df_equality(
        driver.read().select(*JOBS["copy"][1]),
        spark.read.format("delta").load(path),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert (tail.path, tail.path_note) == (
        "spark",
        f"commit {latest_version(spark, path)} of the source removes a file with a deletion "
        "vector, whose change rows delta-rs reads wrong",
    )


SNAPSHOT_SCHEMA = (
    "id INT NOT NULL, name STRING, amount DOUBLE, ratio FLOAT, ok BOOLEAN, day DATE, "
    "at TIMESTAMP, price DECIMAL(10,2), emb ARRAY<FLOAT>, b TINYINT, bin BINARY, "
    "ntz TIMESTAMP_NTZ"
)


def test_a_small_snapshot_is_written_in_the_driver_as_spark_writes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A replica's snapshot of a small table, natively and on Spark: the same schema
    (every column nullable), rows and change feed property; a replay writes nothing;
    a re-snapshot over the target replaces it; what Spark must write stays there."""
    path = f"{tmp_path}/p/src"
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({SNAPSHOT_SCHEMA}) USING DELTA PARTITIONED BY (ok) "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    spark.sql(
        f"INSERT INTO delta.`{path}` VALUES (1, 'a', 1.5, 2.5, true, DATE'2020-01-01', "
        "TIMESTAMP'2020-01-01 10:00:00.123456', 1.23, array(1.0, null), 1, X'00ff', "
        "TIMESTAMP_NTZ'2021-01-01 00:00:00'), "
        "(2, null, null, null, null, null, null, null, null, null, null, null)"
    )
    copy = JOBS["copy"][0]
    drivers = {
        mode: HandDriven(
            spark,
            str(tmp_path),
            JobKey(1, "p", "src", mode),
            copy,
            native=NativeSettings() if mode == "native" else None,
        )
        for mode in ("native", "spark")
    }
    version = latest_version(spark, path)
    done = {mode: driver.snapshot(version) for mode, driver in drivers.items()}
    assert (done["native"].path, done["native"].spark_jobs) == ("native", 0)
    assert done["spark"].path == "spark"
    native, spark_side = (drivers[m].read() for m in ("native", "spark"))
    assert_df_equality(native, spark_side, ignore_row_order=True)  # nullability too
    assert_df_equality(
        native, at(spark, path, version), ignore_row_order=True, ignore_nullable=True
    )
    for driver in drivers.values():
        properties = DeltaTable.forPath(spark, driver.path()).detail().first()["properties"]
        assert properties["delta.enableChangeDataFeed"] == "true"

    target_version = latest_version(spark, drivers["native"].path())
    drivers["native"].snapshot(version)  # a replay: the job's transaction is there
    assert latest_version(spark, drivers["native"].path()) == target_version

    spark.sql(f"UPDATE delta.`{path}` SET name = 'z', id = 3 WHERE id = 1")
    spark.sql(f"INSERT INTO delta.`{path}` (id, ok) VALUES (4, false)")
    resync = drivers["native"].snapshot(latest_version(spark, path))
    assert resync.path == "native"
    assert_df_equality(
        drivers["native"].read(),
        spark.read.format("delta").load(path),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", target_version + 1)
        .load(drivers["native"].path())
    )
    assert sorted((r["id"], r["_change_type"]) for r in feed.collect()) == [
        (1, "delete"),
        (2, "delete"),
        (2, "insert"),
        (3, "insert"),
        (4, "insert"),
    ]

    # what keeps a snapshot on Spark, said in its note, and the target still exact
    spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS (m MAP<STRING, INT>)")
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN name COMMENT 'who'")
    version = latest_version(spark, path)

    def two(column: str) -> dict[str, Any]:
        return {"type": "replica", "options": {"primary_key": ["id"], "columns": ["id", column]}}

    quarantined = HandDriven(spark, str(tmp_path), JobKey(1, "p", "src", "q"), two("amount"))
    spark.range(1).write.format("delta").save(quarantined.path("__quarantine"))
    cases = {
        "m": (copy, NativeSettings(), "column(s) ['m'] are of a nested type"),
        "few": (
            two("amount"),
            NativeSettings(max_rows=2),
            "more than 2 rows (engine.native_max_rows)",
        ),
        "noted": (
            two("name"),
            NativeSettings(),
            "column(s) ['name'] carry metadata (a comment, say)",
        ),
        "q": (
            two("amount"),
            NativeSettings(),
            f"a snapshot empties {quarantined.path('__quarantine')}",
        ),
    }
    for name, (consumer, settings, note) in cases.items():
        driver = HandDriven(
            spark, str(tmp_path), JobKey(1, "p", "src", name), consumer, native=settings
        )
        result = driver.snapshot(version)
        assert (result.path, result.path_note) == ("spark", note), name
        columns = (
            consumer["options"].get("columns") or spark.read.format("delta").load(path).columns
        )
        assert_df_equality(  # ordered by hand: a map column has no hash to sort by
            driver.read().orderBy("id"),
            at(spark, path, version).select(*columns).orderBy("id"),
            ignore_nullable=True,
        )


def test_the_service_runs_small_tails_natively_and_records_the_path(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "shop", "quick", SCHEMA)
    workload = Workload(spark, path, seed=3)
    key = JobKey(1, "shop", "quick", "copy")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    client.register_job(
        key, {"trigger": {"kind": "greedy"}, "iteration": {"consumer": JOBS["copy"][0]}}
    )
    config = replace(app_config, engine=replace(app_config.engine, small_iterations="auto"))
    with running(spark, config):
        wait_for_watermark(spark, config, key, 0)
        for _ in range(2):
            workload.burst(1)
            wait_for_watermark(spark, config, key, latest_version(spark, path))
    runs = history(spark, config).collect()
    tails = [r for r in runs if r["kind"] == "tail"]
    assert tails and {r["path"] for r in tails} == {"native"}
    assert {r["spark_jobs"] for r in tails} == {0}
    # the first snapshot of a small table too
    assert [(r["path"], r["spark_jobs"]) for r in runs if r["kind"] == "snapshot"] == [
        ("native", 0)
    ]
    assert_df_equality(
        spark.read.format("delta").load(f"{config.tables.warehouse}/shop/quick_copy"),
        spark.read.format("delta").load(path),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    client.close()


FEED_SCHEMA = (
    "id INT, name STRING, amount DOUBLE, ratio FLOAT, ok BOOLEAN, day DATE, at TIMESTAMP, "
    "price DECIMAL(10,2), emb ARRAY<FLOAT>"
)


def test_a_feed_publishes_the_same_messages_to_the_same_partitions_on_both_paths(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    """Two ``kafka_changefeed`` jobs of a partitioned source, one always on Spark and one native
    where it can, each to a topic of its own: after a snapshot, inserts, updates, a
    key-changing update and deletes, both topics hold the same messages, byte for byte, in the
    same partitions and order. A column type only Spark's JSON writer writes keeps
    the native one's tail on Spark, saying so."""
    path = f"{tmp_path}/p/src"
    DeltaTable.create(spark).location(path).addColumns(
        spark.createDataFrame([], FEED_SCHEMA).schema
    ).partitionedBy("ok").property("delta.enableChangeDataFeed", "true").execute()
    table = f"delta.`{path}`"  # partitioned by a middle column: delta-rs reads it last
    spark.sql(
        f"INSERT INTO {table} VALUES "
        "(1, 'a', 1.5, 0.1, true, date'2026-01-02', timestamp'2026-01-02 03:04:05.123456', "
        "1.50, array(0.1, 0.25)), "
        "(2, 'b\"é', 1e10, 3.0, false, date'2026-02-03', timestamp'2026-02-03 00:00:00', "
        "-2.00, null), "
        "(3, null, null, null, null, null, null, null, array())"
    )
    drivers = {}
    for name in ("spark", "native"):
        topic = f"feed-{name}-{uuid.uuid4().hex[:8]}"
        create_topic(KafkaConfig(kafka.bootstrap_servers), topic, 3, {}, 30.0)
        feed = {
            "type": "kafka_changefeed",
            "options": {
                "topic": topic,
                "bootstrap_servers": kafka.bootstrap_servers,
                "primary_key": ["id"],
            },
        }
        drivers[name] = (
            topic,
            HandDriven(
                spark,
                str(tmp_path),
                JobKey(1, "p", "src", name),
                feed,
                native=NativeSettings() if name == "native" else None,
            ),
        )
        snapshot = drivers[name][1].snapshot(latest_version(spark, path))
        assert snapshot.path == name, snapshot.path_note
    for statement in (
        f"UPDATE {table} SET amount = amount * 2, name = 'c' WHERE id = 1",
        # doubles whose digits the JDK chooses (17's are not always the shortest),
        # and a control character, which Jackson escapes in upper-case hex
        f"INSERT INTO {table} VALUES (4, 'd\\u000Be', 1e23, 1e10, true, date'2026-03-04', "
        "timestamp'2026-03-04 05:06:07.5', 12.34, array(1.0)), "
        "(6, 'f', 4.9E-324, 1.4E-45, false, null, null, 0.01, array(cast('NaN' as float)))",
        f"UPDATE {table} SET id = 5 WHERE id = 2",  # the key changes: a delete and an insert
        f"DELETE FROM {table} WHERE id = 3",
    ):
        spark.sql(statement)
        version = latest_version(spark, path)
        paths = {name: driver.tail(version).path for name, (_, driver) in drivers.items()}
        assert paths == {"spark": "spark", "native": "native"}, paths

    published = {name: read_topic(kafka.bootstrap_servers, t) for name, (t, _) in drivers.items()}
    assert len(published["native"]) == len(published["spark"])
    assert by_key(published["native"]) == by_key(published["spark"])  # Kafka's order: a key's
    ops = [json.loads(value)["op"] for _, _, value in published["native"]]
    assert sorted(set(ops)) == ["delete", "insert", "snapshot", "update"]

    # a map column: Spark's JSON writer alone writes it
    spark.sql(f"ALTER TABLE {table} ADD COLUMNS (tags MAP<STRING, INT>)")
    _, driver = drivers["native"]
    driver.tail(latest_version(spark, path))  # a metadata change: Spark reads it
    spark.sql(f"UPDATE {table} SET tags = map('x', 1) WHERE id = 1")
    result = driver.tail(latest_version(spark, path))
    assert result.path == "spark" and "tags" in result.path_note, result.path_note


def by_key(messages: list[tuple[int, bytes | None, bytes]]) -> dict[tuple[int, bytes], list[bytes]]:
    """Each (partition, key)'s messages in order: what Kafka keeps in order."""
    out: dict[tuple[int, bytes], list[bytes]] = {}
    for partition, key, value in messages:
        out.setdefault((partition, key or b""), []).append(value)
    return out
