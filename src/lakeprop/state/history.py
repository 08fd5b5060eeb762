"""The iteration history: one Delta row per finished iteration.

Written after the consumers' writes, it is the durable record of a watermark:
the catalog table catches up only on its flush, so after a crash
:meth:`IterationHistory.latest_success` and :func:`rolled_forward` bring the
catalog level with what the consumers already hold, and the history of a job
has neither a gap nor an overlap in its version ranges. The client reads
watermarks the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.state import store as state
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.schema import ADDED_LATER, Int32, row_tuple, spark_schema
from lakeprop.state.shared import Signed, with_retries
from lakeprop.state.status import JobState

Reached = Mapping[tuple[int, "str | None"], tuple[int, datetime]]
"""Per job id and consumer digest: the last version a success reached, and when."""


@dataclass(frozen=True)
class RuleCount:
    """What one of a job's expectations found in one iteration: the rows (a
    ``unique`` rule: the keys) that broke it."""

    name: str
    action: str
    failed: int

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


@dataclass(frozen=True)
class MemberRecord:
    """One job's part in a recorded iteration: an element of ``members``."""

    job_id: int
    job_name: str
    consumer_type: str
    from_version: int | None
    rows_written: int
    error_code: Int32
    error_msg: str
    consumer_digest: str | None = None
    """:func:`consumer_digest` of the consumer spec the member ran with."""
    expectations: list[RuleCount] | None = None
    """What the job's expectations found (None: it has none)."""
    origin_table: str | None = None
    """For a job reading another job's target: its chain's first table, and when the
    commit to it that this write reflects was made (its end-to-end freshness is
    from then to ``ended_at``)."""
    origin_at: datetime | None = None
    target_version: int | None = None
    """For a job whose target other jobs read: the version of its target this write
    left, and the commit to the chain's first table that version reflects (what a
    restarted service credits the readers of that version with)."""
    target_origin_table: str | None = None
    target_origin_at: datetime | None = None
    joined: str | None = None
    """For a job reading tables beside its source (a join): the version of each its
    write reflects, as JSON (``{"db.table": version}``), beside the range of its own
    source the record's versions give."""

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


