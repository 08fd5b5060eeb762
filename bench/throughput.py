"""Throughput: sustained small iterations per second, on each path, with bounded lag.

``tables`` source tables, each with one ``greedy`` replica job, in one running
service. A writer commits one inserted row at a time to random tables at a
rising rate (``rates``, commits per second, each for ``window`` seconds); it
writes with delta-rs, as an application outside Spark would, so its commits do
not take the service's Spark cores. Per rate, the commit-to-sink latency of every
commit is read back from the Delta logs (each commit's time, and the first sink
commit whose transaction covers it). A rate is kept up with while its p95 stays
within ``bound`` seconds and every commit reached its sink; the figure is the
highest rate kept up with and the tail iterations per second run at it. The
same service runs once with ``engine.small_iterations = "auto"`` (native) and
once with ``"spark"``. The check: every replica equals its source at the end.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.common import (
    Figure,
    Result,
    app_config,
    eventually,
    percentile,
    same_rows,
    sources,
    wait_until,
)
from bench.latency import _commit_time, _lakeprop_visible
from lakeprop.client.api import LakepropClient
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

TITLE = "throughput"
"""The benchmark's name in its results."""

SPEC = {
    "trigger": {"kind": "greedy"},
    "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
}


def _write(
    paths: list[str], rate: float, window: float, seed: int, first_id: int
) -> list[tuple[str, int]]:
    """Commit one new row (ids from ``first_id`` on) at a time to random tables at
    ``rate`` per second for ``window`` seconds; (table, version) of each commit."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    rng = random.Random(seed)
    done: list[tuple[str, int]] = []
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < window:
        path = rng.choice(paths)
        n += 1
        row = pa.table(
            {
                "id": pa.array([first_id + n], pa.int32()),
                "name": pa.array([f"w{n}"]),
                "amount": pa.array([float(n)]),
            }
        )
        write_deltalake(path, row, mode="append")
        done.append((path, DeltaTable(path).version()))
        wake = start + n / rate
        time.sleep(max(0.0, wake - time.monotonic()))
    return done


def _side(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    mode: str,
    tables: int,
    rates: list[float],
    window: float,
    bound: float,
    seed: int,
) -> tuple[float, float, bool]:
    """(highest rate kept up with, tail iterations per second at it, replicas equal)."""
    config = app_config(workdir, bootstrap_servers, small_iterations=mode, workers=2)
    config = replace(config, tick_interval=0.5)
    paths = sources(spark, Path(config.tables.warehouse), tables)
    client = LakepropClient(config.kafka, config.state, spark)
    client.register_jobs([(JobKey(1, "db", f"t{i}", "copy"), SPEC) for i in range(tables)])
    client.close()
    app = PropagationApp(spark, config)
    query = app.start()
    best, per_second = 0.0, 0.0
    try:
        wait_until(lambda: _all_at(app, {p: 1 for p in paths}), 1800, 0.2)
        for n, rate in enumerate(rates):
            before = _tails(app)
            commits = _write(paths, rate, window, seed + n, (n + 1) * 1_000_000)
            latest = _latest(commits)
            caught = eventually(functools.partial(_all_at, app, latest), window + 4 * bound)
            latencies = _latencies(commits)
            kept = (
                caught and len(latencies) == len(commits) and percentile(latencies, 0.95) <= bound
            )
            if not kept:
                break
            best, per_second = rate, (_tails(app) - before) / window
    finally:
        app.stop_query(query)
        app.shutdown()
    equal = all(
        same_rows(spark.read.format("delta").load(f"{p}_copy"), spark.read.format("delta").load(p))
        for p in paths
    )
    return best, per_second, equal


def _tails(app: PropagationApp) -> int:
    return app.runner.tails_recorded


def _latest(commits: list[tuple[str, int]]) -> dict[str, int]:
    latest: dict[str, int] = {}
    for path, version in commits:
        latest[path] = max(latest.get(path, 0), version)
    return latest


def _all_at(app: PropagationApp, versions: dict[str, Any]) -> bool:
    by_table = {r.table: r.watermark for r in app.catalog.rows() if r.is_live}
    return all((by_table.get(Path(p).name) or -1) >= v for p, v in versions.items())


def _latencies(commits: list[tuple[str, int]]) -> list[float]:
    out = []
    visible: dict[str, list[tuple[int, float]]] = {}
    for path, version in commits:
        if path not in visible:
            visible[path] = _lakeprop_visible(f"{path}_copy")
        seen = [t for reached, t in visible[path] if reached >= version]
        if seen:
            out.append(min(seen) - _commit_time(path, version))
    return out


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    tables: int = 100,
    window: int = 15,
    bound: int = 5,
    max_rate: int = 64,
    seed: int = 1,
) -> Result:
    rates = []
    rate = 1.0
    while rate <= max_rate:
        rates.append(rate)
        rate *= 2
    sides = {
        mode: _side(
            spark, workdir / mode, bootstrap_servers, mode, tables, rates, window, bound, seed
        )
        for mode in ("auto", "spark")
    }
    native, on_spark = sides["auto"], sides["spark"]
    return Result(
        TITLE,
        {"tables": tables, "window_s": window, "p95_bound_s": bound, "max_rate": max_rate},
        [
            Figure("commits per second kept up with", "per_s", native[0], on_spark[0]),
            Figure("tail iterations per second at it", "per_s", native[1], on_spark[1]),
        ],
        {"native_replicas_equal": native[2], "spark_replicas_equal": on_spark[2]},
        baseline='the same service with engine.small_iterations = "spark"',
    )
