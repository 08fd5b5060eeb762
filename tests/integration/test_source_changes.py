"""What real source tables do: updates that change a key, whole-table changes, tables
delta-rs cannot read or write, auto_cdc's sequences, quarantine replays.

Each test drives the engine's own iterations (:class:`devkit.iterations.HandDriven`)
on real Delta tables and compares whole targets with the source at the version the
job reached. The operation fuzzer (``test_fuzz.py``) mixes these changes at random.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from devkit.fuzzing import models
from devkit.iterations import HandDriven, IterationFailed
from lakeprop.config import TablesConfig
from lakeprop.consumers import native
from lakeprop.engine.model import IterationKind, IterationPlan, Member, MemberJob, TableRef
from lakeprop.engine.native import NativePlan, NativeSettings, plan_native
from lakeprop.spec import JobKey
from lakeprop.storage import Storage
from lakeprop.tables.resolve import Tables

pytestmark = pytest.mark.integration

SCHEMA = "id INT, grp INT, v INT, name STRING, emb ARRAY<FLOAT>"
COLUMNS = ["id", "grp", "v", "name", "emb"]


def make_source(spark: SparkSession, warehouse: Path, name: str, **props: str) -> str:
    path = f"{warehouse}/s/{name}"
    settings = {"delta.enableChangeDataFeed": "true", **props}
    listed = ", ".join(f"'{k}' = '{v}'" for k, v in settings.items())
    spark.sql(f"CREATE TABLE delta.`{path}` ({SCHEMA}) USING delta TBLPROPERTIES ({listed})")
    return path


def insert(spark: SparkSession, path: str, ids: range) -> None:
    rows = [(i, i % 3, i, f"word{i} lake", [float(i), 1.0, 0.0, -1.0]) for i in ids]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(path)


def version_of(spark: SparkSession, path: str) -> int:
    return int(DeltaTable.forPath(spark, path).history(1).first()["version"])  # type: ignore[index]


def at(spark: SparkSession, path: str, version: int) -> DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(path)


CONSUMERS: dict[str, dict[str, Any]] = {
    "copy": {"type": "replica", "options": {"primary_key": ["id"]}},
    "by_grp": {"type": "secondary_index", "options": {"columns": ["grp"], "primary_key": ["id"]}},
    "text": {"type": "fulltext_index", "options": {"columns": ["name"], "primary_key": ["id"]}},
    "vec": {"type": "vector_index", "options": {"key": ["id"], "vector": "emb", "lists": 2}},
    "cdc": {
        "type": "auto_cdc",
        "options": {"keys": ["id"], "source_kind": "table", "stored_as_scd_type": 1},
    },
}


def compare(job: str, driver: HandDriven, source: DataFrame) -> None:
    def target(suffix: str) -> DataFrame:
        return driver.read(suffix)

    expected, actual = {
        "copy": lambda: models.replica(source, target, COLUMNS),
        "by_grp": lambda: models.secondary_index(source, target),
        "text": lambda: models.fulltext_index(source, target),
        "vec": lambda: models.vector_index(source, target),
        "cdc": lambda: models.auto_cdc_scd1(source, target, COLUMNS),
    }[job]()
    assert models.Check(job, 0, expected, actual).differences() is None


@pytest.mark.parametrize("path", ["native"])
def test_an_update_that_changes_a_key_removes_the_old_key_for_every_keyed_consumer(
    spark: SparkSession, tmp_path: Path, path: str
) -> None:
    """The old key of a key-changing update leaves every target: one key moved, keys
    moved along a chain and swapped in one statement, a key moved away and back.
    (The fuzzer's seed in the suite moves keys on the Spark path; ``path="spark"``
    runs this one there.)"""
    source = make_source(spark, tmp_path, "keys")
    insert(spark, source, range(20))
    settings = NativeSettings() if path == "native" else None
    drivers = {
        name: HandDriven(
            spark,
            str(tmp_path),
            JobKey(1, "s", "keys", name),
            consumer,
            job_id=i,
            small_rows=0 if path == "spark" else 100_000,
            native=settings,
        )
        for i, (name, consumer) in enumerate(CONSUMERS.items(), start=1)
    }
    for driver in drivers.values():
        driver.snapshot(version_of(spark, source))
    updates = [
        "UPDATE {t} SET id = 100 WHERE id = 1",
        "UPDATE {t} SET id = CASE id WHEN 2 THEN 3 WHEN 3 THEN 4 WHEN 4 THEN 101 END "
        "WHERE id IN (2, 3, 4)",
        "UPDATE {t} SET id = CASE id WHEN 5 THEN 6 WHEN 6 THEN 5 END WHERE id IN (5, 6)",
        "UPDATE {t} SET id = 102 WHERE id = 7",
        "UPDATE {t} SET id = 7, v = v + 1 WHERE id = 102",
    ]
    for i, update in enumerate(updates):
        spark.sql(update.format(t=f"delta.`{source}`"))
        if i % 2 or i == len(updates) - 1:  # ranges of one version and of two
            version = version_of(spark, source)
            for driver in drivers.values():
                result = driver.tail(version)
                if path == "native" and driver.key.job_name in ("copy", "by_grp"):
                    assert result.path == "native"
            for name, driver in drivers.items():
                compare(name, driver, at(spark, source, version))


def test_an_overwrite_of_many_rows_is_never_a_small_change_set(
    spark: SparkSession, tmp_path: Path
) -> None:
    """100 rows overwritten by 5 are 100 deletes and 5 inserts: over a bound of 50 the
    tail runs on Spark, and the replica equals the source."""
    source = make_source(spark, tmp_path, "over")
    insert(spark, source, range(100))
    driver = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "s", "over", "copy"),
        CONSUMERS["copy"],
        native=NativeSettings(max_rows=50),
    )
    driver.snapshot(version_of(spark, source))
    rows = [(i, 0, i, "new", None) for i in range(200, 205)]
    spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("overwrite").save(source)
    member = Member((driver.key, 1), 1, driver.watermark)
    plan = IterationPlan(
        TableRef(1, "s", "over"), IterationKind.TAIL, version_of(spark, source), (member,), 0, 0.0
    )
    tables = Tables(spark, TablesConfig(resolution="path", warehouse=str(tmp_path)))
    job = MemberJob(member, driver.key, driver.spec)
    where = plan_native(spark, plan, [job], tables, NativeSettings(max_rows=50))
    assert not isinstance(where, NativePlan)
    assert "removes files whose rows its log does not count" in where
    assert driver.tail(plan.to_version).path == "spark"
    compare("copy", driver, at(spark, source, plan.to_version))


def test_tables_delta_rs_cannot_read_or_write_take_the_spark_path_and_end_equal(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Decided from the protocol, legacy versions included, and the schema: a source
    with column mapping (delta-rs reads no column-mapped change feed), targets at the
    legacy protocols (2,5) and (1,6), one with a generated column."""
    mapped = make_source(spark, tmp_path, "mapped", **{"delta.columnMapping.mode": "name"})
    reason = native.readable(native.open_table(mapped, Storage()))
    assert reason is not None and "column mapping" in reason
    plain = make_source(spark, tmp_path, "plain")
    assert native.readable(native.open_table(plain, Storage())) is None

    legacy = {
        "cm25": (
            "(id INT) USING delta TBLPROPERTIES ('delta.minReaderVersion' = '2', "
            "'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')",
            "columnMapping",
        ),
        "id16": (
            "(id BIGINT GENERATED ALWAYS AS IDENTITY, v INT) USING delta",
            "identity",
        ),
        "gen": (
            "(id INT, twice INT GENERATED ALWAYS AS (id * 2)) USING delta",
            "generated",
        ),
    }
    for name, (ddl, word) in legacy.items():
        target = f"{tmp_path}/t/{name}"
        spark.sql(f"CREATE TABLE delta.`{target}` {ddl}")
        blocked = native.writable(native.open_table(target, Storage()))
        assert blocked is not None and word in blocked, (name, blocked)

    # the source with column mapping: its replica's small tails run on Spark, equal
    insert(spark, mapped, range(10))
    driver = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "s", "mapped", "copy"),
        CONSUMERS["copy"],
        native=NativeSettings(),
    )
    driver.snapshot(version_of(spark, mapped))
    spark.sql(f"UPDATE delta.`{mapped}` SET id = id + 50 WHERE id < 3")
    assert driver.tail(version_of(spark, mapped)).path == "spark"
    compare("copy", driver, at(spark, mapped, version_of(spark, mapped)))