def consumer_digest(consumer_spec: str) -> str:
    """A short fingerprint of a canonical consumer spec."""
    return hashlib.sha256(consumer_spec.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class IterationRecord:
    """One row of the iteration history: a row of :data:`HISTORY_SCHEMA`."""

    iteration_id: str
    account_id: int
    database: str
    table: str
    kind: str
    from_version: int | None
    to_version: int
    rows_read: int
    source_scans: Int32
    resync_reason: str
    started_at: datetime
    ended_at: datetime
    outcome: str
    error_code: Int32
    error_msg: str
    members: list[MemberRecord]
    spark_jobs: Int32 = field(metadata=ADDED_LATER)
    queued_seconds: float = field(default=0.0, metadata=ADDED_LATER)
    """From planned to a worker starting it (the wait for a share of the workers)."""
    task_seconds: float | None = None
    """Executor run time of the iteration's Spark tasks (None: not known)."""
    bytes_cached: int | None = None
    """Bytes the change set or snapshot held in Spark's cache (None: not known)."""
    paused_seconds: float = field(default=0.0, metadata=ADDED_LATER)
    """The part of ``queued_seconds`` its account spent paused by backpressure."""
    path: str = field(default="spark", metadata=ADDED_LATER)
    """Which way the iteration ran: ``spark``, or ``native`` (delta-rs in the driver)."""
    owner: str | None = None
    """``<instance>@<epoch>`` of the instance that ran it (``cluster.enabled``)."""

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


HISTORY_SCHEMA = spark_schema(IterationRecord)


class IterationHistory:
    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self._created = False

    def ensure(self) -> None:
        self._created = state.ensure_table(
            self.spark, self.path, HISTORY_SCHEMA, state.APPEND_LOG_PROPERTIES
        )

    @property
    def is_new(self) -> bool:
        """Created by this process and written by no one since: empty. Another
        instance sharing the state may have written it, so the log is looked at
        until it has been written."""
        if self._created:
            self._created = state.untouched(self.spark, self.path)
        return self._created

    def record(self, records: Sequence[IterationRecord], signed: Signed | None = None) -> None:
        """Append (a result is recorded once: after a crash it is gone, not replayed).

        ``signed`` (``cluster.enabled``): the append carries the writer's transaction
        id, so that Delta skips it once a newer owner fenced the writer, and it is
        retried after a conflict with another instance's fence.
        """
        rows = [r.as_tuple() for r in records]
        if not rows:
            return
        self._created = False
        frame = self.spark.createDataFrame(rows, HISTORY_SCHEMA)
        # mergeSchema: a history table of an earlier release gains the new columns
        writer = frame.write.format("delta").mode("append").option("mergeSchema", "true")
        if signed is None:
            writer.save(self.path)
            return
        writer = writer.options(**signed.writer_options())
        with_retries(
            f"history append to {self.path}", lambda: writer.save(self.path), table="iterations"
        )

    def latest_success(
        self, database: str | None = None, table: str | None = None
    ) -> dict[tuple[int, str | None], tuple[int, datetime]]:
        """Per job id and consumer digest: the highest version a successful member
        reached, and when (the digest is None in rows of releases without it).

        ``database`` and ``table`` narrow it to one source table's jobs (Delta
        skips the files of other tables by their statistics).
        """
        if self.is_new:  # so empty
            return {}
        df = state.read_table(self.spark, self.path)
        if database is not None and table is not None:
            df = df.where((F.col("database") == database) & (F.col("table") == table))
        members = df.select("to_version", "ended_at", F.explode("members").alias("m"))
        digest = (
            F.col("m.consumer_digest")
            if "consumer_digest" in members.schema["m"].dataType.fieldNames()  # type: ignore[attr-defined]
            else F.lit(None).cast("string")
        )
        rows = (
            members.where(F.col("m.error_code") == 0)
            .groupBy(F.col("m.job_id").alias("job_id"), digest.alias("digest"))
            .agg(F.max(F.struct("to_version", "ended_at")).alias("last"))
            .collect()
        )
        return {
            (r["job_id"], r["digest"]): (r["last"]["to_version"], r["last"]["ended_at"])
            for r in rows
        }

    def writes_of(
        self, database: str, table: str, job_id: int, limit: int
    ) -> list[tuple[int, str, datetime]]:
        """The newest ``limit`` versions job ``job_id`` (of source ``database.table``)
        left its target at, each with the origin it reflects: ``(target_version,
        origin_table, origin_at)``, oldest first."""
        if self.is_new:
            return []
        df = state.read_table(self.spark, self.path)
        df = df.where((F.col("database") == database) & (F.col("table") == table))
        members = df.select(F.explode("members").alias("m"))
        if "target_version" not in members.schema["m"].dataType.fieldNames():  # type: ignore[attr-defined]
            return []  # a history of a release that did not keep them
        rows = (
            members.where((F.col("m.job_id") == job_id) & F.col("m.target_version").isNotNull())
            .select("m.target_version", "m.target_origin_table", "m.target_origin_at")
            .orderBy(F.col("target_version").desc())
            .limit(limit)
            .collect()
        )
        return [(r[0], r[1], r[2]) for r in reversed(rows)]


def rolled_forward(row: CatalogRow, reached: Reached) -> CatalogRow | None:
    """``row`` with the watermark the history shows its job reached, if that is ahead.

    Only what the job's current consumer reached counts: after a consumer
    change the old consumer's progress is not the new one's (it starts from a
    snapshot). None when the row is already level (or the job is dropped).
    """
    done = reached.get((row.job_id, consumer_digest(row.consumer_spec()))) or reached.get(
        (row.job_id, None)
    )
    if not row.is_live or done is None or (row.watermark is not None and done[0] <= row.watermark):
        return None
    return replace(row, watermark=done[0], watermark_ts=done[1], job_state=JobState.COMPLETED)
