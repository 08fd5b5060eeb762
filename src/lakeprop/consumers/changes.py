"""Helpers over the change set an iteration hands its consumers."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

CDF_COLUMNS = frozenset({"_change_type", "_commit_version", "_commit_timestamp"})


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
