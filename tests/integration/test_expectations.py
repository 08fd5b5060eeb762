"""Expectations run as a worker runs an iteration: ``drop`` keeps a target to the
source rows that pass, its quarantine takes each dropped row once (a replay adds
nothing), ``warn`` and ``unique`` count, and ``fail`` writes nothing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from devkit.expected import AGGREGATE_COLUMNS, aggregated, aggregates_of
from devkit.harness import SOURCE_SCHEMA, cdf_source, latest_version
from devkit.iterations import iterate
from lakeprop.config import AppConfig
from lakeprop.engine.iteration import _TALLY_FAILED, run_iteration
from lakeprop.engine.model import (
    CancelToken,
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberJob,
    TableRef,
)
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.history import RuleCount
from lakeprop.tables.resolve import Tables

pytestmark = pytest.mark.integration

KNOWN = {"name": "amount_known", "check": "amount IS NOT NULL", "action": "drop"}
SMALL = {"name": "small", "check": "amount < 100", "action": "warn"}
NAMES = {"name": "one_per_name", "unique": ["name"], "action": "warn"}
CONSUMERS: dict[str, dict[str, Any]] = {
    "clean": {
        "type": "replica",
        "options": {"primary_key": ["id"], "expectations": [KNOWN, SMALL, NAMES]},
    },
    "totals": {
        "type": "aggregate_view",
        "options": {
            "group_by": ["name"],
            "aggregates": aggregates_of("amount"),
            "expectations": [KNOWN],
        },
    },
    "strict": {
        "type": "replica",
        "options": {
            "primary_key": ["id"],
            "expectations": [
                {"name": "not_negative", "check": "amount >= 0", "action": "fail"},
                {"name": "one_per_id", "unique": ["id"], "action": "fail"},
            ],
        },
    },
}
CONSUMERS["capped"] = {
    "type": "aggregate_view",
    "options": {
        "group_by": ["name"],
        "aggregates": aggregates_of("amount"),
        "expectations": [{"name": "below_1000", "check": "amount < 1000", "action": "drop"}],
    },
}
NUMBERS = {name: n for n, name in enumerate(CONSUMERS, start=1)}
QUARANTINE_COLUMNS = ["id", "name", "amount", "__reason", "__source_version"]


def run(
    spark: SparkSession, tables: Tables, to: int, names: Sequence[str], start: int | None
) -> IterationResult:
    """One iteration of the named jobs: a snapshot, or a tail from ``start``."""
    jobs = [
        (
            JobKey(1, "qa", "orders", name),
            NUMBERS[name],
            JobSpec.from_json({"iteration": {"consumer": CONSUMERS[name]}}),
        )
        for name in names
    ]
    kind = IterationKind.SNAPSHOT if start is None else IterationKind.TAIL
    return iterate(spark, tables, jobs, kind, start, to, small_rows=1000)


def counts(result: IterationResult, name: str) -> list[RuleCount]:
    (found,) = [m for m in result.members if m.job_id == NUMBERS[name]]
    assert found.ok, found.error_msg
    return list(found.expectations)


def target(spark: SparkSession, tables: Tables, name: str) -> DataFrame:
    return tables.handle("qa", name, spark).delta().toDF()


def assert_view(spark: SparkSession, tables: Tables, name: str, kept: DataFrame) -> None:
    """The aggregate view ``name`` is the per-name aggregate of ``kept``, whole."""
    columns = ["name", *AGGREGATE_COLUMNS]
    assert_df_equality(
        target(spark, tables, name).select(*columns),
        aggregated(kept, ["name"], "amount").select(*columns),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_drop_keeps_the_target_to_the_passing_rows_and_quarantines_each_row_once(
    spark: SparkSession, app_config: AppConfig
) -> None:
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "qa", "orders")
    rows = [(1, "a", 1.0), (2, "b", 2.0), (3, "c", None), (4, "d", 4.0)]
    spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
    first = latest_version(spark, path)
    snapshot = run(spark, tables, first, ["clean", "totals"], None)
    assert counts(snapshot, "clean") == [
        RuleCount("amount_known", "drop", 1),
        RuleCount("small", "warn", 1),
        RuleCount("one_per_name", "warn", 0),
    ]

    source = DeltaTable.forPath(spark, path)
    spark.createDataFrame(
        [(10, "e", None), (11, "f", 150.0), (12, "a", 12.0)], SOURCE_SCHEMA
    ).write.format("delta").mode("append").save(path)  # dropped, warned, a shared name
    source.update(F.col("id") == 1, {"amount": F.lit(None)})  # leaves the target
    emptied = latest_version(spark, path)
    source.update(F.col("id") == 3, {"amount": F.lit(3.0)})  # enters it
    source.delete(F.col("id") == 10)  # a row the target never held
    second = latest_version(spark, path)
    tail = run(spark, tables, second, ["clean", "totals"], first)
    assert counts(tail, "clean") == [
        RuleCount("amount_known", "drop", 2),
        RuleCount("small", "warn", 3),
        RuleCount("one_per_name", "warn", 1),
    ]

    def assert_targets() -> None:
        now = spark.read.format("delta").load(path).where("amount IS NOT NULL")
        assert_df_equality(
            target(spark, tables, "orders_clean").select(*now.columns),
            now,
            ignore_row_order=True,
        )
        assert_view(spark, tables, "orders_totals", now)

    expected = [
        (3, "c", None, "amount_known", first),
        (10, "e", None, "amount_known", first + 1),
        (1, "a", None, "amount_known", emptied),
    ]

    def assert_quarantine(rows: list[tuple[Any, ...]]) -> None:
        for job in ("clean", "totals"):
            held = target(spark, tables, f"orders_{job}__quarantine")
            assert_df_equality(
                held.select(*QUARANTINE_COLUMNS),
                spark.createDataFrame(rows, held.select(*QUARANTINE_COLUMNS).schema),
                ignore_row_order=True,
            )

    assert_targets()
    assert_quarantine(expected)

    # a replay of the same range (a crash before the watermark moved) adds nothing
    replay = run(spark, tables, second, ["clean", "totals"], first)
    assert counts(replay, "clean")[0] == RuleCount("amount_known", "drop", 2)
    assert_targets()
    assert_quarantine(expected)

    # nor does a longer one over it: only the new version's rows go in
    spark.createDataFrame([(13, "g", None)], SOURCE_SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    third = latest_version(spark, path)
    run(spark, tables, third, ["clean", "totals"], first)
    assert_targets()
    assert_quarantine([*expected, (13, "g", None, "amount_known", third)])

    # a range whose only change is a dropped row leaving: it never counted, so it
    # must not be taken away from the view
    source.delete(F.col("id") == 13)
    fourth = latest_version(spark, path)
    last = run(spark, tables, fourth, ["clean", "totals"], third)
    assert counts(last, "totals") == [RuleCount("amount_known", "drop", 0)]
    assert_targets()
    assert_quarantine([*expected, (13, "g", None, "amount_known", third)])


def test_an_extreme_recomputed_from_the_source_sees_only_the_rows_the_rules_keep(
    spark: SparkSession, app_config: AppConfig
) -> None:
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "qa", "orders")
    rows = [(1, "g", 5.0), (2, "g", 3.0), (3, "g", 2000.0), (4, "h", 1.0)]
    spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
    first = latest_version(spark, path)
    run(spark, tables, first, ["capped"], None)
    # the group's greatest kept value goes: its max is recomputed from the source,
    # where 2000 (dropped, never in the view) must stay out
    DeltaTable.forPath(spark, path).update(F.col("amount") == 5.0, {"amount": F.lit(4.0)})
    second = latest_version(spark, path)
    assert counts(run(spark, tables, second, ["capped"], first), "capped") == [
        RuleCount("below_1000", "drop", 0)
    ]
    kept = spark.read.format("delta").load(path).where("amount < 1000")
    assert_view(spark, tables, "orders_capped", kept)


def test_a_broken_fail_rule_names_it_and_writes_nothing(
    spark: SparkSession, app_config: AppConfig
) -> None:
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "qa", "orders")
    spark.createDataFrame([(1, "a", 1.0), (2, "b", 2.0)], SOURCE_SCHEMA).write.format("delta").mode(
        "append"
    ).save(path)
    first = latest_version(spark, path)
    run(spark, tables, first, ["strict"], None)
    written = tables.handle("qa", "orders_strict", spark)
    before = written.delta().history(1).collect()[0]["version"]
    start = first  # the job's watermark: a failure does not move it

    for rows, rule, named in (
        ([(3, "c", -3.0), (4, "d", 4.0)], "not_negative (amount >= 0)", "{'id': 3}"),
        ([(1, "again", 5.0)], "one_per_id (unique(id))", "{'id': 1, 'count': 2}"),
    ):
        spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
        to = latest_version(spark, path)
        result = run(spark, tables, to, ["strict"], start)
        (failed,) = result.members
        assert failed.error_code == ErrorCode.EXPECTATION_FAILED
        assert f"expectation {rule} failed on 1 " in failed.error_msg
        assert named in failed.error_msg and "nothing of the range was written" in failed.error_msg
        assert written.delta().history(1).collect()[0]["version"] == before
        assert not tables.handle("qa", "orders_strict__quarantine", spark).exists()
        DeltaTable.forPath(spark, path).delete("id >= 3 OR name = 'again'")
        start = latest_version(spark, path)  # as a resync after the fix would start


EVERY: dict[str, dict[str, Any]] = {
    "replica": {"primary_key": ["id"]},
    "secondary_index": {"columns": ["name"], "primary_key": ["id"]},
    "fulltext_index": {"columns": ["name"], "primary_key": ["id"]},
    "aggregate_view": {"group_by": ["name"], "aggregates": aggregates_of("amount")},
    "auto_cdc": {"keys": ["id"], "source_kind": "table", "quarantine": True},
}
"""A job of each consumer type that writes tables beside a change feed's (which is
added with the test's broker)."""
FOUR_AT_MOST = {"name": "four_at_most", "check": "amount IS NULL OR amount < 4", "action": "drop"}


