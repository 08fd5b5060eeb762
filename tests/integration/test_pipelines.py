"""Pipelines: jobs that read other jobs' targets, through the running service.

A chain of three jobs (a replica of the source, an aggregate view of the
replica, a replica of the view) is told of commits to its first table only,
with an hour between ticks and between sweeps: a change reaches the last table
because each iteration that writes a table another job reads makes that job's
table due at once. The last table is compared whole with a model of the source
after every commit, on the native path and on Spark. The graph's rules (no
cycle, no drop that strands a job without ``cascade``, a job waiting on a paused
upstream) are checked on the same service, and ``lakeprop graph`` draws it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import (
    SOURCE_SCHEMA,
    cdf_source,
    cli_settings,
    history,
    latest_version,
    running,
    wait_for_watermark,
)
from devkit.waiting import assert_eventually
from lakeprop import cli
from lakeprop.client.api import LakepropClient
from lakeprop.client.notebook import Notebook
from lakeprop.config import AppConfig
from lakeprop.errors import ErrorCode, InvalidArgumentError
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

COPY = JobKey(1, "p", "events", "copy")  # p.events -> p.events_copy
TOTALS = JobKey(1, "p", "events_copy", "totals")  # -> p.events_copy_totals
OUT = JobKey(1, "p", "events_copy_totals", "out")  # -> p.events_copy_totals_out


def spec(consumer: str, **options: object) -> dict[str, object]:
    return {
        "trigger": {"kind": "greedy"},
        "iteration": {"consumer": {"type": consumer, "options": options}},
    }


CHAIN = [
    (COPY, spec("replica", primary_key=["id"])),
    (TOTALS, spec("aggregate_view", group_by=["name"], aggregates=aggregates_of("amount"))),
    (OUT, spec("replica", primary_key=["name"])),
]
POSITIVE = {"name": "positive", "check": "amount >= 0", "action": "warn"}
"""A rule of the aggregate view's on Spark (expectations run there only)."""


def table(spark: SparkSession, config: AppConfig, name: str) -> DataFrame:
    return spark.read.format("delta").load(f"{config.tables.warehouse}/p/{name}")


def commit(spark: SparkSession, path: str, sql: str) -> int:
    spark.sql(sql.format(t=f"delta.`{path}`"))
    return latest_version(spark, path)


def source_version(spark: SparkSession, config: AppConfig, key: JobKey) -> int:
    return latest_version(spark, f"{config.tables.warehouse}/{key.database}/{key.table}")


def through_the_chain(spark: SparkSession, config: AppConfig) -> None:
    """Each job of the chain, in order, at the version its source holds once the job
    before it is done: the version that job wrote."""
    for key, _ in CHAIN:
        wait_for_watermark(spark, config, key, source_version(spark, config, key))


