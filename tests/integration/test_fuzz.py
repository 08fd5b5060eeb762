"""The operation fuzzer in the suite: a few fixed seeds of random real Delta operations
(see :mod:`devkit.fuzzing`), every consumer on both paths, every target whole against
its model, a seed of the pipeline workload (random chains of table consumers with
random rules, each step against the model of the chain up to it), and two of the
join workload (random operations on every table of a two- and a three-table join
view, its target against the query at its recorded versions). ``scripts/fuzz.sh
--seeds N [--workload pipelines]`` runs many more; a failure there prints its seed and
the shortest operation list that still fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devkit.fuzzing.joins import run_joins
from devkit.fuzzing.runner import Fuzzer, run
from lakeprop.dev.localkafka import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=80)]

SEEDS = (7, 1)
"""Seed 7: updates, then one that changes keys, on a partitioned source with
deletion vectors (it failed before key changes were followed). Seed 1: a delete
of a file's last live rows after a deletion vector took another row of it (on the
delta-rs path it failed until such commits went to Spark). ``scripts/fuzz.sh``
runs the others, longer."""
OPERATIONS = 4


@pytest.mark.timeout(900)  # its run on a loaded worker (a timeout ends that worker's session)
def test_random_real_delta_operations_leave_every_target_equal_to_its_model(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    fuzzer = Fuzzer(spark, tmp_path, kafka.bootstrap_servers)
    assert run(fuzzer, SEEDS, OPERATIONS) == []
    # the native fleet (replica, index, feed) ran tails on its path, not on Spark alone
    assert fuzzer.paths[("native", "native")] > 0, fuzzer.paths


PIPELINE_SEED = 3
"""A chain on each path; ``scripts/fuzz.sh --workload pipelines`` runs the others."""


@pytest.mark.timeout(900)
def test_random_operations_leave_every_step_of_random_chains_equal_to_its_model(
    spark: SparkSession, kafka: LocalKafka, tmp_path: Path
) -> None:
    fuzzer = Fuzzer(spark, tmp_path, kafka.bootstrap_servers, workload="pipelines")
    case = fuzzer.generate(PIPELINE_SEED, OPERATIONS)  # drawn once: drawing applies it
    chains = [steps for _, steps in case.chains]
    # the seed's chains: a three-step one, and rules on more than one step
    assert max(map(len, chains)) == 3 and sum(bool(s.rule) for c in chains for s in c) >= 2
    problem = fuzzer.check(case)  # what run() does with each seed's case
    assert problem is None, f"{case.describe()}\n  fails: {problem}"


JOIN_SEEDS = ((2, 2), (3, 3))
"""(seed, tables) of the join workload in the suite; ``scripts/fuzz.sh --workload joins
[--tables 3]`` runs the others."""


@pytest.mark.timeout(900)
def test_random_operations_on_every_table_of_a_join_leave_its_target_the_query(
    spark: SparkSession, tmp_path: Path
) -> None:
    for seed, tables in JOIN_SEEDS:
        assert run_joins(spark, tmp_path, [seed], OPERATIONS + 2, tables) == []
