"""A job as the catalog holds it: one row of the catalog table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from functools import cached_property
from typing import Any

from lakeprop.changelog import JOB_PARTITION, LogRecord
from lakeprop.pipeline.graph import Node
from lakeprop.spec import JobKey, JobRef, JobSpec
from lakeprop.state.schema import Int32, row_tuple, spark_schema
from lakeprop.state.status import JobState


@dataclass(frozen=True)
class CatalogRow:
    """One job as stored in the catalog: a row of :data:`CATALOG_SCHEMA`."""

    account_id: int
    database: str
    table: str
    job_name: str
    job_id: int
    table_id: str
    job_spec: str
    job_state: JobState
    watermark: int | None
    """Delta version of the source up to which the job has consumed changes."""
    watermark_ts: datetime | None
    job_status: str
    create_at: datetime
    drop_at: datetime | None
    owner: str | None
    log_partition: Int32
    log_offset: int

    @cached_property
    def key(self) -> JobKey:
        """Built (and its names validated) once per row: every tick asks each row's."""
        return JobKey(self.account_id, self.database, self.table, self.job_name)

    @cached_property
    def node(self) -> Node:
        """The job in the pipeline graph: its source and target tables, read from its
        stored spec once per row (every micro-batch with a registration builds the
        graph of all live jobs)."""
        return Node.stored(self.key, self.job_spec)

    @cached_property
    def row_id(self) -> JobRef:
        return (self.key, self.job_id)

    @property
    def is_live(self) -> bool:
        return self.drop_at is None

    def spec(self) -> JobSpec:
        return JobSpec.from_json(json.loads(self.job_spec))

    def consumer_spec(self) -> str:
        """Canonical JSON of the job's consumer (type and options)."""
        return self.spec().iteration.consumer.canonical()

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)

    @classmethod
    def from_spark(cls, row: Any) -> CatalogRow:
        values = {f.name: row[f.name] for f in fields(cls)}
        values["job_state"] = JobState(values["job_state"])
        return cls(**values)

    def touched_by(self, record: LogRecord) -> CatalogRow:
        return replace(self, log_partition=record.partition, log_offset=record.offset)

    def shows(self, partition: int, offset: int) -> bool:
        """Whether the row holds the message at (``partition``, ``offset``): it was last
        written by that message or a later one of its partition."""
        return self.log_partition == partition and self.log_offset >= offset


CATALOG_SCHEMA = spark_schema(CatalogRow)


def one_row_per_job(rows: Sequence[CatalogRow]) -> tuple[list[CatalogRow], int]:
    """``rows`` with one row per job, and how many were left out. A catalog holds one
    row per job; should a write have gone in twice (an append whose commit was
    retried, a stale instance's write), the later row stays (:func:`later`)."""
    kept: dict[JobRef, CatalogRow] = {}
    for row in rows:
        other = kept.get(row.row_id)
        if other is None or later(row, other):
            kept[row.row_id] = row
    return list(kept.values()), len(rows) - len(kept)


def later(row: CatalogRow, other: CatalogRow) -> bool:
    """Whether ``row`` is a later state of its job than ``other``: written by a later
    message of the change log (job messages go to partition 0, so a row of partition
    0 is later than one of a partition written before), else further along."""
    if row.log_partition != other.log_partition:
        return row.log_partition == JOB_PARTITION
    if row.log_offset != other.log_offset:
        return row.log_offset > other.log_offset
    return (-1 if row.watermark is None else row.watermark) > (
        -1 if other.watermark is None else other.watermark
    )