def assert_the_last_table_is_the_model(spark: SparkSession, config: AppConfig, path: str) -> None:
    columns = ["name", *AGGREGATE_COLUMNS]
    assert_df_equality(
        table(spark, config, "events_copy_totals_out").select(*columns),
        aggregated(spark.read.format("delta").load(path), ["name"], "amount").select(*columns),
        ignore_row_order=True,
        ignore_nullable=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("path_taken", ["auto", "spark"])
def test_a_change_goes_through_a_chain_of_three_jobs_in_one_pass(
    spark: SparkSession, app_config: AppConfig, path_taken: str
) -> None:
    notifications = replace(
        app_config.notifications,
        enabled=True,
        topic=f"{app_config.kafka.topic}.commits",
        sweep_interval=3600.0,
    )
    config = replace(
        app_config,
        notifications=notifications,
        tick_interval=3600.0,
        engine=replace(app_config.engine, small_iterations=path_taken),
    )
    path = cdf_source(spark, config, "p", "events")
    spark.createDataFrame(
        [(i, f"g{i % 3}", float(i)) for i in range(9)], SOURCE_SCHEMA
    ).write.format("delta").mode("append").save(path)
    client = LakepropClient(
        config.kafka, config.state, spark, tables=config.tables, notifications=notifications
    )
    chain = CHAIN
    if path_taken == "spark":
        totals = spec(
            "aggregate_view",
            group_by=["name"],
            aggregates=aggregates_of("amount"),
            expectations=[POSITIVE],
        )
        chain = [CHAIN[0], (TOTALS, totals), CHAIN[2]]
    with running(spark, config):
        for key, job in chain:  # each once its upstream's target exists
            client.register_job(key, job)
            wait_for_watermark(spark, config, key, source_version(spark, config, key))
        assert_the_last_table_is_the_model(spark, config, path)
        for sql in (
            "INSERT INTO {t} VALUES (20, 'g1', 5.0), (21, 'g4', 7.5)",
            "UPDATE {t} SET amount = amount + 1 WHERE id % 2 = 0",
            "UPDATE {t} SET name = 'g9' WHERE id = 4",  # a row moves to another group
            "DELETE FROM {t} WHERE name = 'g0'",  # a group disappears
        ):
            version = commit(spark, path, sql)
            client.notify_commit("p", "events", version)  # the first only
            through_the_chain(spark, config)
            assert_the_last_table_is_the_model(spark, config, path)
        # a wait for a commit to reach the end, from the client and from the CLI
        version = commit(spark, path, "UPDATE {t} SET amount = amount * 2 WHERE id < 3")
        client.notify_commit("p", "events", version)
        reached = client.wait_for_origin(OUT, ("p", "events"), version, timeout=90)
        assert reached.key == OUT
        assert_the_last_table_is_the_model(spark, config, path)
        version = commit(spark, path, "DELETE FROM {t} WHERE id = 1")
        client.notify_commit("p", "events", version)
        where = ["--account", "1", "--database", "p", "--table", OUT.table, "--name", OUT.job_name]
        wait = ["wait", *where, "--origin", f"p.events@{version}", "--timeout", "90"]
        assert cli.main([*cli_settings(config), *wait]) == 0
        assert_the_last_table_is_the_model(spark, config, path)
        with pytest.raises(InvalidArgumentError, match=r"not downstream of p\.other"):
            client.wait_for_origin(OUT, ("p", "other"), 0)
        out = client.get_job_status(OUT)
        assert out is not None and out.freshness is not None
        assert out.freshness["origin"] == "p.events" and out.freshness["seconds"] >= 0
    paths = {r["path"] for r in history(spark, config).where("kind = 'tail'").collect()}
    assert paths == ({"native", "spark"} if path_taken == "auto" else {"spark"})
    if path_taken == "spark":
        assert_the_events_tell_the_story(spark, config, client)
    else:
        assert_a_restart_keeps_the_freshness(spark, config, client, path)
    client.close()


def assert_a_restart_keeps_the_freshness(
    spark: SparkSession, config: AppConfig, client: LakepropClient, path: str
) -> None:
    """A write made before a restart is credited after it with the commit to the
    first table it reflects (the history recorded it): the last job, paused, reads
    after the restart what its upstream wrote before it."""
    with running(spark, config):
        client.wait_for_outcome(client.pause_job(OUT))
        version = commit(spark, path, "INSERT INTO {t} VALUES (30, 'g2', 3.0)")
        client.notify_commit("p", "events", version)
        for key in (COPY, TOTALS):
            wait_for_watermark(spark, config, key, source_version(spark, config, key))
    with running(spark, config):
        client.wait_for_outcome(client.resume_job(OUT))
        upstream = source_version(spark, config, OUT)
        client.notify_commit(OUT.database, OUT.table, upstream)
        wait_for_watermark(spark, config, OUT, upstream)
    assert_the_last_table_is_the_model(spark, config, path)
    (last,) = (
        history(spark, config)
        .selectExpr("ended_at", "explode(members) AS m")
        .where("m.job_name = 'out'")
        .orderBy(F.col("ended_at").desc())
        .limit(1)
        .select("m.origin_table", "m.origin_at")
        .collect()
    )
    assert (last["origin_table"], last["origin_at"]) == ("p.events", commit_time(path, version))


def commit_time(path: str, version: int) -> datetime:
    """When commit ``version`` of the table at ``path`` was made, as its log says."""
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    info = next(json.loads(line)["commitInfo"] for line in log.open() if '"commitInfo"' in line)
    return datetime.fromtimestamp(info["timestamp"] / 1000)


def assert_the_events_tell_the_story(
    spark: SparkSession, config: AppConfig, client: LakepropClient
) -> None:
    """The event table holds the verdicts, every iteration, and the rule's counts
    (written at the stop, for the last ones); a notebook reads it."""
    events = spark.read.format("delta").load(f"{config.state.location}/events")
    notebook = Notebook(spark, config, client)
    frame = notebook.events("verdict")
    assert list(frame["job_name"]) == [key.job_name for key, _ in CHAIN]
    # one job's newest, and a time range: the filters hold
    last = notebook.events(job=TOTALS, limit=1)
    assert len(last) == 1 and list(last["job_name"]) == ["totals"]
    assert last["at"].iloc[0] == notebook.events(job=TOTALS, limit=None)["at"].max()
    first = frame["at"].iloc[0].to_pydatetime()
    assert notebook.events("verdict", until=first).empty
    assert len(notebook.events("verdict", since=first)) == len(CHAIN)
    verdicts = events.where("kind = 'verdict'").select("job_name", "message").collect()
    assert sorted(verdicts) == sorted(
        (key.job_name, "register applied: registered") for key, _ in CHAIN
    )
    runs = history(spark, config).count()
    assert events.where("kind = 'iteration'").count() == runs
    counted = events.where("kind = 'expectation'").select("job_name", "details").collect()
    assert {r["job_name"] for r in counted} == {"totals"}
    assert all(
        '"expectation": "positive", "action": "warn", "failed": 0' in r["details"] for r in counted
    )
    totals = (
        history(spark, config).selectExpr("explode(members) AS m").where("m.job_name = 'totals'")
    )
    assert len(counted) == totals.count()


def test_the_graph_refuses_cycles_and_stranding_drops_and_shows_who_waits(
    spark: SparkSession, app_config: AppConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    path = cdf_source(spark, app_config, "p", "events")
    spark.createDataFrame([(1, "g1", 1.0)], SOURCE_SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    with running(spark, app_config):
        early = client.wait_for_outcome(client.register_job(OUT, CHAIN[2][1]))
        assert early["outcome"] == "rejected"  # its source does not exist yet
        for key, job in CHAIN[:2]:
            client.register_job(key, job)
            wait_for_watermark(spark, app_config, key, source_version(spark, app_config, key))
        client.register_job(OUT, CHAIN[2][1])
        wait_for_watermark(spark, app_config, OUT, source_version(spark, app_config, OUT))

        unknown = {"name": "odd", "check": "no_such_column > 1"}
        bad = client.wait_for_outcome(
            client.register_job(
                JobKey(1, "p", "events", "odd"),
                spec("replica", primary_key=["id"], expectations=[unknown]),
            )
        )
        assert (bad["outcome"], bad["error_code"]) == (
            "rejected",
            ErrorCode.INVALID_CONSUMER_OPTIONS,
        )
        assert "expectation odd 'no_such_column > 1' does not resolve" in bad["detail"]

        back = JobKey(1, "p", "events_copy_totals_out", "back")
        cycle = client.wait_for_outcome(
            client.register_job(back, spec("replica", primary_key=["name"], target_table="events"))
        )
        assert (cycle["outcome"], cycle["error_code"]) == ("rejected", ErrorCode.PIPELINE_CYCLE)
        assert (
            "p.events_copy_totals_out -[back]-> p.events -[copy]-> p.events_copy "
            "-[totals]-> p.events_copy_totals -[out]-> p.events_copy_totals_out"
        ) in cycle["detail"]

        # p.events/copy_totals defaults to the target of p.events_copy/totals
        second = JobKey(1, "p", "events", "copy_totals")
        taken = client.wait_for_outcome(
            client.register_job(second, spec("replica", primary_key=["id"]))
        )
        assert (taken["outcome"], taken["error_code"]) == ("rejected", ErrorCode.TARGET_TAKEN)
        assert f"p.events_copy_totals, the target of job {TOTALS}" in taken["detail"]

        stranding = client.wait_for_outcome(client.unregister_job(TOTALS))
        assert (stranding["outcome"], stranding["error_code"]) == (
            "rejected",
            ErrorCode.DOWNSTREAM_JOBS,
        )
        assert str(OUT) in stranding["detail"]

        client.wait_for_outcome(client.pause_job(COPY))

        def waiting() -> None:
            for key in (TOTALS, OUT):
                job = client.get_job_status(key)
                assert job is not None and job.waiting == f"upstream job {COPY} is paused"

        assert_eventually(waiting, timeout=60)

        capsys.readouterr()
        assert cli.main([*cli_settings(app_config), "graph", "--database", "p"]) == 0
        assert capsys.readouterr().out.splitlines() == [
            "p.events",
            "  └─ copy (replica, paused) → p.events_copy",
            "       └─ totals (aggregate_view, completed) → p.events_copy_totals",
            "            └─ out (replica, completed) → p.events_copy_totals_out",
        ]
        assert cli.main([*cli_settings(app_config), "graph", "--format", "mermaid"]) == 0
        assert capsys.readouterr().out.splitlines()[:2] == ["flowchart LR", '  t0["p.events"]']

        dropped = client.wait_for_outcome(client.unregister_job(COPY, cascade=True))
        assert dropped["outcome"] == "applied"
        assert dropped["detail"] == f"unregistered with 2 job(s) downstream: {TOTALS}, {OUT}"
        assert client.list_jobs() == []
    client.close()
