"""Waiting for a job to reach a source version: the client and ``lakeprop wait``."""

from __future__ import annotations

import json
import shutil

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from devkit.harness import SOURCE_SCHEMA, cdf_source, cli_settings, running
from devkit.specs import replica_spec
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.errors import PermanentError, TemporaryError
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration


def test_a_script_waits_for_its_job_instead_of_sleeping(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = cdf_source(spark, app_config, "w", "src")  # version 0
    key = JobKey(1, "w", "src", "copy")
    client = LakepropClient(app_config.kafka, app_config.state, spark, tables=app_config.tables)
    base = cli_settings(app_config)
    where = ["--account", "1", "--database", "w", "--table", "src", "--name", "copy"]

    with pytest.raises(TemporaryError, match=r"is not in the catalog \(is it registered"):
        client.wait_for_watermark(key, 0, timeout=0.2, poll=0.1)
    client.register_job(key, replica_spec(kind="greedy"))

    with running(spark, app_config):
        assert client.wait_for_watermark(key, "latest", timeout=90).watermark == 0
        spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SOURCE_SCHEMA).write.format(
            "delta"
        ).mode("append").save(path)  # version 1
        capsys.readouterr()
        assert cli.main([*base, "wait", *where, "--version", "latest", "--timeout", "90"]) == 0
        job = json.loads(capsys.readouterr().out)
        assert (job["watermark"], job["state"]) == (1, "completed")
        assert_df_equality(
            spark.read.format("delta").load(f"{app_config.tables.warehouse}/w/src_copy"),
            spark.read.format("delta").option("versionAsOf", 1).load(path),
            ignore_row_order=True,
        )
        with pytest.raises(TemporaryError, match=r"did not reach version 9 .* at watermark 1"):
            client.wait_for_watermark(key, 9, timeout=0.5, poll=0.1)

    with pytest.raises(SystemExit) as usage:  # one clear line from argparse, exit 2
        cli.main([*base, "wait", *where, "--version", "soon"])
    assert usage.value.code == 2
    assert "expected a version (0, 1, ...) or 'latest': 'soon'" in capsys.readouterr().err

    shutil.rmtree(path)  # the source goes away: the job goes to error, and waiting says so
    failed = pytest.raises(PermanentError, match=r"is in error at watermark 1 .*no longer exists")
    with running(spark, app_config), failed:
        client.wait_for_watermark(key, 2, timeout=90)
