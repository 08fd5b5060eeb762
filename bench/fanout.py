"""Fan-out: K replicas of one table, lakeprop versus K DIY Change Data Feed queries.

Two identical source tables get the same seeded commits (inserts, updates and
deletes). lakeprop keeps K ``replica`` jobs of the first in step: one shared
read of the change feed per iteration, the K MERGEs at once. The baseline is
what a Spark user writes today: K streaming queries with ``readChangeFeed``,
each MERGEing the last change per key into its own replica of the second
table. Both run warm, with the same trigger interval, one side at a time; the
figure is the time from the first commit until every replica holds the last
version. The check: every replica of both sides equals its source.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from bench.common import (
    SCHEMA,
    Result,
    app_config,
    cdf_table,
    diy_merge,
    latest_version,
    query_reached,
    same_rows,
    stopwatch,
    wait_until,
)
from lakeprop.client.api import LakepropClient
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

Step = tuple[list[int], list[int], list[int], float]
"""One commit: ids updated, ids deleted, ids inserted, and a salt for the new values."""


def seeded_commits(rows: int, commits: int, changes: int, seed: int) -> list[Step]:
    """Commits to apply alike to both sources: a third updates, deletes, inserts each."""
    rng = random.Random(seed)
    live = set(range(rows))
    next_id = rows
    plan: list[Step] = []
    for _ in range(commits):
        updated = rng.sample(sorted(live), changes // 3)
        deleted = rng.sample(sorted(live - set(updated)), changes // 3)
        inserted = list(range(next_id, next_id + changes - 2 * (changes // 3)))
        next_id += len(inserted)
        live = (live - set(deleted)) | set(inserted)
        plan.append((updated, deleted, inserted, rng.random()))
    return plan


def apply_commit(spark: SparkSession, path: str, step: Step) -> None:
    updated, deleted, inserted, salt = step
    table = DeltaTable.forPath(spark, path)
    upserts = spark.createDataFrame(
        [(i, f"u{salt:.6f}", float(i) * salt) for i in updated]
        + [(i, f"n{i}", float(i)) for i in inserted],
        SCHEMA,
    )
    deletes = spark.createDataFrame([(i, None, None) for i in deleted], SCHEMA)
    source = upserts.withColumn("_del", upserts.id < 0).unionByName(
        deletes.withColumn("_del", deletes.id >= 0)
    )
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s._del")
        .whenMatchedUpdate(set={"name": "s.name", "amount": "s.amount"})
        .whenNotMatchedInsert(
            condition="NOT s._del", values={"id": "s.id", "name": "s.name", "amount": "s.amount"}
        )
        .execute()
    )


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    k: int = 8,
    rows: int = 5000,
    commits: int = 5,
    changes: int = 500,
    seed: int = 1,
) -> Result:
    config = app_config(workdir, bootstrap_servers, consumer_threads=k)
    warehouse = config.tables.warehouse
    ours, theirs = f"{warehouse}/db/ours", f"{warehouse}/db/theirs"
    for path in (ours, theirs):
        cdf_table(spark, path)
        spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(rows)], SCHEMA).write.format(
            "delta"
        ).mode("append").save(path)  # version 1
    steps = seeded_commits(rows, commits, changes, seed)
    final = 1 + commits

    lakeprop_s = _lakeprop(spark, config, ours, k, steps, final)
    diy_s = _diy(spark, workdir, theirs, k, steps, final)

    source_ours = spark.read.format("delta").load(ours)
    source_theirs = spark.read.format("delta").load(theirs)
    ours_ok = all(
        same_rows(spark.read.format("delta").load(f"{warehouse}/db/ours_r{i}"), source_ours)
        for i in range(k)
    )
    theirs_ok = all(
        same_rows(spark.read.format("delta").load(f"{workdir}/diy/r{i}"), source_theirs)
        for i in range(k)
    )
    return Result(
        "fan-out",
        {"replicas": k, "rows": rows, "commits": commits, "changes_per_commit": changes},
        {"lakeprop_s": lakeprop_s, "diy_queries_s": diy_s, "ratio": lakeprop_s / diy_s},
        {"lakeprop_replicas_equal_source": ours_ok, "diy_replicas_equal_source": theirs_ok},
    )


def _lakeprop(
    spark: SparkSession, config: Any, path: str, k: int, steps: list[Step], final: int
) -> float:
    client = LakepropClient(config.kafka, config.state, spark)
    app = PropagationApp(spark, config)
    query = app.start()
    try:
        keys = [JobKey(1, "db", "ours", f"r{i}") for i in range(k)]
        spec = {
            "trigger": {"kind": "default"},
            "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
        }
        client.register_jobs([(key, spec) for key in keys])

        def at(version: int) -> bool:
            rows = [r for r in app.catalog.rows() if r.is_live]
            return len(rows) == k and all(r.watermark == version for r in rows)

        wait_until(lambda: at(1), 600)
        with stopwatch() as elapsed:
            for step in steps:
                apply_commit(spark, path, step)
            wait_until(lambda: at(final), 600, 0.02)
        assert latest_version(spark, path) == final
    finally:
        app.stop_query(query)
        app.shutdown()
        client.close()
    return elapsed[0]


def _diy(
    spark: SparkSession, workdir: Path, path: str, k: int, steps: list[Step], final: int
) -> float:
    targets = [f"{workdir}/diy/r{i}" for i in range(k)]
    snapshot = spark.read.format("delta").option("versionAsOf", 1).load(path)
    for target in targets:
        snapshot.write.format("delta").save(target)
    queries = []
    for i, target in enumerate(targets):
        queries.append(
            spark.readStream.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", "latest")  # changes after version 1
            .load(path)
            .writeStream.queryName(f"diy-{i}")
            .option("checkpointLocation", f"{workdir}/diy/checkpoint-{i}")
            .foreachBatch(
                lambda batch, _id, t=target: diy_merge(batch.sparkSession, t, batch, "id")
            )
            .trigger(processingTime="0.2 seconds")
            .start()
        )
    try:
        with stopwatch() as elapsed:
            for step in steps:
                apply_commit(spark, path, step)
            wait_until(lambda: all(query_reached(q, final) for q in queries), 600, 0.02)
    finally:
        for q in queries:
            q.stop()
    return elapsed[0]
