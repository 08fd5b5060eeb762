"""Running the service in a test or a benchmark, making source tables, reading state.

Shared by the integration tests, the chaos harness and the benchmarks."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.waiting import assert_eventually
from lakeprop.client.api import TableWatch
from lakeprop.client.reads import StateReader
from lakeprop.client.scans import Condition, LakeScan, Query, SparkScan, eq
from lakeprop.config import AppConfig
from lakeprop.service.app import PropagationApp
from lakeprop.spec import JobKey
from lakeprop.state import store as state
from lakeprop.state.job_row import CATALOG_SCHEMA, CatalogRow
from lakeprop.state.status import JobState
from lakeprop.tables.probe import DeltaLogProbe
from lakeprop.tables.stores import session_storage


def cli_settings(config: AppConfig) -> list[str]:
    """``--set`` arguments that point the CLI at a test's broker, topic, state and warehouse."""
    settings = {
        "kafka.bootstrap_servers": config.kafka.bootstrap_servers,
        "kafka.topic": config.kafka.topic,
        "state.location": config.state.location,
        "tables.warehouse": config.tables.warehouse,
    }
    return [arg for k, v in settings.items() for arg in ("--set", f"{k}={v}")]


def run_once(spark: SparkSession, config: AppConfig) -> PropagationApp:
    """Start the app on its checkpoint, process everything in the log, stop."""
    app = PropagationApp(spark, config)
    query = app.start(available_now=True)
    try:
        query.awaitTermination(180)
    finally:
        app.stop_query(query)
        app.shutdown()
    assert query.exception() is None, query.exception()
    return app


def make_source(spark: SparkSession, config: AppConfig, database: str, table: str) -> str:
    """A small Delta source table; returns its table id."""
    path = f"{config.tables.warehouse}/{database}/{table}"
    spark.createDataFrame(
        [(1, "a", 10.0), (2, "b", 20.0)], "id INT, name STRING, amount DOUBLE"
    ).write.format("delta").mode("overwrite").save(path)
    detail = DeltaTable.forPath(spark, path).detail().first()
    assert detail is not None
    return str(detail["id"])


def table(spark: SparkSession, config: AppConfig, name: str) -> DataFrame:
    return state.read_table(spark, config.state.table_path(name))


def catalog_df(spark: SparkSession, config: AppConfig) -> DataFrame:
    """The catalog's rows (without the table's partition column, the slot)."""
    return table(spark, config, state.CATALOG_TABLE).select(*CATALOG_SCHEMA.fieldNames())


def rows_df(spark: SparkSession, rows: list[CatalogRow]) -> DataFrame:
    return spark.createDataFrame([r.as_tuple() for r in rows], CATALOG_SCHEMA)


def snapshot(df: DataFrame) -> list[str]:
    """Whole table content as sorted JSON lines (for byte-for-byte comparisons)."""
    return sorted(json.dumps(r.asDict(), sort_keys=True, default=str) for r in df.collect())


# -- engine tests -------------------------------------------------------------------------

SOURCE_SCHEMA = "id INT, name STRING, amount DOUBLE"


@contextmanager
def running(spark: SparkSession, config: AppConfig) -> Iterator[PropagationApp]:
    """The app with a ticking query, stopped (query, then workers) on the way out."""
    app = PropagationApp(spark, config)
    query = app.start()
    RUNNING[config.state.location] = app
    try:
        yield app
        assert query.exception() is None, query.exception()
    finally:
        RUNNING.pop(config.state.location, None)
        app.stop_query(query)
        app.shutdown()


RUNNING: dict[str, PropagationApp] = {}
"""The app :func:`running` runs in this process, by state location."""


def service_reached(config: AppConfig, key: JobKey, version: int) -> bool:
    """Whether the app running in this process holds ``key`` completed at ``version``
    in memory; True when none runs here (the service is another process)."""
    app = RUNNING.get(config.state.location)
    if app is None:
        return True
    try:
        rows = app.catalog.rows()
    except RuntimeError:  # the service changed its rows meanwhile
        return False
    return any(
        r.key == key and r.is_live and r.watermark == version and r.job_state == JobState.COMPLETED
        for r in rows
    )


def ticks_pass(app: PropagationApp, ticks: int = 3, timeout: float = 60.0) -> None:
    """Wait until the service has looked ``ticks`` more times (a micro-batch, or a tick
    with nothing due: :attr:`PropagationApp.ticks`), to see nothing happen."""
    start = app.ticks

    def ticked() -> None:
        assert app.ticks >= start + ticks, (start, app.ticks)

    assert_eventually(ticked, timeout=timeout, interval=0.2)


