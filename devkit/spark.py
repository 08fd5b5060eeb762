"""The local SparkSession of the tests and the chaos script: Delta, Kafka, small and quiet."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from lakeprop.config import SparkConfig
from lakeprop.session import build_session
from lakeprop.stack import STACKS
from lakeprop.storage import CONDITIONAL_PUT_LOG_STORE

ROOT = Path(__file__).resolve().parents[1]
STACK = STACKS[os.environ.get("LAKEPROP_STACK", "default")]
"""The stack this process runs on (``scripts/test.sh --stack``)."""
JARS = ROOT / STACK.jars
"""Delta and the Kafka connector for it, as ``scripts/setup.sh`` left them."""

TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "ERROR",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.scheduler.mode": "FAIR",
    "spark.driver.memory": "2g",
    # Tests run thousands of small queries over a few rows each: compiling
    # generated code for every new plan costs more than interpreting it (a loop
    # of CDF reads, MERGEs and aggregates ran 28% faster interpreted here).
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    # Delta's VACUUM lists a table's directories with this many tasks (Spark's
    # default, 10,000, is made for clusters): 32 s down to 4 s on a small table.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    # One test run makes thousands of short-lived tables, and Delta keeps the log
    # of each (with its snapshot's plans) for an hour, up to 10,000 of them: in
    # one 2 GB driver that nearly filled the heap long before the suite ended.
    "spark.databricks.delta.delta.log.cacheSize": "64",
    # Commits to s3a:// exclude every other writer (the S3 tests' server; the jar
    # is among the stack's jars): what a deployment on S3 sets.
    "spark.delta.logStore.s3a.impl": CONDITIONAL_PUT_LOG_STORE,
}


TEST_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m")
"""The JVMs a test starts (the broker, the S3 API server, each service process)
compile with the quick compiler only. A test run starts dozens of them on two
cores, most for a minute or two: the optimising compiler's threads of four JVMs
at once took more CPU than the work (the three-instance scale-out test: 271 s and
510 CPU s with it, 173 s and 289 CPU s without). The code cache holds what the
quick compiler makes of Spark. They name no collector: every JVM a test starts
gets these options through the environment, and one that names its own (the
standalone cluster's daemons) refuses to start with two."""

SESSION_JAVA_OPTIONS = os.environ.get(
    "LAKEPROP_SESSION_JAVA_OPTIONS", "-XX:TieredStopAtLevel=4 -XX:+UseParallelGC"
)
"""The tests' own session, which lives for the whole run and does most of its
work, compiles fully (its command line overrides :data:`TEST_JAVA_OPTIONS`,
which reach it through the environment): on the quick compiler alone a worker's
session ran the operation fuzzer past its timeout. It collects with the
throughput collector: on two cores G1's concurrent marking and refinement threads
cost more than the pauses they save (the engine module: 9 % less CPU)."""

ADAPTIVE_OFF = {"spark.sql.adaptive.enabled": "false"}
"""The default job's session plans each query once, without adaptive execution:
its thousands of queries over a few rows each gain nothing from re-planning at
every shuffle, and paid for it (the engine module: 8 % less CPU without). The
floor job's session, every service process a test starts and the benchmarks keep
Spark's default, so adaptive plans stay tested on both stacks."""


def hive_conf(directory: Path) -> dict[str, str]:
    """An embedded Hive metastore (Derby) and its warehouse under ``directory``:
    what ``enableHiveSupport`` gives, kept out of the working directory. Derby
    lets one process at a time open it, so only the tests' own session has one."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(directory / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={directory / 'metastore_db'};create=true"
        ),
        "spark.driver.extraJavaOptions": f"{SESSION_JAVA_OPTIONS} -Dderby.system.home={directory}",
    }


def local_session(
    app_name: str = "lakeprop-tests",
    metastore: Path | None = None,
    more: Mapping[str, str] | None = None,
) -> SparkSession:
    """Local Spark with Delta and the Kafka connector from the stack's jars, with
    ``metastore`` a Hive metastore there, and ``more`` settings."""
    return build_session(
        SparkConfig(
            app_name=app_name,
            master="local[2]",
            jars_dir=str(JARS),
            conf={
                **TEST_CONF,
                "spark.driver.extraJavaOptions": SESSION_JAVA_OPTIONS,
                **(hive_conf(metastore) if metastore else {}),
                **(more or {}),
            },
        )
    )


def spark_toml(
    app_name: str, master: str = "local[2]", more: Mapping[str, str] | None = None
) -> str:
    """The ``[spark]`` sections of a config file for a child process (a killed
    service, a notebook kernel): the settings of the tests' own session, and
    ``more`` (how to reach an S3 server, say)."""
    settings = {**TEST_CONF, **(more or {})}
    conf = "".join(f'"{key}" = "{value}"\n' for key, value in settings.items())
    return (
        f'[spark]\napp_name = "{app_name}"\nmaster = "{master}"\n'
        f'jars_dir = "{JARS}"\n[spark.conf]\n{conf}'
    )
