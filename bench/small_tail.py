"""Small tail: one changed row in 1,000, applied to a replica, natively and on Spark.

A source of ``rows`` rows and its ``replica`` job, synced. Each repeat updates
one row (one commit) and runs the job's tail iteration twice over the same
range, on two replicas: once the native way (delta-rs in the driver) and once on
Spark, which is how every small tail ran before the native path (a Spark
MERGE: planning, several Spark jobs and a commit). The figure is the median of
the repeats; the check: both replicas equal the source.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from bench.common import Figure, Result, same_rows, stopwatch
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table, latest_version
from devkit.iterations import HandDriven
from lakeprop.engine.native import NativeSettings
from lakeprop.spec import JobKey

TITLE = "small tail"
"""The benchmark's name in its results."""

REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}


@dataclass(frozen=True)
class Tails:
    """The medians of one-row tails, and whether each replica equals the source."""

    native: float
    spark: float
    native_equal: bool
    spark_equal: bool
    paths: frozenset[str]
    """The paths the native side's tails took."""


def one_row_tails(
    spark: SparkSession, warehouse: str, rows: int, repeats: int, native: NativeSettings
) -> Tails:
    """A ``rows``-row source under ``warehouse`` and two replicas of it, synced; each
    repeat updates one row and tails both, natively (``native``) and on Spark (the
    first round warms both paths up, untimed)."""
    path = f"{warehouse}/db/src"
    cdf_table(spark, path)
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(rows)], SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)
    on_native = HandDriven(
        spark, warehouse, JobKey(1, "db", "src", "native"), REPLICA, native=native
    )
    on_spark = HandDriven(spark, warehouse, JobKey(1, "db", "src", "spark"), REPLICA, job_id=2)
    for driver in (on_native, on_spark):
        driver.snapshot(latest_version(spark, path))
    native_s: list[float] = []
    spark_s: list[float] = []
    paths = set()
    for n in range(repeats + 1):
        spark.sql(f"UPDATE delta.`{path}` SET amount = amount + 1 WHERE id = {n * 7 % rows}")
        version = latest_version(spark, path)
        with stopwatch() as elapsed:
            paths.add(on_native.tail(version).path)
        if n:
            native_s.append(elapsed[0])
        with stopwatch() as elapsed:
            on_spark.tail(version)
        if n:
            spark_s.append(elapsed[0])
    source = spark.read.format("delta").load(path)
    return Tails(
        statistics.median(native_s),
        statistics.median(spark_s),
        same_rows(on_native.read(), source),
        same_rows(on_spark.read(), source),
        frozenset(paths),
    )


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    rows: int = 1000,
    repeats: int = 5,
) -> Result:
    del bootstrap_servers  # iterations run by hand: no broker
    tails = one_row_tails(spark, str(workdir / "warehouse"), rows, repeats, NativeSettings())
    return Result(
        TITLE,
        {"rows": rows, "changed_rows": 1, "repeats": repeats},
        [Figure("one-row tail", "s", tails.native, tails.spark)],
        {
            "native_replica_equals_source": tails.native_equal,
            "spark_replica_equals_source": tails.spark_equal,
            "the_native_path_ran": tails.paths == {"native"},
        },
        baseline="the same tail on Spark (every small tail before the native path)",
    )
