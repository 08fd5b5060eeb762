"""Fair share: one account's backlog against another account's one new job.

Account A registers ``backlog`` replica jobs, one per source table, so the
service queues ``backlog`` initial snapshots. Once they are queued, account B
registers one replica job. The figure is B's time to first sync: from its
register being sent to its job's first watermark. It is measured under the
service's weighted fair share and, in the same process on identical tables,
under plain first-come-first-served (the policy before tenants). The check:
every job of both runs in sync with its source, and B's replica equal to its
source.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from pyspark.sql import SparkSession

from bench.common import Figure, Result, app_config, wait_until
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from lakeprop.client.api import LakepropClient
from lakeprop.engine.policy import priority_first
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey

TITLE = "fairness"
"""The benchmark's name in its results."""

SPEC = {
    "trigger": {"kind": "default"},
    "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
}


def _first_sync(
    spark: SparkSession, workdir: Path, bootstrap_servers: str, backlog: int, fair: bool
) -> tuple[float, float, bool]:
    """(B's time to first sync, A's time to drain its backlog, every job in sync)."""
    config = app_config(workdir, bootstrap_servers)
    warehouse = Path(config.tables.warehouse)
    template = warehouse / "_template" / "t"
    cdf_table(spark, str(template), SCHEMA)
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(20)], SCHEMA).write.format(
        "delta"
    ).mode("append").save(str(template))
    for i in range(backlog):
        shutil.copytree(template, warehouse / "a" / f"t{i}")
    shutil.copytree(template, warehouse / "b" / "t")
    client = LakepropClient(config.kafka, config.state, spark)
    app = PropagationApp(spark, config)
    if not fair:
        app.scheduler.policy = priority_first
    query = app.start()
    try:
        started = time.monotonic()
        client.register_jobs([(JobKey(1, "a", f"t{i}", "copy"), SPEC) for i in range(backlog)])
        wait_until(lambda: len(app.scheduler.in_flight()) >= backlog // 2, 600, 0.05)
        sent = time.monotonic()
        b = JobKey(2, "b", "t", "copy")
        client.register_job(b, SPEC)

        def synced(key: JobKey) -> bool:
            return any(r.key == key and r.watermark is not None for r in app.catalog.rows())

        wait_until(lambda: synced(b), 1800, 0.05)
        b_time = time.monotonic() - sent
        wait_until(lambda: all(r.watermark is not None for r in app.catalog.rows()), 1800, 0.1)
        a_time = time.monotonic() - started
    finally:
        client.close()
        app.stop_query(query)
        app.shutdown()
    copy = spark.read.format("delta").load(str(warehouse / "b" / "t_copy"))
    source = spark.read.format("delta").load(str(warehouse / "b" / "t"))
    equal = sorted(copy.collect()) == sorted(source.collect())
    in_sync = equal and len([r for r in app.catalog.rows() if r.watermark == 1]) == backlog + 1
    return b_time, a_time, in_sync


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    backlog: int = 200,
    fifo_first: int = 0,
) -> Result:
    """``fifo_first=1`` runs the first-come-first-served side first (on the colder JVM)."""
    sides = {
        fair: _first_sync(spark, workdir / name, bootstrap_servers, backlog, fair)
        for fair, name in ((False, "fifo"), (True, "fair"))[:: 1 if fifo_first else -1]
    }
    (fair_b, fair_a, fair_ok), (fifo_b, fifo_a, fifo_ok) = sides[True], sides[False]
    return Result(
        TITLE,
        {"backlog": backlog, "workers": 2, "first": "fifo" if fifo_first else "fair"},
        [
            Figure("other account's first sync", "s", fair_b, fifo_b),
            Figure("backlog drained", "s", fair_a, fifo_a),
        ],
        {"fair_share_in_sync": fair_ok, "fifo_in_sync": fifo_ok},
        baseline="the same service scheduling first come, first served",
    )
