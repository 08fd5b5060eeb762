"""From-scratch computations that consumer targets are compared with."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def aggregates_of(column: str) -> list[dict[str, Any]]:
    """An aggregate_view ``aggregates`` option with every function over ``column``."""
    return [
        {"fn": "count", "as": "n"},
        {"fn": "count", "column": column, "as": "counted"},
        {"fn": "sum", "column": column, "as": "total"},
        {"fn": "avg", "column": column, "as": "mean"},
        {"fn": "min", "column": column, "as": "low"},
        {"fn": "max", "column": column, "as": "high"},
    ]


AGGREGATE_COLUMNS = ["n", "counted", "total", "mean", "low", "high"]


def aggregated(rows: DataFrame, group_by: list[str], column: str) -> DataFrame:
    """The batch query :func:`aggregates_of` asks an aggregate_view to keep."""
    aggs = [
        F.count(F.lit(1)).alias("n"),
        F.count(column).alias("counted"),
        F.sum(column).alias("total"),
        F.avg(column).alias("mean"),
        F.min(column).alias("low"),
        F.max(column).alias("high"),
    ]
    return rows.groupBy(*group_by).agg(*aggs) if group_by else rows.agg(*aggs)
