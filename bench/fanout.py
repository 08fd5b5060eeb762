"""Fan-out: K replicas of one table, lakeprop versus K DIY Change Data Feed queries.

Two identical source tables get the same seeded commits (inserts, updates and
deletes). lakeprop keeps K ``replica`` jobs of the first in step: one shared
read of the change feed per iteration, the K MERGEs at once. The baseline is
what a Spark user writes today: K streaming queries with ``readChangeFeed``,
each MERGEing the last change per key into its own replica of the second
table. One side at a time, each with its replicas already at version 1. The
check: every replica of both sides equals its source.

Two ways to run it:

* live (``backlog=0``, the default): both sides run, with the same trigger
  interval, while the commits land; the figure is the time from the first
  commit until every replica holds the last version, so it includes the
  commits both sides wait for.
* backlog (``backlog=1``): the commits land first, with both sides stopped;
  the figure is the time from starting a side (the service on its checkpoint,
  or K ``availableNow`` queries) until every replica holds the last version.

The side that runs first runs on a colder JVM (its MERGE and change feed code
not compiled yet), which at this size is worth more than the difference
between the sides: ``warmup=1`` runs the DIY side once, untimed, on a third
table first, and ``diy_first=1`` swaps the order.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from bench.common import (
    Figure,
    Result,
    app_config,
    diy_merge,
    query_reached,
    same_rows,
    stopwatch,
    wait_until,
)
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table, latest_version
from lakeprop.client.api import LakepropClient
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

Step = tuple[list[int], list[int], list[int], float]
"""One commit: ids updated, ids deleted, ids inserted, and a salt for the new values."""


TITLE = "fan-out"
"""The benchmark's name in its results."""


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
    backlog: int = 0,
    warmup: int = 0,
    diy_first: int = 0,
) -> Result:
    config = app_config(workdir, bootstrap_servers, consumer_threads=k)
    warehouse = config.tables.warehouse
    ours, theirs, warm = (f"{warehouse}/db/{name}" for name in ("ours", "theirs", "warm"))
    for path in (ours, theirs, warm) if warmup else (ours, theirs):
        cdf_table(spark, path)
        spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(rows)], SCHEMA).write.format(
            "delta"
        ).mode("append").save(path)  # version 1
    steps = seeded_commits(rows, commits, changes, seed)
    final = 1 + commits

    if warmup:  # the MERGE and change feed code both sides run, compiled before either is timed
        _diy(spark, workdir / "warmup", warm, k, steps, final, bool(backlog))
    if diy_first:
        diy_s = _diy(spark, workdir, theirs, k, steps, final, bool(backlog))
        lakeprop_s = _lakeprop(spark, config, ours, k, steps, final, bool(backlog))
    else:
        lakeprop_s = _lakeprop(spark, config, ours, k, steps, final, bool(backlog))
        diy_s = _diy(spark, workdir, theirs, k, steps, final, bool(backlog))

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
        TITLE,
        {
            "replicas": k,
            "rows": rows,
            "commits": commits,
            "changes_per_commit": changes,
            "backlog": backlog,
            "warmup": warmup,
            "diy_first": diy_first,
        },
        [
            Figure("time to every replica in step", "s", lakeprop_s, diy_s),
            Figure("time vs DIY", "ratio", lakeprop_s / diy_s),
        ],
        {"lakeprop_replicas_equal_source": ours_ok, "diy_replicas_equal_source": theirs_ok},
        baseline=f"{k} DIY readChangeFeed streaming queries, each MERGEing its replica",
    )


def _lakeprop(
    spark: SparkSession,
    config: Any,
    path: str,
    k: int,
    steps: list[Step],
    final: int,
    backlog: bool,
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
        if backlog:  # the commits land while the service is down
            app.stop_query(query)
            app.shutdown()
            for step in steps:
                apply_commit(spark, path, step)
        with stopwatch() as elapsed:
            if backlog:
                app = PropagationApp(spark, config)
                query = app.start()
            else:
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
    spark: SparkSession,
    workdir: Path,
    path: str,
    k: int,
    steps: list[Step],
    final: int,
    backlog: bool,
) -> float:
    targets = [f"{workdir}/diy/r{i}" for i in range(k)]
    snapshot = spark.read.format("delta").option("versionAsOf", 1).load(path)
    for target in targets:
        snapshot.write.format("delta").save(target)
    if backlog:  # the commits land before any query starts
        for step in steps:
            apply_commit(spark, path, step)

    def start(i: int, target: str) -> Any:
        reader = spark.readStream.format("delta").option("readChangeFeed", "true")
        # changes after version 1: the commits still to come, or those already made
        reader = reader.option("startingVersion", 2 if backlog else "latest")
        writer = (
            reader.load(path)
            .writeStream.queryName(f"diy-{i}")
            .option("checkpointLocation", f"{workdir}/diy/checkpoint-{i}")
            .foreachBatch(
                lambda batch, _id, t=target: diy_merge(batch.sparkSession, t, batch, "id")
            )
        )
        if backlog:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime="0.2 seconds").start()

    queries: list[Any] = []
    try:
        if backlog:
            with stopwatch() as elapsed:
                queries = [start(i, target) for i, target in enumerate(targets)]
                for q in queries:
                    q.awaitTermination(600)
        else:  # the queries run before the first commit, as the service does
            queries = [start(i, target) for i, target in enumerate(targets)]
            with stopwatch() as elapsed:
                for step in steps:
                    apply_commit(spark, path, step)
                wait_until(lambda: all(query_reached(q, final) for q in queries), 600, 0.02)
    finally:
        for q in queries:
            q.stop()
    return elapsed[0]
