"""What became of each change log message.

Two Delta tables record it, both keyed by the message's Kafka coordinates so
that a replayed micro-batch writes nothing new:

* ``requests``: one row per message that names a request: applied,
  already_exists, not_found or rejected, with a detail a person can read. The
  client waits on it; the runner reads it back on replay so a replayed message
  gets the verdict it got the first time (the catalog is written after it).
* ``rejects``: every message that could not be applied, with its raw payload,
  its coordinates and the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.changelog import BulkCommand, Command, LogRecord, best_effort_request_id
from lakeprop.errors import LakepropError
from lakeprop.spec import JobKey
from lakeprop.state import store as state
from lakeprop.state.schema import Int32, row_tuple, spark_schema
from lakeprop.state.shared import with_retries

MAX_STORED_PAYLOAD = 65_536
"""Rejects keep at most this many bytes of a payload (payload_size has the full size)."""

Coordinates = tuple[str, int, int]
"""(topic, partition, offset) of a change log message."""


class Outcome(str, Enum):
    APPLIED = "applied"
    ALREADY_EXISTS = "already_exists"
    NOT_FOUND = "not_found"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one change log message."""

    record: LogRecord
    outcome: Outcome
    request_id: str | None = None
    op: str | None = None
    key: JobKey | None = None
    job_id: int | None = None
    table_id: str | None = None
    error_code: int = 0
    detail: str = ""

    @property
    def coordinates(self) -> Coordinates:
        return (self.record.topic, self.record.partition, self.record.offset)

    @classmethod
    def of(
        cls, command: Command | BulkCommand, outcome: Outcome, detail: str, **found: Any
    ) -> Verdict:
        """The verdict on a decoded message (a job's or a bulk message): ``found`` adds
        the job id, table id or error code."""
        key = command.key if isinstance(command, Command) else None
        return cls(
            record=command.record,
            outcome=outcome,
            request_id=command.request_id,
            op=command.op.value,
            key=key,
            detail=detail,
            **found,
        )

    @classmethod
    def undecodable(cls, record: LogRecord, error: LakepropError) -> Verdict:
        """The verdict on a message that did not decode: rejected, with the request id
        if one can be read at all."""
        return cls(
            record=record,
            outcome=Outcome.REJECTED,
            request_id=best_effort_request_id(record.value),
            error_code=error.code,
            detail=str(error),
        )


@dataclass(frozen=True)
class RecordedVerdict:
    """A verdict read back from the requests table (for replays)."""

    outcome: Outcome
    job_id: int | None
    table_id: str | None


@dataclass(frozen=True)
class RequestRow:
    """A row of the ``requests`` table: the verdict on a message that names a request."""

    topic: str
    partition: Int32
    offset: int
    request_id: str | None
    op: str | None
    account_id: int | None
    database: str | None
    table: str | None
    job_name: str | None
    job_id: int | None
    table_id: str | None
    outcome: str
    error_code: Int32
    detail: str
    log_timestamp: datetime
    batch_id: int

    @classmethod
    def of(cls, v: Verdict, batch_id: int) -> RequestRow:
        key = v.key
        return cls(
            *v.coordinates,
            v.request_id,
            v.op,
            key.account_id if key else None,
            key.database if key else None,
            key.table if key else None,
            key.job_name if key else None,
            v.job_id,
            v.table_id,
            v.outcome.value,
            v.error_code,
            v.detail,
            v.record.timestamp,
            batch_id,
        )


@dataclass(frozen=True)
class RejectRow:
    """A row of the ``rejects`` table: a message that could not be applied, as it came."""

    topic: str
    partition: Int32
    offset: int
    log_timestamp: datetime
    message_key: str | None
    payload: bytes | None
    payload_size: Int32
    error_code: Int32
    reason: str
    batch_id: int

    @classmethod
    def of(cls, v: Verdict, batch_id: int) -> RejectRow:
        record = v.record
        return cls(
            *v.coordinates,
            record.timestamp,
            None if record.key is None else record.key.decode("utf-8", "replace"),
            None if record.value is None else record.value[:MAX_STORED_PAYLOAD],
            0 if record.value is None else len(record.value),
            v.error_code,
            v.detail,
            batch_id,
        )


REQUESTS_SCHEMA = spark_schema(RequestRow)
REJECTS_SCHEMA = spark_schema(RejectRow)

COORDINATE_KEYS = ("topic", "partition", "offset")


