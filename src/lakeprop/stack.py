"""The Spark, Delta and Kafka versions lakeprop runs on, and the jars each needs.

Delta ships one Maven artifact per Spark minor (``delta-spark_4.0_2.13``,
``_4.1_``, ``_4.2_``) and the Kafka connector follows Spark's own version, so
the jars are a function of the installed PySpark and delta-spark:
:func:`spark_packages`. ``scripts/setup.sh`` (through ``python -m
lakeprop.stack``), ``spark-submit.sh`` and the CLI's local sessions all ask it,
so every stack is set up by the same selection.

:data:`STACKS` are the two stacks the test suite runs: the default (the newest
pair whose Python package and jars both resolve) and the floor (the oldest
PySpark the supported range admits). This module imports nothing but the
standard library: ``scripts/setup.sh`` runs it before any package is installed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

SCALA = "2.13"
SUPPORTED_PYSPARK = ">=4.0.1,<=4.2.0"
"""What ``pyproject.toml``'s ``spark`` extra admits (delta-spark 4.4's own range)."""
SUPPORTED_DELTA = ">=4.4.0,<4.5"

AWS_SDK_FOR_HADOOP = {"3.4.1": "2.24.8", "3.4.2": "2.29.52", "3.5.0": "2.35.4"}
"""The AWS SDK v2 whose modules hadoop-aws runs on, per Hadoop release: the one its
S3A was built with (``aws-java-sdk-v2.version`` in its ``hadoop-project`` pom), or
the nearest patch release after it that published every module S3A needs (Hadoop
3.4.1 was built with 2.24.6, which has no ``s3-transfer-manager`` on Maven Central)."""

CONNECTOR_OVERRIDES = {"4.0.1": "4.0.0"}
"""Spark versions whose Kafka connector is incomplete on Maven Central (4.0.1's
token provider jar is missing), and the connector release they load instead."""


@dataclass(frozen=True)
class Stack:
    """One tested combination: the Python packages pinned, the jars they imply."""

    name: str
    pyspark: str
    delta_spark: str
    kafka_broker: str
    venv: str
    """The stack's virtual environment, relative to the repository root."""
    jars: str
    """Where ``scripts/setup.sh`` leaves its jars, relative to the repository root."""

    def constraints(self) -> str:
        """pip constraints that pin the stack's packages."""
        return f"pyspark=={self.pyspark}\ndelta-spark=={self.delta_spark}\n"

    def packages(self) -> tuple[str, str]:
        return spark_packages(self.pyspark, self.delta_spark)


STACKS = {
    "default": Stack("default", "4.2.0", "4.4.0", "4.4.0", ".venv", ".cache/jars"),
    "floor": Stack("floor", "4.0.1", "4.4.0", "4.4.0", ".venv-floor", ".cache/floor/jars"),
}


def _refuse(message: str) -> Exception:
    # lakeprop is importable here: only an installed lakeprop asks for versions
    from lakeprop.errors import InvalidConfigError

    return InvalidConfigError(message)


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        raise _refuse(f"{package} is not installed: run scripts/setup.sh") from None


def spark_minor(spark_version: str) -> str:
    """``4.2.0`` -> ``4.2``."""
    major, minor, *_ = spark_version.split(".")
    return f"{major}.{minor}"


def spark_packages(
    pyspark_version: str | None = None, delta_version: str | None = None
) -> tuple[str, str]:
    """Maven coordinates of Delta and the Kafka connector for a PySpark and a
    delta-spark version (default: the installed ones)."""
    spark = pyspark_version or _installed("pyspark")
    delta = delta_version or _installed("delta-spark")
    connector = CONNECTOR_OVERRIDES.get(spark, spark)
    return (
        f"io.delta:delta-spark_{spark_minor(spark)}_{SCALA}:{delta}",
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{connector}",
    )


def bundled_hadoop() -> str:
    """The Hadoop release the installed PySpark ships (``hadoop-client-api-3.5.0.jar``)."""
    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise _refuse("pyspark is not installed: run scripts/setup.sh")
    for jar in (Path(spec.origin).parent / "jars").glob("hadoop-client-api-*.jar"):
        return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    raise _refuse("the installed PySpark ships no hadoop-client-api jar")


def s3a_versions(hadoop: str | None = None) -> tuple[str, str]:
    """hadoop-aws and AWS SDK versions for S3A on the installed PySpark's Hadoop."""
    hadoop = hadoop or bundled_hadoop()
    if hadoop not in AWS_SDK_FOR_HADOOP:
        raise _refuse(
            f"no AWS SDK version is known for Hadoop {hadoop}: add it to "
            "lakeprop.stack.AWS_SDK_FOR_HADOOP from that release's hadoop-project pom"
        )
    return hadoop, AWS_SDK_FOR_HADOOP[hadoop]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the stacks lakeprop is tested on")
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("packages", help="Maven coordinates for the installed PySpark, comma-separated")
    sub.add_parser("maven-properties", help="-D properties of tools/spark/pom.xml, installed")
    for what in ("constraints", "venv", "jars", "broker"):
        p = sub.add_parser(what, help=f"the stack's {what}")
        p.add_argument("stack", choices=sorted(STACKS))
    args = parser.parse_args(argv)
    if args.what == "packages":
        print(",".join(spark_packages()))
    elif args.what == "maven-properties":
        delta, connector = (c.split(":") for c in spark_packages())
        hadoop, sdk = s3a_versions()
        print(
            f"-Ddelta.artifact={delta[1]} -Ddelta.version={delta[2]} "
            f"-Dkafka.connector.version={connector[2]} "
            f"-Dhadoop.version={hadoop} -Dawssdk.version={sdk}"
        )
    else:
        stack = STACKS[args.stack]
        answers = {
            "constraints": stack.constraints().strip(),
            "venv": stack.venv,
            "jars": stack.jars,
            "broker": stack.kafka_broker,
        }
        print(answers[args.what])
    return 0


if __name__ == "__main__":
    sys.exit(main())
