"""Each table consumer's Spark tail keeps to its budget of Spark jobs.

On two cores a Spark job costs tens to hundreds of milliseconds whatever its size,
so the jobs a tail launches set the floor of its latency. The benchmark that
counts them (``bench/spark_jobs.py``: every table consumer's tail of one commit,
on Spark, against the MERGE a user writes of the same commit) runs here at its
smoke size, and every tail must stay within the jobs its budget allows beyond that
MERGE (``BUDGET``). A count is no timing: the same plans launch the same jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench import spark_jobs
from bench.run import SIZES
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [pytest.mark.integration]


def test_every_consumer_tail_keeps_to_its_budget_of_spark_jobs(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    result = spark_jobs.run(
        spark, tmp_path, kafka.bootstrap_servers, **SIZES["smoke"]["spark_jobs"]
    )
    (baseline,) = {f.baseline for f in result.figures}  # one MERGE, one count
    assert baseline is not None, result.show()
    counts = {f.name.removesuffix(" tail"): f.lakeprop for f in result.figures}
    allowed = {name: baseline + extra for name, extra in spark_jobs.BUDGET.items()}
    assert set(counts) == set(allowed), result.show()
    assert {n: c for n, c in counts.items() if c > allowed[n]} == {}, (counts, allowed)
    assert result.checks == {
        "replica_equals_source": True,
        "copy_equals_source": True,
        "within_budget": True,
    }, result.show()