def test_every_consumer_keeps_the_quarantine_contract_over_replays_resyncs_and_rule_changes(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """Each dropped row version is in the quarantine once, over a replayed snapshot (a
    crash after its writes, before its history row), a replayed tail and a longer
    one; a resync and a rule change replace what it holds."""
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "qa", "every")
    rows = [(1, "a", 1.0), (2, "b", None)]
    spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
    first = latest_version(spark, path)

    every = EVERY | {
        "kafka_changefeed": {
            "topic": f"{app_config.kafka.topic}.qa",
            "bootstrap_servers": app_config.kafka.bootstrap_servers,
            "primary_key": ["id"],
        }
    }

    def jobs(rules: list[dict[str, Any]], generation: int) -> list[tuple[JobKey, int, JobSpec]]:
        out = []
        for n, (kind, options) in enumerate(every.items(), start=1):
            consumer = {"type": kind, "options": {**options, "expectations": rules}}
            spec = JobSpec.from_json(
                {"iteration": {"consumer": {**consumer, "generation": generation}}}
            )
            out.append((JobKey(1, "qa", "every", kind), n, spec))
        return out

    def step(rules: list[dict[str, Any]], start: int | None, to: int, generation: int = 0) -> None:
        kind = IterationKind.SNAPSHOT if start is None else IterationKind.TAIL
        result = iterate(spark, tables, jobs(rules, generation), kind, start, to, small_rows=1000)
        assert all(m.ok for m in result.members), [m.error_msg for m in result.members]

    def assert_quarantines(expected: list[tuple[Any, ...]]) -> None:
        for kind in every:
            held = target(spark, tables, f"every_{kind}__quarantine").select(*QUARANTINE_COLUMNS)
            assert_df_equality(
                held, spark.createDataFrame(expected, held.schema), ignore_row_order=True
            )

    step([KNOWN], None, first)
    step([KNOWN], None, first)  # replayed: a crash after the snapshot's writes
    snapshot = [(2, "b", None, "amount_known", first)]
    assert_quarantines(snapshot)

    spark.createDataFrame([(3, "c", None), (4, "d", 4.0)], SOURCE_SCHEMA).write.format(
        "delta"
    ).mode("append").save(path)
    second = latest_version(spark, path)
    step([KNOWN], first, second)
    step([KNOWN], first, second)  # replayed
    tail = [*snapshot, (3, "c", None, "amount_known", second)]
    assert_quarantines(tail)

    # a resync: the new snapshot's dropped rows, and nothing of before
    step([KNOWN], None, second, generation=1)
    assert_quarantines(
        [(2, "b", None, "amount_known", second), (3, "c", None, "amount_known", second)]
    )

    # a rule change restarts from a snapshot too: what the new rules drop, alone
    step([FOUR_AT_MOST], None, second, generation=1)
    assert_quarantines([(4, "d", 4.0, "four_at_most", second)])

    # and rules taken away: nothing is dropped any more, so nothing stays
    step([], None, second, generation=1)
    assert_quarantines([])


