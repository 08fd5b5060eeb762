"""Scale-out, pinned: sustained tail iterations of one instance on one core against
two instances on one core each.

Two instances sharing one machine's two cores cannot beat one instance that has
both; what scale-out buys is more cores. So each instance here gets a core of
its own: one instance (``spark-submit.sh``, a local master of one core) pinned
to core 0 with ``taskset``, against two instances pinned to cores 0 and 1 that
share `tables` tables through the membership group (both sides run with
``cluster.enabled``, the one instance holding every slot). Each table has one
greedy replica job. A writer commits one inserted row at a time to random
tables with delta-rs at a rising rate (1, 2, 4 ... `max_rate` commits per
second, `window` seconds each), as `throughput` does; a rate is kept up with
while every commit reached its replica and the p95 commit-to-replica latency
stays within `bound` seconds, both read back from the Delta logs. The figures:
the highest rate kept up with, and the replica commits per second made at it.
The baseline is the one instance. The writer and this benchmark's driver are
not pinned: they take their share of both cores on either side. The check:
every replica equals its source at the end.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.common import Figure, Result, app_config, eventually, percentile, same_rows, sources
from bench.latency import _commit_time, _lakeprop_visible
from bench.throughput import _latencies, _latest, _write
from devkit.instances import Instance, settled, stopped_at_exit
from lakeprop.client.api import LakepropClient
from lakeprop.config import ClusterConfig
from lakeprop.spec import JobKey

TITLE = "scale-out, pinned"
SPEC = {
    "trigger": {"kind": "greedy"},
    "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
}


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    tables: int = 24,
    window: int = 15,
    bound: int = 5,
    max_rate: int = 64,
    seed: int = 1,
    **_: Any,
) -> Result:
    rates = [float(2**n) for n in range(max_rate.bit_length()) if 2**n <= max_rate]
    result = Result(
        TITLE,
        {"tables": tables, "window_s": window, "p95_bound_s": bound, "max_rate": max_rate},
        baseline="one instance pinned to one core",
    )
    sides = {
        count: _side(spark, workdir / f"x{count}", bootstrap, count, tables, rates, window, bound)
        for count in (1, 2)
    }
    (one_rate, one_tails, one_equal), (two_rate, two_tails, two_equal) = sides[1], sides[2]
    result.figures += [
        Figure("commits per second kept up with", "per_s", two_rate, one_rate),
        Figure("replica commits per second at it", "per_s", two_tails, one_tails),
    ]
    if one_rate:
        ratio = round(two_rate / one_rate, 2)
        result.figures.append(Figure("rate kept up with, two instances over one", "ratio", ratio))
    result.checks["every replica equals its source, both sides"] = one_equal and two_equal
    return result


def _side(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    count: int,
    tables: int,
    rates: list[float],
    window: float,
    bound: float,
) -> tuple[float, float, bool]:
    """(highest rate kept up with, replica commits per second at it, replicas equal)
    with ``count`` instances, instance ``n`` pinned to core ``n``."""
    config = app_config(workdir, bootstrap)
    paths = sources(spark, Path(config.tables.warehouse), tables)
    names = [("db", Path(p).name) for p in paths]
    client = LakepropClient(config.kafka, config.state, spark)
    client.register_jobs([(JobKey(1, "db", name, "copy"), SPEC) for _, name in names])
    client.close()
    cluster = ClusterConfig(
        enabled=True,
        topic=f"{config.kafka.topic}.members",
        slots=12,
        session_timeout=10.0,
        heartbeat_interval=1.0,
    )
    settings = {"tick_interval": '"0.5s"'}
    started = {
        f"p{n}": Instance(f"p{n}", config, workdir, cluster, settings=settings, cpus=str(n)).start()
        for n in range(count)
    }
    best, per_second = 0.0, 0.0
    with stopped_at_exit(started) as running:
        settled(config.kafka, cluster, names, set(running), timeout=600)
        if not eventually(functools.partial(_reached, {p: 1 for p in paths}), 600):
            raise AssertionError(f"{count} instance(s): the first syncs did not end")
        for n, rate in enumerate(rates):
            commits = _write(paths, rate, window, n, (n + 1) * 1_000_000)
            began = _first_commit_time(commits)
            caught = eventually(functools.partial(_reached, _latest(commits)), window + 4 * bound)
            latencies = _latencies(commits)
            kept = (
                caught and len(latencies) == len(commits) and percentile(latencies, 0.95) <= bound
            )
            print(
                f"{count} instance(s) at {rate:g} commits/s: caught up {caught}, "
                f"{len(latencies)} of {len(commits)} commits seen, "
                f"p95 {percentile(latencies, 0.95):.2f} s",
                flush=True,
            )
            if not kept:
                break
            best = rate
            per_second = _replica_commits_since(paths, began) / window
    equal = all(
        same_rows(spark.read.format("delta").load(f"{p}_copy"), spark.read.format("delta").load(p))
        for p in paths
    )
    return best, per_second, equal


def _reached(versions: dict[str, int]) -> bool:
    """Whether every replica holds its source up to the given version."""
    return all(
        max((v for v, _ in _lakeprop_visible(f"{path}_copy")), default=-1) >= version
        for path, version in versions.items()
    )


def _first_commit_time(commits: list[tuple[str, int]]) -> float:
    return min((_commit_time(path, version) for path, version in commits), default=0.0)


def _replica_commits_since(paths: list[str], since: float) -> int:
    return sum(1 for p in paths for _, at in _lakeprop_visible(f"{p}_copy") if at >= since)
