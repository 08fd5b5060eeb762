"""AUTO CDC: lakeprop's ``auto_cdc`` against the DIY upsert a Spark user writes today.

An event table (``id``, ``seq``, ``op``, ``a``, ``b``) gets one event per key
(the initial load), then batches of events, one commit each: updates with new
sequences, some deletes, and a share of *late* events whose sequence is lower
than their key's current one. Each side keeps a target of ``keys`` keys from
the same commits:

* lakeprop: an ``auto_cdc`` job's tail iteration per commit (SCD type 1, or 2);
* DIY, SCD type 1: what a ``foreachBatch`` does, the latest event per key in the
  batch, MERGEd (delete, update, insert) with no sequence check;
* DIY, SCD type 2: Delta's documented SCD type 2 MERGE (the staged-updates
  pattern: a changed key's current version is closed and a new one inserted).

lakeprop's target always has its change feed on (other jobs may consume it),
which makes every MERGE write change files too; ``diy_change_feed=1`` (the
default) gives the DIY target the same, ``0`` leaves it off as many users do.
Both sides are timed per commit, and checked against the truth: the events of
all commits applied in sequence order. For SCD type 1 that is the latest event
per key over every event, a batch query; for SCD type 2 the pure model
(:mod:`devkit.cdc_model`) over the keys the batches touched, and the initial
row for every other key. The DIY side is expected to be wrong on late events.
"""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from bench.common import Figure, Result, stopwatch
from devkit import cdc_model
from devkit.iterations import HandDriven
from lakeprop.spec import JobKey

TITLE = "auto cdc"
"""The benchmark's name in its results."""

SCHEMA = "id LONG, seq LONG, op STRING, a LONG, b STRING"


Batch = list[tuple[Any, ...]]
"""The events of one commit: (id, seq, op, a, b)."""


def batches(rng: random.Random, keys: int, count: int, size: int, late: float) -> list[Batch]:
    """Event batches: each key's sequence grows, except the late share, which takes a
    sequence below the key's current one that no event of the key has; 2 % deletes.
    Every (key, sequence) is one event: the data holds no conflict."""
    current = dict.fromkeys(range(keys), 1)
    used: dict[int, set[int]] = {}
    out = []
    for n in range(count):
        batch = []
        for key in rng.sample(range(keys), size):
            taken = used.setdefault(key, {1})
            free = [s for s in range(2, current[key]) if s not in taken]
            if free and rng.random() < late:
                seq = rng.choice(free)  # late: below what the key holds
            else:
                seq = current[key] + rng.randint(1, 3)
                current[key] = seq
            taken.add(seq)
            if rng.random() < 0.02:
                batch.append((key, seq, "D", None, None))
            else:
                batch.append((key, seq, "U", rng.randint(0, 1000), f"b{n}"))
        out.append(batch)
    return out


def _changes(spark: SparkSession, path: str, version: int) -> DataFrame:
    """The rows a streaming ``foreachBatch`` gets for one commit of the event table."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(path)
        .where("_change_type = 'insert'")
        .drop("_change_type", "_commit_version", "_commit_timestamp")
    )


def diy_scd1(spark: SparkSession, target: str, batch: DataFrame) -> None:
    """The upsert a user writes: latest event per key in the batch, one MERGE."""
    latest = batch.withColumn(
        "_n", F.row_number().over(Window.partitionBy("id").orderBy(F.desc("seq")))
    ).where("_n = 1")
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(latest.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s.op = 'D'")
        .whenMatchedUpdate(set={c: f"s.{c}" for c in ("seq", "op", "a", "b")})
        .whenNotMatchedInsert(
            condition="s.op != 'D'", values={c: f"s.{c}" for c in ("id", "seq", "op", "a", "b")}
        )
        .execute()
    )


def diy_scd2(spark: SparkSession, target: str, batch: DataFrame) -> None:
    """Delta's documented SCD type 2 MERGE, with the sequence as the effective date."""
    latest = (
        batch.withColumn("_n", F.row_number().over(Window.partitionBy("id").orderBy(F.desc("seq"))))
        .where("_n = 1")
        .drop("_n")
    )
    current = DeltaTable.forPath(spark, target).toDF().where("__END_AT IS NULL")
    changed = (
        latest.alias("u")
        .join(current.alias("c"), "id")
        .where("u.op != 'D' AND NOT (u.a <=> c.a AND u.b <=> c.b)")
        .select("u.*")
    )
    staged = changed.selectExpr("NULL AS merge_key", "*").unionByName(
        latest.selectExpr("id AS merge_key", "*")
    )
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(staged.alias("s"), "t.id = s.merge_key AND t.__END_AT IS NULL")
        .whenMatchedUpdate(
            condition="s.op = 'D' OR NOT (t.a <=> s.a AND t.b <=> s.b)",
            set={"__END_AT": "s.seq"},
        )
        .whenNotMatchedInsert(
            condition="s.op != 'D'",
            values={
                "id": "s.id",
                "seq": "s.seq",
                "op": "s.op",
                "a": "s.a",
                "b": "s.b",
                "__START_AT": "s.seq",
                "__END_AT": "NULL",
            },
        )
        .execute()
    )


def scd1_truth(events: DataFrame) -> DataFrame:
    """The latest event per key over every event; a key whose latest is a delete is gone."""
    latest = events.withColumn(
        "_n", F.row_number().over(Window.partitionBy("id").orderBy(F.desc("seq")))
    ).where("_n = 1")
    return latest.where("op != 'D'").select("id", "seq", "op", "a", "b")


