"""Building the SparkSession, for entry points only (library code receives one).

Under ``spark-submit`` or on Databricks a session already exists and
``getOrCreate`` returns it unchanged; the settings here matter for plain
``python`` runs (the CLI, tests, local development).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from lakeprop.config import SparkConfig
from lakeprop.errors import InvalidConfigError
from lakeprop.stack import spark_packages

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def build_session(config: SparkConfig) -> SparkSession:
    """A session with Delta and the Kafka connector, as the config describes.

    Python workers run this process's interpreter unless ``PYSPARK_PYTHON`` says
    otherwise (Spark's default, the first ``python3`` on the PATH, may lack the
    packages a consumer's Arrow functions import, such as numpy)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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


def client_spark_config(config: SparkConfig) -> SparkConfig:
    """How a client process (a CLI verb, a notebook outside Databricks) builds its
    session from the service's config: a small local one, quiet on stdout.

    A cluster config names the service's master and leaves the jars to
    ``spark-submit``; a client that only reads state tables must not start an
    application on that cluster, and needs Delta on its own classpath: ``local[1]``
    unless ``spark.master`` is set, and the Maven coordinates of Delta and the
    Kafka connector for the installed PySpark (as ``spark-submit.sh`` ships
    them) unless ``jars_dir`` or ``packages`` is.
    """
    return replace(
        config,
        master=config.master or "local[1]",
        packages=config.packages or (() if config.jars_dir else spark_packages()),
        conf={"spark.ui.showConsoleProgress": "false", **config.conf},
    )
