"""Recent keys: a small tail into a large replica, versus a plain MERGE of it.

The source holds N rows written in F files by key range, as appends by an
increasing key leave a table. A tail then touches its newest keys: the last
``changes`` keys updated, a tenth of them deleted, ``changes`` new keys
inserted. lakeprop runs a real tail iteration of one ``replica`` job (its
MERGE bounded by the least and greatest key of the change set, so Delta skips
the target files outside); the baseline is that work written by hand, a batch
read of the change feed, the last change per key and one plain MERGE. Both
targets start as the same copy of the source at version 1, laid out alike; each
side runs ``repeats`` times on fresh targets, alternating, and the figure is the
median. The check: both replicas equal the source.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
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

TITLE = "recent keys"
"""The benchmark's name in its results."""


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    rows: int = 2_000_000,
    files: int = 40,
    changes: int = 1000,
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
    laid_out(base, files).write.format("delta").mode("append").save(path)  # version 1
    newest = rows - changes
    spark.sql(f"UPDATE delta.`{path}` SET amount = -amount WHERE id >= {newest}")  # 2
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id >= {rows - changes // 10}")  # 3
    spark.range(rows, rows + changes).select(
        F.col("id").cast("int").alias("id"),
        F.concat(F.lit("new"), F.col("id")).alias("name"),
        F.lit(1.0).alias("amount"),
    ).write.format("delta").mode("append").save(path)  # version 4
    source = spark.read.format("delta").load(path)
    first = spark.read.format("delta").option("versionAsOf", 1).load(path)

    spec = JobSpec.from_json(
        {"iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}}}
    )
    table = TableRef(1, "db", "src")
    ours: list[float] = []
    theirs: list[float] = []
    ours_ok = theirs_ok = True
    jobs = 0
    for rep in range(repeats):
        name = f"copy{rep}"
        target = tables.path_for("db", f"src_{name}")
        laid_out(first, files).write.format("delta").save(target)
        key = JobKey(1, "db", "src", name)
        member = MemberJob(Member((key, rep + 1), rep + 1, 1), key, spec)
        tail = IterationPlan(table, IterationKind.TAIL, 4, (member.member,), 0, time.time())
        spark.sparkContext.setJobGroup(tail.iteration_id, "recent keys")  # as a worker does
        with stopwatch() as elapsed:
            result = run_iteration(
                spark,
                tail,
                [member],
                tables,
                CancelToken(),
                small_rows=config.engine.small_iteration_rows,  # as the service passes it
            )
        assert result.outcome == "success", result.members
        ours.append(elapsed[0])
        jobs = result.spark_jobs
        ours_ok &= same_rows(spark.read.format("delta").load(target), source)

        mine = f"{workdir}/diy/{name}"
        laid_out(first, files).write.format("delta").save(mine)
        with stopwatch() as elapsed:
            changed = (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", 2)
                .option("endingVersion", 4)
                .load(path)
            )
            diy_merge(spark, mine, changed, "id")
        theirs.append(elapsed[0])
        theirs_ok &= same_rows(spark.read.format("delta").load(mine), source)
    ours_s, theirs_s = statistics.median(ours), statistics.median(theirs)
    return Result(
        TITLE,
        {"rows": rows, "files": files, "changed_keys": changes + changes, "repeats": repeats},
        [
            Figure("tail time", "s", ours_s, theirs_s),
            Figure("speed vs plain MERGE", "ratio", theirs_s / ours_s),
            Figure("Spark jobs", "count", jobs),
        ],
        {"lakeprop_replica_equals_source": ours_ok, "merge_replica_equals_source": theirs_ok},
        baseline="a plain Delta MERGE of the same changes",
    )


def laid_out(rows: DataFrame, files: int) -> DataFrame:
    """``rows`` in ``files`` files by key range, each sorted by key."""
    return rows.repartitionByRange(files, "id").sortWithinPartitions("id")
