"""Spark jobs per tail: each table consumer's Spark iteration against a user's MERGE.

On two cores a Spark job costs tens to hundreds of milliseconds whatever its
size, so the jobs a tail launches set the floor of its latency. A source of
``rows`` rows (``id``, ``name``, ``amount``) and one job of each table consumer
on it, each snapshotted: ``replica``, ``secondary_index`` (by ``name``),
``aggregate_view`` (per ``name``: the rows, the total, the largest amount),
``auto_cdc`` SCD type 1 and type 2 (keyed on ``id``, sequenced by the commit
version), ``fulltext_index`` (of ``name``), ``kafka_changefeed``, and the
replica again with five expectations. Each repeat updates ``changed`` rows in
one commit and runs every job's tail over it on Spark (the engine's own
iteration, as the service runs one that is not small enough for the native
path: the native path is on, bounded below the change set), and counts the
Spark jobs in the iteration's job group, Delta's own included (the history's
``spark_jobs``).

The baseline is the MERGE a user writes to keep a copy: the same commit's
change feed read, the last change per key, one MERGE into a copy of the
source, in a job group of its own, planned with the settings lakeprop plans a
small tail with (no adaptive execution, as many shuffle partitions as cores:
fewer jobs than Spark's defaults give it). The figure is the median over the repeats
(after one untimed round); the check: the replica and the copy equal the source.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.common import Figure, Result, diy_merge, same_rows
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table, latest_version
from devkit.iterations import HandDriven
from lakeprop.engine.fanout import session_confs, small_confs
from lakeprop.engine.native import NativeSettings
from lakeprop.engine.sparkstats import group_jobs
from lakeprop.spec import JobKey

TITLE = "spark jobs"
"""The benchmark's name in its results."""

RULES = [
    {"name": "id_known", "check": "id IS NOT NULL", "action": "drop"},
    {"name": "priced", "check": "amount >= 0", "action": "drop"},
    {"name": "named", "check": "name IS NOT NULL", "action": "warn"},
    {"name": "short_name", "check": "length(name) < 40", "action": "warn"},
    {"name": "one_row_per_id", "unique": ["id"], "action": "fail"},
]
"""Five rules every row keeps: their cost, not their effect."""

BUDGET = {
    "replica": 1,
    "secondary_index": 1,
    "aggregate_view": 3,
    "auto_cdc SCD 1": 2,
    "auto_cdc SCD 2": 15,
    "fulltext_index": 5,
    "kafka_changefeed": 0,
    "replica, five expectations": 2,
}
"""The Spark jobs each tail may run beyond the user's MERGE of the same commit (the
baseline): the change set's read, and what the consumer does beside one MERGE
(an aggregate's read of its view, AUTO CDC's held events, SCD 2's event store,
the rules' counting pass). A tail over its budget fails the check
``within_budget`` (and the test that runs this benchmark at its smoke size)."""

ON_SPARK = NativeSettings(max_rows=1)
"""The service's native settings with a bound below every change set: each tail runs
on Spark, as one too large for the driver does, and may read tables' logs there."""

AGGREGATES = [
    {"fn": "count", "as": "n"},
    {"fn": "sum", "column": "amount", "as": "total"},
    {"fn": "max", "column": "amount", "as": "largest"},
]


def consumers(bootstrap_servers: str, topic: str) -> dict[str, dict[str, Any]]:
    """Each measured job's consumer, by the name its figure carries."""
    cdc = {"keys": ["id"], "source_kind": "table"}
    return {
        "replica": {"type": "replica", "options": {"primary_key": ["id"]}},
        "secondary_index": {
            "type": "secondary_index",
            "options": {"columns": ["name"], "primary_key": ["id"]},
        },
        "aggregate_view": {
            "type": "aggregate_view",
            "options": {"group_by": ["name"], "aggregates": AGGREGATES},
        },
        "auto_cdc SCD 1": {"type": "auto_cdc", "options": {**cdc, "stored_as_scd_type": 1}},
        "auto_cdc SCD 2": {"type": "auto_cdc", "options": {**cdc, "stored_as_scd_type": 2}},
        "fulltext_index": {
            "type": "fulltext_index",
            "options": {"columns": ["name"], "primary_key": ["id"]},
        },
        "kafka_changefeed": {
            "type": "kafka_changefeed",
            "options": {
                "topic": topic,
                "bootstrap_servers": bootstrap_servers,
                "primary_key": ["id"],
            },
        },
        "replica, five expectations": {
            "type": "replica",
            "options": {"primary_key": ["id"], "expectations": RULES},
        },
    }


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    rows: int = 1000,
    changed: int = 10,
    repeats: int = 3,
) -> Result:
    warehouse = str(workdir / "warehouse")
    path = f"{warehouse}/db/src"
    cdf_table(spark, path)
    spark.createDataFrame(
        [(i, f"name {i % 13}", float(i)) for i in range(rows)], SCHEMA
    ).write.format("delta").mode("append").save(path)
    start = latest_version(spark, path)
    topic = f"bench-jobs-{workdir.name}"
    jobs = {
        name: HandDriven(
            spark,
            warehouse,
            JobKey(1, "db", "src", f"j{n}"),
            consumer,
            job_id=n + 1,
            native=ON_SPARK,
        )
        for n, (name, consumer) in enumerate(consumers(bootstrap_servers, topic).items())
    }
    copy = f"{warehouse}/db/copy"
    spark.read.format("delta").load(path).write.format("delta").save(copy)
    for job in jobs.values():
        job.snapshot(start)
    counted: dict[str, list[int]] = {name: [] for name in jobs}
    diy: list[int] = []
    before = start
    for n in range(repeats + 1):
        first = n * changed % rows
        spark.sql(
            f"UPDATE delta.`{path}` SET amount = amount + 1 "
            f"WHERE id >= {first} AND id < {first + changed}"
        )
        version = latest_version(spark, path)
        for name, job in jobs.items():
            result = job.tail(version)
            if n:
                counted[name].append(result.spark_jobs)
        group = f"bench-diy-merge-{n}"
        spark.sparkContext.setJobGroup(group, "the MERGE a user writes")
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", before + 1)
            .option("endingVersion", version)
            .load(path)
        )
        with session_confs(spark, small_confs(spark)):  # as lakeprop's small tails plan
            diy_merge(spark, copy, changes, "id")
        if n:
            diy.append(len(group_jobs(spark, group)))
        before = version
    source = spark.read.format("delta").load(path)
    baseline = statistics.median(diy)
    over = {
        name: found
        for name, found in counted.items()
        if statistics.median(found) > baseline + BUDGET[name]
    }
    return Result(
        TITLE,
        {"rows": rows, "changed_rows": changed, "repeats": repeats},
        [
            Figure(f"{name} tail", "count", statistics.median(found), baseline)
            for name, found in counted.items()
        ],
        {
            "replica_equals_source": same_rows(jobs["replica"].read(), source),
            "copy_equals_source": same_rows(spark.read.format("delta").load(copy), source),
            "within_budget": not over,
        },
        baseline="the MERGE a user writes into a copy (change feed, last change per key)",
    )
