"""lakeprop on object storage: a real S3 API server (S3Proxy), Spark over ``s3a://``
with lakeprop's log store, and delta-rs beside it.

The server must honour ``If-None-Match: *``, or every later test would pass over
a lost commit: that is checked first. Then Spark and delta-rs race on one table
and every commit is accounted for; the start-up check refuses what is unsafe;
and the service keeps its state, checkpoint and targets on the server across a
restart, running small tails with delta-rs on ``s3a://`` and on Spark on
``s3://`` (mapped to S3A without the log store), saying why. The chaos round on
the server is ``scripts/chaos.sh --s3``; ``scripts/s3_race.py`` shows the race
losing commits with Delta's default log store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable as RustTable
from deltalake import write_deltalake
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import count, lit, udf
from pyspark.sql.functions import sum as sum_

from devkit.chaos import postings
from devkit.harness import (
    cdf_source,
    cdf_table,
    history,
    latest_version,
    running,
    wait_for_watermark,
)
from devkit.iterations import HandDriven
from devkit.s3 import LocalS3, log_audit
from devkit.workload import SCHEMA, Workload
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.consumers.vector_index import live_postings
from lakeprop.engine.native import NativeSettings
from lakeprop.errors import InvalidConfigError
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey
from lakeprop.storage import CONDITIONAL_PUT_LOG_STORE, Storage
from lakeprop.tables.stores import check_storage, session_storage, written_locations
from tests.integration.test_consumers import read_feed

pytestmark = pytest.mark.integration

RACERS = 6
SPARK_COMMITS = 3
RUST_COMMITS_PER_SPARK_COMMIT = 2
REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}
VECTOR_SCHEMA = "id INT, emb ARRAY<FLOAT>"
VECTORS = {"type": "vector_index", "options": {"key": ["id"], "vector": "emb", "lists": 2}}
CONSUMERS = {
    "copy": REPLICA,
    "by_g": {"type": "secondary_index", "options": {"columns": ["g"], "primary_key": ["id"]}},
    "sums": {
        "type": "aggregate_view",
        "options": {
            "group_by": ["g"],
            "aggregates": [{"fn": "count", "as": "n"}, {"fn": "sum", "column": "v", "as": "total"}],
        },
    },
    "latest": {"type": "auto_cdc", "options": {"keys": ["id"], "source_kind": "table"}},
    "text": {"type": "fulltext_index", "options": {"columns": ["body"], "primary_key": ["id"]}},
}


def commit_store(spark: SparkSession) -> Callable[[str, str], bool]:
    """Writes one commit file through lakeprop's log store: True when it won."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    store = jvm.io.lakeprop.delta.S3ConditionalPutLogStore(conf)

    def write(location: str, line: str) -> bool:
        lines = jvm.java.util.ArrayList()
        lines.add(line)
        try:
            store.write(jvm.org.apache.hadoop.fs.Path(location), lines.iterator(), False, conf)
        except Py4JJavaError as exc:
            refused = exc.java_exception.getClass().getName()
            assert refused == "java.nio.file.FileAlreadyExistsException", refused
            return False
        return True

    return write


@pytest.mark.floor
def test_the_server_lets_exactly_one_of_racing_commits_win(
    spark: SparkSession, s3: LocalS3, bucket: str
) -> None:
    """A server that ignored ``If-None-Match`` would let every racer win; one that
    did not apply it atomically, several. Either fails the run here."""
    write = commit_store(spark)
    name = bucket.removeprefix("s3a://")
    for version in range(10):
        location = f"{bucket}/race/_delta_log/{version:020d}.json"
        lines = [json.dumps({"racer": racer}) for racer in range(RACERS)]
        with ThreadPoolExecutor(RACERS) as pool:
            won = list(pool.map(write, [location] * RACERS, lines))
        assert won.count(True) == 1, won
        stored = s3.store / name / "race" / "_delta_log" / f"{version:020d}.json"
        assert json.loads(stored.read_text()) == {"racer": won.index(True)}


