"""Trigger selection: which iterations are due this tick (pure, no Spark).

The rules of the seed, per source table:

* a **new** job (no watermark) starts at once with a snapshot iteration of its
  own. A default job on a table whose default jobs already have a watermark
  syncs up to that watermark, so it can join them; otherwise to the latest version;
* **default** jobs share one iteration from their common watermark to the
  latest version, unless that iteration is still running. Jobs that lag behind
  the table's highest default watermark catch up one at a time: the lagging job
  rides along in the group's iteration (the scan starts at its watermark, each
  consumer gets only its own range), or, while the group is busy, catches up to
  the group's watermark on its own;
* a **greedy** job has an iteration of its own on every tick with new data;
* a **periodic** job runs only once its watermark is older than its interval;
  with ``share`` the due periodic jobs of a table share one iteration.

A table is probed only when it has an eligible job, and a table without a
version beyond the watermark gets no iteration: its jobs are just marked fresh.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lakeprop.spec import TriggerKind


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
class JobView:
    """What trigger selection needs to know of one live job."""

    ref: Any
    """Opaque handle the caller uses to find the job again (its catalog row id)."""
    job_id: int
    kind: TriggerKind
    priority: int = 0
    interval_s: float | None = None
    share: bool = False
    watermark: int | None = None
    watermark_ts: float | None = None
    """When the job was last known to be in step with ``watermark`` (epoch seconds)."""
    in_flight: bool = False
    """An iteration with this job is queued or running."""
    blocked_until: float | None = None
    """Retry backoff: not eligible before this time."""
    failed: bool = False
    """In state ``error``: waits for a person (update_spec) before it runs again."""


@dataclass(frozen=True)
class Member:
    """One job in an iteration, with the version its changes start after."""

    ref: Any
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


@dataclass
class TablePlan:
    iterations: list[IterationPlan] = field(default_factory=list)
    fresh: list[Any] = field(default_factory=list)
    """Refs of jobs found in step with the latest version: their watermark_ts moves."""


def is_eligible(job: JobView, now: float) -> bool:
    """Could this job start an iteration now (before looking at the table)?"""
    if job.failed or job.in_flight:
        return False
    if job.blocked_until is not None and now < job.blocked_until:
        return False
    if job.watermark is None or job.kind is not TriggerKind.PERIODIC:
        return True
    assert job.interval_s is not None
    return job.watermark_ts is None or now - job.watermark_ts >= job.interval_s


def probe_from(jobs: Iterable[JobView], now: float) -> tuple[bool, int | None]:
    """(should probe, lowest watermark) for a table's jobs.

    The probe asks whether the table has a version after that watermark; a new
    job (no watermark) needs the latest version whatever it is, shown as None.
    """
    eligible = [j for j in jobs if is_eligible(j, now)]
    if not eligible:
        return False, None
    if any(j.watermark is None for j in eligible):
        return True, None
    return True, min(j.watermark for j in eligible if j.watermark is not None)


def _tail(
    table: TableRef, members: Sequence[JobView], to_version: int, now: float
) -> IterationPlan:
    return IterationPlan(
        table=table,
        kind=IterationKind.TAIL,
        to_version=to_version,
        members=tuple(Member(j.ref, j.job_id, j.watermark) for j in members),
        priority=max(j.priority for j in members),
        planned_at=now,
    )


def plan_table(
    table: TableRef, jobs: Sequence[JobView], latest: int | None, now: float
) -> TablePlan:
    """The iterations due on one table, given its latest version (None: no versions)."""
    plan = TablePlan()
    if latest is None:
        return plan
    eligible = [j for j in jobs if is_eligible(j, now)]
    synced_default = [j for j in jobs if j.kind is TriggerKind.DEFAULT and j.watermark is not None]
    group_mark = max((j.watermark for j in synced_default if j.watermark is not None), default=None)

    for job in (j for j in eligible if j.watermark is None):
        to_version = latest
        if job.kind is TriggerKind.DEFAULT and group_mark is not None:
            to_version = group_mark
        plan.iterations.append(
            IterationPlan(
                table=table,
                kind=IterationKind.SNAPSHOT,
                to_version=to_version,
                members=(Member(job.ref, job.job_id, None),),
                priority=job.priority,
                planned_at=now,
            )
        )

    synced = [j for j in eligible if j.watermark is not None]
    plan.fresh = [j.ref for j in synced if j.watermark == latest]
    behind = [j for j in synced if j.watermark is not None and j.watermark < latest]

    for job in (j for j in behind if j.kind is TriggerKind.GREEDY):
        plan.iterations.append(_tail(table, [job], latest, now))

    periodic = [j for j in behind if j.kind is TriggerKind.PERIODIC]
    shared = [j for j in periodic if j.share]
    if shared:
        plan.iterations.append(_tail(table, shared, latest, now))
    for job in (j for j in periodic if not j.share):
        plan.iterations.append(_tail(table, [job], latest, now))

    default = [j for j in behind if j.kind is TriggerKind.DEFAULT]
    if default and group_mark is not None:
        group_busy = any(j.in_flight and j.watermark == group_mark for j in synced_default)
        catching_up = any(
            j.in_flight and j.watermark is not None and j.watermark < group_mark
            for j in synced_default
        )
        leaders = [j for j in default if j.watermark == group_mark]
        laggards = sorted(
            (j for j in default if j.watermark is not None and j.watermark < group_mark),
            key=lambda j: (j.watermark, -j.priority, j.job_id),
        )
        laggard = laggards[0] if laggards and not catching_up else None
        if leaders and not group_busy:
            riders = [laggard] if laggard is not None else []
            plan.iterations.append(_tail(table, [*leaders, *riders], latest, now))
        elif laggard is not None:
            plan.iterations.append(_tail(table, [laggard], group_mark, now))
    return plan
