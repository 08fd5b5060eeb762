"""Trigger selection: which iterations are due this tick (pure, no Spark).

The rules of ISCP's triggers, per source table:

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

Each trigger kind has one planner in :data:`PLANNERS`; a new kind is an enum
value in :class:`~lakeprop.spec.TriggerKind` and a planner here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lakeprop.engine.model import IterationKind, IterationPlan, Member, TableRef
from lakeprop.spec import JobRef, TriggerKind


@dataclass(frozen=True)
class JoinedWatch:
    """A table a job reads beside its source, as trigger selection watches it."""

    name: str
    """``database.table``."""
    location: str | None
    """None: it cannot be found."""
    version: int | None
    """The version the job's target reflects (None: not known, as after a resync)."""
    table_id: str | None = None
    """Its identity at that version."""


@dataclass(frozen=True)
class JobView:
    """What trigger selection needs to know of one live job."""

    ref: JobRef
    """The job's identity (key and job id), to find it again in the catalog."""
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
    joined: tuple[JoinedWatch, ...] = ()
    """For a job that reads tables beside its source (a join): what selection watches
    of each."""


@dataclass
class TablePlan:
    iterations: list[IterationPlan] = field(default_factory=list)
    fresh: list[JobRef] = field(default_factory=list)
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


def eligible_at(job: JobView) -> float | None:
    """From when a job is eligible with nothing else happening: its retry backoff
    ends, its periodic interval passes (the time may have passed). None: no time
    holds it back, or only an event can (it is in error, or in flight)."""
    if job.failed or job.in_flight:
        return None
    times = [] if job.blocked_until is None else [job.blocked_until]
    if job.kind is TriggerKind.PERIODIC and job.watermark is not None:
        assert job.interval_s is not None
        if job.watermark_ts is not None:
            times.append(job.watermark_ts + job.interval_s)
    return max(times, default=None)


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


@dataclass(frozen=True)
class TableState:
    """One table's jobs at one tick, as the planners see it."""

    table: TableRef
    jobs: Sequence[JobView]
    """Every live job of the table, eligible or not."""
    latest: int
    now: float
    max_versions: int | None = None
    """Chunked catch-up: a tail covers at most this many versions."""
    max_rows: int = 0
    """Chunked catch-up: a tail covers at most this many change rows (0: no bound)."""
    change_rows: Callable[[int], int | None] | None = None
    """Change rows of one version (None: unknown, counted as 0), for ``max_rows``."""

    def tail(self, members: Sequence[JobView], to_version: int | None = None) -> IterationPlan:
        to = self.latest if to_version is None else to_version
        start = min(j.watermark for j in members if j.watermark is not None)
        if self.max_versions is not None:
            to = min(to, start + self.max_versions)
        if self.max_rows and self.change_rows is not None:
            to = self._rows_bound(start, to)
        return IterationPlan(
            table=self.table,
            kind=IterationKind.TAIL,
            to_version=to,
            members=tuple(Member(j.ref, j.job_id, j.watermark) for j in members),
            priority=max(j.priority for j in members),
            planned_at=self.now,
        )

    def _rows_bound(self, start: int, to: int) -> int:
        """The last version after ``start`` whose changes fit in ``max_rows`` (at
        least ``start + 1``: one version is never split)."""
        assert self.change_rows is not None
        total = 0
        for version in range(start + 1, to + 1):
            total += self.change_rows(version) or 0
            if total > self.max_rows and version > start + 1:
                return version - 1
        return to

    def behind(self, kind: TriggerKind) -> list[JobView]:
        """Eligible jobs of ``kind`` with a watermark short of the latest version."""
        return [
            j
            for j in self.jobs
            if j.kind is kind
            and j.watermark is not None
            and j.watermark < self.latest
            and is_eligible(j, self.now)
        ]

    @property
    def group_mark(self) -> int | None:
        """The highest watermark of the table's synced default jobs."""
        marks = [j.watermark for j in self.jobs if j.kind is TriggerKind.DEFAULT]
        return max((m for m in marks if m is not None), default=None)


Planner = Callable[[TableState], list[IterationPlan]]
"""The tail iterations one trigger kind wants on a table this tick."""


def plan_greedy(state: TableState) -> list[IterationPlan]:
    """An iteration of its own for every greedy job behind."""
    return [state.tail([job]) for job in state.behind(TriggerKind.GREEDY)]


def plan_periodic(state: TableState) -> list[IterationPlan]:
    """Due periodic jobs: the sharing ones together, the others alone."""
    periodic = state.behind(TriggerKind.PERIODIC)
    shared = [j for j in periodic if j.share]
    plans = [state.tail(shared)] if shared else []
    return plans + [state.tail([j]) for j in periodic if not j.share]


def plan_default(state: TableState) -> list[IterationPlan]:
    """Default jobs share one iteration; one laggard at a time catches up."""
    default = state.behind(TriggerKind.DEFAULT)
    group_mark = state.group_mark
    if not default or group_mark is None:
        return []
    synced = [j for j in state.jobs if j.kind is TriggerKind.DEFAULT and j.watermark is not None]
    group_busy = any(j.in_flight and j.watermark == group_mark for j in synced)
    catching_up = any(
        j.in_flight and j.watermark is not None and j.watermark < group_mark for j in synced
    )
    leaders = [j for j in default if j.watermark == group_mark]
    laggards = sorted(
        (j for j in default if j.watermark is not None and j.watermark < group_mark),
        key=lambda j: (j.watermark, -j.priority, j.job_id),
    )
    laggard = laggards[0] if laggards and not catching_up else None
    if leaders and not group_busy:
        return [state.tail([*leaders, *([laggard] if laggard is not None else [])])]
    if laggard is not None:
        return [state.tail([laggard], group_mark)]
    return []


PLANNERS: dict[TriggerKind, Planner] = {
    TriggerKind.GREEDY: plan_greedy,
    TriggerKind.PERIODIC: plan_periodic,
    TriggerKind.DEFAULT: plan_default,
}


def plan_snapshots(state: TableState) -> list[IterationPlan]:
    """A snapshot of its own for every new job: a default job syncs to the group's
    watermark (so it can join the group), any other to the latest version."""
    plans = []
    for job in (j for j in state.jobs if j.watermark is None and is_eligible(j, state.now)):
        to_version = state.latest
        if job.kind is TriggerKind.DEFAULT and state.group_mark is not None:
            to_version = state.group_mark
        plans.append(
            IterationPlan(
                table=state.table,
                kind=IterationKind.SNAPSHOT,
                to_version=to_version,
                members=(Member(job.ref, job.job_id, None),),
                priority=job.priority,
                planned_at=state.now,
            )
        )
    return plans


def plan_table(
    table: TableRef,
    jobs: Sequence[JobView],
    latest: int | None,
    now: float,
    planners: Mapping[TriggerKind, Planner] = PLANNERS,
    max_versions: int | None = None,
    max_rows: int = 0,
    change_rows: Callable[[int], int | None] | None = None,
) -> TablePlan:
    """The iterations due on one table, given its latest version (None: no versions).

    With ``max_versions`` a tail covers at most that many versions, and with
    ``max_rows`` at most that many change rows (``change_rows`` counts a
    version's): a backlog becomes several bounded iterations, each committed
    before the next.
    """
    if latest is None:
        return TablePlan()
    state = TableState(table, jobs, latest, now, max_versions, max_rows, change_rows)
    iterations = plan_snapshots(state)
    for planner in planners.values():
        iterations += planner(state)
    fresh = [j.ref for j in jobs if j.watermark == latest and is_eligible(j, now)]
    return TablePlan(iterations, fresh)
