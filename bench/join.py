"""Join: a ``join_view`` of orders and customers, kept from both change feeds, versus
a full recompute of the same query and a hand-written stream-static join.

Orders (``orders`` rows, ten per customer) LEFT JOIN customers (``customers``
rows). Each commit changes 1 % of one side, alternating: orders get new amounts
(a seventh of them another customer), customers get new names. lakeprop runs a real tail
iteration of the job (hand-driven, the engine's own) after each commit; the
baseline is what an open-source materialized view does, the query run over both
tables whole and written over its target. A third side is the DIY stream-static
join a Spark user writes: a stream of the orders' change feed, each micro-batch
joined with the customers as they are then and MERGEd by order id. It never
revisits an order whose customer changed; its wrong rows are counted at the end.
Everything runs twice: with the customers clustered on their key (the join key)
and without. The check: lakeprop's target equals the recompute after every
commit.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.common import Figure, Result, same_rows, stopwatch
from devkit.iterations import HandDriven
from lakeprop.changes import latest_change_per_key
from lakeprop.spec import JobKey
from lakeprop.tables.probe import DeltaLogProbe

TITLE = "join"
"""The benchmark's name in its results."""

QUERY = (
    "SELECT o.id, o.amount, c.name AS customer FROM b.orders AS o "
    "LEFT JOIN b.customers AS c ON o.customer_id = c.id"
)
ORDERS = "id BIGINT, customer_id BIGINT, amount DOUBLE"
CUSTOMERS = "id BIGINT, name STRING, region STRING"


def _create(spark: SparkSession, path: str, schema: str, cluster: str | None) -> None:
    builder = (
        DeltaTable.create(spark)
        .location(path)
        .addColumns(spark.createDataFrame([], schema).schema)
        .property("delta.enableChangeDataFeed", "true")
    )
    if cluster is not None:
        builder = builder.clusterBy(cluster)
    builder.execute()


def _truth(spark: SparkSession, orders: str, customers: str) -> DataFrame:
    o = spark.read.format("delta").load(orders).alias("o")
    c = spark.read.format("delta").load(customers).alias("c")
    return o.join(c, F.col("o.customer_id") == F.col("c.id"), "left").select(
        F.col("o.id").alias("id"),
        F.col("o.amount").alias("amount"),
        F.col("c.name").alias("customer"),
    )


def _diy_batch(
    spark: SparkSession, target: str, customers: str
) -> Callable[[DataFrame, int], None]:
    """The stream-static join's foreachBatch: the batch's last change per order, joined
    with the customers as they are now, MERGEd by order id."""

    def write(batch: DataFrame, _: int) -> None:
        latest = latest_change_per_key(batch, ["id"]).alias("o")
        c = spark.read.format("delta").load(customers).alias("c")
        rows = latest.join(c, F.col("o.customer_id") == F.col("c.id"), "left").select(
            "o.id", "o.amount", F.col("c.name").alias("customer"), "o._change_type"
        )
        (
            DeltaTable.forPath(spark, target)
            .alias("t")
            .merge(rows.alias("s"), "t.id = s.id")
            .whenMatchedDelete(condition="s._change_type = 'delete'")
            .whenMatchedUpdateAll(condition="s._change_type != 'delete'")
            .whenNotMatchedInsertAll(condition="s._change_type != 'delete'")
            .execute()
        )

    return write