def test_a_replica_follows_a_column_added_to_its_source_on_both_paths(
    spark: SparkSession, tmp_path: Path
) -> None:
    source = make_source(spark, tmp_path, "grow")
    insert(spark, source, range(6))
    driver = HandDriven(
        spark,
        str(tmp_path),
        JobKey(1, "s", "grow", "copy"),
        CONSUMERS["copy"],
        native=NativeSettings(),
    )
    driver.snapshot(version_of(spark, source))
    spark.sql(f"ALTER TABLE delta.`{source}` ADD COLUMNS (note STRING)")
    spark.sql(f"UPDATE delta.`{source}` SET note = 'n' WHERE id < 2")
    assert driver.tail(version_of(spark, source)).path == "spark"  # the target lacks `note`
    spark.sql(f"UPDATE delta.`{source}` SET note = 'm' WHERE id = 5")
    assert driver.tail(version_of(spark, source)).path == "native"
    version = version_of(spark, source)
    expected, actual = models.replica(at(spark, source, version), driver.read, [*COLUMNS, "note"])
    assert expected == actual


@pytest.mark.parametrize("job", ["copy", "cdc"])
def test_a_column_added_alone_reaches_the_target(
    spark: SparkSession, tmp_path: Path, job: str
) -> None:
    """An ALTER TABLE ADD COLUMNS in a range of its own (no change rows) widens the
    target, so it equals the source at that version, NULLs in the new column."""
    source = make_source(spark, tmp_path, f"alone_{job}")
    insert(spark, source, range(4))
    driver = HandDriven(spark, str(tmp_path), JobKey(1, "s", f"alone_{job}", job), CONSUMERS[job])
    driver.snapshot(version_of(spark, source))
    spark.sql(f"ALTER TABLE delta.`{source}` ADD COLUMNS (note STRING)")
    driver.tail(version_of(spark, source))
    model = {"copy": models.replica, "cdc": models.auto_cdc_scd1}[job]
    columns = [*COLUMNS, "note"]
    expected, actual = model(at(spark, source, version_of(spark, source)), driver.read, columns)
    assert models.Check(job, 0, expected, actual).differences() is None