@pytest.mark.floor
def test_spark_and_delta_rs_racing_on_one_table_lose_no_commit(
    spark: SparkSession, s3: LocalS3, bucket: str
) -> None:
    """Each commit adds one row with a token of its own. Every Spark append computes
    its row with a function that commits to the same table with delta-rs first, so
    Spark's commit always finds the version it read taken: the server must refuse
    it, and Delta retry it. Every commit of either engine is then in the table, in
    contiguous versions, read the same by both."""
    path = f"{bucket}/race"
    schema = "token STRING, writer STRING"
    spark.createDataFrame([("created", "spark")], schema).write.format("delta").save(path)
    options = session_storage(spark, AppConfig()).options(path)

    def commit_with_delta_rs_first(i: int) -> str:
        for j in range(RUST_COMMITS_PER_SPARK_COMMIT):
            data = pa.table({"token": [f"rs-{i}-{j}"], "writer": ["delta-rs"]})
            write_deltalake(path, data, mode="append", storage_options=options)
        return f"spark-{i}"

    racing = udf(commit_with_delta_rs_first, "string").asNondeterministic()
    for i in range(SPARK_COMMITS):
        frame = spark.range(1).select(racing(lit(i)).alias("token"), lit("spark").alias("writer"))
        frame.write.format("delta").mode("append").save(path)
    committed = [("created", "spark")] + [
        (token, writer)
        for i in range(SPARK_COMMITS)
        for token, writer in [
            (f"rs-{i}-{j}", "delta-rs") for j in range(RUST_COMMITS_PER_SPARK_COMMIT)
        ]
        + [(f"spark-{i}", "spark")]
    ]
    expected = spark.createDataFrame(committed, schema)
    assert_df_equality(spark.read.format("delta").load(path), expected, ignore_row_order=True)
    rust = RustTable(path, storage_options=options)
    read_by_rust = [(r["token"], r["writer"]) for r in rust.to_pyarrow_table().to_pylist()]
    assert sorted(read_by_rust) == sorted(committed)
    assert rust.version() == len(committed) - 1  # one version per commit, none lost
    table = path.removeprefix("s3a://")
    refused = [
        r
        for r in s3.requests()
        if r.method == "PUT"
        and r.key.startswith(f"{table}/_delta_log/")
        and r.error == "PreconditionFailed"
    ]
    assert len(refused) >= SPARK_COMMITS, refused  # each Spark commit lost its first try
    assert [p for p in log_audit(s3) if table in p] == []


def test_a_cluster_on_commits_that_exclude_no_other_instance_refuses_to_start(
    spark: SparkSession, app_config: AppConfig, bucket: str
) -> None:
    """``s3://`` is S3A without lakeprop's log store here: Delta's default store."""
    unsafe = bucket.replace("s3a://", "s3://")
    config = replace(
        app_config,
        state=replace(app_config.state, location=f"{unsafe}/state"),
        cluster=replace(app_config.cluster, enabled=True),
    )
    with pytest.raises(InvalidConfigError) as refused:
        PropagationApp(spark, config)
    assert f"commits to {unsafe}/state go through S3SingleDriverLogStore" in str(refused.value)
    assert f"spark.delta.logStore.s3.impl={CONDITIONAL_PUT_LOG_STORE}" in str(refused.value)
    safe = replace(config, state=replace(config.state, location=f"{bucket}/state"))
    storage = session_storage(spark, safe)
    assert check_storage(spark, storage, written_locations(spark, safe), cluster=True) == []


def test_a_log_store_that_is_not_on_the_classpath_refuses_the_start(
    spark: SparkSession, bucket: str
) -> None:
    storage = Storage(log_stores={"spark.delta.logStore.s3a.impl": "io.example.NoSuchLogStore"})
    with pytest.raises(
        InvalidConfigError, match=r"io\.example\.NoSuchLogStore is not on the classpath"
    ):
        check_storage(spark, storage, [f"{bucket}/state"], cluster=False)


def write_vectors(spark: SparkSession, path: str, ids: range) -> None:
    """Upserts vectors ``ids`` (a vector a function of its id and the batch)."""
    rows = [(i, [float(i % 7), float(ids.start + i % 3)]) for i in ids]
    spark.createDataFrame(rows, VECTOR_SCHEMA).createOrReplaceTempView("vectors_in")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING vectors_in s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )


