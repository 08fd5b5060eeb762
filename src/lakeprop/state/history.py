"""The iteration history: one Delta row per finished iteration.

Written after the consumers' writes and before the catalog update, it is also
the commit record of a watermark: when the service restarts after a crash that
fell between the two, :meth:`IterationHistory.latest_success` rolls the catalog
forward to what the consumers already hold, so the history of a job has neither
a gap nor an overlap in its version ranges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakeprop.engine.iteration import IterationResult
from lakeprop.state import store as state

# Delta accepts no NOT NULL constraint nested in an array: member fields are nullable.
MEMBER_SCHEMA = StructType(
    [
        StructField("job_id", LongType(), True),
        StructField("job_name", StringType(), True),
        StructField("consumer_type", StringType(), True),
        StructField("from_version", LongType(), True),
        StructField("rows_written", LongType(), True),
        StructField("error_code", IntegerType(), True),
        StructField("error_msg", StringType(), True),
    ]
)

HISTORY_SCHEMA = StructType(
    [
        StructField("iteration_id", StringType(), False),
        StructField("account_id", LongType(), False),
        StructField("database", StringType(), False),
        StructField("table", StringType(), False),
        StructField("kind", StringType(), False),
        StructField("from_version", LongType(), True),
        StructField("to_version", LongType(), False),
        StructField("rows_read", LongType(), False),
        StructField("source_scans", IntegerType(), False),
        StructField("resync_reason", StringType(), False),
        StructField("started_at", TimestampType(), False),
        StructField("ended_at", TimestampType(), False),
        StructField("outcome", StringType(), False),
        StructField("error_code", IntegerType(), False),
        StructField("error_msg", StringType(), False),
        StructField("members", ArrayType(MEMBER_SCHEMA, True), False),
    ]
)


def history_row(result: IterationResult, job_names: Mapping[int, str]) -> tuple[Any, ...]:
    plan = result.plan
    from_versions = {m.job_id: m.from_version for m in plan.members}
    failures = [m for m in result.members if not m.ok]
    return (
        plan.iteration_id,
        plan.table.account_id,
        plan.table.database,
        plan.table.table,
        result.kind.value,
        None if result.kind.value == "snapshot" else plan.from_version,
        plan.to_version,
        result.rows_read,
        result.source_scans,
        result.resync_reason,
        datetime.fromtimestamp(result.started_at),
        datetime.fromtimestamp(result.ended_at),
        result.outcome,
        max((m.error_code for m in failures), default=0),
        "; ".join(f"job {m.job_id}: [{m.error_code}] {m.error_msg}" for m in failures)[:4000],
        [
            (
                m.job_id,
                job_names.get(m.job_id, ""),
                m.consumer_type,
                None if result.kind.value == "snapshot" else from_versions.get(m.job_id),
                m.rows_written,
                m.error_code,
                m.error_msg[:2000],
            )
            for m in result.members
        ],
    )


class IterationHistory:
    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path

    def ensure(self) -> None:
        state.ensure_table(self.spark, self.path, HISTORY_SCHEMA)

    def record(self, results: Sequence[IterationResult], job_names: Mapping[int, str]) -> None:
        """Append (a result is recorded once: after a crash it is gone, not replayed)."""
        rows = [history_row(r, job_names) for r in results]
        if rows:
            self.spark.createDataFrame(rows, HISTORY_SCHEMA).write.format("delta").mode(
                "append"
            ).save(self.path)

    def latest_success(self) -> dict[int, tuple[int, datetime]]:
        """Per job id: the highest version a successful member reached, and when."""
        rows = (
            state.read_table(self.spark, self.path)
            .select("to_version", "ended_at", F.explode("members").alias("m"))
            .where(F.col("m.error_code") == 0)
            .groupBy(F.col("m.job_id").alias("job_id"))
            .agg(F.max(F.struct("to_version", "ended_at")).alias("last"))
            .collect()
        )
        return {r["job_id"]: (r["last"]["to_version"], r["last"]["ended_at"]) for r in rows}