def events_table(spark: SparkSession, warehouse: Path, seq: str = "INT") -> str:
    path = f"{warehouse}/e/events"
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id INT, seq {seq}, a INT) USING delta "
        "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    return path


def append(spark: SparkSession, path: str, rows: list[tuple[Any, ...]], schema: str) -> int:
    spark.createDataFrame(rows, schema).write.format("delta").mode("append").save(path)
    return version_of(spark, path)


def cdc_job(spark: SparkSession, warehouse: Path, name: str, **options: Any) -> HandDriven:
    consumer = {"type": "auto_cdc", "options": {"keys": ["id"], "sequence_by": "seq", **options}}
    return HandDriven(spark, str(warehouse), JobKey(1, "e", "events", name), consumer)


def test_a_longer_replay_of_a_range_adds_no_quarantine_row_twice(
    spark: SparkSession, tmp_path: Path
) -> None:
    """After a crash between the writes and the watermark, the range comes again and
    longer: its quarantined rows are there once."""
    path = events_table(spark, tmp_path)
    schema = "id INT, seq INT, a INT"
    start = append(spark, path, [(1, 1, 1)], schema)
    job = cdc_job(spark, tmp_path, "q", quarantine=True)
    job.snapshot(start)
    append(spark, path, [(None, 2, 2), (2, 2, 2)], schema)
    first = append(spark, path, [(3, None, 3)], schema)
    job.tail(first)
    job.watermark = start  # the crash: the watermark did not move
    later = append(spark, path, [(None, 5, 5)], schema)
    job.tail(later)
    found = sorted((r["a"], r["__source_version"]) for r in job.read("__quarantine").collect())
    assert found == [(2, start + 1), (3, start + 2), (5, later)]


