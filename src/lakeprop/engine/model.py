"""The engine's values: tables, iteration plans, their results, cancellation, retries.

Plain data, no Spark: trigger selection produces :class:`IterationPlan`, the
scheduler runs them, an iteration returns an :class:`IterationResult`, and the
watermark logic turns results into catalog rows. Jobs are referred to by
:data:`~lakeprop.spec.JobRef` (key and job id) throughout.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from lakeprop.errors import ErrorCode
from lakeprop.pipeline.freshness import Origin, Written
from lakeprop.spec import JobKey, JobRef, JobSpec
from lakeprop.state.history import IterationRecord, MemberRecord, RuleCount, consumer_digest
from lakeprop.state.status import JoinedMark


class IterationKind(str, Enum):
    SNAPSHOT = "snapshot"
    """Hand the consumers the whole table as of ``to_version`` (they replace)."""
    TAIL = "tail"
    """Hand the consumers the changes in ``(from_version, to_version]``."""


@dataclass(frozen=True, order=True)
class TableRef:
    """A source table as one tenant sees it: the unit of serial processing."""

    account_id: int
    database: str
    table: str

    def __str__(self) -> str:
        return f"{self.account_id}/{self.database}.{self.table}"


@dataclass(frozen=True)
class Member:
    """One job in an iteration, with the version its changes start after."""

    ref: JobRef
    job_id: int
    from_version: int | None


@dataclass(frozen=True)
class IterationPlan:
    table: TableRef
    kind: IterationKind
    to_version: int
    members: tuple[Member, ...]
    priority: int
    planned_at: float
    iteration_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def from_version(self) -> int | None:
        """Where the shared scan starts: the lowest member watermark (tail only)."""
        starts = [m.from_version for m in self.members if m.from_version is not None]
        return min(starts) if starts else None

    @property
    def serial(self) -> bool:
        """Tails of one table run one at a time, in order; snapshots run beside them."""
        return self.kind is IterationKind.TAIL


@dataclass(frozen=True)
class MemberJob:
    """A member of the plan together with what its consumer needs."""

    member: Member
    key: JobKey
    spec: JobSpec
    joined_from: Mapping[str, JoinedMark] = field(default_factory=dict)
    """For a job reading tables beside its source: the versions of them its target
    reflects, as its status keeps them (:attr:`ConsumerContext.joined_from`)."""


class CancelToken:
    """Set when an iteration is cancelled (timeout, unregister, update, shutdown).

    It also tells the scheduler what the running iteration holds: ``cached_rows``,
    the rows of its held change set or snapshot (the account's rows in flight, for
    backpressure), set once the set is read and counted, and ``cached_bytes``,
    their size in Spark's cache.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        self.code = ErrorCode.ITERATION_CANCELED
        self.cached_rows = 0
        self.cached_bytes = 0

    def cancel(self, reason: str, code: ErrorCode = ErrorCode.ITERATION_CANCELED) -> None:
        if not self._event.is_set():
            self.reason, self.code = reason, code
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@dataclass
class MemberResult:
    ref: JobRef
    job_id: int
    consumer_type: str
    rows_written: int = 0
    error_code: int = 0
    error_msg: str = ""
    consumer_spec: str = ""
    """Canonical JSON of the consumer (type and options) the member ran with."""
    expectations: Sequence[RuleCount] = ()
    """What the job's expectations found (:mod:`lakeprop.engine.expect`)."""
    origin: Origin | None = None
    """For a job reading another job's target: the commit to its chain's first table
    its write reflects (:mod:`lakeprop.pipeline.freshness`)."""
    joined: dict[str, JoinedMark] | None = None
    """For a job reading tables beside its source (a join): the version of each its
    write reflects (None: the consumer did not say, or the job reads none)."""
    wrote: Written | None = None
    """For a job whose target other jobs read: the version of the target its write
    left, and the origin that version reflects (the history keeps it for a restart)."""

    @property
    def ok(self) -> bool:
        return self.error_code == 0


