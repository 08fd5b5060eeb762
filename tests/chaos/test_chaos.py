"""Crash the service at every fault point and at random, restart it, and check it all.

The same round on object storage (state, checkpoint and tables on a local S3 API
server, every Delta log audited for an overwritten or missing commit) is
``scripts/chaos.sh --s3``; with ``--instances 3`` it kills and pauses instances
of a cluster there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devkit.chaos import KILL_POINTS, Chaos, ChaosSettings
from lakeprop import faults
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.integration,
    pytest.mark.floor,
    pytest.mark.slow(seconds=200),
    pytest.mark.processes,
]

FLOOR_POINTS = (
    *sorted(KILL_POINTS - {"index.written", "auto_cdc.between_writes", "join_view.written"}),
    "catalog.written",
    "history.written",
)
"""The floor job's round: the points where a process death crashes an iteration,
and the two raise points where the catalog rolls forward from the history (a
slice, in its time; a killed vector index build and join view are left to the
default job)."""

DEFAULT_POINTS = tuple(p for p in faults.POINTS if p not in FLOOR_POINTS)
"""The default job's round: every point the floor job's round does not crash.
Between them the two jobs crash every point once; ``scripts/chaos.sh`` crashes
them all on one stack."""


@pytest.mark.timeout(1500)
def test_every_crash_is_survived_and_everything_comes_out_exactly_right(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    # the bounded version: each point once (scripts/chaos.sh adds random kills)
    points = FLOOR_POINTS if os.environ.get("LAKEPROP_STACK") == "floor" else DEFAULT_POINTS
    settings = ChaosSettings(seed=1, random_kills=0, step_every=3.0, points=tuple(points))
    report = Chaos(spark, tmp_path / "chaos", kafka.bootstrap_servers, settings).run()
    print(report.summary())
    assert report.differences == []
    assert report.points_missed == []
    assert set(report.points_fired) == set(points)
    # every cycle crashed the service: by a process death where only that tells the truth
    killed = KILL_POINTS.intersection(points)
    assert report.kills == len(killed) + settings.random_kills
    assert report.raises == len(points) - len(killed)
    # engine.small_iterations = "auto": iterations ran on Spark, and on the native path
    # where a small tail of the greedy replica ran alone. Whether one did depends on
    # when its commits fell between ticks, so only the paths themselves are checked.
    assert set(report.paths) <= {"native", "spark"} and report.paths.get("spark", 0) > 0
