"""Chain: events, then an SCD type 1 table, then an aggregate view, then a Kafka feed.

A pipeline of three steps under a trickle of commits, built two ways:

* lakeprop: three jobs, each reading the target of the one before: ``auto_cdc``
  (SCD type 1) on the event table, ``aggregate_view`` (per ``name``: the rows,
  the total, the latest sequence) on its target, and ``kafka_changefeed`` on the
  view. Commit notifications are on and the writer announces its commits to the
  event table only: the later steps are due because the step before wrote.
  It runs twice, with five expectations on the first job (all kept: their
  cost, not their effect, is measured) and then without, each with three
  iteration workers, one per step; then, without the rules, on two instances
  (``spark-submit.sh`` processes of one core each, the same two cores between
  them) sharing the tables through the membership group, so that a step's
  next one may be served by the other instance: the commit announcement
  crosses between them (its baseline is the one in-process instance, on both
  cores, of the run without rules);
* DIY: the same chain as three Structured Streaming queries, each with a
  ``processingTime`` trigger (``trigger`` seconds): the event table's new rows
  MERGEd (latest event per key, newer sequence wins) into an SCD type 1 table;
  that table's change feed re-aggregating the groups it touched into the view;
  the view's change feed written to a topic by Spark's Kafka sink. Each step
  waits for its own trigger.

Each commit appends one event, written with delta-rs as a writer outside this
Spark would. Its **end-to-end latency** is from its commit to the first message
on the side's topic whose group holds its sequence (the message's timestamp);
**one step's latency** is from its commit to the SCD type 1 table's commit that
holds it. The target: end-to-end p50 at most 1.5 x one step's. The driver's CPU
(the JVM and this process) is measured over each side's trickle.

The check: each side's view equals the aggregate of the latest event per key,
and the last message of every group on its topic equals the view's row.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bench.common import Figure, Result, app_config, eventually, percentile, same_rows
from bench.latency import _commit_time, _diy_visible, _lakeprop_visible
from bench.many import cpu_seconds, jvm_pid
from devkit.instances import Instance, settled, small_data_conf, stopped_at_exit
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, ClusterConfig
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey
from lakeprop.state.store import HISTORY_TABLE

TITLE = "chain"
"""The benchmark's name in its results."""

SCHEMA = "id LONG, seq LONG, name STRING, amount DOUBLE"
AGGREGATES = [
    {"fn": "count", "as": "n"},
    {"fn": "sum", "column": "amount", "as": "total"},
    {"fn": "max", "column": "seq", "as": "last"},
]
RULES = [
    {"name": "id_known", "check": "id IS NOT NULL", "action": "drop"},
    {"name": "sequenced", "check": "seq > 0", "action": "drop"},
    {"name": "named", "check": "name IS NOT NULL AND length(name) < 40", "action": "warn"},
    {"name": "not_negative", "check": "amount >= 0", "action": "warn"},
    {"name": "one_event_per_sequence", "unique": ["id", "seq"], "action": "fail"},
]
"""Five rules on the first job, every event keeps them; the last is checked on the
keys each range wrote, against the event table at the range's end."""
STEP_SOURCES = ("events", "events_scd1", "events_scd1_agg")
"""The table each step reads, in the chain's order."""
WORKERS = 3
"""The service's iteration workers: one per step, as the DIY side runs three queries."""
BOUND_S = 180
"""How long a side gets to deliver every commit to its topic."""


@dataclass(frozen=True)
class Settings:
    keys: int
    groups: int
    preload: int
    trickle: int
    trigger: int


@dataclass
class Measured:
    e2e_p50: float = float("nan")
    e2e_p95: float = float("nan")
    step_p50: float = float("nan")
    step_p95: float = float("nan")
    cpu: float = 0.0
    delivered: bool = False
    equal: bool = False


def _event(n: int, settings: Settings) -> dict[str, Any]:
    return {
        "id": n % settings.keys,
        "seq": settings.preload + n,
        "name": f"g{n % settings.groups}",
        "amount": float(n % 97),
    }


def _events_table(spark: SparkSession, path: str, settings: Settings) -> None:
    schema = spark.createDataFrame([], SCHEMA).schema
    DeltaTable.create(spark).location(path).addColumns(schema).property(
        "delta.enableChangeDataFeed", "true"
    ).execute()
    spark.createDataFrame(
        [tuple(_event(n - settings.preload, settings).values()) for n in range(settings.preload)],
        schema,
    ).write.format("delta").mode("append").save(path)