def same(left: DataFrame, right: DataFrame) -> bool:
    right = right.select(*left.columns)
    return left.exceptAll(right).isEmpty() and right.exceptAll(left).isEmpty()


def scd2_right(spark: SparkSession, table: DataFrame, events: DataFrame, touched: set[int]) -> bool:
    """SCD type 2 equals the model on the keys the batches touched, and every other
    key holds its one initial version."""
    mine = [r for r in events.where(F.col("id").isin(sorted(touched))).collect()]
    model = cdc_model.Scd2(["seq", "op", "a", "b"], ["seq", "op", "a", "b"]).apply(
        cdc_model.Event(
            (r["id"],),
            r["seq"],
            cdc_model.DELETE if r["op"] == "D" else cdc_model.UPSERT,
            (("seq", r["seq"]), ("op", r["op"]), ("a", r["a"]), ("b", r["b"]))
            if r["op"] != "D"
            else (),
        )
        for r in mine
    )
    columns = ["id", "seq", "op", "a", "b", "__START_AT", "__END_AT"]
    want = sorted(tuple(row[c] for c in columns) for row in model.table(["id"]))
    got = sorted(
        tuple(r) for r in table.where(F.col("id").isin(sorted(touched))).select(*columns).collect()
    )
    untouched = table.where(~F.col("id").isin(sorted(touched)))
    initial = events.where("seq = 1 AND op = 'U'").where(~F.col("id").isin(sorted(touched)))
    rest = same(
        untouched.select(*columns),
        initial.selectExpr("*", "seq AS __START_AT", "CAST(NULL AS LONG) AS __END_AT").select(
            *columns
        ),
    )
    return want == got and rest


def opened(rows: DataFrame) -> DataFrame:
    """Rows as SCD type 2 versions opened at their sequence."""
    return rows.selectExpr("*", "seq AS __START_AT", "CAST(NULL AS LONG) AS __END_AT")


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    keys: int = 1_000_000,
    batch: int = 10_000,
    commits: int = 5,
    late_percent: int = 10,
    scd: int = 1,
    seed: int = 1,
    diy_change_feed: int = 1,
) -> Result:
    del bootstrap_servers  # no broker: the iterations are run by hand, as catch-up does
    rng = random.Random(seed)
    warehouse = str(workdir / "warehouse")
    path = f"{warehouse}/db/events"
    schema = spark.createDataFrame([], SCHEMA).schema
    DeltaTable.create(spark).location(path).addColumns(schema).property(
        "delta.enableChangeDataFeed", "true"
    ).execute()  # version 0
    spark.range(keys).select(
        F.col("id"),
        F.lit(1).cast("long").alias("seq"),
        F.lit("U").alias("op"),
        F.col("id").alias("a"),
        F.lit("b").alias("b"),
    ).write.format("delta").mode("append").save(path)  # version 1: the initial load
    for events in batches(rng, keys, commits, batch, late_percent / 100):
        spark.createDataFrame(events, schema).write.format("delta").mode("append").save(path)

    options: dict[str, Any] = {
        "keys": ["id"],
        "sequence_by": "seq",
        "apply_as_deletes": "op = 'D'",
        "stored_as_scd_type": scd,
    }
    ours = HandDriven(
        spark,
        warehouse,
        JobKey(1, "db", "events", "ours"),
        {"type": "auto_cdc", "options": options},
    )
    ours.snapshot(1)
    theirs = f"{workdir}/diy"
    initial = spark.read.format("delta").option("versionAsOf", 1).load(path)
    if scd == 2:
        initial = opened(initial)
    initial.write.format("delta").option(
        "delta.enableChangeDataFeed", str(bool(diy_change_feed)).lower()
    ).save(theirs)

    ours_s: list[float] = []
    theirs_s: list[float] = []
    for version in range(2, commits + 2):
        with stopwatch() as elapsed:
            ours.tail(version)
        ours_s.append(elapsed[0])
        with stopwatch() as elapsed:
            (diy_scd1 if scd == 1 else diy_scd2)(spark, theirs, _changes(spark, path, version))
        theirs_s.append(elapsed[0])

    events = spark.read.format("delta").load(path)
    mine = ours.read().drop("__SEQUENCE")
    diy = spark.read.format("delta").load(theirs)
    if scd == 1:
        truth = scd1_truth(events)
        ours_ok, theirs_ok = same(mine, truth), same(diy, truth)
    else:
        touched = {
            r["id"] for r in events.where("seq > 1 OR op = 'D'").select("id").distinct().collect()
        }
        ours_ok = scd2_right(spark, mine, events, touched)
        theirs_ok = scd2_right(spark, diy, events, touched)
    ours_p50, theirs_p50 = statistics.median(ours_s), statistics.median(theirs_s)
    return Result(
        f"{TITLE} scd{scd}" + ("" if diy_change_feed else " vs a plain target"),
        {
            "keys": keys,
            "batch": batch,
            "commits": commits,
            "late_percent": late_percent,
            "scd": scd,
            "diy_change_feed": diy_change_feed,
        },
        [
            Figure("commit applied p50", "s", ours_p50, theirs_p50),
            Figure("speed vs DIY", "ratio", theirs_p50 / ours_p50),
            Figure(
                "result equals the events in sequence order", "count", int(ours_ok), int(theirs_ok)
            ),
        ],
        # the DIY side is expected to be wrong (late events): only lakeprop's must be right
        {"lakeprop_equals_the_model": ours_ok},
        baseline=(
            "a foreachBatch upsert of the latest event per key (SCD 1)"
            if scd == 1
            else "Delta's documented SCD type 2 MERGE (SCD 2)"
        ),
    )
