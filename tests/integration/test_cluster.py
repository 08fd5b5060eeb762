"""The documented cluster command on a real Spark standalone cluster.

A master and one worker run on 127.0.0.1 from the PySpark distribution. The
service is submitted with ``./spark-submit.sh --master spark://…`` and the
shipped ``conf/cluster.toml`` (its secrets from the environment, the local
broker), in client mode, the one standalone supports for Python. The test
registers a replica, commits to its source, starts the service and compares the
replica whole; then
it checks where the work and the code were: tasks in the worker's executor
directory, the wheel fetched there, and the driver importing lakeprop from the
wheel rather than from the checkout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from devkit.harness import cdf_source, latest_version, wait_for_watermark
from devkit.instances import SMALL_DATA
from devkit.spark import JARS, TEST_CONF
from devkit.standalone import ROOT, StandaloneCluster
from devkit.waiting import assert_eventually
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.spec import JobKey
from tests.integration.test_recovery import add_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.processes]


def submit(cluster: StandaloneCluster, config: AppConfig, state: Path) -> subprocess.Popen[bytes]:
    """The documented command, with the test's broker, topic, state and warehouse."""
    settings = {
        "kafka.topic": config.kafka.topic,
        "kafka.create_topic": "true",
        "tick_interval": '"1s"',
        "tables.resolution": '"path"',
        "tables.warehouse": config.tables.warehouse,
        "metrics.port": "0",
    }
    command = [
        str(ROOT / "spark-submit.sh"),
        *("--master", cluster.url, "--config", "conf/cluster.toml"),
        *("--jars-dir", str(JARS)),
        *[arg for k in SMALL_DATA for arg in ("--conf", f"{k}={TEST_CONF[k]}")],
        *[arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")],
    ]
    env = {
        **os.environ,
        "LAKEPROP_KAFKA_BOOTSTRAP": config.kafka.bootstrap_servers,
        "LAKEPROP_STATE": str(state),
    }
    log = open(cluster.directory / "service.log", "wb")  # noqa: SIM115 (the process owns it)
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def started(service: subprocess.Popen[bytes], cluster: StandaloneCluster) -> None:
    """The service's query is running (it logs so once its state is set up)."""
    if service.poll() is not None:
        raise RuntimeError(f"the service exited with {service.returncode}")
    assert "query lakeprop-changelog started" in (cluster.directory / "service.log").read_text()


def stop(service: subprocess.Popen[bytes]) -> int:
    """What Ctrl-C does: the script stops the query after its micro-batch."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(service.pid, signal.SIGTERM)
    try:
        return service.wait(timeout=150)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGKILL)
        service.wait()
        raise


def test_the_cluster_command_runs_the_service_on_a_standalone_cluster(
    spark: SparkSession, app_config: AppConfig, tmp_path: Path
) -> None:
    path = cdf_source(spark, app_config, "sales", "orders")
    key = JobKey(1, "sales", "orders", "copy")
    LakepropClient(app_config.kafka, app_config.state, spark).register_job(
        key,
        {
            "trigger": {"kind": "greedy"},
            "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
        },
    )
    add_rows(spark, path, range(1, 6))
    (tmp_path / "cluster").mkdir()
    with StandaloneCluster(tmp_path / "cluster") as cluster:
        service = submit(cluster, app_config, tmp_path)
        try:
            assert_eventually(lambda: started(service, cluster), timeout=240)
            wait_for_watermark(spark, app_config, key, latest_version(spark, path))
        except BaseException:
            stop(service)
            print(cluster.logs())  # shown with the failure
            raise
        assert stop(service) == 0, cluster.logs()
        apps = cluster.state()["completedapps"]

    assert_df_equality(
        spark.read.format("delta").load(f"{app_config.tables.warehouse}/sales/orders_copy"),
        spark.read.format("delta").load(path),
        ignore_row_order=True,
    )
    # the application ran on the cluster, and its executor did the work
    assert [a["name"] for a in apps] == ["lakeprop"], apps  # type: ignore[attr-defined]
    (executor,) = cluster.executor_dirs()
    assert executor.parent.name == apps[0]["id"]  # type: ignore[index]
    assert "Finished task" in (executor / "stderr").read_text()
    # the code travelled as the wheel: fetched by the executor, imported by the driver
    assert [w.name for w in executor.glob("lakeprop-*.whl")], sorted(os.listdir(executor))
    log = (cluster.directory / "service.log").read_text()
    origin = next(line for line in log.splitlines() if "lakeprop from " in line)
    assert "/dist/lakeprop-" in origin and ".whl/lakeprop" in origin, origin
    assert f"master {cluster.url}" in origin, origin
