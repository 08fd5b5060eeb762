"""Usage accounting: what each account's jobs used, per hour (charging).

The Delta table ``usage`` holds one row per account, job and hour (of an
iteration's end): iterations, rows read, rows written, rows and bytes cached,
Spark jobs, Spark task time (executor run time of those jobs' tasks), wall
time, queue wait and the part of it spent paused by backpressure. It is
computed from the iteration history, never added to: refreshing an hour
recomputes its rows from the history rows of that hour and replaces them (a
MERGE on account, job and hour), every ``engine.usage_refresh_interval`` and
at shutdown. So a replay, a crash
between the history append and the refresh, or a refresh run twice count
nothing twice; at start, when the history has commits after the table's last
one, the service refreshes every hour from the newest one in ``usage`` on,
which catches up what a crash left behind.

With several instances the one holding slot 0 refreshes the table, and it does
not see the others record their iterations. So each of its refreshes also
recomputes every hour from :data:`LATE_RECORDS` before its previous refresh
(or before its start) on, when the history has had a commit since: an
iteration another instance recorded after the leader last refreshed its hour
is counted then, whichever instance leads by that time.

An iteration shared by several jobs (one change set fanned out) is split
between them: each gets ``1 / members`` of its rows read, rows and bytes
cached, Spark jobs and task time, wall time and queue wait (from planned to
started: the wait for a share of the workers), and its own rows written, so
an account's total is what the service really spent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakeprop.state import store as state
from lakeprop.state.schema import ADDED_LATER, row_tuple, spark_schema
from lakeprop.tables.probe import DeltaLogProbe

EPOCH = datetime(1970, 1, 1)


@dataclass
class UsageRow:
    """One account's job in one hour: a row of :data:`USAGE_SCHEMA`."""

    account_id: int
    database: str
    table: str
    job_name: str
    job_id: int
    hour: datetime
    iterations: int = 0
    rows_read: float = 0.0
    rows_written: int = 0
    rows_cached: float = 0.0
    spark_jobs: float = 0.0
    wall_seconds: float = 0.0
    queued_seconds: float = 0.0
    task_seconds: float = field(default=0.0, metadata=ADDED_LATER)
    bytes_cached: float = field(default=0.0, metadata=ADDED_LATER)
    paused_seconds: float = field(default=0.0, metadata=ADDED_LATER)

    def as_tuple(self) -> tuple[Any, ...]:
        return row_tuple(self)


USAGE_SCHEMA = spark_schema(UsageRow)

LATE_RECORDS = timedelta(minutes=10)
"""How long after its end an iteration may still be recorded in the history: at the
owner's next micro-batch, or never (an owner that loses its slots meanwhile is
fenced from the history, and the next owner runs the range again)."""


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    """Every hour from ``start``'s to ``end``'s, both included."""
    hour, last, out = hour_of(start), hour_of(end), []
    while hour <= last:
        out.append(hour)
        hour += timedelta(hours=1)
    return out


def _get(row: Any, name: str) -> Any:
    """A field that history rows of earlier releases lack."""
    try:
        return row[name]
    except (KeyError, ValueError):
        return None


def usage_of(iterations: Iterable[Any]) -> list[UsageRow]:
    """Usage rows of history rows (``iterations`` table rows, or records with the
    same fields): per account, job and hour of the iteration's end."""
    rows: dict[tuple[int, int, datetime], UsageRow] = {}
    for it in iterations:
        members = list(it["members"])
        if not members:
            continue
        share = 1.0 / len(members)
        hour = hour_of(it["ended_at"])
        wall = (it["ended_at"] - it["started_at"]).total_seconds()
        for m in members:
            key = (int(it["account_id"]), int(m["job_id"]), hour)
            row = rows.get(key)
            if row is None:
                row = rows[key] = UsageRow(
                    int(it["account_id"]),
                    it["database"],
                    it["table"],
                    m["job_name"],
                    int(m["job_id"]),
                    hour,
                )
            row.iterations += 1
            row.rows_read += it["rows_read"] * share
            row.rows_cached += it["rows_read"] * share
            row.rows_written += int(m["rows_written"] or 0)
            row.spark_jobs += (it["spark_jobs"] or 0) * share
            row.wall_seconds += wall * share
            row.queued_seconds += (_get(it, "queued_seconds") or 0.0) * share
            row.task_seconds += (_get(it, "task_seconds") or 0.0) * share
            row.bytes_cached += (_get(it, "bytes_cached") or 0) * share
            row.paused_seconds += (_get(it, "paused_seconds") or 0.0) * share
    return sorted(rows.values(), key=lambda r: (r.account_id, r.job_id, r.hour))