def _append(path: str, event: dict[str, Any]) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable as RsTable
    from deltalake import write_deltalake

    row = pa.table(
        {
            "id": pa.array([event["id"]], pa.int64()),
            "seq": pa.array([event["seq"]], pa.int64()),
            "name": pa.array([event["name"]]),
            "amount": pa.array([event["amount"]]),
        }
    )
    write_deltalake(path, row, mode="append")
    return int(RsTable(path).version())


def _trickle(path: str, settings: Settings, announce: Any = None) -> list[tuple[int, int, str]]:
    """One event a second: (version, sequence, group) of each commit."""
    done = []
    start = time.monotonic()
    for n in range(settings.trickle):
        event = _event(n, settings)
        version = _append(path, event)
        if announce is not None:
            announce(version)
        done.append((version, event["seq"], event["name"]))
        time.sleep(max(0.0, start + n + 1 - time.monotonic()))
    return done


def _messages(bootstrap_servers: str, topic: str) -> list[tuple[float, dict[str, Any]]]:
    """Every message on ``topic``: (its timestamp, its row)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"bench-chain-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        ended: set[int] = set()
        out = []
        while len(ended) < len(partitions):
            message = consumer.poll(5.0)
            if message is None:
                break
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(message.partition())
                continue
            value = json.loads(message.value())
            out.append((message.timestamp()[1] / 1000.0, value["row"]))
        return out
    finally:
        consumer.close()


def _delivered_at(
    commits: list[tuple[int, int, str]], messages: list[tuple[float, dict[str, Any]]]
) -> list[float]:
    """Per commit: when the first message holding its sequence in its group came."""
    out = []
    for _, seq, group in commits:
        seen = [at for at, row in messages if row["name"] == group and row["last"] >= seq]
        out.append(min(seen, default=float("inf")))
    return out


def _delivered(commit: tuple[int, int, str], bootstrap_servers: str, topic: str) -> bool:
    """Whether ``commit`` has reached the topic."""
    return _delivered_at([commit], _messages(bootstrap_servers, topic))[0] < float("inf")


def _newest(events: DataFrame) -> DataFrame:
    """The event of each key with the highest sequence: an SCD type 1 table's rows."""
    order = Window.partitionBy("id").orderBy(F.desc("seq"))
    return events.withColumn("_n", F.row_number().over(order)).where("_n = 1").drop("_n")


def _truth(spark: SparkSession, events: str) -> DataFrame:
    return _aggregated(_newest(spark.read.format("delta").load(events)))


def _aggregated(rows: DataFrame) -> DataFrame:
    return rows.groupBy("name").agg(
        F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"), F.max("seq").alias("last")
    )


def _feed_matches(view: DataFrame, messages: list[tuple[float, dict[str, Any]]]) -> bool:
    last: dict[str, dict[str, Any]] = {}
    for _, row in sorted(messages, key=lambda m: m[0]):
        last[row["name"]] = row
    held = {r["name"]: (r["n"], r["total"], r["last"]) for r in view.collect()}
    return held == {k: (r["n"], r["total"], r["last"]) for k, r in last.items()}


def _measured(
    spark: SparkSession,
    commits: list[tuple[int, int, str]],
    events: str,
    steps: list[tuple[int, float]],
    messages: list[tuple[float, dict[str, Any]]],
    out: Measured,
) -> None:
    delivered = _delivered_at(commits, messages)
    e2e = [
        at - _commit_time(events, version)
        for (version, _, _), at in zip(commits, delivered, strict=True)
    ]
    step = []
    for version, _, _ in commits:
        seen = [at for reached, at in steps if reached >= version]
        step.append(min(seen, default=float("inf")) - _commit_time(events, version))
    out.e2e_p50, out.e2e_p95 = percentile(e2e, 0.5), percentile(e2e, 0.95)
    out.step_p50, out.step_p95 = percentile(step, 0.5), percentile(step, 0.95)


def _config(workdir: Path, bootstrap_servers: str) -> AppConfig:
    config = app_config(workdir, bootstrap_servers, workers=WORKERS)
    notifications = replace(
        config.notifications,
        enabled=True,
        topic=f"{config.kafka.topic}.commits",
        sweep_interval=3600.0,
    )
    return replace(config, tick_interval=10.0, notifications=notifications)


