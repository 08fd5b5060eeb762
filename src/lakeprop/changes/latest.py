"""The last change of every key in a change set: one rule, for Spark and for Arrow.

The engine reads a table's change set once (:mod:`lakeprop.engine.changeset`) and
hands it to every consumer; consumers that keep one row per key apply the last
change of each key, in commit order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

if TYPE_CHECKING:
    import pyarrow as pa


def latest_change_per_key(changes: DataFrame, key: list[str]) -> DataFrame:
    """The last change of every key in commit order (pre-images dropped).

    Within one commit a key may be deleted and inserted again (an overwrite
    does that): the insert is the state the commit leaves, so it ranks last.
    """
    rank = F.when(F.col("_change_type") == "delete", 0).otherwise(1)
    order = Window.partitionBy(*key).orderBy(F.desc("_commit_version"), F.desc("_rank"))
    return (
        changes.where(F.col("_change_type") != "update_preimage")
        .withColumn("_rank", rank)
        .withColumn("_n", F.row_number().over(order))
        .where(F.col("_n") == 1)
        .drop("_n", "_rank")
    )


def latest_change_per_key_arrow(changes: pa.Table, key: Sequence[str]) -> pa.Table:
    """The last change of every key in commit order, pre-images dropped (Arrow); in one
    commit an insert after a delete of the same key is what the commit leaves."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = changes.filter(pc.not_equal(changes["_change_type"], "update_preimage"))
    rank = pc.if_else(pc.equal(rows["_change_type"], "delete"), 0, 1)
    rows = rows.append_column("_rank", rank).append_column(
        "_row", pa.array(range(rows.num_rows), pa.int64())
    )
    rows = rows.sort_by(
        [("_commit_version", "ascending"), ("_rank", "ascending"), ("_row", "ascending")]
    )
    last = (
        rows.append_column("_order", pa.array(range(rows.num_rows), pa.int64()))
        .group_by(list(key), use_threads=False)
        .aggregate([("_order", "max")])
    )
    return rows.take(last["_order_max"]).drop_columns(["_rank", "_row"])
