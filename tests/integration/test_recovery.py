"""Faults the service must survive in-process: a second instance, a broker outage,
sources dropped or replaced, targets dropped or altered, a fuzzed change log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakeprop.app import PropagationApp
from lakeprop.config import AppConfig
from lakeprop.lock import LEASE_FILE, CheckpointInUseError, CheckpointLock
from tests.integration.helpers import run_once, running

pytestmark = pytest.mark.integration


def test_a_second_instance_on_the_same_checkpoint_refuses_to_start(
    spark: SparkSession, app_config: AppConfig
) -> None:
    with running(spark, app_config):
        second = PropagationApp(spark, app_config)
        with pytest.raises(CheckpointInUseError, match="in use by another lakeprop instance"):
            second.start()
    run_once(spark, app_config)  # the lock went with the first instance


def test_a_lease_on_a_hadoop_file_system_checkpoint(spark: SparkSession, tmp_path: Path) -> None:
    location = f"file://{tmp_path}/checkpoint"
    first = CheckpointLock(spark, location, ttl=4.0)
    first.acquire()
    try:
        with pytest.raises(CheckpointInUseError, match="in use"):
            CheckpointLock(spark, location, ttl=4.0).acquire()
        time.sleep(5)  # renewed meanwhile, so still held
        with pytest.raises(CheckpointInUseError):
            CheckpointLock(spark, location, ttl=4.0).acquire()
    finally:
        first.release()
    assert not (tmp_path / "checkpoint" / LEASE_FILE).exists()
    # a holder that died leaves a stale lease: taken over once it is older than the ttl
    (tmp_path / "checkpoint" / LEASE_FILE).write_text(
        json.dumps({"owner": "gone", "pid": 1, "host": "h", "renewed": time.time() - 10})
    )
    taker = CheckpointLock(spark, location, ttl=4.0)
    taker.acquire()
    taker.release()