@dataclass
class IterationResult:
    plan: IterationPlan
    kind: IterationKind
    started_at: float
    ended_at: float = 0.0
    rows_read: int = 0
    source_scans: int = 0
    resync_reason: str = ""
    members: list[MemberResult] = field(default_factory=list)
    canceled: bool = False
    spark_jobs: int = 0
    """Spark jobs the iteration launched (its job group's)."""
    task_seconds: float | None = None
    """Executor run time of those jobs' tasks (None: Spark did not say)."""
    bytes_cached: int | None = None
    """Bytes the change set or snapshot held in Spark's cache."""
    paused_seconds: float = 0.0
    """The part of its queue wait during which its account was paused by backpressure."""
    path: str = "spark"
    """``native`` when delta-rs ran it in the driver (:mod:`lakeprop.engine.native`)."""
    path_note: str = ""
    """Why a tail ran on Spark rather than natively (the jobs' status shows it)."""

    @property
    def outcome(self) -> str:
        if self.canceled:
            return "canceled"
        failed = sum(not m.ok for m in self.members)
        if failed == 0:
            return "success"
        return "failed" if failed == len(self.members) else "partial"

    def from_version_of(self, job_id: int) -> int | None:
        """Where this member's changes started (None for a snapshot)."""
        if self.kind is IterationKind.SNAPSHOT:
            return None
        return next((m.from_version for m in self.plan.members if m.job_id == job_id), None)

    def record(self, job_names: dict[int, str]) -> IterationRecord:
        """The iteration history row of this result."""
        plan = self.plan
        failures = [m for m in self.members if not m.ok]
        return IterationRecord(
            iteration_id=plan.iteration_id,
            account_id=plan.table.account_id,
            database=plan.table.database,
            table=plan.table.table,
            kind=self.kind.value,
            from_version=None if self.kind is IterationKind.SNAPSHOT else plan.from_version,
            to_version=plan.to_version,
            rows_read=self.rows_read,
            source_scans=self.source_scans,
            resync_reason=self.resync_reason,
            started_at=datetime.fromtimestamp(self.started_at),
            ended_at=datetime.fromtimestamp(self.ended_at),
            outcome=self.outcome,
            error_code=max((m.error_code for m in failures), default=0),
            error_msg="; ".join(
                f"job {m.job_id}: [{m.error_code}] {m.error_msg}" for m in failures
            )[:4000],
            members=[
                MemberRecord(
                    job_id=m.job_id,
                    job_name=job_names.get(m.job_id, ""),
                    consumer_type=m.consumer_type,
                    from_version=self.from_version_of(m.job_id),
                    rows_written=m.rows_written,
                    error_code=m.error_code,
                    error_msg=m.error_msg[:2000],
                    consumer_digest=consumer_digest(m.consumer_spec) if m.consumer_spec else None,
                    expectations=list(m.expectations) or None,
                    origin_table=None if m.origin is None else m.origin.name,
                    origin_at=None if m.origin is None else datetime.fromtimestamp(m.origin.at),
                    target_version=None if m.wrote is None else m.wrote[0],
                    target_origin_table=None if m.wrote is None else m.wrote[1].name,
                    target_origin_at=(
                        None if m.wrote is None else datetime.fromtimestamp(m.wrote[1].at)
                    ),
                    joined=(
                        None
                        if not m.joined
                        else json.dumps({n: j.version for n, j in sorted(m.joined.items())})
                    ),
                )
                for m in self.members
            ],
            spark_jobs=self.spark_jobs,
            queued_seconds=max(0.0, self.started_at - plan.planned_at),
            task_seconds=self.task_seconds,
            bytes_cached=self.bytes_cached,
            paused_seconds=self.paused_seconds,
            path=self.path,
        )


def source_gone(source: object) -> str:
    """The error of jobs whose source table went away (permanent: re-register)."""
    return f"source {source} no longer exists or is not a Delta table; re-register the job"


@dataclass(frozen=True)
class Retry:
    """A job's retry after a temporary failure: how many so far, and not before when."""

    attempts: int
    not_before: float
