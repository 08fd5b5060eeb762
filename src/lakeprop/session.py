"""Building the SparkSession, for entry points only (library code receives one).

Under ``spark-submit`` or on Databricks a session already exists and
``getOrCreate`` returns it unchanged; the settings here matter for plain
``python`` runs (the CLI, tests, local development).
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from lakeprop.config import SparkConfig
from lakeprop.errors import InvalidConfigError

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def build_session(config: SparkConfig) -> SparkSession:
    """A session with Delta and the Kafka connector, as the config describes."""
    builder = SparkSession.builder.appName(config.app_name)
    if config.master:
        builder = builder.master(config.master)
    for key, value in {**DELTA_CONF, **config.conf}.items():
        builder = builder.config(key, value)
    if config.jars_dir:
        jars = sorted(Path(config.jars_dir).glob("*.jar"))
        if not jars:
            raise InvalidConfigError(
                f"spark.jars_dir {config.jars_dir} holds no jars; run scripts/setup.sh first"
            )
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    if config.packages:
        builder = builder.config("spark.jars.packages", ",".join(config.packages))
    return builder.getOrCreate()
