"""Every benchmark runs at a tiny size and its checks hold (no timing is asserted).

Marked ``bench``: the test command leaves them out (each starts an app or a set of
streaming queries of its own, minutes in all); ``make bench-smoke`` runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from bench.run import BENCHMARKS, SIZES
from devkit.s3 import LocalS3
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.bench]


VARIANTS = {"auto_cdc_plain"}
"""Benchmarks that are another one with a flag set: their code runs already."""
BY_HAND = {"failover", "scale_out", "pinned", "rolling_restart"}
"""Benchmarks of several service processes: at any size they start three JVMs and
wait out session timeouts (minutes), and the scale-out test runs the same
launcher (``devkit.instances``); run them with ``python -m bench.run NAME --size smoke``."""

RUNS = [(name, {}) for name in sorted(BENCHMARKS) if name not in VARIANTS | BY_HAND] + [
    ("fanout", {"backlog": 1, "warmup": 1, "diy_first": 1})
]
"""Each benchmark at its smoke size, and the fan-out with its options on."""


@pytest.mark.parametrize(
    ("name", "overrides"),
    RUNS,
    ids=[name + "".join(f"-{k}={v}" for k, v in o.items()) for name, o in RUNS],
)
def test_a_benchmark_runs_and_both_sides_agree(
    name: str,
    overrides: dict[str, int],
    spark: SparkSession,
    kafka: LocalKafka,
    s3: LocalS3,
    tmp_path: Path,
) -> None:
    sizes: dict[str, object] = SIZES["smoke"][name] | overrides
    if name == "object_storage":
        sizes["s3"] = s3  # the session's server: the session reaches one at a time
    result = BENCHMARKS[name](spark, tmp_path, kafka.bootstrap_servers, **sizes)
    print(result.show())
    assert result.checks and all(result.checks.values()), result.show()
    assert all(v == v for v in result.values().values())  # no NaN: every figure was measured
    assert {k: result.sizes[k] for k in overrides} == overrides  # the run it says it was
