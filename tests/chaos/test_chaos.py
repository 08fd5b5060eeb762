"""Crash the service at every fault point and at random, restart it, and check it all."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devkit.chaos import KILL_POINTS, Chaos, ChaosSettings
from lakeprop import faults
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


@pytest.mark.timeout(1500)
def test_every_crash_is_survived_and_everything_comes_out_exactly_right(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    # the bounded version: every fault point once (scripts/chaos.sh adds random kills)
    settings = ChaosSettings(seed=1, random_kills=0, step_every=3.0)
    report = Chaos(spark, tmp_path / "chaos", kafka.bootstrap_servers, settings).run()
    print(report.summary())
    assert report.differences == []
    assert report.points_missed == []
    assert set(report.points_fired) == set(faults.POINTS)
    # every cycle crashed the service: by a process death where only that tells the truth
    assert report.kills == len(KILL_POINTS) + settings.random_kills
    assert report.raises == len(faults.POINTS) - len(KILL_POINTS)
