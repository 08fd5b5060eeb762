"""Advancing watermarks, states and statuses from iteration results (pure).

A member that succeeded moves its job's watermark to the iteration's end
version; the consumer's write has committed by then, so the watermark never
runs ahead of the data. A temporary failure (codes 1-9999) leaves the
watermark and schedules a retry with backoff; a permanent one (10000+) puts the
job in ``error`` until an update repairs it; a cancelled iteration leaves the
job ``canceled``, to be planned again on the next tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from lakeprop.engine.model import IterationKind, IterationResult, MemberResult, Retry
from lakeprop.engine.retry import retry_delay
from lakeprop.errors import ErrorCode, is_temporary_code
from lakeprop.spec import JobRef
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import ConsumerStatus, JobState, JobStatus, RetryStatus, joined_marks


def status_of(
    result: IterationResult,
    member: MemberResult,
    retry: Retry | None = None,
    before: str = "",
) -> str:
    """The job status a member's result leaves (JSON of :class:`JobStatus`); the
    versions of the tables it joins are the member's, or, where it did not say (a
    failure), those of the status ``before`` it, unless it ran a snapshot (which
    starts them over)."""
    joined = member.joined
    if joined is None:
        joined = {} if result.kind is IterationKind.SNAPSHOT and member.ok else joined_marks(before)
    return JobStatus(
        iteration_id=result.plan.iteration_id,
        kind=result.kind.value,
        from_version=result.from_version_of(member.job_id),
        to_version=result.plan.to_version,
        start_at=datetime.fromtimestamp(result.started_at).isoformat(),
        end_at=datetime.fromtimestamp(result.ended_at).isoformat(),
        error_code=member.error_code,
        error_msg=member.error_msg,
        resync=result.resync_reason,
        consumers=(
            ConsumerStatus(
                member.consumer_type, member.rows_written, member.error_code, member.error_msg
            ),
        ),
        retry=None
        if retry is None
        else RetryStatus(retry.attempts, datetime.fromtimestamp(retry.not_before).isoformat()),
        path=result.path,
        path_note=result.path_note,
        joined=joined,
    ).to_json()


def advance(
    rows: Mapping[JobRef, CatalogRow],
    results: Sequence[IterationResult],
    retries: dict[JobRef, Retry],
    now: float,
    *,
    retry_base: float,
    retry_cap: float,
) -> dict[JobRef, CatalogRow]:
    """Catalog rows changed by these results; ``retries`` is updated in place. A job
    paused while its iteration ran keeps the iteration's watermark and stays paused."""
    changed: dict[JobRef, CatalogRow] = {}
    for result in results:
        plan = result.plan
        for member in result.members:
            row = changed.get(member.ref) or rows.get(member.ref)
            if row is None or not row.is_live or row.job_id != member.job_id:
                continue  # dropped (or dropped and re-registered) meanwhile
            if member.consumer_spec and member.consumer_spec != row.consumer_spec():
                continue  # its consumer was re-specified meanwhile: it will resync
            if member.ok:
                if row.watermark is not None and plan.to_version < row.watermark:
                    continue
                retries.pop(member.ref, None)
                changed[member.ref] = replace(
                    row,
                    watermark=plan.to_version,
                    watermark_ts=datetime.fromtimestamp(plan.planned_at),
                    job_state=JobState.COMPLETED,
                    job_status=status_of(result, member, before=row.job_status),
                )
            elif member.error_code == ErrorCode.ITERATION_CANCELED:
                changed[member.ref] = replace(
                    row,
                    job_state=JobState.CANCELED,
                    job_status=status_of(result, member, before=row.job_status),
                )
            elif is_temporary_code(member.error_code):
                attempts = retries[member.ref].attempts + 1 if member.ref in retries else 1
                retry = Retry(attempts, now + retry_delay(attempts, retry_base, retry_cap))
                retries[member.ref] = retry
                changed[member.ref] = replace(
                    row,
                    job_state=JobState.PENDING,
                    job_status=status_of(result, member, retry, row.job_status),
                )
            else:
                retries.pop(member.ref, None)
                changed[member.ref] = replace(
                    row,
                    job_state=JobState.ERROR,
                    job_status=status_of(result, member, before=row.job_status),
                )
    return {
        ref: replace(row, job_state=JobState.PAUSED)
        if (rows.get(ref) or row).job_state == JobState.PAUSED
        else row
        for ref, row in changed.items()
    }
