"""Catch-up: R replicas applying N changed rows, versus plain MERGEs of the same rows.

The source gets N rows in one commit, then N/2 of them updated and N/10 deleted
in a second. lakeprop runs a real tail iteration of R ``replica`` jobs over
both versions (the change feed read once and checkpointed, the last change per
key, one MERGE per replica, up to R at once); the baseline is the same work
written by hand: per replica, a batch read of the change feed, the last change
per key, one MERGE, the R of them on R threads at once. Each side runs
``repeats`` times on fresh targets, alternating; the figure is the median.
The check: every replica of both sides equals the source.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, app_config, diy_merge, same_rows, stopwatch
from devkit.harness import cdf_table
from lakeprop.engine.iteration import run_iteration
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    Member,
    MemberJob,
    TableRef,
)
from lakeprop.spec import JobKey, JobSpec
from lakeprop.tables.resolve import Tables

TITLE = "catch-up"
"""The benchmark's name in its results."""


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    rows: int = 200_000,
    repeats: int = 3,
    replicas: int = 1,
) -> Result:
    config = app_config(workdir, bootstrap_servers)
    tables = Tables(spark, config.tables)
    path = tables.path_for("db", "src")
    cdf_table(spark, path)  # version 0
    base = spark.range(rows).select(
        F.col("id").cast("int").alias("id"),
        F.concat(F.lit("n"), F.col("id")).alias("name"),
        F.col("id").cast("double").alias("amount"),
    )
    base.write.format("delta").mode("append").save(path)  # version 1
    spark.sql(f"UPDATE delta.`{path}` SET amount = amount * 2 WHERE id % 2 = 0")  # version 2
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 10 = 1")  # version 3
    source = spark.read.format("delta").load(path)

    ours: list[float] = []
    theirs: list[float] = []
    ours_ok = theirs_ok = True
    spec = JobSpec.from_json(
        {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    )
    table = TableRef(1, "db", "src")
    for rep in range(repeats):
        names = [f"copy{rep}_{r}" for r in range(replicas)]
        members = []
        for r, name in enumerate(names):
            key, job_id = JobKey(1, "db", "src", name), rep * replicas + r + 1
            member = MemberJob(Member((key, job_id), job_id, None), key, spec)
            snapshot = IterationPlan(
                table, IterationKind.SNAPSHOT, 0, (member.member,), 0, time.time()
            )
            synced = run_iteration(spark, snapshot, [member], tables, CancelToken())
            assert synced.outcome == "success", synced.members
            members.append(MemberJob(Member((key, job_id), job_id, 0), key, spec))
        tail = IterationPlan(
            table, IterationKind.TAIL, 3, tuple(m.member for m in members), 0, time.time()
        )
        spark.sparkContext.setJobGroup(tail.iteration_id, "catch-up")  # as a worker does
        with stopwatch() as elapsed:
            result = run_iteration(
                spark,
                tail,
                members,
                tables,
                CancelToken(),
                fan_out=replicas,
                small_rows=config.engine.small_iteration_rows,  # as the service passes it
            )
        assert result.outcome == "success", result.members
        ours.append(elapsed[0])
        for name in names:
            ours_ok &= same_rows(
                spark.read.format("delta").load(tables.path_for("db", f"src_{name}")), source
            )

        targets = [f"{workdir}/diy/{name}" for name in names]
        empty = spark.read.format("delta").option("versionAsOf", 0).load(path)
        for target in targets:
            empty.write.format("delta").save(target)

        def merge(target: str) -> None:
            changes = (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", 1)
                .option("endingVersion", 3)
                .load(path)
            )
            diy_merge(spark, target, changes, "id")

        with stopwatch() as elapsed, ThreadPoolExecutor(replicas) as pool:
            list(pool.map(merge, targets))
        theirs.append(elapsed[0])
        for target in targets:
            theirs_ok &= same_rows(spark.read.format("delta").load(target), source)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    return Result(
        TITLE,
        {
            "rows": rows,
            "change_rows": rows + rows // 2 + rows // 10,
            "replicas": replicas,
            "repeats": repeats,
        },
        [
            Figure("catch-up time", "s", ours_s, theirs_s),
            Figure("speed vs plain MERGE", "ratio", theirs_s / ours_s),
            Figure("Spark jobs", "count", result.spark_jobs),
        ],
        {"lakeprop_replica_equals_source": ours_ok, "merge_replica_equals_source": theirs_ok},
        baseline=f"{replicas} plain Delta MERGE(s) of the same changes, at once",
    )
