"""Every benchmark runs at a tiny size and its checks hold (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench.run import BENCHMARKS, SIZES
from lakeprop.dev.localkafka import LocalKafka

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_a_benchmark_runs_and_both_sides_agree(
    name: str, spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    result = BENCHMARKS[name](spark, tmp_path, kafka.bootstrap_servers, **SIZES["smoke"][name])
    print(result.show())
    assert result.checks and all(result.checks.values()), result.show()
    assert all(v == v for v in result.figures.values())  # no NaN: every figure was measured
