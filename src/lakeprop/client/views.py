"""What the state reader returns: jobs and bulk operations as the service last
wrote them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lakeprop.bulk.model import BulkOperation, BulkTask, TaskState, counts
from lakeprop.spec import JobKey
from lakeprop.state.job_row import CatalogRow


@dataclass(frozen=True)
class JobInfo:
    """A job as the catalog holds it, with spec and status decoded."""

    key: JobKey
    job_id: int
    table_id: str
    state: str
    watermark: int | None
    spec: dict[str, Any]
    status: dict[str, Any]
    create_at: datetime
    drop_at: datetime | None
    owner: str | None = None
    """``<instance>@<epoch>`` of the instance serving the job (``cluster.enabled``)."""
    waiting: str | None = None
    """Why the job waits on a job upstream of it, paused or in error (a job whose
    source is another job's target; :mod:`lakeprop.pipeline`), or None."""
    freshness: dict[str, Any] | None = None
    """For a job reading another job's target, its last write's end-to-end
    freshness (:mod:`lakeprop.pipeline.freshness`): ``origin`` (the chain's first
    table), ``seconds`` from the commit to it to the write's end, and ``at`` (that
    end); None when not known. Set by ``get_job_status`` only."""

    @classmethod
    def from_row(cls, row: CatalogRow) -> JobInfo:
        return cls(
            key=row.key,
            job_id=row.job_id,
            table_id=row.table_id,
            state=row.job_state.value,
            watermark=row.watermark,
            spec=json.loads(row.job_spec),
            status=json.loads(row.job_status),
            create_at=row.create_at,
            drop_at=row.drop_at,
            owner=row.owner,
        )


@dataclass(frozen=True)
class BulkStatus:
    """A bulk operation and its tasks, as the service last wrote them."""

    operation: BulkOperation
    tasks: list[BulkTask]

    @property
    def done(self) -> int:
        """Tasks that will not run again (unless rolled back)."""
        return sum(t.state.terminal for t in self.tasks)

    @property
    def failed(self) -> int:
        return sum(t.state in (TaskState.FAIL, TaskState.ROLLBACK_FAIL) for t in self.tasks)

    @property
    def ended(self) -> bool:
        return self.operation.state.terminal

    def summary(self) -> str:
        by_state = ", ".join(f"{n} {s}" for s, n in sorted(counts(self.tasks).items()))
        return (
            f"bulk {self.operation.bulk_id} ({self.operation.operation.value}): "
            f"{self.operation.state.value}, {self.done}/{len(self.tasks)} tasks done, "
            f"{self.failed} failed [{by_state}]"
        )


def current_row(rows: Sequence[CatalogRow]) -> CatalogRow | None:
    """Of one key's catalog rows, the live job, or else the most recently dropped one."""
    return max(rows, key=lambda r: (r.is_live, r.create_at, r.job_id), default=None)


def by_key(rows: Sequence[CatalogRow]) -> list[JobInfo]:
    """Catalog rows as jobs, ordered by key (then job id)."""
    return [JobInfo.from_row(r) for r in sorted(rows, key=lambda r: (r.key, r.job_id))]