def _jobs(topic: str, bootstrap_servers: str, rules: bool) -> list[tuple[JobKey, str, Any]]:
    cdc: dict[str, Any] = {"keys": ["id"], "sequence_by": "seq", "stored_as_scd_type": 1}
    if rules:
        cdc["expectations"] = RULES
    return [
        (JobKey(1, "db", "events", "scd1"), "auto_cdc", cdc),
        (
            JobKey(1, "db", "events_scd1", "agg"),
            "aggregate_view",
            {"group_by": ["name"], "aggregates": AGGREGATES},
        ),
        (
            JobKey(1, "db", "events_scd1_agg", "feed"),
            "kafka_changefeed",
            {"topic": topic, "bootstrap_servers": bootstrap_servers, "primary_key": ["name"]},
        ),
    ]


def _register(spark: SparkSession, client: LakepropClient, warehouse: str, jobs: list[Any]) -> None:
    for key, kind, options in jobs:  # each once the target it reads exists
        client.register_job(key, {"iteration": {"consumer": {"type": kind, "options": options}}})
        client.wait_for_watermark(key, _latest(spark, f"{warehouse}/db/{key.table}"), timeout=600)


def _checked(
    spark: SparkSession,
    config: AppConfig,
    commits: list[tuple[int, int, str]],
    topic: str,
    out: Measured,
) -> Measured:
    """The latencies, and whether the view and the feed are right."""
    warehouse = config.tables.warehouse
    events = f"{warehouse}/db/events"
    messages = _messages(config.kafka.bootstrap_servers, topic)
    _measured(
        spark, commits, events, _lakeprop_visible(f"{warehouse}/db/events_scd1"), messages, out
    )
    view = (
        spark.read.format("delta")
        .load(f"{warehouse}/db/events_scd1_agg")
        .select("name", "n", "total", "last")
    )
    out.equal = same_rows(view, _truth(spark, events)) and _feed_matches(view, messages)
    return out


def _lakeprop(
    spark: SparkSession, workdir: Path, bootstrap_servers: str, settings: Settings, rules: bool
) -> Measured:
    out = Measured()
    config = _config(workdir, bootstrap_servers)
    events = f"{config.tables.warehouse}/db/events"
    _events_table(spark, events, settings)
    topic = f"{config.kafka.topic}.feed"
    client = LakepropClient(config.kafka, config.state, spark, notifications=config.notifications)
    app = PropagationApp(spark, config)
    query = app.start()
    try:
        _register(spark, client, config.tables.warehouse, _jobs(topic, bootstrap_servers, rules))
        pid = jvm_pid(spark)
        cpu, started = cpu_seconds(pid), time.monotonic()
        commits = _trickle(events, settings, lambda v: client.notify_commit("db", "events", v))
        out.delivered = eventually(
            functools.partial(_delivered, commits[-1], bootstrap_servers, topic), BOUND_S
        )
        out.cpu = (cpu_seconds(pid) - cpu) / (time.monotonic() - started)
    finally:
        app.stop_query(query)
        app.shutdown()
        client.close()
    return _checked(spark, config, commits, topic, out)


