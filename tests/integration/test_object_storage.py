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
from devkit.harness import cdf_source, history, latest_version, running, wait_for_watermark
from devkit.iterations import HandDriven
from devkit.s3 import LocalS3, log_audit
from devkit.workload import SCHEMA, Workload
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.engine.native import NativeSettings
from lakeprop.errors import InvalidConfigError
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey
from lakeprop.storage import CONDITIONAL_PUT_LOG_STORE, Storage
from lakeprop.tables.stores import check_storage, session_storage, written_locations

pytestmark = pytest.mark.integration

RACERS = 6
SPARK_COMMITS = 3
RUST_COMMITS_PER_SPARK_COMMIT = 2
REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}
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


def test_the_service_on_object_storage_keeps_its_targets_exact_across_a_restart(
    spark: SparkSession, app_config: AppConfig, bucket: str
) -> None:
    """State, checkpoint and tables on the S3 server; a replica and an index (small
    tails with delta-rs on ``s3a://``), an aggregate view, an ``auto_cdc`` table and
    a full-text index (on Spark); the service stops, the source changes, it starts again on its
    checkpoint. Every target equals its source's query; on ``s3://`` (no log store)
    the same tail runs on Spark and says why."""
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
    workload = Workload(spark, path, seed=3)
    client = LakepropClient(config.kafka, config.state, spark)
    keys = {name: JobKey(1, "shop", "quick", name) for name in CONSUMERS}
    for name, consumer in CONSUMERS.items():
        client.register_job(
            keys[name], {"trigger": {"kind": "greedy"}, "iteration": {"consumer": consumer}}
        )
    with running(spark, config):
        for key in keys.values():
            wait_for_watermark(spark, config, key, 0)
        workload.burst(1)
        workload.update()
        for key in keys.values():
            wait_for_watermark(spark, config, key, latest_version(spark, path))
    workload.burst(1)
    with running(spark, config):  # again, on the first run's checkpoint
        for key in keys.values():
            wait_for_watermark(spark, config, key, latest_version(spark, path))
    client.close()
    tails = history(spark, config).where("kind = 'tail'").collect()
    assert {r["path"] for r in tails} == {"native", "spark"}
    source = spark.read.format("delta").load(path)

    def target(name: str) -> DataFrame:
        return spark.read.format("delta").load(f"{config.tables.warehouse}/shop/quick_{name}")

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
    # the same tail on s3:// runs on Spark, and the result says why
    unsafe = bucket.replace("s3a://", "s3://")
    unsafe_source = f"{unsafe}/warehouse/shop/quick"
    driver = HandDriven(
        spark,
        f"{unsafe}/warehouse",
        JobKey(1, "shop", "quick", "again"),
        REPLICA,
        native=NativeSettings(storage=session_storage(spark, config)),
    )
    driver.snapshot(latest_version(spark, unsafe_source) - 1)
    tail = driver.tail(latest_version(spark, unsafe_source))
    assert tail.path == "spark"
    assert tail.path_note.startswith("the native path is off: commits to ")
    assert "S3SingleDriverLogStore" in tail.path_note
    assert_df_equality(
        driver.read(), spark.read.format("delta").load(unsafe_source), ignore_row_order=True
    )
