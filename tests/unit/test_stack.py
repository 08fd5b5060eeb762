"""The stacks: their versions lie in the declared range, and each gets its own jars."""

from __future__ import annotations

import sys
from pathlib import Path

from lakeprop.stack import STACKS, SUPPORTED_DELTA, SUPPORTED_PYSPARK, spark_packages

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _within(version: str, spec: str) -> bool:
    checks = {">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}
    for part in spec.split(","):
        op = next(o for o in (">=", "<=", "<") if part.startswith(o))
        if not checks[op](_version(version), _version(part[len(op) :])):
            return False
    return True


def test_pyproject_declares_the_supported_range() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert sorted(extras["spark"]) == sorted(
        [f"delta-spark{SUPPORTED_DELTA}", f"pyspark{SUPPORTED_PYSPARK}"]
    )


def test_every_tested_stack_lies_in_the_supported_range() -> None:
    for stack in STACKS.values():
        assert _within(stack.pyspark, SUPPORTED_PYSPARK), stack
        assert _within(stack.delta_spark, SUPPORTED_DELTA), stack
    assert STACKS["floor"].pyspark == SUPPORTED_PYSPARK.split(",")[0].removeprefix(">=")


def test_delta_follows_the_spark_minor_and_the_connector_follows_spark() -> None:
    assert spark_packages("4.2.0", "4.4.0") == (
        "io.delta:delta-spark_4.2_2.13:4.4.0",
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
    )
    assert spark_packages("4.1.1", "4.4.0")[0] == "io.delta:delta-spark_4.1_2.13:4.4.0"
    # 4.0.1's connector is incomplete on Maven Central: the 4.0.0 one loads on 4.0.1
    assert spark_packages("4.0.1", "4.4.0")[1] == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"


def test_the_stacks_keep_their_environments_and_jars_apart() -> None:
    assert len({s.venv for s in STACKS.values()}) == len({s.jars for s in STACKS.values()}) == 2
