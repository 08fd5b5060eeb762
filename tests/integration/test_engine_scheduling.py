"""Trigger selection on real tables: quiet tables, periodic jobs, lagging jobs, GC."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from devkit.harness import (
    SOURCE_SCHEMA,
    catalog_df,
    cdf_source,
    cli_settings,
    history,
    job_row,
    latest_version,
    running,
    ticks_pass,
    wait_for_watermark,
    watches,
)
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.client.notifier import CommitNotifier
from lakeprop.config import AppConfig
from lakeprop.engine.selection import SELECTION_JOB_GROUP
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration


def replica(kind: str, **trigger: object) -> dict:
    return {
        "trigger": {"kind": kind, **trigger},
        "iteration": {"consumer": {"type": "replica", "options": {"primary_key": ["id"]}}},
    }


def append(spark: SparkSession, path: str, ids: range) -> int:
    spark.createDataFrame([(i, f"n{i}", float(i)) for i in ids], SOURCE_SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)
    return latest_version(spark, path)


def test_with_a_tick_of_an_hour_work_starts_when_it_is_told_of(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """Nothing here waits for a tick: the registration (a change log message), the
    finished snapshot and the notified commit each start a micro-batch at once."""
    notifications = replace(
        app_config.notifications,
        enabled=True,
        topic=f"{app_config.kafka.topic}.commits",
        sweep_interval=3600.0,
    )
    config = replace(app_config, notifications=notifications, tick_interval=3600.0)
    path = cdf_source(spark, config, "w", "events")
    client = LakepropClient(
        config.kafka, config.state, spark, tables=config.tables, notifications=notifications
    )
    key = JobKey(1, "w", "events", "copy")
    with running(spark, config):
        client.register_job(key, replica("greedy"))
        wait_for_watermark(spark, config, key, 0)
        version = append(spark, path, range(5))
        client.notify_commit("w", "events", version)
        wait_for_watermark(spark, config, key, version)
        assert_df_equality(
            spark.read.format("delta").load(f"{config.tables.warehouse}/w/events_copy"),
            spark.read.format("delta").load(path),
            ignore_row_order=True,
        )
    client.close()


def test_quiet_tables_launch_no_spark_job_periodic_jobs_wait_and_dropped_jobs_are_collected(
    spark: SparkSession, app_config: AppConfig
) -> None:
    config = replace(
        app_config,
        engine=replace(
            app_config.engine, gc_interval=1.0, gc_retention=2.0, watermark_flush_interval=1.0
        ),
    )
    busy = cdf_source(spark, config, "s", "busy")
    cdf_source(spark, config, "s", "quiet")
    client = LakepropClient(config.kafka, config.state, spark)
    dflt, every = JobKey(1, "s", "busy", "dflt"), JobKey(1, "s", "busy", "every")
    quiet = [JobKey(1, "s", "quiet", f"q{i}") for i in range(3)]
    client.register_job(dflt, replica("default"))
    client.register_job(every, replica("periodic", interval="6s"))
    for key in quiet:
        client.register_job(key, replica("greedy"))

    with running(spark, config) as app:
        for key in [dflt, every, *quiet]:
            wait_for_watermark(spark, config, key, 0)
        spark.sparkContext.setJobGroup("test-sanity", "a job the tracker must see")
        spark.range(1).count()
        assert spark.sparkContext.statusTracker().getJobIdsForGroup("test-sanity")

        every_row = next(r for r in app.catalog.rows() if r.key == every)
        fresh_since = every_row.watermark_ts.timestamp()
        version = append(spark, busy, range(5))
        committed = time.time()
        wait_for_watermark(spark, config, dflt, version)
        wait_for_watermark(spark, config, every, version)
        # the periodic job waited for its interval, the default one did not
        tails = {
            m["job_name"]: r["started_at"].timestamp()
            for r in history(spark, config).collect()
            if r["kind"] == "tail"
            for m in r["members"]
        }
        assert tails["every"] >= fresh_since + 6.0 - 0.01, (tails, fresh_since)
        if committed < fresh_since + 6.0 - 1.0:  # committed before the periodic job was due
            assert tails["dflt"] < tails["every"]

        # quiet tables: probed every tick, but no Spark job and no iteration
        assert spark.sparkContext.statusTracker().getJobIdsForGroup(SELECTION_JOB_GROUP) == []
        quiet_tails = [
            r
            for r in history(spark, config).collect()
            if r["table"] == "quiet" and r["kind"] == "tail"
        ]
        assert quiet_tails == []

        # idle jobs' fresh watermark times reach the catalog on the flush interval
        def stored_ts() -> float:
            row = catalog_df(spark, config).where("job_name = 'q1'").first()
            return row["watermark_ts"].timestamp()

        before = stored_ts()
        assert_eventually(
            lambda: (
                stored_ts() > before + 1.0
                or (_ for _ in ()).throw(AssertionError("watermark time not flushed"))
            ),
            timeout=30,
            changes=watches(spark, config, "catalog"),
        )

        # dropped jobs are removed from the catalog after the retention
        client.unregister_job(quiet[0])

        def collected() -> None:
            names = [r["job_name"] for r in catalog_df(spark, config).collect()]
            assert "q0" not in names and "q1" in names

        assert_eventually(collected, timeout=30, changes=watches(spark, config, "catalog"))


def test_a_lagging_job_catches_up_and_then_shares_the_groups_iterations(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "s", "lag")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    first, late = JobKey(1, "s", "lag", "first"), JobKey(1, "s", "lag", "late")
    client.register_job(first, replica("default"))
    with running(spark, app_config):
        wait_for_watermark(spark, app_config, first, 0)
    # while the service is down: more commits, and a second default job
    append(spark, path, range(0, 5))
    version = append(spark, path, range(5, 10))
    client.register_job(late, replica("default"))

    with running(spark, app_config):
        wait_for_watermark(spark, app_config, first, version)
        wait_for_watermark(spark, app_config, late, version)
        final = append(spark, path, range(10, 12))
        wait_for_watermark(spark, app_config, first, final)
        wait_for_watermark(spark, app_config, late, final)

    rows = history(spark, app_config).orderBy("started_at").collect()
    late_runs = [
        (r["kind"], r["to_version"]) for r in rows for m in r["members"] if m["job_name"] == "late"
    ]
    # the late job first syncs to a watermark the group had reached (0, or a version the first
    # job's tail reached before the late registration was read), then catches up
    first_watermarks = {0} | {
        r["to_version"] for r in rows for m in r["members"] if m["job_name"] == "first"
    }
    assert late_runs[0][0] == "snapshot" and late_runs[0][1] in first_watermarks
    assert late_runs[-1] == ("tail", final)
    shared = [r for r in rows if {m["job_name"] for m in r["members"]} == {"first", "late"}]
    assert shared and shared[-1]["to_version"] == final and shared[-1]["source_scans"] == 1
    for name in ("first", "late"):
        assert_df_equality(
            spark.read.format("delta").load(f"{app_config.tables.warehouse}/s/lag_{name}"),
            spark.read.format("delta").load(path),
            ignore_row_order=True,
        )


def test_with_notifications_only_announced_tables_are_probed_and_a_sweep_finds_the_rest(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    notifications = replace(
        app_config.notifications,
        enabled=True,
        topic=f"{app_config.kafka.topic}.commits",
        sweep_interval=3600.0,
    )
    config = replace(app_config, notifications=notifications)
    paths = {name: cdf_source(spark, config, "n", name) for name in ("told", "heard", "untold")}
    client = LakepropClient(
        config.kafka, config.state, spark, tables=config.tables, notifications=notifications
    )
    keys = {name: JobKey(1, "n", name, "copy") for name in paths}
    for key in keys.values():
        client.register_job(key, replica("greedy"))

    def assert_copied(name: str) -> None:
        assert_df_equality(
            spark.read.format("delta").load(f"{config.tables.warehouse}/n/{name}_copy"),
            spark.read.format("delta").load(paths[name]),
            ignore_row_order=True,
        )

    with running(spark, config) as app:
        for key in keys.values():
            wait_for_watermark(spark, config, key, 0)  # the first ticks probe every table
        probes = app.runner.tables_probed
        ticks_pass(app)
        assert app.runner.tables_probed == probes  # idle tables cost no probe at all

        for path in (paths["told"], paths["untold"]):
            append(spark, path, range(5))
        ticks_pass(app)
        assert app.runner.tables_probed == probes  # nobody announced the commits yet
        announce = ["--set", f"notifications.topic={notifications.topic}", "notify"]
        table = ["--database", "n", "--table", "told"]
        assert cli.main([*cli_settings(config), *announce, *table]) == 0  # the latest: 1
        assert json.loads(capsys.readouterr().out)["version"] == 1
        wait_for_watermark(spark, config, keys["told"], 1)
        assert app.runner.tables_probed > probes
        assert_copied("told")

        # a writer with the listener installed announces its own commits
        notifier = CommitNotifier(spark, client, [("n", "heard")]).install()
        try:
            append(spark, paths["heard"], range(5))
            DeltaTable.forPath(spark, paths["heard"]).update("id = 2", {"name": "'two'"})
            wait_for_watermark(spark, config, keys["heard"], 2)
        finally:
            notifier.uninstall()
        assert notifier.failures == 0
        assert_copied("heard")
        assert job_row(spark, config, keys["untold"])["watermark"] == 0  # until its sweep

    swept = replace(config, notifications=replace(notifications, sweep_interval=1.0))
    with running(spark, swept) as app:
        # a start probes every table: notices sent while the service was down are lost
        wait_for_watermark(spark, swept, keys["untold"], 1)
        # after that only a sweep finds a commit nobody announces
        version = append(spark, paths["untold"], range(5, 9))
        wait_for_watermark(spark, swept, keys["untold"], version)
        assert_copied("untold")
    client.close()