def test_members_count_their_rules_from_their_own_start_in_the_change_sets_read(
    spark: SparkSession, app_config: AppConfig
) -> None:
    """The rules of every member are counted per commit version as the change set is
    read, and each member sums the versions after its own start. A rule that cannot
    run on these rows (a cast that fails) fails its own job alone: the others count
    their rules themselves, and their targets are written."""
    tables = Tables(spark, app_config.tables)
    path = cdf_source(spark, app_config, "qa", "orders")
    specs = {
        **CONSUMERS,
        "casting": {
            "type": "replica",
            "options": {
                "primary_key": ["id"],
                "expectations": [
                    {"name": "numeric", "check": "cast(name AS INT) > 0", "action": "warn"}
                ],
            },
        },
    }

    def commit(rows: list[tuple[Any, ...]]) -> int:
        spark.createDataFrame(rows, SOURCE_SCHEMA).write.format("delta").mode("append").save(path)
        return latest_version(spark, path)

    def tail(to: int, starts: dict[str, int]) -> dict[str, Any]:
        """One tail of the named jobs, each from its own start: their outcomes by name."""
        numbers = {name: n for n, name in enumerate(specs, start=1)}
        members = [
            MemberJob(
                Member((key, numbers[name]), numbers[name], start),
                key,
                JobSpec.from_json({"iteration": {"consumer": specs[name]}}),
            )
            for name, start in starts.items()
            for key in [JobKey(1, "qa", "orders", name)]
        ]
        plan = IterationPlan(
            TableRef(1, "qa", "orders"),
            IterationKind.TAIL,
            to,
            tuple(m.member for m in members),
            0,
            time.time(),
        )
        spark.sparkContext.setJobGroup(plan.iteration_id, "members from their own starts")
        result = run_iteration(spark, plan, members, tables, CancelToken(), small_rows=1000)
        named = {n: name for name, n in numbers.items()}
        return {named[m.job_id]: m for m in result.members}

    def found(outcome: Any) -> list[tuple[str, int]]:
        assert outcome.ok, outcome.error_msg
        return [(c.name, c.failed) for c in outcome.expectations]

    def assert_targets() -> None:
        now = spark.read.format("delta").load(path).where("amount IS NOT NULL")
        assert_df_equality(
            target(spark, tables, "orders_clean").select(*now.columns), now, ignore_row_order=True
        )
        assert_view(spark, tables, "orders_totals", now)

    first = commit([(1, "a", 1.0)])
    run(spark, tables, first, ["clean", "totals"], None)
    middle = commit([(2, "b", None), (3, "a", 300.0)])
    run(spark, tables, middle, ["totals"], first)  # totals is a version ahead of clean
    last = commit([(4, "c", None), (5, "d", 5.0)])
    both = tail(last, {"clean": first, "totals": middle})
    assert found(both["clean"]) == [("amount_known", 2), ("small", 3), ("one_per_name", 1)]
    assert found(both["totals"]) == [("amount_known", 1)]
    assert_targets()

    try:
        later = commit([(6, "a", None)])
        mixed = tail(later, {"clean": last, "casting": first})
        assert found(mixed["clean"]) == [("amount_known", 1), ("small", 1), ("one_per_name", 1)]
        failed = mixed["casting"]
        assert not failed.ok and "CAST" in (failed.error_msg or "").upper(), failed
        assert_targets()
    finally:
        _TALLY_FAILED.pop(TableRef(1, "qa", "orders"), None)  # the next test's table too
