"""A job's state and status as the catalog stores them (ISCP's job_state, job_status).

:class:`JobState` is the state column; :class:`JobStatus` is the JSON of the
``job_status`` column: what the job's last iteration did (or why the job
failed), with one canonical :meth:`JobStatus.to_json`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum

from lakeprop.spec import canonical_json


class JobState(str, Enum):
    """Job states, as in ISCP. A new job starts ``completed`` so the runner begins iterating."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELED = "canceled"
    PAUSED = "paused"
    """Paused through the change log: keeps its watermark, runs no iteration."""

    @property
    def transient(self) -> bool:
        """Queued or running: kept in memory, not worth a Delta commit of its own."""
        return self in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class ConsumerStatus:
    type: str
    rows_written: int
    error_code: int
    error_msg: str


@dataclass(frozen=True)
class RetryStatus:
    attempts: int
    not_before: str
    """ISO time before which the job is not retried."""


@dataclass(frozen=True)
class JoinedMark:
    """A table a job reads beside its own source (a join), as its write reflects it:
    the version, and the table's identity at that version (a table re-created under
    the job starts over from version 0)."""

    version: int
    table_id: str

    @classmethod
    def of(cls, value: object) -> JoinedMark | None:
        """The mark a status's JSON holds, or None for anything else."""
        if not isinstance(value, dict):
            return None
        version, table_id = value.get("version"), value.get("table_id")
        if isinstance(version, int) and not isinstance(version, bool) and isinstance(table_id, str):
            return cls(version, table_id)
        return None


def joined_marks(job_status: str) -> dict[str, JoinedMark]:
    """The ``joined`` marks a ``job_status`` JSON holds (none when it holds none)."""
    try:
        found = json.loads(job_status).get("joined") if job_status else None
    except (ValueError, AttributeError):
        return {}
    if not isinstance(found, dict):
        return {}
    marks = {str(name): JoinedMark.of(value) for name, value in found.items()}
    return {name: mark for name, mark in marks.items() if mark is not None}


@dataclass(frozen=True)
class JobStatus:
    """The ``job_status`` JSON: the last iteration of a job, or the error that stopped it."""

    iteration_id: str | None = None
    kind: str | None = None
    from_version: int | None = None
    to_version: int | None = None
    start_at: str | None = None
    end_at: str | None = None
    error_code: int = 0
    error_msg: str = ""
    resync: str = ""
    consumers: tuple[ConsumerStatus, ...] = field(default_factory=tuple)
    retry: RetryStatus | None = None
    path: str = ""
    """``spark`` or ``native``: where the iteration ran."""
    path_note: str = ""
    """Why a tail ran on Spark rather than natively."""
    joined: dict[str, JoinedMark] = field(default_factory=dict)
    """For a job that reads tables beside its source (a join): the version of each,
    by ``database.table``, that its target reflects with ``to_version`` of its own.
    Kept through failures: the next iteration reads each of them from there."""

    def to_json(self) -> str:
        fields = asdict(self)
        if not self.joined:  # the status of a job without joined tables, as before them
            del fields["joined"]
        return canonical_json(fields)

    @classmethod
    def failure(cls, code: int, message: str) -> JobStatus:
        """The status of a job that failed outside an iteration (its source went away)."""
        return cls(error_code=code, error_msg=message)


EMPTY_STATUS = JobStatus().to_json()
