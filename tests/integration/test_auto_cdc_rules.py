"""auto_cdc, rule by rule: each with its events and the exact table they must leave."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from devkit.harness import cdf_source, run_once
from devkit.iterations import HandDriven, IterationFailed
from lakeprop.client.api import LakepropClient
from lakeprop.config import AppConfig, EngineConfig
from lakeprop.errors import ErrorCode
from lakeprop.spec import JobKey
from tests.integration.test_auto_cdc import SCHEMA, EventTable, job

pytestmark = pytest.mark.integration


def U(key: int, seq: int, a: int | None = None, b: str | None = None) -> dict[str, Any]:
    return {"id": key, "seq": seq, "op": "U", "a": a, "b": b}


def D(key: int, seq: int) -> dict[str, Any]:
    return {"id": key, "seq": seq, "op": "D"}


def T(seq: int) -> dict[str, Any]:
    return {"id": 0, "seq": seq, "op": "T"}


def rows(driver: HandDriven, *columns: str, suffix: str = "") -> list[tuple[Any, ...]]:
    frame = driver.read(suffix)
    return sorted(tuple(r) for r in frame.select(*columns).collect())


def test_scd1_late_events_tombstones_truncates_duplicates_and_partial_updates(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = EventTable(spark, tmp_path)
    table.commit([U(1, 2, 2, "b"), U(2, 1, 1), U(3, 5, 5)])
    plain = job(spark, table, "plain", apply_as_truncates="op = 'T'")
    partial = job(spark, table, "partial", ignore_null_updates=True)
    plain.snapshot(1)
    partial.snapshot(1)

    # a late event (below the row's sequence) changes nothing; a delete leaves a tombstone
    table.commit([U(1, 1, 9, "late"), D(2, 3)])
    plain.tail(2)
    assert rows(plain, "id", "a", "b", "__SEQUENCE") == [(1, 2, "b", 2), (3, 5, None, 5)]
    assert rows(plain, "id", "__SEQUENCE", "__KIND", suffix="__tombstones") == [(2, 3, "delete")]

    # an insert older than the tombstone stays deleted; one after it is a re-insert
    table.commit([U(2, 2, 7), U(4, 1, 4)])
    plain.tail(3)
    assert rows(plain, "id", "a") == [(1, 2), (3, 5), (4, 4)]
    table.commit([U(2, 4, 8)])
    plain.tail(4)
    assert rows(plain, "id", "a") == [(1, 2), (2, 8), (3, 5), (4, 4)]

    # a truncate removes the rows of a lower sequence; an event at its sequence survives it
    table.commit([T(4), U(5, 4, 6), U(1, 3, 3)])
    plain.tail(5)
    assert rows(plain, "id", "a", "__SEQUENCE") == [(2, 8, 4), (3, 5, 5), (5, 6, 4)]
    assert rows(plain, "__SEQUENCE", "__KIND", suffix="__tombstones")[-1] == (4, "truncate")

    # identical duplicates count once: a range of nothing but them changes nothing
    table.commit([U(3, 5, 5), D(2, 3)])
    before = plain.read().collect()
    assert plain.tail(6).members[0].rows_written == 0
    assert sorted(plain.read().collect()) == sorted(before)

    # partial updates: a NULL keeps the row's value
    partial.tail(6)
    assert rows(partial, "id", "a", "b") == [
        (0, None, None),  # this job takes no truncates: the truncate row is an upsert of key 0
        (1, 3, "b"),
        (2, 8, None),
        (3, 5, None),
        (4, 4, None),
        (5, 6, None),
    ]


def test_scd2_late_events_split_intervals_and_deletes_close_versions(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = EventTable(spark, tmp_path)
    table.commit([U(1, 1, 1, "x"), U(1, 3, 3, "x"), U(2, 1, 1, "x")])
    history = {"stored_as_scd_type": 2, "except_column_list": ["seq", "op"]}
    every = job(spark, table, "every", **history)
    some = job(spark, table, "some", **history, track_history_column_list=["a"])
    every.snapshot(1)
    some.snapshot(1)
    # late (1, 2) splits [1, 3); a delete closes key 2's version; a change of b only
    # opens a version where b is tracked; an event that changes nothing opens none
    table.commit([U(1, 2, 2, "x"), D(2, 5), U(1, 4, 3, "y"), U(1, 6, 3, "y")])
    every.tail(2)
    some.tail(2)
    columns = ("id", "a", "b", "__START_AT", "__END_AT")
    assert rows(every, *columns) == [
        (1, 1, "x", 1, 2),
        (1, 2, "x", 2, 3),
        (1, 3, "x", 3, 4),
        (1, 3, "y", 4, None),
        (2, 1, "x", 1, 5),
    ]
    assert rows(some, *columns) == [
        (1, 1, "x", 1, 2),
        (1, 2, "x", 2, 3),
        (1, 3, "y", 3, None),  # b changed at 4: in place, b untracked
        (2, 1, "x", 1, 5),
    ]
    # the target's change feed, keyed by the keys and __START_AT, shows true changes only
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(every.path())
        .where("_change_type != 'update_preimage'")
        .select("id", "__START_AT", "_change_type")
        .collect()
    )
    assert sorted(tuple(r) for r in feed) == [
        (1, 1, "update_postimage"),  # [1, 3) became [1, 2)
        (1, 2, "insert"),
        (1, 3, "update_postimage"),  # [3, -) became [3, 4)
        (1, 4, "insert"),
        (2, 1, "update_postimage"),  # closed by the delete
    ]


def test_a_table_source_gives_its_latest_rows_or_its_history_by_commit_version(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = f"{tmp_path}/db/products"
    schema = spark.createDataFrame([], "sku STRING, price INT").schema
    DeltaTable.create(spark).location(path).addColumns(schema).property(
        "delta.enableChangeDataFeed", "true"
    ).execute()  # version 0
    spark.createDataFrame([("a", 10), ("b", 20)], schema).write.format("delta").mode("append").save(
        path
    )  # version 1
    options = {"keys": ["sku"], "source_kind": "table"}
    latest = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "db", "products", "latest"),
        {"type": "auto_cdc", "options": options},
    )
    history = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "db", "products", "history"),
        {"type": "auto_cdc", "options": {**options, "stored_as_scd_type": 2}},
    )
    latest.snapshot(1)
    history.snapshot(1)
    source = DeltaTable.forPath(spark, path)
    source.update("sku = 'a'", {"price": "11"})  # version 2
    source.delete("sku = 'b'")  # version 3
    spark.createDataFrame([("b", 21)], schema).write.format("delta").mode("append").save(path)  # 4
    latest.tail(4)
    history.tail(4)
    assert rows(latest, "sku", "price", "__SEQUENCE") == [("a", 11, 2), ("b", 21, 4)]
    assert rows(history, "sku", "price", "__START_AT", "__END_AT") == [
        ("a", 10, 1, 2),
        ("a", 11, 2, None),
        ("b", 20, 1, 3),
        ("b", 21, 4, None),
    ]


def test_conflicting_events_bad_rows_and_updated_event_rows_are_errors_that_write_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = EventTable(spark, tmp_path)
    table.commit([U(1, 1, 1), U(2, 2, 2)])
    scd1 = job(spark, table, "one")
    scd2 = job(spark, table, "two", stored_as_scd_type=2)
    kept = job(spark, table, "kept", quarantine=True)
    for driver in (scd1, scd2, kept):
        driver.snapshot(1)

    # two different events at one key and sequence, in one range
    table.commit([U(3, 7, 1), U(3, 7, 2)])
    for driver in (scd1, scd2):
        before = driver.read().collect()
        with pytest.raises(IterationFailed) as failed:
            driver.tail(2)
        assert failed.value.code == ErrorCode.CONSUMER_FAILED
        assert "different events at one sequence" in failed.value.message
        assert "'id': 3, 'sequence': 7" in failed.value.message
        assert sorted(driver.read().collect()) == sorted(before)  # nothing written
        driver.watermark = 2  # the source is repaired past it, as a person would

    # against what was applied before: the key's current row (SCD 1), the stored event (SCD 2)
    table.commit([U(1, 1, 5)])
    with pytest.raises(IterationFailed, match="other content"):
        scd1.tail(3)
    with pytest.raises(IterationFailed, match="contradict events already applied"):
        scd2.tail(3)

    # a NULL key: an error naming the rows, or with quarantine set aside
    table.commit([{"id": None, "seq": 9, "op": "U", "a": 1}, U(4, 9, 4)])
    scd1.watermark = 3
    with pytest.raises(IterationFailed, match=r"1 event.* NULL key or sequence"):
        scd1.tail(4)
    kept.watermark = 3
    kept.tail(4)
    assert rows(kept, "id", "a") == [(1, 1), (2, 2), (4, 4)]
    assert rows(kept, "id", "__reason", "__source_version", suffix="__quarantine") == [
        (None, "NULL key", 4)
    ]

    # an event table's rows are only inserted
    DeltaTable.forPath(spark, table.path).delete("id = 4")
    with pytest.raises(IterationFailed, match="changed 1 existing row"):
        kept.tail(5)


def test_a_column_added_to_the_source_appears_in_both_scd_types_and_a_dropped_one_is_an_error(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = EventTable(spark, tmp_path)
    table.commit([U(1, 1, 1, "x")])
    scd1 = job(spark, table, "one")
    scd2 = job(spark, table, "two", stored_as_scd_type=2)
    scd1.snapshot(1)
    scd2.snapshot(1)
    spark.sql(f"ALTER TABLE delta.`{table.path}` ADD COLUMNS (c STRING)")  # version 2
    table.version += 1
    table.schema = spark.read.format("delta").load(table.path).schema
    table.commit([{**U(1, 2, 2, "x"), "c": "new"}, {**U(2, 1, 5, "y"), "c": "z"}])  # version 3
    scd1.tail(3)
    scd2.tail(3)
    assert rows(scd1, "id", "a", "c") == [(1, 2, "new"), (2, 5, "z")]
    assert rows(scd2, "id", "a", "c", "__START_AT") == [
        (1, 1, None, 1),
        (1, 2, "new", 2),
        (2, 5, "z", 1),
    ]

    spark.sql(
        f"ALTER TABLE delta.`{table.path}` SET TBLPROPERTIES ("
        "'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
        "'delta.minWriterVersion' = '5')"
    )
    spark.sql(f"ALTER TABLE delta.`{table.path}` DROP COLUMN b")
    table.version += 2
    table.schema = spark.read.format("delta").load(table.path).schema
    table.commit([{"id": 1, "seq": 5, "op": "U", "a": 3, "c": "later"}])
    with pytest.raises(IterationFailed) as failed:
        scd1.tail(table.version)
    assert failed.value.code == ErrorCode.SOURCE_SCHEMA_CHANGED
    assert "it no longer has column(s) ['b']" in failed.value.message


def test_registration_checks_the_expressions_against_the_source_and_rejects_with_the_reason(
    spark: SparkSession, app_config: AppConfig
) -> None:
    cdf_source(spark, app_config, "db", "events", SCHEMA)
    client = LakepropClient(app_config.kafka, app_config.state, spark)
    expressions = {
        "unknown": ("nope = 'D'", "does not resolve against the source's columns"),
        "not_boolean": ("a + 1", "not boolean"),
        "random": ("rand() > 0.5", "is not deterministic"),
        "subquery": ("a IN (SELECT 1)", "subqueries and user-defined functions"),
        "two": ("op = 'D'; DROP TABLE x", "is not one SQL expression"),
        "fine": ("op = 'D'", ""),
    }
    receipts = {
        name: client.register_job(
            JobKey(1, "db", "events", name),
            {
                "iteration": {
                    "consumer": {
                        "type": "auto_cdc",
                        "options": {"keys": ["id"], "sequence_by": "seq", "apply_as_deletes": text},
                    }
                }
            },
        )
        for name, (text, _) in expressions.items()
    }
    run_once(spark, replace(app_config, engine=EngineConfig(enabled=False)))
    for name, (_, reason) in expressions.items():
        outcome = client.request_outcome(receipts[name].request_id, receipts[name])
        assert outcome is not None, name
        if not reason:
            assert outcome["outcome"] == "applied", outcome
            continue
        assert (outcome["outcome"], outcome["error_code"]) == (
            "rejected",
            ErrorCode.INVALID_CONSUMER_OPTIONS,
        ), outcome
        assert reason in outcome["detail"], (name, outcome["detail"])
    client.close()
