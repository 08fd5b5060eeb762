"""Advancing watermarks, states and statuses from iteration results (pure).

A member that succeeded moves its job's watermark to the iteration's end
version; the consumer's write has committed by then, so the watermark never
runs ahead of the data. A temporary failure (codes 1-9999) leaves the
watermark and schedules a retry with backoff; a permanent one (10000+) puts the
job in ``error`` until an update repairs it; a cancelled iteration leaves the
job ``canceled``, to be planned again on the next tick.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from lakeprop.engine.iteration import IterationResult, MemberResult
from lakeprop.engine.retry import retry_delay
from lakeprop.errors import ErrorCode, is_temporary_code
from lakeprop.state.catalog import CatalogRow, JobState, RowId


@dataclass(frozen=True)
class Retry:
    attempts: int
    not_before: float


def status_json(result: IterationResult, member: MemberResult, retry: Retry | None = None) -> str:
    plan = result.plan
    from_versions = {m.job_id: m.from_version for m in plan.members}
    status: dict[str, Any] = {
        "iteration_id": plan.iteration_id,
        "kind": result.kind.value,
        "from_version": None
        if result.kind.value == "snapshot"
        else from_versions.get(member.job_id),
        "to_version": plan.to_version,
        "start_at": datetime.fromtimestamp(result.started_at).isoformat(),
        "end_at": datetime.fromtimestamp(result.ended_at).isoformat(),
        "error_code": member.error_code,
        "error_msg": member.error_msg,
        "resync": result.resync_reason,
        "consumers": [
            {
                "type": member.consumer_type,
                "rows_written": member.rows_written,
                "error_code": member.error_code,
                "error_msg": member.error_msg,
            }
        ],
    }
    if retry is not None:
        status["retry"] = {
            "attempts": retry.attempts,
            "not_before": datetime.fromtimestamp(retry.not_before).isoformat(),
        }
    return json.dumps(status, sort_keys=True, separators=(",", ":"))


def advance(
    rows: Mapping[RowId, CatalogRow],
    results: Sequence[IterationResult],
    retries: dict[RowId, Retry],
    now: float,
    *,
    retry_base: float,
    retry_cap: float,
) -> dict[RowId, CatalogRow]:
    """Catalog rows changed by these results; ``retries`` is updated in place."""
    changed: dict[RowId, CatalogRow] = {}
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
                    job_state=JobState.COMPLETED.value,
                    job_status=status_json(result, member),
                )
            elif member.error_code == ErrorCode.ITERATION_CANCELED:
                changed[member.ref] = replace(
                    row, job_state=JobState.CANCELED.value, job_status=status_json(result, member)
                )
            elif is_temporary_code(member.error_code):
                attempts = retries[member.ref].attempts + 1 if member.ref in retries else 1
                retry = Retry(attempts, now + retry_delay(attempts, retry_base, retry_cap))
                retries[member.ref] = retry
                changed[member.ref] = replace(
                    row,
                    job_state=JobState.PENDING.value,
                    job_status=status_json(result, member, retry),
                )
            else:
                retries.pop(member.ref, None)
                changed[member.ref] = replace(
                    row, job_state=JobState.ERROR.value, job_status=status_json(result, member)
                )
    return changed