def _variant(
    spark: SparkSession,
    workdir: Path,
    orders_n: int,
    customers_n: int,
    commits: int,
    clustered: bool,
) -> tuple[dict[str, list[float]], tuple[int, int], bool]:
    """One run: the seconds per commit of each side by the side changed, the wrong rows
    of lakeprop's target and of the DIY join's at the end, and whether lakeprop's
    target matched the recompute after every commit."""
    warehouse = workdir / ("clustered" if clustered else "plain") / "warehouse"
    orders, customers = str(warehouse / "b" / "orders"), str(warehouse / "b" / "customers")
    _create(spark, orders, ORDERS, None)
    _create(spark, customers, CUSTOMERS, "id" if clustered else None)
    spark.range(customers_n).selectExpr(
        "id", "concat('c', id) AS name", "concat('r', id % 10) AS region"
    ).write.format("delta").mode("append").save(customers)
    spark.range(orders_n).selectExpr(
        "id", f"id % {customers_n} AS customer_id", "CAST(id % 1000 AS DOUBLE) AS amount"
    ).write.format("delta").mode("append").save(orders)
    options = {"query": QUERY, "keys": {"o": ["id"], "c": ["id"]}}
    driver = HandDriven(
        spark, str(warehouse), _key(), {"type": "join_view", "options": options}, small_rows=0
    )
    driver.snapshot(_latest(spark, orders))
    recompute = str(warehouse / "b" / "recomputed")
    _truth(spark, orders, customers).write.format("delta").save(recompute)
    diy = str(warehouse / "b" / "diy")
    spark.read.format("delta").load(recompute).write.format("delta").save(diy)
    stream = (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", _latest(spark, orders) + 1)
        .load(orders)
    )
    checkpoint = str(workdir / ("clustered" if clustered else "plain") / "diy-checkpoint")
    seconds: dict[str, list[float]] = {"orders": [], "customers": [], "recompute": [], "diy": []}
    exact = True
    for commit in range(commits):
        side = "orders" if commit % 2 == 0 else "customers"
        step = commit // 2
        if side == "orders":  # 1 %: new amounts, some orders moved to another customer
            spark.sql(
                f"UPDATE delta.`{orders}` SET amount = amount + 1, customer_id = "
                f"CASE WHEN id % 7 = 0 THEN (customer_id + 1) % {customers_n} ELSE customer_id END "
                f"WHERE id % 100 = {step % 100}"
            )
        else:  # 1 % of the customers renamed
            spark.sql(
                f"UPDATE delta.`{customers}` SET name = concat(name, '+') "
                f"WHERE id % 100 = {step % 100}"
            )
        with stopwatch() as took:
            driver.tail(_latest(spark, orders))
        seconds[side].append(took[0])
        with stopwatch() as took:
            _truth(spark, orders, customers).write.format("delta").mode("overwrite").save(recompute)
        seconds["recompute"].append(took[0])
        with stopwatch() as took:
            query = (
                stream.writeStream.foreachBatch(_diy_batch(spark, diy, customers))
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        seconds["diy"].append(took[0])
        exact &= same_rows(
            driver.read().select("id", "amount", "customer"),
            spark.read.format("delta").load(recompute),
        )
    truth = spark.read.format("delta").load(recompute)
    wrong = spark.read.format("delta").load(diy).exceptAll(truth).count()
    ours = driver.read().select("id", "amount", "customer").exceptAll(truth).count()
    return seconds, (ours, wrong), exact


def _key() -> JobKey:
    return JobKey(1, "b", "orders", "joined")


def _latest(spark: SparkSession, path: str) -> int:
    version = DeltaLogProbe(spark).latest_version(path)
    assert version is not None
    return version


def run(
    spark: SparkSession,
    workdir: Path,
    bootstrap_servers: str,
    orders: int = 1_000_000,
    customers: int = 100_000,
    commits: int = 4,
) -> Result:
    del bootstrap_servers  # hand-driven iterations: no change log
    figures: list[Figure] = []
    checks: dict[str, bool] = {}
    for clustered in (True, False):
        suffix = ", customers clustered" if clustered else ", not clustered"
        seconds, wrong, exact = _variant(spark, workdir, orders, customers, commits, clustered)
        full = statistics.median(seconds["recompute"])
        for side in ("orders", "customers"):
            if seconds[side]:
                tail = statistics.median(seconds[side])
                figures.append(Figure(f"1 % of {side} changed: tail{suffix}", "s", tail, full))
                figures.append(
                    Figure(f"1 % of {side}: tail / recompute{suffix}", "ratio", tail / full)
                )
        tails = seconds["orders"] + seconds["customers"]
        figures.append(
            Figure(
                f"per commit, against the stream-static join{suffix}",
                "s",
                statistics.median(tails),
                statistics.median(seconds["diy"]),
            )
        )
        figures.append(
            Figure(
                f"wrong rows at the end, against the stream-static join{suffix}", "count", *wrong
            )
        )
        checks[f"the join view equals the recompute{suffix}"] = exact
    return Result(
        TITLE,
        {"orders": orders, "customers": customers, "commits": commits},
        figures,
        checks,
        baseline="the same query recomputed whole and written over its target",
    )
