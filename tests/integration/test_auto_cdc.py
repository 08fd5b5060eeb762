"""auto_cdc: every version of the target equals the events applied in sequence order.

Seeded random events (out of order, late, identical duplicates, partial NULL
updates, deletes, re-inserts after deletes, truncates) land in random commits;
the job's iterations run over random ranges (a snapshot, then tails of one to
three versions). Each version of the target is read back (Delta time travel,
through the source version its write recorded) and compared whole with the
pure model (:mod:`devkit.cdc_model`) over the events of the source up to that
version. Hand-written cases below pin each rule with its exact table.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from devkit import cdc_model as model
from devkit.iterations import HandDriven, IterationFailed, recorded_versions
from lakeprop import faults
from lakeprop.engine.native import NativeSettings
from lakeprop.spec import JobKey

pytestmark = pytest.mark.integration

SCHEMA = "id INT, seq BIGINT, op STRING, a INT, b STRING"
COLUMNS = ["seq", "op", "a", "b"]


class EventTable:
    """An event table with the change feed on; ``commit`` appends rows as one version."""

    def __init__(self, spark: SparkSession, warehouse: Path, schema: str = SCHEMA) -> None:
        self.spark = spark
        self.warehouse = str(warehouse)
        self.path = f"{warehouse}/db/events"
        shutil.rmtree(self.path, ignore_errors=True)
        self.schema = spark.createDataFrame([], schema).schema
        DeltaTable.create(spark).location(self.path).addColumns(self.schema).property(
            "delta.enableChangeDataFeed", "true"
        ).execute()
        self.rows: list[tuple[int, dict[str, Any]]] = []
        """(commit version, row) of every event."""
        self.version = 0

    def commit(self, rows: Sequence[dict[str, Any]]) -> int:
        frame = self.spark.createDataFrame(
            [tuple(r.get(f.name) for f in self.schema.fields) for r in rows], self.schema
        )
        frame.write.format("delta").mode("append").save(self.path)
        self.version += 1
        self.rows += [(self.version, dict(r)) for r in rows]
        return self.version

    def events(self, up_to: int, columns: Sequence[str] = COLUMNS) -> list[model.Event]:
        def kind(row: dict[str, Any]) -> str:
            return {"D": model.DELETE, "T": model.TRUNCATE}.get(row["op"], model.UPSERT)

        rows = [r for v, r in self.rows if v <= up_to]
        return model.events_of_rows(rows, ["id"], ["seq"], columns, kind)


ON_SPARK = NativeSettings(max_rows=1)
"""The service's native settings with a bound below every range: each iteration runs
on Spark as the service runs it (which may read a table's log in the driver)."""


def job(
    spark: SparkSession,
    table: EventTable,
    name: str,
    native: NativeSettings | None = ON_SPARK,
    **options: Any,
) -> HandDriven:
    consumer = {
        "type": "auto_cdc",
        "options": {
            "keys": ["id"],
            "sequence_by": "seq",
            "apply_as_deletes": "op = 'D'",
            **options,
        },
    }
    return HandDriven(
        spark, table.warehouse, JobKey(1, "db", "events", name), consumer, native=native
    )


def expected_frame(
    spark: SparkSession, rows: list[dict[str, Any]], schema: StructType
) -> DataFrame:
    def value(row: dict[str, Any], name: str) -> Any:
        found = row.get(name)
        if isinstance(found, dict):  # a struct column: the model gives it as a dict
            fields = schema[name].dataType.names  # type: ignore[attr-defined]
            return tuple(found.get(f) for f in fields)
        return found

    return spark.createDataFrame(
        [tuple(value(r, f.name) for f in schema.fields) for r in rows], schema
    )


KEYS = 14


def random_events(rng: random.Random, count: int, truncates: bool) -> list[dict[str, Any]]:
    """Events of a few keys, some five each: distinct (key, sequence) slots, a third of
    them deletes, some copied again whole."""
    events: list[dict[str, Any]] = []
    used: set[tuple[int, int]] = set()
    for _ in range(count):
        roll = rng.random()
        if events and roll < 0.1:
            events.append(dict(rng.choice(events)))  # an identical duplicate
            continue
        if truncates and roll < 0.13:
            seq = rng.randrange(1, 400)
            if (0, seq) not in used:
                used.add((0, seq))
                events.append({"id": 0, "seq": seq, "op": "T"})
            continue
        key = rng.randint(1, KEYS)
        seq = rng.randrange(1, 400)
        if (key, seq) in used:
            continue
        used.add((key, seq))
        if roll < 0.45:
            events.append({"id": key, "seq": seq, "op": "D"})
        else:
            events.append(
                {
                    "id": key,
                    "seq": seq,
                    "op": "U",
                    "a": None if rng.random() < 0.3 else rng.randint(0, 3),
                    "b": None if rng.random() < 0.3 else rng.choice("xyz"),
                }
            )
    return events


CASES = {
    "scd1": ({"apply_as_truncates": "op = 'T'"}, True),
    "scd1-partial": ({"apply_as_truncates": "op = 'T'", "ignore_null_updates": True}, True),
    "scd2": ({"stored_as_scd_type": 2}, False),
    "scd2-history-partial": (
        {"stored_as_scd_type": 2, "track_history_column_list": ["a"], "ignore_null_updates": True},
        False,
    ),
}


def model_of(options: dict[str, Any], events: list[model.Event]) -> list[dict[str, Any]]:
    partial = bool(options.get("ignore_null_updates"))
    if options.get("stored_as_scd_type") == 2:
        tracked = options.get("track_history_column_list") or COLUMNS
        return model.Scd2(COLUMNS, tracked, partial).apply(events).table(["id"])
    return model.Scd1(COLUMNS, partial).apply(events).table(["id"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_target_version_equals_the_events_applied_in_sequence_order(
    spark: SparkSession, tmp_path: Path, case: str
) -> None:
    options, truncates = CASES[case]
    rng = random.Random(sorted(CASES).index(case) + 11)
    table = EventTable(spark, tmp_path)
    events = random_events(rng, 90, truncates)
    rng.shuffle(events)
    cuts = sorted(rng.sample(range(1, len(events)), 9))
    for start, end in zip([0, *cuts], [*cuts, len(events)], strict=True):
        table.commit(events[start:end])
    driver = job(spark, table, case.replace("-", "_"), **options)
    driver.snapshot(rng.randint(1, 3))
    while driver.watermark is not None and driver.watermark < table.version:
        driver.tail(min(table.version, driver.watermark + rng.randint(1, 3)))

    versions = recorded_versions(driver.path(), driver.job_id)
    assert len(set(versions.values())) >= 4, versions  # intermediate versions were written
    deleted_somewhere = False
    for sink_version, source_version in sorted(versions.items()):
        actual = driver.read(version=sink_version)
        rows = model_of(options, table.events(source_version))
        keys_seen = {e.key for e in table.events(source_version) if e.kind == model.UPSERT}
        deleted_somewhere |= len({r["id"] for r in rows if r.get("__END_AT") is None}) < len(
            keys_seen
        )
        expected = expected_frame(spark, rows, actual.schema)
        try:
            assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
        except AssertionError as exc:
            raise AssertionError(
                f"{case}: target version {sink_version} != the model at source version "
                f"{source_version}"
            ) from exc
    assert deleted_somewhere, "the workload never left a key deleted: it tests too little"


def assert_model(
    spark: SparkSession, table: EventTable, options: dict[str, Any], *jobs: HandDriven
) -> None:
    """Each job's target equals the model of ``options`` over every event so far."""
    expected = model_of(options, table.events(table.version))
    for each in jobs:
        actual = each.read()
        assert_df_equality(
            actual,
            expected_frame(spark, expected, actual.schema),
            ignore_row_order=True,
            ignore_nullable=True,
        )


def test_a_job_with_no_tombstone_yet_skips_reading_them_and_a_late_upsert_stays_dead(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Until its first delete an SCD 1 job's tombstone table has no file: its log says
    so in the driver, and the range is decided without reading it (fewer Spark jobs
    than the same job that may not read logs there). The delete that fills it is
    remembered, so an upsert from before it arriving later stays dead."""
    table = EventTable(spark, tmp_path)
    table.commit([{"id": 1, "seq": 1, "op": "U", "a": 1}, {"id": 2, "seq": 1, "op": "U", "a": 2}])
    driven = job(spark, table, "driven")
    spark_only = job(spark, table, "spark_only", native=None)
    for each in (driven, spark_only):
        each.snapshot(table.version)
    steps: list[list[dict[str, Any]]] = [
        [{"id": 1, "seq": 3, "op": "U", "a": 3}, {"id": 3, "seq": 2, "op": "U", "a": 30}],
        [{"id": 1, "seq": 10, "op": "D"}],
        [{"id": 1, "seq": 5, "op": "U", "a": 5}, {"id": 2, "seq": 6, "op": "U", "a": 6}],
    ]
    jobs: list[tuple[int, int]] = []
    for rows in steps:
        table.commit(rows)
        jobs.append(
            (driven.tail(table.version).spark_jobs, spark_only.tail(table.version).spark_jobs)
        )
        assert_model(spark, table, {}, driven, spark_only)
    assert {r["id"] for r in model_of({}, table.events(table.version))} == {2, 3}
    # no tombstone yet (the first two ranges): fewer jobs; the last range reads them
    assert jobs[0][0] < jobs[0][1] and jobs[1][0] < jobs[1][1], jobs
    assert jobs[2][0] == jobs[2][1], jobs


HISTORY_PARTIAL = {
    "stored_as_scd_type": 2,
    "track_history_column_list": ["a"],
    "ignore_null_updates": True,
}
"""SCD 2 with the most the fold carries from one event to the next: filled-in NULLs,
and versions only where a tracked column changes."""


def test_an_scd2_range_of_later_events_goes_on_from_the_open_versions(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A range whose every event is later than its key's stored ones is folded with
    the keys' open versions alone (fewer Spark jobs than the job that may not read
    the logs in the driver, which folds every stored event); one with a late event
    falls back to the full fold. Both equal the model after every range."""
    table = EventTable(spark, tmp_path)
    table.commit(
        [{"id": 1, "seq": 1, "op": "U", "a": 1, "b": "x"}, {"id": 2, "seq": 1, "op": "U", "a": 2}]
    )
    driven = job(spark, table, "driven", **HISTORY_PARTIAL)
    spark_only = job(spark, table, "spark_only", native=None, **HISTORY_PARTIAL)
    for each in (driven, spark_only):
        each.snapshot(table.version)
    in_order: list[list[dict[str, Any]]] = [
        # an untracked change in place, a NULL filled in, a tracked change, a new key
        [
            {"id": 1, "seq": 4, "op": "U", "b": "y"},
            {"id": 2, "seq": 3, "op": "U", "a": 3},
            {"id": 3, "seq": 2, "op": "U", "a": 7, "b": "z"},
        ],
        # a delete, and a key re-inserted after it in the same range
        [
            {"id": 2, "seq": 5, "op": "D"},
            {"id": 3, "seq": 6, "op": "D"},
            {"id": 3, "seq": 9, "op": "U", "b": "w"},
        ],
        # after a delete, a new history; the open version's filled values carry on
        [
            {"id": 2, "seq": 8, "op": "U", "b": "v"},
            {"id": 1, "seq": 6, "op": "U", "a": 1},
            {"id": 1, "seq": 7, "op": "U", "a": 5},
        ],
    ]
    late = [{"id": 1, "seq": 5, "op": "U", "a": 9}, {"id": 4, "seq": 1, "op": "U", "a": 1}]
    # later than the open version's start, not than the key's last event (seq 20)
    late_in_place = [{"id": 1, "seq": 15, "op": "U", "a": 5, "b": "t"}]
    later = [{"id": 1, "seq": 20, "op": "U", "b": "u"}]
    jobs: list[tuple[int, int]] = []
    for rows in [*in_order, late, later, late_in_place]:
        table.commit(rows)
        jobs.append(
            (driven.tail(table.version).spark_jobs, spark_only.tail(table.version).spark_jobs)
        )
        assert_model(spark, table, HISTORY_PARTIAL, driven, spark_only)
    fast, slow = [*jobs[:3], jobs[4]], [jobs[3], jobs[5]]
    assert all(d < s for d, s in fast), jobs
    assert all(d >= s for d, s in slow), jobs  # tried, found late, folded in full


def test_an_scd2_range_crashed_between_its_writes_is_folded_in_full_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A range that wrote the target and crashed before storing its events leaves the
    target ahead of the store: the next range folds every event, though each of
    its events is later than the stored ones. (Going on from the open version,
    which holds the crashed range's filled-in value, would give the version it
    closes that value too early.)"""
    table = EventTable(spark, tmp_path)
    table.commit([{"id": 1, "seq": 1, "op": "U", "a": 1}])
    driven = job(spark, table, "driven", **HISTORY_PARTIAL)
    driven.snapshot(table.version)
    table.commit([{"id": 1, "seq": 8, "op": "U", "b": "y"}])
    faults.arm("auto_cdc.between_writes=raise")
    try:
        with pytest.raises(IterationFailed):
            driven.tail(table.version)
        assert "auto_cdc.between_writes" in faults.fired()
    finally:
        faults.disarm()
    table.commit([{"id": 1, "seq": 5, "op": "U"}, {"id": 1, "seq": 7, "op": "U", "a": 2}])
    driven.tail(table.version)
    assert_model(spark, table, HISTORY_PARTIAL, driven)
    later = [{"id": 1, "seq": 9, "op": "U", "b": "z"}]
    table.commit(later)  # in step again: goes on from the open version
    driven.tail(table.version)
    assert_model(spark, table, HISTORY_PARTIAL, driven)


def test_a_range_applied_again_or_overlapping_changes_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = EventTable(spark, tmp_path)
    table.commit([{"id": 1, "seq": 1, "op": "U", "a": 1}, {"id": 2, "seq": 1, "op": "U", "a": 2}])
    table.commit([{"id": 1, "seq": 5, "op": "U", "a": 5}, {"id": 2, "seq": 4, "op": "D"}])
    table.commit([{"id": 3, "seq": 2, "op": "U", "a": 3}])
    for options in ({}, {"stored_as_scd_type": 2}):
        name = f"replayed{options.get('stored_as_scd_type', 1)}"
        driver = job(spark, table, name, **options)
        driver.snapshot(1)
        driver.tail(3)
        once = driver.read().collect()
        stored = driver.read("__events").collect() if "2" in name else []
        driver.watermark = 1  # a crash before the watermark moved: the range again
        driver.tail(3)
        driver.watermark = 2  # and an overlapping one
        driver.tail(3)
        assert sorted(driver.read().collect()) == sorted(once), name
        if stored:  # no event stored twice
            assert sorted(driver.read("__events").collect()) == sorted(stored), name
