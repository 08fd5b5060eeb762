"""How the CLI shows jobs, usage and bulk operations to a person: plain text tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from lakeprop.client.api import BulkStatus, JobInfo
from lakeprop.membership.members import Member
from lakeprop.state.accounts import AccountRow
from lakeprop.state.usage import UsageRow

ERROR_WIDTH = 60
COLUMNS = ("JOB", "ID", "STATE", "WATERMARK", "LAG", "LAST ERROR")


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def last_error(job: JobInfo) -> str:
    """``[code] message`` of the job's last failure, cut to one short line; "" if none."""
    code = job.status.get("error_code") or 0
    if not code and not job.waiting:
        return ""
    message = " ".join(str(job.status.get("error_msg") or "").split())
    text = f"[{code}] {message}" if code else str(job.waiting)
    return text if len(text) <= ERROR_WIDTH else text[: ERROR_WIDTH - 1] + "…"


def lag(job: JobInfo, latest: int | None) -> int | None:
    """Source versions after the job's watermark (None: not known)."""
    if latest is None or job.watermark is None or job.drop_at is not None:
        return None
    return max(0, latest - job.watermark)


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


USAGE_COLUMNS = (
    "HOUR",
    "JOB",
    "ITERATIONS",
    "ROWS READ",
    "ROWS WRITTEN",
    "ROWS CACHED",
    "MB CACHED",
    "SPARK JOBS",
    "TASK S",
    "WALL S",
    "QUEUED S",
    "PAUSED S",
)


def usage_table(rows: Sequence[UsageRow]) -> str:
    """One row per job and hour, shares of shared iterations to one decimal."""
    return _aligned(
        [USAGE_COLUMNS]
        + [
            (
                u.hour.strftime("%Y-%m-%d %H:00"),
                f"{u.account_id}/{u.database}.{u.table}/{u.job_name}",
                str(u.iterations),
                f"{u.rows_read:.1f}",
                str(u.rows_written),
                f"{u.rows_cached:.1f}",
                f"{u.bytes_cached / 1e6:.2f}",
                f"{u.spark_jobs:.1f}",
                f"{u.task_seconds:.1f}",
                f"{u.wall_seconds:.1f}",
                f"{u.queued_seconds:.1f}",
                f"{u.paused_seconds:.1f}",
            )
            for u in rows
        ]
    )


ACCOUNT_COLUMNS = (
    "ACCOUNT",
    "QUEUED",
    "RUNNING",
    "ROWS IN FLIGHT",
    "MB IN FLIGHT",
    "WAITING",
    "PAUSED",
)


def accounts_table(rows: Sequence[AccountRow]) -> str:
    """One row per account: how long its oldest queued iteration has waited and
    how long backpressure has paused it, as of the rows' ``updated_at``."""

    def since(at: datetime | None, now: datetime) -> str:
        return "-" if at is None else f"{(now - at).total_seconds():.1f}s (since {at:%H:%M:%S})"

    return _aligned(
        [ACCOUNT_COLUMNS]
        + [
            (
                str(r.account_id),
                str(r.queued),
                str(r.running),
                str(r.rows_in_flight),
                f"{r.bytes_in_flight / 1e6:.2f}",
                since(r.waiting_since, r.updated_at),
                since(r.paused_since, r.updated_at),
            )
            for r in rows
        ]
    )


def watermark_cell(job: JobInfo) -> str:
    """The job's watermark, and for a job that reads tables beside its source (a join)
    the version of each that its target reflects: ``7 +shop.prices@3``."""
    marks = job.status.get("joined") if isinstance(job.status, dict) else None
    if not isinstance(marks, dict) or not marks:
        return _cell(job.watermark)
    joined = " ".join(
        f"+{name}@{mark.get('version', '?') if isinstance(mark, dict) else '?'}"
        for name, mark in sorted(marks.items())
    )
    return f"{_cell(job.watermark)} {joined}"


def job_table(jobs: Sequence[JobInfo], latest: Mapping[tuple[str, str], int | None]) -> str:
    """One row per job; ``latest`` maps (database, table) to the source's version. Jobs
    served by several instances (``cluster.enabled``) also show their owner."""
    owned = any(j.owner for j in jobs)
    rows = [(*COLUMNS, "OWNER") if owned else COLUMNS] + [
        (
            f"{j.key.account_id}/{j.key.database}.{j.key.table}/{j.key.job_name}",
            str(j.job_id),
            (j.state + (" (waiting)" if j.waiting else "")) if j.drop_at is None else "dropped",
            watermark_cell(j),
            _cell(lag(j, latest.get((j.key.database, j.key.table)))),
            last_error(j),
            *((_cell(j.owner),) if owned else ()),
        )
        for j in jobs
    ]
    return _aligned(rows)


MEMBER_COLUMNS = ("INSTANCE", "HOST", "SLOTS", "TABLES", "JOBS", "LAG", "LAST HEARTBEAT")


def members_table(members: Sequence[Member], now: float) -> str:
    """One row per instance in the membership group."""

    def slots(values: Sequence[int]) -> str:
        text = ",".join(map(str, values))
        return text if len(text) <= 30 else f"{len(values)} slots"

    return _aligned(
        [MEMBER_COLUMNS]
        + [
            (
                m.instance,
                m.host,
                slots(m.slots),
                str(len(m.tables)),
                _cell(m.status.get("jobs")),
                _cell(m.lag),
                "-" if m.heartbeat is None else f"{now - m.heartbeat:.1f}s ago",
            )
            for m in members
        ]
    )


BULK_COLUMNS = ("TASK", "JOB", "JOB ID", "STATE", "ATTEMPTS", "DETAIL")


def bulk_table(status: BulkStatus) -> str:
    """A bulk operation's summary line, then one row per task."""
    rows = [
        (
            str(t.task_no),
            str(t.key),
            str(t.job_id),
            t.state.value,
            str(t.attempts),
            t.detail if len(t.detail) <= ERROR_WIDTH else t.detail[: ERROR_WIDTH - 1] + "…",
        )
        for t in status.tasks
    ]
    return status.summary() + ("\n" + _aligned([BULK_COLUMNS, *rows]) if rows else "")
