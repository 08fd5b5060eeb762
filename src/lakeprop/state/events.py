"""The event table: one Delta row per thing the service did, for a notebook to query.

In the spirit of a declarative pipeline's event log: every iteration, every
job error, every expectation's count, every verdict on a change log message,
each a row of :data:`EVENTS_SCHEMA` with its time, kind, level, job and a
message a person reads; ``details`` holds the rest as JSON text. The history
and the verdict tables stay the durable record the service itself reads; the
event table is written from memory every ``events.flush_interval`` (and at a
stop), so a crash may lose the last seconds of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from lakeprop.state import store as state
from lakeprop.state.schema import Int32, row_tuple, spark_schema

ITERATION, JOB_ERROR, EXPECTATION, VERDICT = "iteration", "job_error", "expectation", "verdict"
"""The kinds of event."""
INFO, WARN, ERROR = "INFO", "WARN", "ERROR"
"""Their levels."""


@dataclass(frozen=True)
class EventRecord:
    """One row of the event table."""

    at: datetime
    kind: str
    level: str
    message: str
    account_id: int | None = None
    database: str | None = None
    table: str | None = None
    job_name: str | None = None
    job_id: int | None = None
    iteration_id: str | None = None
    error_code: Int32 | None = None
    details: str | None = None
    """The rest, as JSON text (per kind: the versions read, a rule's action, ...)."""
    instance: str | None = None
    """The instance that wrote it (several instances share one table)."""

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


EVENTS_SCHEMA = spark_schema(EventRecord)


class EventTable:
    """Appends to the event table (blind appends: instances never conflict)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path

    def ensure(self) -> None:
        state.ensure_table(self.spark, self.path, EVENTS_SCHEMA, state.APPEND_LOG_PROPERTIES)

    def append(self, events: Sequence[EventRecord]) -> None:
        if not events:
            return
        frame = self.spark.createDataFrame([e.as_tuple() for e in events], EVENTS_SCHEMA)
        frame.write.format("delta").mode("append").option("mergeSchema", "true").save(self.path)
