"""Every version of every sink equals a from-scratch computation at its source version.

The other consumer tests compare final states. This one reads each version of
each sink back with Delta time travel: every sink commit records, in its Delta
transaction (``txnAppId`` / ``txnVersion``), the source version it brings the
sink to, and the sink at that commit must equal the batch computation over the
source at that version. Commits land while the service is stopped, so each
restart sees a range of several versions, with groups born and emptied, extremes
inserted and removed, NULLs and the table emptied inside one range. The jobs
share one trigger, so each range is one iteration fanned out to every consumer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import cdf_source, latest_version, running, wait_for_watermark
from devkit.workload import SCHEMA, Workload
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig
from lakeprop.consumers.fulltext_index import Tokenizer
from lakeprop.spec import JobKey
from tests.integration.test_consumers import read_feed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def fulltext(rows: DataFrame) -> DataFrame:
    tokenizer = Tokenizer()
    entries = []
    for row in rows.collect():
        positions: dict[str, list[int]] = {}
        for position, term in tokenizer.tokens(row["body"]):
            positions.setdefault(term, []).append(position)
        entries += [(t, row["id"], "body", len(p), p) for t, p in positions.items()]
    return rows.sparkSession.createDataFrame(
        entries, "term STRING, id INT, field STRING, tf INT, positions ARRAY<INT>"
    )


# job name -> (trigger, consumer, from-scratch computation, sink columns compared)
# (ranges come from commits made while the service is down, whatever the trigger)
Expected = Callable[[DataFrame], DataFrame]
JOBS: dict[str, tuple[dict[str, Any], dict[str, Any], Expected, list[str]]] = {
    "copy": (
        {"kind": "default"},
        {"type": "replica", "options": {"primary_key": ["id"]}},
        lambda src: src,
        ["id", "g", "v", "body"],
    ),
    "by_g": (
        {"kind": "default"},
        {"type": "secondary_index", "options": {"columns": ["g"], "primary_key": ["id"]}},
        lambda src: src.select("g", "id"),
        ["g", "id"],
    ),
    "words": (
        {"kind": "default"},
        {"type": "fulltext_index", "options": {"columns": ["body"], "primary_key": ["id"]}},
        fulltext,
        ["term", "id", "field", "tf", "positions"],
    ),
    "stats": (
        {"kind": "default"},
        {
            "type": "aggregate_view",
            "options": {"group_by": ["g"], "aggregates": aggregates_of("v")},
        },
        lambda src: aggregated(src, ["g"], "v"),
        ["g", *AGGREGATE_COLUMNS],
    ),
    "overall": (
        {"kind": "default"},
        {"type": "aggregate_view", "options": {"aggregates": aggregates_of("v")}},
        lambda src: aggregated(src, [], "v"),
        AGGREGATE_COLUMNS,
    ),
}


def recorded_versions(path: str, job_id: int) -> dict[int, int]:
    """{sink version: source version} from the job's Delta transactions in the sink's log."""
    found: dict[int, int] = {}
    for commit in sorted(Path(path, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"].startswith(f"lakeprop-{job_id}-"):
                found[int(commit.stem)] = int(txn["version"])
    return found


def at(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def test_every_version_of_every_sink_equals_the_batch_computation_at_its_source_version(  # noqa: C901 - one workload, every sink, every version
    spark: SparkSession, app_config: AppConfig
) -> None:
    source = cdf_source(spark, app_config, "p", "src", SCHEMA)
    workload = Workload(spark, source, seed=5)
    workload.burst(3)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    feed_topic = f"{app_config.kafka.topic}.feed"
    jobs = {
        **{name: (trigger, consumer) for name, (trigger, consumer, _, _) in JOBS.items()},
        "feed": (
            {"kind": "default"},
            {
                "type": "kafka_changefeed",
                "options": {
                    "topic": feed_topic,
                    "bootstrap_servers": app_config.kafka.bootstrap_servers,
                    "primary_key": ["id"],
                },
            },
        ),
    }
    keys = {name: JobKey(1, "p", "src", name) for name in jobs}
    for name, (trigger, consumer) in jobs.items():
        client.register_job(keys[name], {"trigger": trigger, "iteration": {"consumer": consumer}})

    job_ids: dict[str, int] = {}
    for round_ in range(3):
        if round_:
            workload.burst(6)  # with the service down: one range of several versions
        with running(spark, app_config):
            latest = latest_version(spark, source)
            for name, key in keys.items():
                job_ids[name] = wait_for_watermark(spark, app_config, key, latest)["job_id"]

    warehouse = app_config.tables.warehouse
    for name, (_, _, expected, columns) in JOBS.items():
        sink = f"{warehouse}/p/src_{name}"
        versions = recorded_versions(sink, job_ids[name])
        # every commit of the sink is one of the job's writes, the last one at the watermark
        assert sorted(versions) == list(range(max(versions) + 1)), (name, versions)
        assert versions[max(versions)] == latest, (name, versions)
        assert len(set(versions.values())) > 2, (name, versions)  # intermediate versions seen
        for sink_version, source_version in sorted(versions.items()):
            try:
                assert_df_equality(
                    at(spark, sink, sink_version).select(*columns),
                    expected(at(spark, source, source_version)).select(*columns),
                    ignore_row_order=True,
                    ignore_nullable=True,
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{name}: sink version {sink_version} != source version {source_version}"
                ) from exc

    # the change feed, replayed up to any source version, gives the source at that version
    messages = read_feed(app_config.kafka.bootstrap_servers, feed_topic)
    first = min(v["version"] for _, _, v in messages)
    for version in range(first, latest + 1):
        state: dict[int, tuple[Any, ...]] = {}
        seen: set[tuple[int, int, str]] = set()
        for _, key, value in sorted(
            (m for m in messages if m[2]["version"] <= version),
            key=lambda m: (m[2]["version"], m[2]["op"] != "delete"),
        ):
            if (value["version"], key["id"], value["op"]) in seen:
                continue  # at least once: a replayed range publishes again
            seen.add((value["version"], key["id"], value["op"]))
            row = value["row"]
            if value["op"] == "delete":
                state.pop(key["id"], None)
            else:
                state[key["id"]] = (row["id"], row.get("g"), row.get("v"), row.get("body"))
        source_rows = {r["id"]: tuple(r) for r in at(spark, source, version).collect()}
        assert state == source_rows, f"the feed replayed up to version {version}"
