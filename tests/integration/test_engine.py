"""The propagation engine end to end: change log -> iterations -> replicas."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import replace

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from devkit.harness import (
    SOURCE_SCHEMA,
    cdf_source,
    history,
    latest_version,
    running,
    wait_for_watermark,
)
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, TenantsConfig
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration


def replica(primary_key: list[str], trigger: dict[str, object], **options: object) -> dict:
    return {
        "trigger": trigger,
        "iteration": {
            "consumer": {"type": "replica", "options": {"primary_key": primary_key, **options}}
        },
    }


def source_at(spark: SparkSession, path: str, version: int, columns: list[str]):
    return spark.read.format("delta").option("versionAsOf", version).load(path).select(*columns)


def target(spark: SparkSession, config: AppConfig, database: str, table: str):
    return spark.read.format("delta").load(f"{config.tables.warehouse}/{database}/{table}")


def commit_steps(spark: SparkSession, path: str) -> list[Callable[[], None]]:
    """Insert, update, delete and a merge that updates and inserts: one commit each."""
    table = DeltaTable.forPath(spark, path)
    changes = spark.createDataFrame(
        [(2, "two", 2.5), (21, "n21", 21.0), (22, "n22", 22.0)], SOURCE_SCHEMA
    )
    return [
        lambda: (
            spark.createDataFrame([(i, f"n{i}", float(i)) for i in range(1, 21)], SOURCE_SCHEMA)
            .write.format("delta")
            .mode("append")
            .save(path)
        ),
        lambda: table.update("id % 3 = 0", {"amount": "amount * 10", "name": "concat(name, '!')"}),
        lambda: table.delete("id % 5 = 0"),
        lambda: (
            table.alias("t")
            .merge(changes.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        ),
    ]


@pytest.mark.floor
def test_three_trigger_kinds_keep_their_replicas_equal_to_the_source(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "shop", "orders")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    jobs = {
        JobKey(1, "shop", "orders", "dflt"): replica(["id"], {"kind": "default"}),
        JobKey(1, "shop", "orders", "greedy"): replica(
            ["id"], {"kind": "greedy"}, columns=["id", "name"]
        ),
        JobKey(1, "shop", "orders", "every2s"): replica(
            ["id"], {"kind": "periodic", "interval": "2s"}, target_table="orders_periodic"
        ),
    }
    columns = {
        "dflt": ["id", "name", "amount"],
        "greedy": ["id", "name"],
        "every2s": ["id", "name", "amount"],
    }
    targets = {"dflt": "orders_dflt", "greedy": "orders_greedy", "every2s": "orders_periodic"}
    for key, spec in jobs.items():
        client.register_job(key, spec)

    with running(spark, app_config):
        for key in jobs:
            wait_for_watermark(spark, app_config, key, 0)
        for step in commit_steps(spark, path):
            step()
            version = latest_version(spark, path)
            for key in jobs:
                row = wait_for_watermark(spark, app_config, key, version)
                assert_df_equality(
                    target(spark, app_config, "shop", targets[key.job_name]),
                    source_at(spark, path, row["watermark"], columns[key.job_name]),
                    ignore_row_order=True,
                )

    iterations = history(spark, app_config).collect()
    assert {r["outcome"] for r in iterations} == {"success"}
    assert all(r["source_scans"] == 1 for r in iterations)
    snapshots = [r for r in iterations if r["kind"] == "snapshot"]
    assert sorted(m["job_name"] for r in snapshots for m in r["members"]) == [
        "dflt",
        "every2s",
        "greedy",
    ]
    # every job's tail iterations cover its versions without gap or overlap
    for name in ("dflt", "greedy", "every2s"):
        ranges = sorted(
            (m["from_version"], r["to_version"])
            for r in iterations
            if r["kind"] == "tail"
            for m in r["members"]
            if m["job_name"] == name
        )
        assert ranges[0][0] == 0 and ranges[-1][1] == latest_version(spark, path)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges


def test_one_scan_is_shared_by_every_default_job_of_a_table(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path = cdf_source(spark, app_config, "shop", "items")
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    keys = [JobKey(2, "shop", "items", f"copy{i}") for i in range(3)]
    with running(spark, app_config):
        for key in keys:
            client.register_job(key, replica(["id"], {"kind": "default"}))
        for key in keys:
            wait_for_watermark(spark, app_config, key, 0)
        spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SOURCE_SCHEMA).write.format(
            "delta"
        ).mode("append").save(path)
        for key in keys:
            wait_for_watermark(spark, app_config, key, 1)

    tails = [r for r in history(spark, app_config).collect() if r["kind"] == "tail"]
    assert len(tails) == 1
    (tail,) = tails
    assert (tail["from_version"], tail["to_version"], tail["rows_read"], tail["source_scans"]) == (
        0,
        1,
        2,
        1,
    )
    assert sorted((m["job_name"], m["rows_written"], m["error_code"]) for m in tail["members"]) == [
        ("copy0", 2, 0),
        ("copy1", 2, 0),
        ("copy2", 2, 0),
    ]
    status = json.loads(
        spark.read.format("delta")
        .load(app_config.state.table_path("catalog"))
        .where("job_name = 'copy1'")
        .first()["job_status"]
    )
    assert status["consumers"] == [
        {"type": "replica", "rows_written": 2, "error_code": 0, "error_msg": ""}
    ]


def one_replica(
    spark: SparkSession,
    app_config: AppConfig,
    table: str,
    trigger: str = "default",
    **engine: object,
) -> tuple[str, AppConfig, JobKey, LakepropClient]:
    """A CDF source ``shop.<table>`` and one registered replica job of it, under
    the engine settings given: (source path, config, job key, client)."""
    path = cdf_source(spark, app_config, "shop", table)  # version 0
    config = replace(app_config, engine=replace(app_config.engine, **engine))
    key = JobKey(1, "shop", table, "copy")
    client = LakepropClient(config.kafka, config.state, spark)
    client.register_job(key, replica(["id"], {"kind": trigger}))
    return path, config, key, client


def test_a_backlog_is_caught_up_in_bounded_iterations_and_ends_equal_to_the_source(
    spark: SparkSession, app_config: AppConfig
) -> None:
    path, config, key, _ = one_replica(spark, app_config, "backlog", max_versions_per_iteration=2)
    with running(spark, config):
        wait_for_watermark(spark, config, key, 0)
        for step in commit_steps(spark, path) + commit_steps(spark, path)[1:]:
            step()  # six commits (the second delete finds nothing to delete)
        final = latest_version(spark, path)
        row = wait_for_watermark(spark, config, key, final)
    assert (row["watermark"], final) == (6, 6)
    assert_df_equality(
        target(spark, config, "shop", "backlog_copy"),
        source_at(spark, path, final, ["id", "name", "amount"]),
        ignore_row_order=True,
    )
    tails = [
        (r["from_version"], r["to_version"])
        for r in history(spark, config).where("kind = 'tail'").orderBy("to_version").collect()
    ]
    # chained without gap or overlap, none longer than the bound
    assert tails[0][0] == 0 and tails[-1][1] == final
    assert all(b[0] == a[1] for a, b in itertools.pairwise(tails))
    assert all(0 < to - start <= 2 for start, to in tails)


def test_advancing_watermarks_commit_only_the_history_and_the_catalog_catches_up_on_flush(
    spark: SparkSession, app_config: AppConfig
) -> None:
    # no status flush while it runs: a tick that advances watermarks commits no catalog;
    # on Spark, to count the Spark jobs of small tails (natively they launch none)
    path, config, key, client = one_replica(
        spark, app_config, "quick", "greedy", status_flush_interval=3600.0, small_iterations="spark"
    )
    catalog_path = config.state.table_path("catalog")
    with running(spark, config) as app:
        wait_for_watermark(spark, config, key, 0)
        catalog_version = latest_version(spark, catalog_path)
        for step in commit_steps(spark, path):
            step()
            version = latest_version(spark, path)
            wait_for_watermark(spark, config, key, version)  # the client reads the history
            assert_df_equality(
                target(spark, config, "shop", "quick_copy"),
                source_at(spark, path, version, ["id", "name", "amount"]),
                ignore_row_order=True,
            )
        final = version
        assert latest_version(spark, catalog_path) == catalog_version
        (stored,) = spark.read.format("delta").load(catalog_path).collect()
        assert stored["watermark"] in (None, 0)  # behind the data, as a crash would leave it
        assert next(r for r in app.catalog.rows() if r.key == key).watermark == final

    # the shutdown flushed it; a restart rolls nothing forward and runs nothing
    (stored,) = spark.read.format("delta").load(catalog_path).collect()
    assert (stored["watermark"], stored["job_state"]) == (final, "completed")
    # Spark jobs of these small tails: the change set stored as it is counted
    # per version (1), the target's state for Delta's idempotent-write check (1),
    # then the MERGE without a copy of its source: its scan for touched files
    # and its rewrite (3 here). The first tail, inserts into an empty target,
    # takes Delta's inserts-only path, one more.
    tail_rows = history(spark, config).where("kind = 'tail'").orderBy("to_version").collect()
    jobs = [r["spark_jobs"] for r in tail_rows]
    assert len(jobs) == 4 and jobs[0] <= 7 and max(jobs[1:]) <= 5, jobs
    assert {r["path"] for r in tail_rows} == {"spark"}
    tails = len(jobs)
    with running(spark, config) as app:
        assert app.roll_forward() == 0
        assert client.get_job_status(key).watermark == final  # type: ignore[union-attr]
    assert history(spark, config).where("kind = 'tail'").count() == tails
    # the tables appended to on most ticks checkpoint every 100 commits, not every 10
    for name in ("iterations", "requests"):
        detail = DeltaTable.forPath(spark, config.state.table_path(name)).detail().first()
        assert detail is not None
        assert detail["properties"] == {"delta.checkpointInterval": "100"}


def test_a_backlog_is_cut_into_iterations_of_at_most_the_accounts_max_rows_change_rows(
    spark: SparkSession, app_config: AppConfig
) -> None:
    # the account's own bound (tenants.accounts) wins over the engine's
    path, config, key, _ = one_replica(spark, app_config, "rows", max_rows_per_iteration=1000)
    config = replace(config, tenants=TenantsConfig(accounts={"1": {"max_rows_per_iteration": 25}}))
    with running(spark, config):
        wait_for_watermark(spark, config, key, 0)
    # a backlog while the service is stopped: 20 inserts; 6 updates (12 change rows);
    # 4 deletes; a merge of 1 update and 2 inserts (4)
    for step in commit_steps(spark, path):
        step()
    final = latest_version(spark, path)
    with running(spark, config):
        wait_for_watermark(spark, config, key, final)
    assert_df_equality(
        target(spark, config, "shop", "rows_copy"),
        source_at(spark, path, final, ["id", "name", "amount"]),
        ignore_row_order=True,
    )
    tails = [
        (r["from_version"], r["to_version"], r["rows_read"])
        for r in history(spark, config).where("kind = 'tail'").orderBy("to_version").collect()
    ]
    # 20 + 12 is over the bound; 12 + 4 + 4 fits
    assert tails == [(0, 1, 20), (1, 4, 20)]