class OutcomeTables:
    """Writer and reader of the requests and rejects tables."""

    def __init__(
        self, spark: SparkSession, requests_path: str, rejects_path: str, *, shared: bool = False
    ) -> None:
        self.spark = spark
        self.shared = shared
        """Several instances write the tables (``cluster.enabled``): what this one has
        not written may be there, so every write keeps what is (a MERGE, retried on
        a conflict) and every batch looks its verdicts up."""
        self.requests_path = requests_path
        self.rejects_path = rejects_path
        self._created = False
        self._highest: dict[tuple[str, int], int] | None = None
        """Per topic partition, the highest offset with a verdict written: a message
        above it cannot have one, so its batch is no replay (None: read it first)."""

    def ensure(self) -> None:
        created = state.ensure_table(
            self.spark, self.requests_path, REQUESTS_SCHEMA, state.APPEND_LOG_PROPERTIES
        )
        created &= state.ensure_table(self.spark, self.rejects_path, REJECTS_SCHEMA)
        self._created = created

    def load(self) -> None:
        """Learn the highest offset with a verdict per partition (at every start)."""
        if self._created and all(  # both tables are new, so empty
            state.untouched(self.spark, p) for p in (self.requests_path, self.rejects_path)
        ):
            self._highest = {}
            return
        written = (
            state.read_table(self.spark, self.requests_path)
            .select(*COORDINATE_KEYS)
            .unionByName(state.read_table(self.spark, self.rejects_path).select(*COORDINATE_KEYS))
            .groupBy("topic", "partition")
            .agg(F.max("offset").alias("offset"))
            .collect()
        )
        self._highest = {(r["topic"], r["partition"]): r["offset"] for r in written}

    def _all_new(self, coordinates: Iterable[Coordinates]) -> bool:
        if self.shared:
            return False
        if self._highest is None:
            self.load()
        assert self._highest is not None
        return all(offset > self._highest.get((t, p), -1) for t, p, offset in coordinates)

    def maybe_recorded(
        self, verdicts: Sequence[Verdict], recorded: Mapping[Coordinates, Any]
    ) -> set[Coordinates]:
        """Of these verdicts (before :meth:`record`), the coordinates of those that
        may be recorded already: alone on the state, every one of a micro-batch that
        is not all new (a replay); shared, the ones :meth:`recorded` found, and those
        without a request id (``recorded`` reads the requests only)."""
        coordinates = [v.coordinates for v in verdicts]
        if not self.shared:
            return set() if self._all_new(coordinates) else set(coordinates)
        return {
            v.coordinates for v in verdicts if v.request_id is None or v.coordinates in recorded
        }

    def record(self, verdicts: Sequence[Verdict], batch_id: int) -> None:
        """Write the verdicts of one micro-batch (idempotent)."""
        requests = [
            row_tuple(RequestRow.of(v, batch_id)) for v in verdicts if v.request_id is not None
        ]
        rejects = [
            row_tuple(RejectRow.of(v, batch_id)) for v in verdicts if v.outcome is Outcome.REJECTED
        ]
        coordinates = [v.coordinates for v in verdicts]
        try:
            if self._all_new(coordinates):  # the usual case: one append per table, no read
                state.append(self.spark, self.rejects_path, REJECTS_SCHEMA, rejects)
                state.append(self.spark, self.requests_path, REQUESTS_SCHEMA, requests)
            else:  # a replay (or shared): keep the verdicts written the first time
                with_retries(
                    f"verdicts to {self.rejects_path}",
                    lambda: state.insert_new(
                        self.spark, self.rejects_path, REJECTS_SCHEMA, rejects, COORDINATE_KEYS
                    ),
                    table="rejects",
                )
                with_retries(
                    f"verdicts to {self.requests_path}",
                    lambda: state.insert_new(
                        self.spark, self.requests_path, REQUESTS_SCHEMA, requests, COORDINATE_KEYS
                    ),
                    table="requests",
                )
        except BaseException:
            self._highest = None  # a write may have landed: read again before the next
            raise
        if self.shared:
            return
        assert self._highest is not None
        for topic, partition, offset in coordinates:
            key = (topic, partition)
            self._highest[key] = max(offset, self._highest.get(key, -1))

    def recorded(self, records: Sequence[LogRecord]) -> Mapping[Coordinates, RecordedVerdict]:
        """Verdicts already recorded for these messages (non-empty only on replay)."""
        if not records or self._all_new((r.topic, r.partition, r.offset) for r in records):
            return {}
        ranges: dict[tuple[str, int], tuple[int, int]] = {}
        for r in records:
            lo, hi = ranges.get((r.topic, r.partition), (r.offset, r.offset))
            ranges[(r.topic, r.partition)] = (min(lo, r.offset), max(hi, r.offset))
        condition = F.lit(False)
        for (topic, partition), (lo, hi) in ranges.items():
            condition |= (
                (F.col("topic") == topic)
                & (F.col("partition") == partition)
                & F.col("offset").between(lo, hi)
            )
        rows = (
            state.read_table(self.spark, self.requests_path)
            .where(condition)
            .select(*COORDINATE_KEYS, "outcome", "job_id", "table_id")
            .collect()
        )
        return {
            (r["topic"], r["partition"], r["offset"]): RecordedVerdict(
                Outcome(r["outcome"]), r["job_id"], r["table_id"]
            )
            for r in rows
        }
