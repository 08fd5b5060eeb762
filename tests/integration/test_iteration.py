"""Tail iterations run as a worker runs them: in a large one, consumers of the same
key and start share one held last change per key; in any, a MERGE reads only the
target files within the change set's key bounds; every target comes out right."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.harness import SOURCE_SCHEMA, cdf_source
from lakeprop.config import AppConfig
from lakeprop.engine import changeset
from lakeprop.engine.iteration import run_iteration
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberJob,
    TableRef,
)
from lakeprop.engine.sparkstats import cached_bytes
from lakeprop.spec import JobKey, JobSpec
from lakeprop.tables.resolve import Tables
from tests.integration.test_fulltext import expected_index

pytestmark = pytest.mark.integration

TABLE = TableRef(1, "shop", "orders")
CONSUMERS: dict[str, dict[str, Any]] = {
    "copy": {"type": "replica", "options": {"primary_key": ["id"]}},
    "names": {"type": "replica", "options": {"primary_key": ["id"], "columns": ["id", "name"]}},
    "by_name": {"type": "secondary_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
    "words": {"type": "fulltext_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
    "late": {"type": "replica", "options": {"primary_key": ["id"]}},
}


def member(name: str, number: int, start: int | None) -> MemberJob:
    key = JobKey(1, "shop", "orders", name)
    spec = JobSpec.from_json({"iteration": {"consumer": CONSUMERS[name]}})
    return MemberJob(Member((key, number), number, start), key, spec)


def run(
    spark: SparkSession, tables: Tables, kind: IterationKind, to: int, jobs: Sequence[MemberJob]
) -> IterationResult:
    plan = IterationPlan(TABLE, kind, to, tuple(j.member for j in jobs), 0, time.time())
    spark.sparkContext.setJobGroup(plan.iteration_id, "test")  # as a worker does
    # small_rows=0: however few its rows, the iteration takes the large path
    result = run_iteration(spark, plan, jobs, tables, CancelToken(), fan_out=3, small_rows=0)
    assert result.outcome == "success", result.members
    return result


def test_consumers_of_one_key_and_start_share_one_held_last_change_per_key(
    spark: SparkSession, app_config: AppConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "shop", "orders")
    source = DeltaTable.forPath(spark, path)
    rows = [(i, f"w{i % 7} w{i % 3}", float(i)) for i in range(60)]
    spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
    early = ["copy", "names", "by_name", "words"]
    numbers = {name: n for n, name in enumerate(CONSUMERS, start=1)}
    run(spark, tables, IterationKind.SNAPSHOT, 1, [member(n, numbers[n], None) for n in early])
    source.update(F.col("id") % 4 == 0, {"name": F.lit("w9 w1"), "amount": F.col("amount") + 1})
    run(spark, tables, IterationKind.SNAPSHOT, 2, [member("late", numbers["late"], None)])
    source.delete(F.col("id") % 5 == 0)  # version 3
    spark.createDataFrame([(100, "w9 new", 1.0), (20, "w8 back", 2.0)], SOURCE_SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)  # version 4: 20 was updated, then deleted: it comes back

    computed: list[tuple[str, ...]] = []
    latest = changeset.latest_change_per_key

    def recorded(changes: DataFrame, key: list[str]) -> DataFrame:
        computed.append(tuple(key))
        return latest(changes, key)

    monkeypatch.setattr(changeset, "latest_change_per_key", recorded)
    tail = [member(n, numbers[n], 1) for n in early] + [member("late", numbers["late"], 2)]
    result = run(spark, tables, IterationKind.TAIL, 4, tail)

    # once for the four jobs at version 1, once for the one at version 2
    assert computed == [("id",), ("id",)]
    assert result.bytes_cached is not None and result.bytes_cached > 0
    now = spark.read.format("delta").option("versionAsOf", 4).load(path)

    def target(name: str) -> DataFrame:
        return tables.handle("shop", f"orders_{name}", spark).delta().toDF()

    for name, columns in {
        "copy": now.columns,
        "late": now.columns,
        "names": ["id", "name"],
    }.items():
        assert_df_equality(
            target(name).select(*columns), now.select(*columns), ignore_row_order=True
        )
    assert_df_equality(
        target("by_name").select("name", "id"), now.select("name", "id"), ignore_row_order=True
    )
    assert_df_equality(
        target("words").select("term", "id", "field", "tf", "positions"),
        expected_index(spark, now, {"columns": ["name"], "tokenizer": None}),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def rows_read_per_stage(spark: SparkSession, group: str) -> list[int]:
    """Rows each stage of the jobs of ``group`` read from files and blocks so far."""
    context = spark.sparkContext
    context._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    store = context._jsc.sc().statusStore()
    tracker = context.statusTracker()
    stages = {s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds}
    rows = []
    for stage in sorted(stages):
        with contextlib.suppress(Py4JJavaError):  # a skipped stage never ran: no attempt
            rows.append(int(store.lastStageAttempt(stage).inputRecords()))
    return rows


def test_a_tail_of_recent_keys_reads_only_the_target_files_that_hold_them(
    spark: SparkSession, app_config: AppConfig
) -> None:
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "shop", "orders")
    spark.range(4000).select(
        F.col("id").cast("int").alias("id"),
        F.concat(F.lit("w"), (F.col("id") % 50).cast("string")).alias("name"),
        F.col("id").cast("double").alias("amount"),
    ).write.format("delta").mode("append").save(path)  # version 1
    names = ["copy", "by_name", "words"]
    first = [member(name, n, None) for n, name in enumerate(names, start=1)]
    run(spark, tables, IterationKind.SNAPSHOT, 1, first)
    for name in names:  # each target in 8 files of about 500 keys, as appends by key leave it
        target = tables.handle("shop", f"orders_{name}", spark).location()
        laid_out = spark.read.format("delta").load(target).repartitionByRange(8, "id")
        laid_out.localCheckpoint().write.format("delta").mode("overwrite").save(target)
    source = DeltaTable.forPath(spark, path)
    source.update(F.col("id") >= 3950, {"name": F.lit("w7 fresh")})  # version 2
    source.delete(F.col("id") >= 3990)  # version 3
    spark.createDataFrame(
        [(i, f"w{i % 3} new", 1.0) for i in range(4000, 4020)], SOURCE_SCHEMA
    ).write.format("delta").mode("append").save(path)  # version 4

    tail = [member(name, n, 1) for n, name in enumerate(names, start=1)]
    plan = IterationPlan(
        TABLE, IterationKind.TAIL, 4, tuple(j.member for j in tail), 0, time.time()
    )
    spark.sparkContext.setJobGroup(plan.iteration_id, "test")
    result = run_iteration(spark, plan, tail, tables, CancelToken(), fan_out=1, small_rows=10_000)
    assert result.outcome == "success", result.members
    # The changes hold keys 3950..4019: every MERGE (and the index's read of its
    # stale postings) reads the target's last file, 500 rows or so; without the
    # bounds each would read all 8 files, 4,000 rows in one stage.
    assert max(rows_read_per_stage(spark, plan.iteration_id)) < 1000

    now = spark.read.format("delta").option("versionAsOf", 4).load(path)

    def target(name: str) -> DataFrame:
        return tables.handle("shop", f"orders_{name}", spark).delta().toDF()

    assert_df_equality(target("copy"), now, ignore_row_order=True)
    assert_df_equality(
        target("by_name").select("name", "id"), now.select("name", "id"), ignore_row_order=True
    )
    assert_df_equality(
        target("words").select("term", "id", "field", "tf", "positions"),
        expected_index(spark, now, {"columns": ["name"], "tokenizer": None}),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_two_snapshots_of_one_version_each_hold_their_own_rows(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """Snapshots of a table run side by side (two new jobs do not wait for each
    other): the one that ends first releases its rows, never the other's."""
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "shop", "orders")
    rows = [(i, f"n{i}", float(i)) for i in range(40)]
    spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
    source = tables.handle("shop", "orders", spark)
    held = []
    for _ in range(2):  # both read before either ends
        plan = IterationPlan(TABLE, IterationKind.SNAPSHOT, 1, (), 0, time.time())
        result = IterationResult(plan, plan.kind, time.time())
        read = changeset.read(source, plan, result, CancelToken(), ["id"])
        assert result.rows_read == 40
        held.append(read.data)
    first, second = held
    size = cached_bytes(spark, first)
    assert size is not None and size > 0

    changeset.release(first)

    assert cached_bytes(spark, second) == size  # still in the block store
    assert_df_equality(
        second,
        spark.createDataFrame(rows, SOURCE_SCHEMA),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    changeset.release(second)
