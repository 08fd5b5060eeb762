"""Scale: N jobs on N/5 tables, 1 % of the tables changing per tick.

What one tick costs the driver (the whole ``foreachBatch``), split into its
phases, when most tables are idle. The jobs are synced (watermark at the
table's version) and use a consumer that writes nothing, so the figure is the
engine's own: selection, the change log, the catalog. Their iterations still
run, in the workers, beside the ticks. The source tables are copies of one
small Delta table (same schema and identity), made by copying its directory.

With ``notifications=1`` the service runs with commit notifications on and
each commit is announced to it as the listener thread would (the announcement
handed over directly: the Kafka round trip is not part of a tick), so a tick
probes only the announced tables; without, it probes every table. Before each
tick the benchmark writes the offset log entry Spark would for a quiet change
log, so the tick reads it and skips the collect, as in the running query
(``log_batches_collected`` counts the ones it collected: the first only).

The baseline is a target, not a DIY run: N streaming queries do
not fit one driver at these sizes. The check: after the last tick every job's
watermark equals its table's latest version, and no Spark job ran in the
selection phase.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from bench.common import Figure, Result, app_config, peak_rss_mb, percentile
from devkit.harness import cdf_table
from lakeprop.config import AppConfig
from lakeprop.engine.selection import SELECTION_JOB_GROUP
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey, JobRef, JobSpec
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import EMPTY_STATUS, JobState
from lakeprop.tables.probe import DeltaLogProbe

TITLE = "scale"
"""The benchmark's name in its results."""

SPEC = JobSpec.from_json(
    {
        "trigger": {"kind": "default"},
        "iteration": {"consumer": {"type": "bench.consumers:NullConsumer"}},
    }
)
BATCH_SCHEMA = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, is_wake BOOLEAN"
)


def quiet_log(config: AppConfig, batch_id: int) -> None:
    """The offset log entry Spark writes before micro-batch ``batch_id`` of a quiet
    change log (its offsets as before): the service reads it and knows the batch
    empty without collecting it, as it does in the running query."""
    offsets = Path(config.state.checkpoint_location) / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    source = json.dumps({config.kafka.topic: {"0": 0, "1": 0}})
    (offsets / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{source}\n')


def one_row(tick: int) -> pa.Table:
    """A commit's row, written by delta-rs: the writes are the set-up, not the figure,
    and a Spark append each would make the 100,000-job size take hours."""
    return pa.table(
        {
            "id": pa.array([tick], pa.int32()),
            "name": [f"t{tick}"],
            "amount": pa.array([float(tick)], pa.float64()),
        }
    )


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    jobs: int = 1000,
    ticks: int = 30,
    changing: float = 0.01,
    seed: int = 1,
    notifications: int = 0,
) -> Result:
    rng = random.Random(seed)
    tables = max(1, jobs // 5)
    config = app_config(workdir, bootstrap_servers)
    if notifications:
        config = replace(config, notifications=replace(config.notifications, enabled=True))
    warehouse = Path(config.tables.warehouse)
    template = warehouse / "_template" / "t"
    cdf_table(spark, str(template))
    spark.createDataFrame([(0, "x", 0.0)], "id INT, name STRING, amount DOUBLE").write.format(
        "delta"
    ).mode("append").save(str(template))  # version 1
    paths = [warehouse / "db" / f"t{i}" for i in range(tables)]
    for path in paths:
        shutil.copytree(template, path)
    metadata = DeltaLogProbe(spark).metadata(str(template))
    assert metadata is not None

    app = PropagationApp(spark, config)
    app.prepare()
    rows = synced_rows(jobs, tables, metadata.table_id)
    app.catalog.commit(rows)  # set-up: N synced jobs in one write
    app.scheduler.start()
    runner = app.runner
    empty = spark.createDataFrame([], BATCH_SCHEMA)
    tracker = spark.sparkContext.statusTracker()
    versions = {i: 1 for i in range(tables)}
    probes = []
    try:
        quiet_log(config, 0)
        runner.process_batch(empty, 0)  # warm-up: parses every spec once, probes every table
        runner.timings.clear()
        for tick in range(1, ticks + 1):
            for i in rng.sample(range(tables), max(1, round(tables * changing))):
                write_deltalake(str(paths[i]), one_row(tick), mode="append")
                versions[i] += 1
                if app.dirty is not None:
                    app.dirty.announce(("db", f"t{i}"), versions[i], time.time())
            before = runner.tables_probed
            quiet_log(config, tick)
            runner.process_batch(empty, tick)
            probes.append(runner.tables_probed - before)
        settle = ticks + 1
        deadline = time.monotonic() + 600
        while app.scheduler.in_flight() and time.monotonic() < deadline:
            time.sleep(0.2)
            quiet_log(config, settle)
            runner.process_batch(empty, settle)  # collects what finished
            settle += 1
        synced = all(r.watermark == versions[int(r.table[1:])] for r in app.catalog.rows())
    finally:
        app.shutdown()
    timings = list(runner.timings)[:ticks]
    totals = [t.total for t in timings]
    phase = lambda name, q: percentile([t.phases.get(name, 0.0) for t in timings], q)  # noqa: E731
    selection_jobs = len(tracker.getJobIdsForGroup(SELECTION_JOB_GROUP))
    return Result(
        TITLE,
        {
            "jobs": jobs,
            "tables": tables,
            "changing_per_tick": max(1, round(tables * changing)),
            "ticks": ticks,
            "notifications": bool(notifications),
        },
        [
            Figure("tick p50", "s", percentile(totals, 0.5)),
            Figure("tick p95", "s", percentile(totals, 0.95)),
            Figure("selection p50", "s", phase("selection", 0.5)),
            Figure("selection p95", "s", phase("selection", 0.95)),
            Figure("selection per table p50", "ms", phase("selection", 0.5) / tables * 1000),
            Figure(
                "tables probed per tick p50", "count", percentile([float(p) for p in probes], 0.5)
            ),
            Figure("log phase p50", "s", phase("log", 0.5)),
            Figure("catalog phase p50", "s", phase("catalog", 0.5)),
            Figure("catalog phase p95", "s", phase("catalog", 0.95)),
            Figure("housekeeping p50", "s", phase("housekeeping", 0.5)),
            Figure(
                "housekeeping max", "s", max(t.phases.get("housekeeping", 0.0) for t in timings)
            ),
            Figure("results phase p50", "s", phase("results", 0.5)),
            Figure("results phase p95", "s", phase("results", 0.95)),
            Figure("Spark jobs in selection", "count", selection_jobs),
            Figure("log batches collected", "count", runner.log_collects),
            Figure("driver peak RSS", "MiB", round(peak_rss_mb(), 1)),
        ],
        {
            "every_watermark_at_its_tables_latest_version": synced,
            "no_spark_job_in_selection": selection_jobs == 0,
        },
    )


def synced_rows(jobs: int, tables: int, table_id: str) -> dict[JobRef, CatalogRow]:
    """N default jobs on ``tables`` tables, each at the tables' version 1."""
    now = datetime.now()
    rows = {}
    for j in range(jobs):
        key = JobKey(1, "db", f"t{j % tables}", f"j{j}")
        row = CatalogRow(
            account_id=1,
            database="db",
            table=key.table,
            job_name=key.job_name,
            job_id=j + 1,
            table_id=table_id,
            job_spec=SPEC.canonical(),
            job_state=JobState.COMPLETED,
            watermark=1,
            watermark_ts=now,
            job_status=EMPTY_STATUS,
            create_at=now,
            drop_at=None,
            owner=None,
            log_partition=0,
            log_offset=j,
        )
        rows[row.row_id] = row
    return rows