def _instances(
    spark: SparkSession, workdir: Path, bootstrap_servers: str, settings: Settings, count: int
) -> tuple[Measured, int]:
    """The chain without rules on ``count`` instance processes sharing the tables; what
    it measured, and how many of its two hops (a step to the next) crossed from one
    instance to another over the trickle."""
    out = Measured()
    config = _config(workdir, bootstrap_servers)
    events = f"{config.tables.warehouse}/db/events"
    _events_table(spark, events, settings)
    topic = f"{config.kafka.topic}.feed"
    seed = PropagationApp(spark, config)
    seed.prepare()
    seed.shutdown()
    cluster = ClusterConfig(
        enabled=True,
        topic=f"{config.kafka.topic}.members",
        slots=16,
        session_timeout=10.0,
        heartbeat_interval=1.0,
    )
    notifications = config.notifications
    service = {
        "tick_interval": f'"{config.tick_interval:g}s"',
        "engine.workers": str(WORKERS),
        "notifications.enabled": "true",
        "notifications.topic": notifications.topic,
        "notifications.sweep_interval": f'"{notifications.sweep_interval:g}s"',
    }
    conf = {**small_data_conf(), "spark.driver.memory": "2g"}
    started = {
        name: Instance(name, config, workdir, cluster, conf, service).start()
        for name in (f"i{n}" for n in range(count))
    }
    client = LakepropClient(config.kafka, config.state, spark, notifications=notifications)
    tables = [("db", t) for t in STEP_SOURCES]
    try:
        with stopped_at_exit(started) as running:
            settled(config.kafka, cluster, tables, set(running))
            _register(
                spark, client, config.tables.warehouse, _jobs(topic, bootstrap_servers, False)
            )
            sessions = [i.session() for i in running.values()]
            jvm = jvm_pid(spark)  # the trickle's writes and announcements, as on one instance
            cpu, began = _sessions_cpu(sessions, jvm), time.monotonic()
            trickle_began = datetime.now()
            commits = _trickle(events, settings, lambda v: client.notify_commit("db", "events", v))
            out.delivered = eventually(
                functools.partial(_delivered, commits[-1], bootstrap_servers, topic), BOUND_S
            )
            out.cpu = (_sessions_cpu(sessions, jvm) - cpu) / (time.monotonic() - began)
    finally:
        client.close()
    owners = {
        r["table"]: r["instance"]
        for r in spark.read.format("delta")
        .load(config.state.table_path(HISTORY_TABLE))
        .where((F.col("outcome") == "success") & (F.col("started_at") >= trickle_began))
        .groupBy("table", F.split("owner", "@")[0].alias("instance"))
        .count()
        .orderBy("count")
        .collect()  # the instance that ran most of each step's iterations last
    }
    crossed = sum(
        owners.get(upstream) != owners.get(downstream)
        for upstream, downstream in itertools.pairwise(STEP_SOURCES)
    )
    return _checked(spark, config, commits, topic, out), crossed


