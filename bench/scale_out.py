"""Scale-out: trigger selection and catch-up with one instance against three.

`jobs` jobs on `tables` tables (five per table, sharing their iterations,
with a consumer that writes nothing), synced at version 1 of every table, and
every table then at version 2: one tail iteration per table to catch up.
First one instance (``spark-submit.sh``, a local master of two cores) runs
alone; then, on a fresh copy of the same state, three instances (one core
each: the same two cores of this machine between them) share the tables
through the membership group. For each: the wall time from launching the
processes until every table's iteration to version 2 is recorded, and the
mean trigger-selection time per tick of each instance over that time, from
its own metrics endpoint (`lakeprop_tick_phase_seconds`), and for the three
the catalog writes that conflicted with another instance's, summed
(`lakeprop_state_write_conflicts`). The baseline is the one instance. Every
driver gets 4 GB rather than spark-submit's 1 GB: Delta keeps the log of each
table a driver reads (up to 10,000 of them, for an hour).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, app_config
from bench.scale import synced_rows
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from devkit.instances import ROOT, Instance, small_data_conf, stopped_at_exit
from devkit.waiting import assert_eventually
from lakeprop.client.api import TableWatch
from lakeprop.client.scans import SparkScan
from lakeprop.config import ClusterConfig
from lakeprop.service.app import PropagationApp
from lakeprop.state.store import HISTORY_TABLE
from lakeprop.tables.probe import DeltaLogProbe

TITLE = "scale-out"
DRIVER_MEMORY = "4g"
SELECTION = 'lakeprop_tick_phase_seconds_{0}{{phase="selection"}}'


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    jobs: int = 20_000,
    tables: int = 4_000,
    instances: int = 3,
    **_: Any,
) -> Result:
    result = Result(TITLE, {"jobs": jobs, "tables": tables, "instances": instances})
    result.baseline = "one instance on the same two cores"
    template = workdir / "_template" / "t"
    cdf_table(spark, str(template))
    for version in (1, 2):
        spark.createDataFrame([(version, "x", 0.0)], SCHEMA).write.format("delta").mode(
            "append"
        ).save(str(template))
    shape = (template, jobs, tables)
    one_time, one, _ = _catch_up(spark, workdir / "one", bootstrap, shape, 1)
    many_time, many, conflicts = _catch_up(spark, workdir / "many", bootstrap, shape, instances)
    result.figures += [
        Figure("catch-up from launch", "s", round(many_time, 1), round(one_time, 1)),
        Figure(
            "selection per tick, mean, busiest instance",
            "ms",
            round(max(many) * 1000, 2),
            round(one[0] * 1000, 2),
        ),
        Figure("catalog write conflicts, all instances", "count", conflicts),
    ]
    result.checks["every table caught up, both ways"] = True  # _catch_up raises otherwise
    return result


def _catch_up(
    spark: SparkSession,
    workdir: Path,
    bootstrap: str,
    shape: tuple[Path, int, int],
    count: int,
) -> tuple[float, list[float], int]:
    """Launch ``count`` instances on a fresh state; the seconds until every table's
    iteration to version 2 is recorded, each instance's mean selection per tick, and
    the catalog writes that conflicted with another instance's (several instances)."""
    template, jobs, tables = shape
    config = app_config(workdir, bootstrap)
    warehouse = Path(config.tables.warehouse)
    for i in range(tables):
        shutil.copytree(template, warehouse / "db" / f"t{i}")
    metadata = DeltaLogProbe(spark).metadata(str(template))
    assert metadata is not None
    seed = PropagationApp(spark, config)
    seed.prepare()
    seed.catalog.commit(synced_rows(jobs, tables, metadata.table_id))
    seed.shutdown()
    cluster = ClusterConfig(
        enabled=count > 1,
        topic=f"{config.kafka.topic}.members",
        slots=256,
        session_timeout=10.0,
        heartbeat_interval=1.0,
    )
    settings = {"cluster.enabled": "true" if count > 1 else "false"}
    env = {"PYTHONPATH": str(ROOT)}  # the benchmark's consumer
    conf = {**small_data_conf(), "spark.driver.memory": DRIVER_MEMORY}
    master = "local[2]" if count == 1 else "local[1]"
    history = config.state.table_path(HISTORY_TABLE)
    watch = TableWatch(SparkScan(spark), history)
    launched = time.monotonic()
    started = {
        name: Instance(name, config, workdir, cluster, conf, settings, master, env).start()
        for name in (f"i{n}" for n in range(count))
    }
    with stopped_at_exit(started) as running:
        assert_eventually(
            lambda: _all_reached(spark, history, tables),
            timeout=3600,
            interval=2.0,
            changes=[watch],
        )
        elapsed = time.monotonic() - launched
        selection = [_selection_mean(i) for i in running.values()]
        conflicts = sum(_catalog_conflicts(i) for i in running.values()) if count > 1 else 0
    return elapsed, selection, conflicts


def _all_reached(spark: SparkSession, history: str, tables: int) -> None:
    reached = (
        spark.read.format("delta")
        .load(history)
        .where("outcome = 'success' AND to_version = 2")
        .select(F.countDistinct("table"))
        .first()[0]
    )
    assert reached == tables, f"{reached} of {tables} tables caught up"


def _selection_mean(instance: Instance) -> float:
    """Mean seconds of the selection phase per tick, from the instance's metrics."""
    scraped = instance.scrape("lakeprop_tick_phase_seconds_")
    ticks = scraped.get(SELECTION.format("count"), 0.0)
    return scraped[SELECTION.format("sum")] / ticks if ticks else 0.0


def _catalog_conflicts(instance: Instance) -> int:
    """The instance's catalog writes Delta refused for another instance's commit."""
    scraped = instance.scrape("lakeprop_state_write_conflicts")
    return int(scraped.get('lakeprop_state_write_conflicts_total{table="catalog"}', 0.0))
