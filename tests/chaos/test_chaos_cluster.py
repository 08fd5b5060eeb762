"""Three instances share the tables; random ones are killed and paused; nothing is
lost or applied twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devkit.chaos import Chaos, ChaosSettings
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


@pytest.mark.timeout(1200)
def test_instances_killed_and_paused_at_random_lose_nothing_and_apply_nothing_twice(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    # the bounded version: a kill and a pause (scripts/chaos.sh --instances 3 --events N)
    settings = ChaosSettings(
        seed=3, points=(), random_kills=0, instances=3, cluster_events=2, step_every=3.0
    )
    report = Chaos(spark, tmp_path / "chaos", kafka.bootstrap_servers, settings).run()
    print(report.summary())
    assert report.differences == []
    assert (report.kills, report.pauses) == (1, 1)
    # every instance served some of the tables at some point, and the last one took over
    assert report.owners >= {"final"} and len(report.owners) >= 2, report.owners