def _sessions_cpu(sessions: list[int], jvm: int) -> float:
    """User and system CPU seconds so far of every process in these sessions (each
    instance's driver and its JVM), of the JVM ``jvm`` and of this process."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if int(fields[3]) in sessions:
            total += int(fields[11]) + int(fields[12])
    return total / ticks + cpu_seconds(jvm)


def _latest(spark: SparkSession, path: str) -> int:
    return int(DeltaTable.forPath(spark, path).history(1).collect()[0]["version"])


def _diy(
    spark: SparkSession, workdir: Path, bootstrap_servers: str, settings: Settings
) -> Measured:
    out = Measured()
    events, scd1, view = (str(workdir / "diy" / name) for name in ("events", "scd1", "agg"))
    _events_table(spark, events, settings)
    latest = _newest(spark.read.format("delta").load(events))
    latest.write.format("delta").option("delta.enableChangeDataFeed", "true").save(scd1)
    _aggregated(latest).write.format("delta").option("delta.enableChangeDataFeed", "true").save(
        view
    )
    topic = f"bench-diy-{uuid.uuid4().hex[:8]}"
    checkpoints = workdir / "diy" / "checkpoints"
    trigger = f"{settings.trigger} seconds"
    merged: list[tuple[int, float]] = []

    def upsert(batch: DataFrame, batch_id: int) -> None:
        newest = _newest(batch)
        (
            DeltaTable.forPath(batch.sparkSession, scd1)
            .alias("t")
            .merge(newest.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll(condition="s.seq > t.seq")
            .whenNotMatchedInsertAll()
            .execute()
        )
        merged.append((batch_id, time.time()))

    def reaggregate(batch: DataFrame, batch_id: int) -> None:
        session = batch.sparkSession
        groups = batch.select("name").distinct()
        fresh = _aggregated(
            session.read.format("delta").load(scd1).join(groups, "name", "left_semi")
        )
        (
            DeltaTable.forPath(session, view)
            .alias("t")
            .merge(fresh.alias("s"), "t.name = s.name")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    queries = [
        spark.readStream.format("delta")
        .option("startingVersion", "latest")
        .load(events)
        .writeStream.option("checkpointLocation", str(checkpoints / "scd1"))
        .foreachBatch(upsert)
        .trigger(processingTime=trigger)
        .start(),
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", "latest")
        .load(scd1)
        .writeStream.option("checkpointLocation", str(checkpoints / "agg"))
        .foreachBatch(reaggregate)
        .trigger(processingTime=trigger)
        .start(),
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", "latest")
        .load(view)
        .where(F.col("_change_type").isin("insert", "update_postimage"))
        .select(
            F.to_json(F.struct("name")).alias("key"),
            F.to_json(F.struct(F.struct("name", "n", "total", "last").alias("row"))).alias("value"),
        )
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("topic", topic)
        .option("checkpointLocation", str(checkpoints / "feed"))
        .trigger(processingTime=trigger)
        .start(),
    ]
    try:
        eventually(lambda: all(q.lastProgress is not None for q in queries), 300)
        pid = jvm_pid(spark)
        cpu, started = cpu_seconds(pid), time.monotonic()
        commits = _trickle(events, settings)
        out.delivered = eventually(
            functools.partial(_delivered, commits[-1], bootstrap_servers, topic), BOUND_S
        )
        out.cpu = (cpu_seconds(pid) - cpu) / (time.monotonic() - started)
    finally:
        for query in queries:
            query.stop()
    messages = _messages(bootstrap_servers, topic)
    _measured(spark, commits, events, _diy_visible(checkpoints / "scd1", merged), messages, out)
    held = spark.read.format("delta").load(view).select("name", "n", "total", "last")
    out.equal = same_rows(held, _truth(spark, events)) and _feed_matches(held, messages)
    return out


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    keys: int = 200,
    groups: int = 10,
    preload: int = 1000,
    trickle: int = 60,
    trigger: int = 1,
    instances: int = 2,
) -> Result:
    settings = Settings(keys, groups, preload, trickle, trigger)
    # the run with rules first: the one after it has the warmer JVM, so its rules'
    # cost is not hidden by the warm-up
    ruled = _lakeprop(spark, workdir / "ruled", bootstrap_servers, settings, rules=True)
    plain = _lakeprop(spark, workdir / "plain", bootstrap_servers, settings, rules=False)
    theirs = _diy(spark, workdir, bootstrap_servers, settings)
    shared, crossed = _instances(spark, workdir / "shared", bootstrap_servers, settings, instances)
    return Result(
        TITLE,
        {
            "keys": keys,
            "groups": groups,
            "preload": preload,
            "trickle_s": trickle,
            "trigger_s": trigger,
            "instances": instances,
        },
        [
            Figure("end-to-end p50", "s", plain.e2e_p50, theirs.e2e_p50),
            Figure("end-to-end p95", "s", plain.e2e_p95, theirs.e2e_p95),
            Figure("first step p50", "s", plain.step_p50, theirs.step_p50),
            Figure("first step p95", "s", plain.step_p95, theirs.step_p95),
            Figure(
                "end-to-end p50 / first step p50",
                "ratio",
                plain.e2e_p50 / plain.step_p50,
                theirs.e2e_p50 / theirs.step_p50,
            ),
            Figure("driver CPU over the trickle", "cores", plain.cpu, theirs.cpu),
            Figure(
                "end-to-end p50, five expectations (baseline: none)",
                "s",
                ruled.e2e_p50,
                plain.e2e_p50,
            ),
            Figure(
                "end-to-end p95, five expectations (baseline: none)",
                "s",
                ruled.e2e_p95,
                plain.e2e_p95,
            ),
            Figure("driver CPU, five expectations (baseline: none)", "cores", ruled.cpu, plain.cpu),
            Figure(
                f"end-to-end p50, {instances} instances (baseline: one)",
                "s",
                shared.e2e_p50,
                plain.e2e_p50,
            ),
            Figure(
                f"end-to-end p95, {instances} instances (baseline: one)",
                "s",
                shared.e2e_p95,
                plain.e2e_p95,
            ),
            Figure(
                f"first step p50, {instances} instances (baseline: one)",
                "s",
                shared.step_p50,
                plain.step_p50,
            ),
            Figure(
                f"CPU over the trickle, {instances} instances (baseline: one)",
                "cores",
                shared.cpu,
                plain.cpu,
            ),
            Figure("hops from one instance to another, of 2", "count", crossed),
        ],
        {
            "lakeprop_view_and_feed_equal": plain.equal,
            "lakeprop_with_expectations_equal": ruled.equal,
            "diy_view_and_feed_equal": theirs.equal,
            "lakeprop_on_instances_equal": shared.equal,
            "every_commit_delivered": all(m.delivered for m in (plain, ruled, theirs, shared)),
        },
        baseline=f"3 DIY streaming queries, {trigger} s trigger each",
    )