def cdf_source(
    spark: SparkSession,
    config: AppConfig,
    database: str,
    table: str,
    schema: str = SOURCE_SCHEMA,
) -> str:
    """An empty source table with the Change Data Feed on; returns its path."""
    path = f"{config.tables.warehouse}/{database}/{table}"
    cdf_table(spark, path, schema)
    return path


def cdf_table(spark: SparkSession, path: str, schema: str = SOURCE_SCHEMA) -> None:
    """An empty Delta table at ``path`` with the Change Data Feed on."""
    (
        DeltaTable.create(spark)
        .location(path)
        .addColumns(spark.createDataFrame([], schema).schema)
        .property("delta.enableChangeDataFeed", "true")
        .execute()
    )


def latest_version(spark: SparkSession, path: str) -> int:
    version = DeltaLogProbe(spark).latest_version(path)  # a log listing, no Spark job
    assert version is not None, f"no Delta table at {path}"
    return version


def job_row(spark: SparkSession, config: AppConfig, key: JobKey) -> dict[str, Any]:
    """The live job as the client sees it: its catalog row, with the watermark its
    iteration history records where that is ahead (the catalog catches up on flush).
    The catalog must hold exactly one live row of the key."""
    row = client_row(config, spark, key)
    assert_one_live_row(spark, config, key, row["job_id"])
    return row


def state_reader(spark: SparkSession, config: AppConfig) -> StateReader:
    """The client's reader of the test's state with delta-rs, as the CLI reads it: a
    wait's poll then costs no Spark job on the cores the service needs (a read with
    Spark took 1 to 2 s of them beside a running service, this one 0.03 s). The
    Spark scan's reads are the notebook and client tests' own. The storage settings
    are the session's, so object-storage tests read their bucket the same way."""
    return StateReader(
        config.state, tables=config.tables, scan=LakeScan(session_storage(spark, config))
    )


def assert_one_live_row(spark: SparkSession, config: AppConfig, key: JobKey, job_id: int) -> None:
    rows = state_reader(spark, config).scan.rows(
        config.state.table_path(state.CATALOG_TABLE),
        Query(
            ("account_id", "database", "table", "job_name", "job_id", "drop_at"),
            (
                eq("account_id", key.account_id),
                eq("database", key.database),
                eq("table", key.table),
                eq("job_name", key.job_name),
                Condition("drop_at", "is null"),
            ),
        ),
    )
    assert len(rows) == 1, rows
    assert rows[0]["job_id"] == job_id, (job_id, rows)


def client_row(config: AppConfig, spark: SparkSession, key: JobKey) -> dict[str, Any]:
    """The job as ``get_job_status`` reports it, in the catalog's column names."""
    job = state_reader(spark, config).get_job_status(key)
    assert job is not None and job.drop_at is None, job
    return {
        "job_id": job.job_id,
        "watermark": job.watermark,
        "job_state": job.state,
        "job_status": json.dumps(job.status, separators=(",", ":")),
    }


def wait_for_watermark(
    spark: SparkSession, config: AppConfig, key: JobKey, version: int, timeout: float = 90.0
) -> Any:
    """The job's row (:func:`job_row`) once the client sees it completed at ``version``.

    While the service runs in this process (:func:`running`), its memory is
    polled first: a poll there costs no Spark job, where a read of the catalog
    and the history costs several, on the cores the service needs. The client's
    view is checked after that, read once per commit to the catalog or history
    until it shows the version too."""

    def reached() -> Any:
        row = client_row(config, spark, key)
        assert row["watermark"] == version and row["job_state"] == "completed", (
            row["watermark"],
            row["job_state"],
            row["job_status"],
        )
        return row

    deadline = time.monotonic() + timeout
    while not service_reached(config, key, version) and time.monotonic() < deadline:
        time.sleep(0.05)  # the service's memory first: polling it costs no Spark job
    row = assert_eventually(
        reached,
        timeout=max(deadline - time.monotonic(), 1.0),
        interval=0.25,
        changes=watches(spark, config, state.CATALOG_TABLE, state.HISTORY_TABLE),
    )
    assert_one_live_row(spark, config, key, row["job_id"])
    return row


def watches(spark: SparkSession, config: AppConfig, *tables: str) -> list[TableWatch]:
    """Watches on state tables, for ``assert_eventually(changes=...)``: a check that
    reads them runs again only after a commit to one of them."""
    return [TableWatch(SparkScan(spark), config.state.table_path(t)) for t in tables]


def history(spark: SparkSession, config: AppConfig) -> DataFrame:
    return table(spark, config, "iterations")
