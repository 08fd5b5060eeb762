"""The event table: one Delta row per thing the service did, for a notebook to query.

In the spirit of a declarative pipeline's event log: every iteration, every
job error, every expectation's count, every verdict on a change log message,
each a row of :data:`EVENTS_SCHEMA` with its time, kind, level, job and a
message a person reads; ``details`` holds the rest as JSON text. The history
and the verdict tables stay the durable record the service itself reads; the
event table is written from memory every ``events.flush_interval`` (and at a
stop), so a crash may lose the last seconds of it. ``event_id`` names what an
event is about, so that an event written again (a replayed micro-batch, a
failed append retried) is inserted only where it is not; housekeeping deletes
the events older than ``events.retention``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakeprop.state import store as state
from lakeprop.state.schema import Int32, row_tuple, spark_schema
from lakeprop.state.shared import with_retries

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
    event_id: str | None = None
    """What the event is about, the same however often it is made (``verdict/<topic>/
    <partition>/<offset>/<request id>``, ``iteration/<iteration id>``, ...)."""

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


EVENTS_SCHEMA = spark_schema(EventRecord)


class EventTable:
    """Appends to the event table (blind appends: instances never conflict)."""

    created = False
    """This process created the table (:meth:`ensure`): no event in it is older."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path

    def ensure(self) -> None:
        if state.ensure_table(self.spark, self.path, EVENTS_SCHEMA, state.APPEND_LOG_PROPERTIES):
            self.created = True
            return
        if self._has_ids():
            return
        try:  # a table of an earlier release: ids from now on
            self.spark.sql(f"ALTER TABLE delta.`{self.path}` ADD COLUMNS (event_id STRING)")
        except Exception:
            if not self._has_ids():  # another instance added it meanwhile: fine
                raise

    def _has_ids(self) -> bool:
        return "event_id" in self.spark.read.format("delta").load(self.path).columns

    def _frame(self, events: Sequence[EventRecord]) -> DataFrame:
        return self.spark.createDataFrame([e.as_tuple() for e in events], EVENTS_SCHEMA)

    def append(self, events: Sequence[EventRecord]) -> None:
        """Append events new to the table (no read of it)."""
        if not events:
            return
        frame = self._frame(events)
        frame.write.format("delta").mode("append").option("mergeSchema", "true").save(self.path)

    def insert_new(self, events: Sequence[EventRecord]) -> None:
        """Insert the events whose id the table does not hold (one MERGE; an event
        table of an earlier release gains the id column)."""
        if not events:
            return
        unique = list({e.event_id: e for e in events}.values())
        with_retries(
            f"events to {self.path}",
            lambda: (
                DeltaTable.forPath(self.spark, self.path)
                .alias("t")
                .merge(self._frame(unique).alias("s"), "t.event_id = s.event_id")
                .whenNotMatchedInsertAll()
                .withSchemaEvolution()
                .execute()
            ),
            table="events",
        )

    def delete_before(self, cutoff: datetime) -> None:
        """Housekeeping: forget the events older than ``cutoff`` (a delete that
        touches only the files holding them)."""
        with_retries(
            f"retention of {self.path}",
            lambda: DeltaTable.forPath(self.spark, self.path).delete(F.col("at") < F.lit(cutoff)),
            table="events",
        )
