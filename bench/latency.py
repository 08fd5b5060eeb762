"""Latency: from a commit to the source until the sink shows it, lakeprop versus DIY.

One source table gets a seeded series of small commits (inserts, updates and
deletes), one every ``gap_ms`` give or take half of it, so that commits land
at every phase of a tick. lakeprop keeps a ``greedy`` ``replica`` of it with a
tick of ``tick`` seconds; the baseline, running at the same time in the same
process, is what a Spark user writes today: a streaming query with
``readChangeFeed`` and ``processingTime = tick`` that MERGEs the last change
per key into its own replica.

The latency of source version v on a side is the time of the first sink
commit that covers v minus the time of v's commit, both from the Delta logs
(commit file times; the DIY side takes the moment its MERGE returned, and
reads which versions the batch covered from its checkpoint's offsets). The
check: both replicas equal the source at the end.
"""

from __future__ import annotations

import json
import os
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
    diy_merge,
    percentile,
    query_reached,
    same_rows,
    wait_until,
)
from bench.fanout import apply_commit, seeded_commits
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from lakeprop.client.api import LakepropClient
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

TITLE = "latency"
"""The benchmark's name in its results."""

ROWS = 200


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    tick: int = 1,
    commits: int = 20,
    gap_ms: int = 2000,
    changes: int = 9,
    seed: int = 1,
) -> Result:
    config = app_config(workdir, bootstrap_servers)
    config = replace(config, tick_interval=float(tick))
    source = f"{config.tables.warehouse}/db/src"
    cdf_table(spark, source)
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(ROWS)], SCHEMA).write.format(
        "delta"
    ).mode("append").save(source)  # version 1
    final = 1 + commits
    ours = f"{config.tables.warehouse}/db/src_copy"
    theirs = f"{workdir}/diy/copy"
    spark.read.format("delta").option("versionAsOf", 1).load(source).write.format("delta").save(
        theirs
    )

    client = LakepropClient(config.kafka, config.state, spark)
    app = PropagationApp(spark, config)
    query = app.start()
    merged: list[tuple[int, float]] = []
    diy = _diy_query(spark, source, theirs, workdir / "diy" / "checkpoint", tick, merged)
    try:
        key = JobKey(1, "db", "src", "copy")
        spec = {
            "trigger": {"kind": "greedy"},
            "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
        }
        client.register_job(key, spec)

        def at(version: int) -> bool:
            rows = [r for r in app.catalog.rows() if r.is_live]
            return len(rows) == 1 and rows[0].watermark == version

        wait_until(lambda: at(1), 600)
        rng = random.Random(seed)
        for step in seeded_commits(ROWS, commits, changes, seed):
            apply_commit(spark, source, step)
            time.sleep(gap_ms / 1000 * rng.uniform(0.5, 1.5))  # pacing of the workload
        wait_until(lambda: at(final) and query_reached(diy, final), 600, 0.05)
    finally:
        diy.stop()
        app.stop_query(query)
        app.shutdown()
        client.close()

    committed = {v: _commit_time(source, v) for v in range(2, final + 1)}
    lakeprop = _latencies(committed, _lakeprop_visible(ours))
    baseline = _latencies(committed, _diy_visible(workdir / "diy" / "checkpoint", merged))
    src = spark.read.format("delta").load(source)
    return Result(
        TITLE,
        {"tick_s": tick, "commits": commits, "gap_ms": gap_ms, "changes_per_commit": changes},
        [
            Figure("commit to sink p50", "s", percentile(lakeprop, 0.5), percentile(baseline, 0.5)),
            Figure(
                "commit to sink p95", "s", percentile(lakeprop, 0.95), percentile(baseline, 0.95)
            ),
            Figure("commit to sink max", "s", max(lakeprop), max(baseline)),
        ],
        {
            "lakeprop_replica_equals_source": same_rows(
                spark.read.format("delta").load(ours).select(*src.columns), src
            ),
            "diy_replica_equals_source": same_rows(spark.read.format("delta").load(theirs), src),
            "every_version_seen_on_both_sides": len(lakeprop) == len(baseline) == commits,
        },
        baseline="a DIY readChangeFeed streaming query MERGEing a replica, same trigger interval",
    )


def _diy_query(
    spark: SparkSession,
    source: str,
    target: str,
    checkpoint: Path,
    tick: int,
    merged: list[tuple[int, float]],
) -> Any:
    def merge(batch: Any, batch_id: int) -> None:
        diy_merge(batch.sparkSession, target, batch, "id")
        merged.append((batch_id, time.time()))

    return (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", "latest")  # changes after version 1
        .load(source)
        .writeStream.queryName("diy-latency")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(merge)
        .trigger(processingTime=f"{tick} seconds")
        .start()
    )


def _commit_time(table: str, version: int) -> float:
    return os.path.getmtime(f"{table}/_delta_log/{version:020d}.json")


def _lakeprop_visible(sink: str) -> list[tuple[int, float]]:
    """(source version reached, time) of each sink commit made by a lakeprop job."""
    found = []
    for commit in sorted(Path(sink, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"].startswith("lakeprop-"):
                found.append((int(txn["version"]), commit.stat().st_mtime))
    return found


def _diy_visible(checkpoint: Path, merged: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """(source version reached, time) of each DIY batch, from its end offset.

    The Delta source's offset (v, -1) means every version before v is done;
    (v, i) with i >= 0 means v is done too (its files are all in the batch).
    """
    found = []
    for batch_id, at in merged:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        offset = json.loads(lines[-1])
        version = int(offset["reservoirVersion"])
        found.append((version - 1 if int(offset["index"]) < 0 else version, at))
    return found


def _latencies(committed: dict[int, float], visible: list[tuple[int, float]]) -> list[float]:
    """Per source version: first time a sink commit covered it minus its commit time."""
    out = []
    for version, at in sorted(committed.items()):
        seen = [t for reached, t in visible if reached >= version]
        if seen:
            out.append(min(seen) - at)
    return out
