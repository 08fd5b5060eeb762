"""Catch-up: one replica applying N changed rows, versus a plain MERGE of the same rows.

The source gets N rows in one commit, then N/2 of them updated and N/10 deleted
in a second. lakeprop runs a real tail iteration of a ``replica`` job over both
versions (the change feed read once and persisted, the last change per key,
one MERGE); the baseline is the same work written by hand: a batch read of the
change feed, the last change per key, one MERGE. Each side runs ``repeats``
times on fresh targets, alternating; the figure is the median. The check:
both replicas equal the source.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Result, app_config, cdf_table, diy_merge, same_rows, stopwatch
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


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    rows: int = 200_000,
    repeats: int = 3,
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
    for rep in range(repeats):
        key = JobKey(1, "db", "src", f"copy{rep}")
        spec = JobSpec.from_json(
            {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
        )
        member = MemberJob(Member((key, rep + 1), rep + 1, None), key, spec)
        table = TableRef(1, "db", "src")
        snapshot = IterationPlan(table, IterationKind.SNAPSHOT, 0, (member.member,), 0, time.time())
        assert run_iteration(spark, snapshot, [member], tables, CancelToken()).outcome == "success"
        tail_member = MemberJob(Member((key, rep + 1), rep + 1, 0), key, spec)
        tail = IterationPlan(table, IterationKind.TAIL, 3, (tail_member.member,), 0, time.time())
        spark.sparkContext.setJobGroup(tail.iteration_id, "catch-up")  # as a worker does
        with stopwatch() as elapsed:
            result = run_iteration(
                spark,
                tail,
                [tail_member],
                tables,
                CancelToken(),
                small_rows=config.engine.small_iteration_rows,  # as the service passes it
            )
        assert result.outcome == "success", result.members
        ours.append(elapsed[0])
        ours_ok &= same_rows(
            spark.read.format("delta").load(tables.path_for("db", f"src_copy{rep}")), source
        )

        target = f"{workdir}/diy/copy{rep}"
        spark.read.format("delta").option("versionAsOf", 0).load(path).write.format("delta").save(
            target
        )
        with stopwatch() as elapsed:
            changes = (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", 1)
                .option("endingVersion", 3)
                .load(path)
            )
            diy_merge(spark, target, changes, "id")
        theirs.append(elapsed[0])
        theirs_ok &= same_rows(spark.read.format("delta").load(target), source)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    return Result(
        "catch-up",
        {"rows": rows, "change_rows": rows + rows // 2 + rows // 10, "repeats": repeats},
        {
            "lakeprop_s": ours_s,
            "plain_merge_s": theirs_s,
            "speed_vs_merge": theirs_s / ours_s,
            "lakeprop_spark_jobs": result.spark_jobs,
        },
        {"lakeprop_replica_equals_source": ours_ok, "merge_replica_equals_source": theirs_ok},
    )