FIRST_APPEND = {"txnAppId": "lakeprop-usage-first", "txnVersion": "1"}
"""The transaction of the one append a usage table gets (its first refresh)."""


class UsageTable:
    """The ``usage`` Delta table, refreshed from the iteration history."""

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        history_path: str,
        shared: bool = False,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.spark = spark
        self.path = path
        self.history_path = history_path
        self.pending: set[datetime] = set()
        """Hours with history rows the table does not reflect yet."""
        self.shared = shared
        """Other instances record iterations too (see the module)."""
        self.clock = clock
        self._refreshed_at = clock()
        self._history_seen: int | None = None
        self._created = False
        """This process created the table (empty) and has not written it yet."""

    def ensure(self) -> None:
        self._created = state.ensure_table(self.spark, self.path, USAGE_SCHEMA)

    def recorded(self, ended: Iterable[datetime]) -> None:
        """History rows ending at these moments were appended: their hours are due."""
        self.pending.update(hour_of(e) for e in ended)

    def catch_up(self) -> int:
        """At start: every hour from the newest one in the table on is due again,
        unless the table was written after the history's last commit (read from the
        two Delta logs: no Spark job then)."""
        probe = DeltaLogProbe(self.spark)
        history_version = probe.latest_version(self.history_path)
        if history_version is None:
            return 0
        usage_version = probe.latest_version(self.path)
        if usage_version is not None:
            history_at = probe.commit_time(self.history_path, history_version)
            usage_at = probe.commit_time(self.path, usage_version)
            if history_at is not None and usage_at is not None and usage_at >= history_at:
                return 0
        newest = state.read_table(self.spark, self.path).agg(F.max("hour")).first()
        since = newest[0] if newest is not None and newest[0] is not None else EPOCH
        history = state.read_table(self.spark, self.history_path)
        hours = (
            history.where(F.col("ended_at") >= F.lit(since))
            .select(F.date_trunc("hour", "ended_at").alias("hour"))
            .distinct()
            .collect()
        )
        self.pending.update(r["hour"] for r in hours)
        return self.refresh()

    def refresh(self) -> int:
        """Recompute the due hours from the history and replace their rows; returns
        the rows written (0, and no commit, when nothing is due)."""
        began, seen = self.clock(), self._history_seen
        if self.shared:
            self._history_seen = DeltaLogProbe(self.spark).latest_version(self.history_path)
            if self._history_seen != seen:
                self.pending.update(hours_between(self._refreshed_at - LATE_RECORDS, began))
        if not self.pending:
            return 0
        hours = sorted(self.pending)
        history = state.read_table(self.spark, self.history_path).where(
            F.col("ended_at").between(hours[0], hours[-1] + timedelta(hours=1))
        )
        due = set(hours)
        rows = [r for r in usage_of(history.collect()) if r.hour in due]
        self._replace(rows)
        self.pending -= due
        self._refreshed_at = began
        return len(rows)

    def _replace(self, rows: Sequence[UsageRow]) -> None:
        """Replace the rows of their hours: a MERGE, or an append to the table this
        process created, while no one has written it (version 0: empty) and no other
        instance writes it (the rows are unique by account, job and hour). The append
        carries a transaction id: a commit retried after it landed unseen (object
        storage) is refused or skipped, never appended twice."""
        fresh = self._created and not self.shared and state.untouched(self.spark, self.path)
        self._created = False  # whatever comes of the append, later writes MERGE
        if fresh:
            tuples = [r.as_tuple() for r in rows]
            state.append(self.spark, self.path, USAGE_SCHEMA, tuples, FIRST_APPEND)
            return
        state.upsert(
            self.spark,
            self.path,
            USAGE_SCHEMA,
            [r.as_tuple() for r in rows],
            ("account_id", "job_id", "hour"),
        )