def test_skip_change_commits_ignores_retention_deletes_of_an_event_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = events_table(spark, tmp_path)
    schema = "id INT, seq INT, a INT"
    start = append(spark, path, [(1, 1, 1), (2, 1, 2)], schema)
    strict = cdc_job(spark, tmp_path, "strict")
    skipping = cdc_job(spark, tmp_path, "skip", skip_change_commits=True)
    for job in (strict, skipping):
        job.snapshot(start)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE seq = 1")  # retention
    latest = append(spark, path, [(1, 2, 10)], schema)
    with pytest.raises(IterationFailed, match="only ever inserted"):
        strict.tail(latest)
    skipping.tail(latest)
    assert sorted((r["id"], r["a"]) for r in skipping.read().collect()) == [(1, 10), (2, 2)]


def test_a_same_sequence_conflict_is_an_error_with_ignore_null_updates_too(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = events_table(spark, tmp_path)
    schema = "id INT, seq INT, a INT"
    start = append(spark, path, [(1, 1, 1)], schema)
    job = cdc_job(spark, tmp_path, "partial", ignore_null_updates=True)
    job.snapshot(start)
    same = append(spark, path, [(1, 1, 1)], schema)  # the same event again: fine
    job.tail(same)
    other = append(spark, path, [(1, 1, 7)], schema)
    with pytest.raises(IterationFailed, match="other content"):
        job.tail(other)


def test_the_sequence_type_widened_by_delta_is_followed_by_every_table_of_the_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = events_table(spark, tmp_path)
    start = append(spark, path, [(1, 1, 1), (2, 1, 2)], "id INT, seq INT, a INT")
    scd1 = cdc_job(spark, tmp_path, "one")
    scd2 = cdc_job(spark, tmp_path, "two", stored_as_scd_type=2)
    for job in (scd1, scd2):
        job.snapshot(start)
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
    spark.sql(f"ALTER TABLE delta.`{path}` ALTER COLUMN seq TYPE BIGINT")
    latest = append(spark, path, [(1, 3_000_000_000, 5)], "id INT, seq BIGINT, a INT")
    for job in (scd1, scd2):
        job.tail(latest)
    assert dict(scd1.read().dtypes)["__SEQUENCE"] == "bigint"
    assert dict(scd2.read().dtypes)["__START_AT"] == "bigint"
    assert dict(scd2.read("__events").dtypes)["__SEQUENCE"] == "bigint"
    assert sorted((r["id"], r["a"], r["__SEQUENCE"]) for r in scd1.read().collect()) == [
        (1, 5, 3_000_000_000),
        (2, 2, 1),
    ]


def test_a_table_source_sequenced_by_commit_timestamp_has_one_type_from_snapshot_on(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The snapshot's sequence and the tails' are (commit timestamp, commit version):
    an update, then a delete, after a snapshot."""
    source = make_source(spark, tmp_path, "stamped")
    insert(spark, source, range(4))
    options = {"keys": ["id"], "source_kind": "table", "sequence_by": "_commit_timestamp"}
    jobs = {
        scd: HandDriven(
            spark,
            str(tmp_path),
            JobKey(1, "s", "stamped", f"scd{scd}"),
            {"type": "auto_cdc", "options": {**options, "stored_as_scd_type": scd}},
        )
        for scd in (1, 2)
    }
    for job in jobs.values():
        job.snapshot(version_of(spark, source))
    spark.sql(f"UPDATE delta.`{source}` SET v = 50 WHERE id = 1")
    spark.sql(f"DELETE FROM delta.`{source}` WHERE id = 2")
    spark.sql(f"UPDATE delta.`{source}` SET id = 30 WHERE id = 3")
    latest = version_of(spark, source)
    for job in jobs.values():
        job.tail(latest)
    compare("cdc", jobs[1], at(spark, source, latest))
    history = jobs[2].read().collect()
    open_rows = sorted((r["id"], r["v"]) for r in history if r["__END_AT"] is None)
    assert open_rows == [(0, 0), (1, 50), (30, 3)]
    closed = sorted(r["id"] for r in history if r["__END_AT"] is not None)
    assert closed == [1, 2, 3]
    assert history[0]["__START_AT"]["_commit_version"] is not None
