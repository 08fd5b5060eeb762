"""Object storage: the idle tick at N jobs and a small replica tail, on a local S3
API server (S3Proxy) against the local disk, and the requests an idle table costs.

N synced jobs on N/5 tables (copies of one small Delta table) and a running
service, its state, checkpoint and tables on the server. Nothing changes: the
figures are what the service pays to find that out.

* **the tick**: the whole ``foreachBatch`` over ``ticks`` micro-batches, after a
  warm-up, on S3 against the same on the local disk (the baseline);
* **requests per tick**, counted from the server's request log and split by
  where they go: the tables (``warehouse``) or the service's own state and
  checkpoint. Without commit notifications every table is probed each tick;
  with them an idle table is probed only by the sweep (once per
  ``notifications.sweep_interval``), so between sweeps it costs nothing, and an
  idle service runs no micro-batch at all: its ticks are tick intervals with
  nothing due (:attr:`~lakeprop.service.app.PropagationApp.ticks`), and its
  tick time is 0;
* **a one-row tail** of a replica of ``rows`` rows on S3 against the local disk,
  on the native path (delta-rs) and on Spark.

The checks: no table request in an idle tick with notifications on, and both
tails' replicas equal their sources.
"""

from __future__ import annotations

import collections
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import SparkSession

from bench.common import Figure, Result, app_config, percentile
from bench.scale import synced_rows
from bench.small_tail import one_row_tails
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from devkit.s3 import LocalS3, with_hadoop_conf
from lakeprop.config import AppConfig
from lakeprop.engine.native import NativeSettings
from lakeprop.service.app import PropagationApp
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.stores import session_storage

TITLE = "object storage"
"""The benchmark's name in its results."""

REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    jobs: int = 1000,
    ticks: int = 20,
    rows: int = 1000,
    repeats: int = 5,
    s3: LocalS3 | None = None,
) -> Result:
    """``s3``: a server the session already reaches (the tests'); by default one of
    its own, started and stopped here."""
    tables = max(1, jobs // 5)
    own = s3 is None
    s3 = LocalS3(workdir / "s3").start() if s3 is None else s3
    try:
        if own:
            with_hadoop_conf(spark, s3.hadoop_conf())
        bucket = s3.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        local, probed, notified = (
            _idle_ticks(
                spark,
                _config(workdir / name, bootstrap_servers, root),
                tables,
                jobs,
                ticks,
                None if root is None else s3,
            )
            for name, root in (("local", None), ("off", f"{bucket}/off"), ("on", f"{bucket}/on"))
        )
        tail_local = one_row_tails(spark, str(workdir / "tails"), rows, repeats, NativeSettings())
        on_s3 = NativeSettings(storage=session_storage(spark, AppConfig()))
        tail_s3 = one_row_tails(spark, f"{bucket}/tails", rows, repeats, on_s3)
    finally:
        if own:
            s3.stop()
    per_table = {kind: n / tables for kind, n in probed.table_requests.items()}
    return Result(
        TITLE,
        {"jobs": jobs, "tables": tables, "ticks": ticks, "rows": rows, "repeats": repeats},
        [
            Figure("idle tick p50", "s", probed.tick_p50, local.tick_p50),
            Figure("idle tick p95", "s", probed.tick_p95, local.tick_p95),
            Figure("idle tick p50, notifications on", "s", notified.tick_p50, local.tick_p50),
            Figure("table requests per idle tick", "count", probed.table_requests.total()),
            *[
                Figure(f"{kind} per probed table per tick", "count", round(n, 3))
                for kind, n in sorted(per_table.items())
            ],
            Figure(
                "table requests per idle tick, notifications on",
                "count",
                notified.table_requests.total(),
            ),
            Figure("state requests per idle tick", "count", probed.state_requests.total()),
            Figure(
                "state requests per idle tick, notifications on",
                "count",
                notified.state_requests.total(),
            ),
            Figure("one-row tail native p50", "s", tail_s3.native, tail_local.native),
            Figure("one-row tail on Spark p50", "s", tail_s3.spark, tail_local.spark),
        ],
        {
            "an_idle_table_costs_no_request_with_notifications": notified.table_requests.total()
            == 0,
            "the_tails_replicas_equal_their_sources": all(
                t.native_equal and t.spark_equal for t in (tail_local, tail_s3)
            ),
            "the_native_path_ran_on_s3": tail_s3.paths == {"native"},
        },
        baseline="the same on the local disk",
    )


def _config(workdir: Path, bootstrap_servers: str, root: str | None) -> AppConfig:
    """On the local disk, or under ``root`` on the server with notifications on when
    ``root`` ends in ``/on``."""
    config = app_config(workdir, bootstrap_servers)
    config = replace(config, tick_interval=1.0)
    if root is not None:
        config = replace(
            config,
            state=replace(
                config.state, location=f"{root}/state", checkpoint_location=f"{root}/checkpoint"
            ),
            tables=replace(config.tables, warehouse=f"{root}/warehouse"),
            notifications=replace(
                config.notifications, enabled=root.endswith("/on"), sweep_interval=3600.0
            ),
        )
    return config


@dataclass(frozen=True)
class _Ticks:
    tick_p50: float
    tick_p95: float
    table_requests: collections.Counter[str]
    """Requests per tick to the tables, by kind."""
    state_requests: collections.Counter[str]
    """Requests per tick to the service's state and checkpoint, by kind."""


def _idle_ticks(
    spark: SparkSession, config: AppConfig, tables: int, jobs: int, ticks: int, s3: LocalS3 | None
) -> _Ticks:
    """``jobs`` synced jobs on ``tables`` idle tables, ``ticks`` micro-batches of the
    running service after two warm-up ones; the tick times and requests per tick."""
    warehouse = config.tables.warehouse
    template = f"{warehouse}/_template/t"
    cdf_table(spark, template)
    spark.createDataFrame([(0, "x", 0.0)], SCHEMA).write.format("delta").mode("append").save(
        template
    )  # version 1
    for i in range(tables):
        _copy(spark, template, f"{warehouse}/db/t{i}")
    metadata = DeltaLogProbe(spark).metadata(template)
    assert metadata is not None
    app = PropagationApp(spark, config)
    app.prepare()
    app.catalog.commit(synced_rows(jobs, tables, metadata.table_id))
    query = app.start()
    try:
        _await_ticks(app, 3)
        since = len(s3.requests()) if s3 else 0
        first, batches = app.ticks, app.runner.batches
        _await_ticks(app, first + ticks)
        answered = s3.requests()[since:] if s3 else []
        counted = app.ticks - first
        ran = app.runner.batches - batches  # with notifications, idle ticks run none
        totals = [t.total for t in list(app.runner.timings)[-ran:]] if ran else [0.0]
    finally:
        app.stop_query(query)
        app.shutdown()
    table: collections.Counter[str] = collections.Counter()
    state: collections.Counter[str] = collections.Counter()
    prefix = warehouse.removeprefix("s3a://")
    for request in answered:
        (table if request.key.startswith(prefix) else state)[request.kind] += 1
    return _Ticks(
        percentile(totals, 0.5),
        percentile(totals, 0.95),
        collections.Counter({kind: n / counted for kind, n in table.items()}),
        collections.Counter({kind: n / counted for kind, n in state.items()}),
    )


def _copy(spark: SparkSession, source: str, target: str) -> None:
    """A copy of a table's directory through Hadoop (the server must write each
    object itself: it serves no file it did not store)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    fs = jvm.org.apache.hadoop.fs
    src, dst = fs.Path(source), fs.Path(target)
    fs.FileUtil.copy(src.getFileSystem(conf), src, dst.getFileSystem(conf), dst, False, conf)


def _await_ticks(app: PropagationApp, ticks: int, timeout: float = 600.0) -> None:
    """Until the service has looked ``ticks`` times (:attr:`PropagationApp.ticks`)."""
    deadline = time.monotonic() + timeout
    while app.ticks < ticks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{app.ticks} ticks of {ticks}")
        time.sleep(0.1)