@pytest.mark.slow
def test_the_service_on_object_storage_keeps_its_targets_exact_across_a_restart(
    spark: SparkSession, app_config: AppConfig, bucket: str
) -> None:
    """State, checkpoint and tables on the S3 server, a job of every consumer: a
    replica and an index (small tails with delta-rs), an aggregate view, an
    ``auto_cdc`` table, a full-text index, a Kafka change feed and a vector index
    (on Spark). The service stops, the sources change, it starts again on its
    checkpoint, and every target equals its source's query."""
    config = replace(
        app_config,
        state=replace(
            app_config.state,
            location=f"{bucket}/state",
            checkpoint_location=f"{bucket}/checkpoint",
            lease_ttl=8.0,
        ),
        tables=replace(app_config.tables, warehouse=f"{bucket}/warehouse"),
        engine=replace(app_config.engine, small_iterations="auto"),
    )
    path = cdf_source(spark, config, "shop", "quick", SCHEMA)
    vectors = cdf_source(spark, config, "shop", "vecs", VECTOR_SCHEMA)
    workload = Workload(spark, path, seed=3)
    feed = {
        "type": "kafka_changefeed",
        "options": {
            "topic": f"{config.kafka.topic}.feed",
            "bootstrap_servers": config.kafka.bootstrap_servers,
            "primary_key": ["id"],
        },
    }
    jobs = {
        JobKey(1, "shop", "quick", name): consumer
        for name, consumer in {**CONSUMERS, "feed": feed}.items()
    } | {JobKey(1, "shop", "vecs", "near"): VECTORS}
    client = LakepropClient(config.kafka, config.state, spark)
    for key, consumer in jobs.items():
        client.register_job(
            key, {"trigger": {"kind": "greedy"}, "iteration": {"consumer": consumer}}
        )

    def caught_up() -> None:
        for key in jobs:
            source = path if key.table == "quick" else vectors
            wait_for_watermark(spark, config, key, latest_version(spark, source))

    write_vectors(spark, vectors, range(0, 40))
    with running(spark, config):
        caught_up()
        workload.burst(1)
        workload.update()
        write_vectors(spark, vectors, range(30, 50))
        caught_up()
    workload.burst(1)
    spark.sql(f"DELETE FROM delta.`{vectors}` WHERE id < 5")
    with running(spark, config):  # again, on the first run's checkpoint
        caught_up()
    client.close()
    tails = history(spark, config).where("kind = 'tail'").collect()
    assert {r["path"] for r in tails} == {"native", "spark"}
    assert_tables_follow(spark, f"{config.tables.warehouse}/shop", path)
    assert_vectors_follow(spark, f"{config.tables.warehouse}/shop", vectors)
    assert_feed_follows(spark, config.kafka.bootstrap_servers, feed["options"]["topic"], path)


def assert_tables_follow(spark: SparkSession, database: str, path: str) -> None:
    """The Delta targets of source ``quick``: each equals its query of the source."""
    source = spark.read.format("delta").load(path)

    def target(name: str) -> DataFrame:
        return spark.read.format("delta").load(f"{database}/quick_{name}")

    expected = {
        "copy": source,
        "by_g": source.select("g", "id"),
        "sums": source.groupBy("g").agg(count("*").alias("n"), sum_("v").alias("total")),
        "latest": source,
    }
    for name, rows in expected.items():
        assert_df_equality(
            target(name).select(*rows.columns),
            rows,
            ignore_row_order=True,
            ignore_nullable=True,
            ignore_column_order=True,
        )
    terms = sorted(
        (term, r["id"], "body", len(at), at)
        for r in source.collect()
        for term, at in postings(r["body"]).items()
    )
    assert terms == sorted(
        (r["term"], r["id"], r["field"], r["tf"], list(r["positions"]))
        for r in target("text").collect()
    )


def assert_vectors_follow(spark: SparkSession, database: str, path: str) -> None:
    """The live index version's postings hold every vector of the source, once."""
    live = live_postings(
        spark.read.format("delta").load(f"{database}/vecs_near"),
        spark.read.format("delta").load(f"{database}/vecs_near__index"),
        "emb",
    )
    assert live is not None
    assert_df_equality(
        live.select("id", "emb"),
        spark.read.format("delta").load(path).select("id", "emb"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def assert_feed_follows(spark: SparkSession, bootstrap: str, topic: str, path: str) -> None:
    """De-duplicated on (version, key, op), the change feed replays to the source."""
    source = spark.read.format("delta").load(path)
    state: dict[int, tuple[object, ...]] = {}
    seen: set[tuple[int, int, str]] = set()
    for _, key, value in read_feed(bootstrap, topic):
        if (value["version"], key["id"], value["op"]) in seen:
            continue
        seen.add((value["version"], key["id"], value["op"]))
        if value["op"] == "delete":
            state.pop(key["id"], None)
        else:
            state[key["id"]] = tuple(value["row"][c] for c in source.columns)
    assert_df_equality(
        spark.createDataFrame(list(state.values()), SCHEMA), source, ignore_row_order=True
    )


def test_on_s3_without_the_log_store_a_small_tail_runs_on_spark_and_says_why(
    spark: SparkSession, bucket: str
) -> None:
    """``s3://`` is S3A without lakeprop's log store here: delta-rs must not commit
    beside Spark, so the tail runs on Spark, and its result says why."""
    warehouse = bucket.replace("s3a://", "s3://") + "/warehouse"
    path = f"{warehouse}/shop/quick"
    cdf_table(spark, path, SCHEMA)
    workload = Workload(spark, path, seed=5)
    workload.burst(1)
    driver = HandDriven(
        spark,
        warehouse,
        JobKey(1, "shop", "quick", "copy"),
        REPLICA,
        native=NativeSettings(storage=session_storage(spark, AppConfig())),
    )
    driver.snapshot(latest_version(spark, path))
    workload.burst(1)
    tail = driver.tail(latest_version(spark, path))
    assert tail.path == "spark"
    assert tail.path_note.startswith(f"the native path is off: commits to {warehouse}/shop/")
    assert "S3SingleDriverLogStore" in tail.path_note
    assert_df_equality(driver.read(), spark.read.format("delta").load(path), ignore_row_order=True)
