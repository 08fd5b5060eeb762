"""Registration throughput: N registrations through the change log, applied.

N ``register`` messages for jobs on N/5 source tables are produced to the
change log in one round of deliveries; then the service starts and the figure
is the time until its catalog table holds all N jobs (each verdict written,
each source checked, the catalog committed). The engine is off here so that
the N initial snapshots do not compete for the two cores: the figure is the
change log path alone. The check: N ``applied`` verdicts and N live catalog
jobs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, app_config, stopwatch, wait_until
from devkit.harness import SOURCE_SCHEMA as SCHEMA
from devkit.harness import cdf_table
from lakeprop.client.api import LakepropClient
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey
from lakeprop.state import store

TITLE = "registration"
"""The benchmark's name in its results."""


def run(spark: SparkSession, workdir: Path, bootstrap_servers: str, jobs: int = 1000) -> Result:
    tables = max(1, jobs // 5)
    config = app_config(workdir, bootstrap_servers, enabled=False)
    warehouse = Path(config.tables.warehouse)
    template = warehouse / "_template" / "t"
    cdf_table(spark, str(template), SCHEMA)
    for i in range(tables):
        shutil.copytree(template, warehouse / "db" / f"t{i}")
    spec = {
        "trigger": {"kind": "default"},
        "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
    }
    client = LakepropClient(config.kafka, config.state, spark)
    from lakeprop.changelog import ensure_topic

    ensure_topic(config.kafka)
    with stopwatch() as sent:
        client.register_jobs(
            [(JobKey(1, "db", f"t{j % tables}", f"j{j}"), spec) for j in range(jobs)]
        )
    client.close()
    app = PropagationApp(spark, config)
    with stopwatch() as started:
        query = app.start()
    try:
        with stopwatch() as applied:
            wait_until(lambda: len(app.catalog.rows()) >= jobs, 1800, 0.05)
            # the rows are in memory once staged; the micro-batch then commits them
            staged_in = app.runner.batches
            wait_until(lambda: app.runner.batches > staged_in, 1800, 0.01)
    finally:
        app.stop_query(query)
        app.shutdown()
    verdicts = (
        store.read_table(spark, config.state.table_path(store.REQUESTS_TABLE))
        .groupBy("outcome")
        .agg(F.count("*").alias("n"))
        .collect()
    )
    outcomes = {r["outcome"]: r["n"] for r in verdicts}
    busy = [t for t in app.runner.timings if t.phases.get("log", 0.0) > 0.5]
    return Result(
        TITLE,
        {"jobs": jobs, "tables": tables},
        [
            Figure("registrations applied", "per_s", jobs / applied[0]),
            Figure("send", "s", sent[0]),
            Figure("service start", "s", started[0]),
            Figure("apply", "s", applied[0]),
            Figure("micro-batches with messages", "count", len(busy)),
            Figure("log phase", "s", sum(t.phases["log"] for t in busy)),
            Figure("catalog phase", "s", sum(t.phases.get("catalog", 0.0) for t in busy)),
        ],
        {
            "every_message_applied": outcomes == {"applied": jobs},
            "every_job_in_the_catalog": len([r for r in app.catalog.rows() if r.is_live]) == jobs,
        },
    )
