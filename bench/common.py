"""What the benchmarks share: timing, percentiles, configs, tables and comparisons."""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from lakeprop.changes import latest_change_per_key
from lakeprop.config import AppConfig, EngineConfig, KafkaConfig, StateConfig, TablesConfig


@dataclass(frozen=True)
class Figure:
    """One measured quantity: lakeprop's value and, where the benchmark runs one,
    its baseline's, in ``unit`` (``s``, ``ms``, ``per_s``, ``MiB``, ``count``,
    ``ratio``)."""

    name: str
    unit: str
    lakeprop: float | int
    baseline: float | int | None = None

    def show(self) -> str:
        text = f"{self.name}: {_fmt(self.lakeprop)} {self.unit}"
        if self.baseline is not None:
            text += f" (baseline {_fmt(self.baseline)} {self.unit}"
            if self.baseline and self.unit not in ("ratio", "count"):
                text += f", ratio {self.lakeprop / self.baseline:.2f}"
            text += ")"
        return text


@dataclass
class Result:
    """One benchmark's figures, printed as a table and kept as data: one JSON record
    per figure in ``bench/results/`` (:func:`records`)."""

    name: str
    sizes: dict[str, Any]
    figures: list[Figure] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    baseline: str = ""
    """What the baseline side is, in a few words ("" when there is none)."""

    def show(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        lines = [f"## {self.name} ({sizes})"]
        if self.baseline:
            lines.append(f"  baseline: {self.baseline}")
        lines += [f"  {figure.show()}" for figure in self.figures]
        lines += [f"  check {k}: {'ok' if v else 'FAILED'}" for k, v in self.checks.items()]
        return "\n".join(lines)

    def values(self) -> dict[str, float | int]:
        """Every measured value by name (the baseline's as ``<name>.baseline``)."""
        out: dict[str, float | int] = {}
        for figure in self.figures:
            out[figure.name] = figure.lakeprop
            if figure.baseline is not None:
                out[f"{figure.name}.baseline"] = figure.baseline
        return out

    def records(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One record per figure, each with the run's ``context`` (when, where, which
        stack and commit, which size) and this benchmark's sizes and checks."""
        return [
            {
                **context,
                "benchmark": self.name,
                "sizes": self.sizes,
                "figure": figure.name,
                "unit": figure.unit,
                "lakeprop": figure.lakeprop,
                "baseline": figure.baseline,
                "baseline_is": self.baseline or None,
                "checks_passed": all(self.checks.values()),
            }
            for figure in self.figures
        ]


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q * 100) - 1]


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    elapsed: list[float] = []
    started = time.perf_counter()
    try:
        yield elapsed
    finally:
        elapsed.append(time.perf_counter() - started)


def wait_until(check: Callable[[], bool], timeout: float, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not reached within {timeout:.0f}s")
        time.sleep(poll)


def eventually(check: Callable[[], bool], timeout: float) -> bool:
    """Whether ``check`` holds within ``timeout`` seconds."""
    try:
        wait_until(check, timeout, 0.2)
    except TimeoutError:
        return False
    return True


def sources(spark: SparkSession, warehouse: Path, count: int) -> list[str]:
    """``count`` one-row change-feed tables ``db.t0``.. under ``warehouse``, copies of one."""
    template = warehouse / "_template" / "t"
    cdf_table(spark, str(template))
    spark.createDataFrame([(0, "n0", 0.0)], SCHEMA).write.format("delta").mode("append").save(
        str(template)
    )
    paths = []
    for i in range(count):
        shutil.copytree(template, warehouse / "db" / f"t{i}")
        paths.append(str(warehouse / "db" / f"t{i}"))
    return paths


def peak_rss_mb() -> float:
    """Peak resident memory of this (driver) Python process, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def app_config(workdir: Path, bootstrap_servers: str, **engine: Any) -> AppConfig:
    return AppConfig(
        kafka=KafkaConfig(
            bootstrap_servers=bootstrap_servers,
            topic=f"bench-{uuid.uuid4().hex[:8]}",
            topic_partitions=2,
        ),
        state=StateConfig(
            location=str(workdir / "state"), checkpoint_location=str(workdir / "checkpoint")
        ),
        tables=TablesConfig(resolution="path", warehouse=str(workdir / "warehouse")),
        engine=EngineConfig(
            **{"workers": 2, "retry_base": 0.5, "retry_max": 4.0, "iteration_timeout": 600.0}
            | engine
        ),
        tick_interval=0.2,
    )


def same_rows(left: DataFrame, right: DataFrame) -> bool:
    """Whole-table equality (as multisets of rows), columns in the same order."""
    right = right.select(*left.columns)
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def diy_merge(spark: SparkSession, target: str, changes: DataFrame, key: str) -> None:
    """The MERGE a Spark user writes into a replica by hand."""
    latest = latest_change_per_key(changes, [key])
    columns = [c for c in latest.columns if not c.startswith("_")]
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(latest.alias("s"), f"t.{key} = s.{key}")
        .whenMatchedDelete(condition="s._change_type = 'delete'")
        .whenMatchedUpdate(set={c: f"s.{c}" for c in columns})
        .whenNotMatchedInsert(
            condition="s._change_type != 'delete'", values={c: f"s.{c}" for c in columns}
        )
        .execute()
    )


def query_reached(query: Any, version: int) -> bool:
    """True once the query has processed every change of ``version``."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return False
    offset = progress["sources"][0]["endOffset"]
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return False
    if not isinstance(offset, dict) or "reservoirVersion" not in offset:
        return False
    # After the last version v the offset rests at (v, index of its last file) once
    # no data is left; while more versions follow it moves on to (v + 1, -1).
    reached, index = int(offset["reservoirVersion"]), int(offset.get("index", -1))
    idle = not query.status["isDataAvailable"] and not query.status["isTriggerActive"]
    return reached > version or (reached == version and index >= 0 and idle)
