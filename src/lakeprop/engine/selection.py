"""Trigger selection against the tables: which iterations are due this tick.

For every source table with an eligible job, one cheap probe of its Delta log
(no Spark job): an unchanged table only marks its jobs fresh; a changed one
gets the iterations its jobs' trigger kinds plan (:mod:`lakeprop.engine.triggers`).
With commit notifications on, only the tables :class:`~lakeprop.engine.dirty.DirtyTables`
names are probed: announced ones, and each table once per sweep interval.
A table whose identity changed under its jobs (dropped, or replaced by a new
table) fails those jobs with a permanent error: their watermarks count
versions of a table that is gone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lakeprop.engine.dirty import DirtyTables
from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    Member,
    Retry,
    TableRef,
    source_gone,
)
from lakeprop.engine.triggers import (
    JobView,
    JoinedWatch,
    eligible_at,
    is_eligible,
    plan_table,
    probe_from,
)
from lakeprop.errors import ErrorCode, SourceTableError
from lakeprop.registry import get_consumer_type
from lakeprop.spec import JobRef, JobSpec
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.status import JobState, JobStatus, joined_marks
from lakeprop.tables.resolve import Tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


@dataclass
class Selected:
    """What one round of trigger selection decided."""

    plans: list[IterationPlan] = field(default_factory=list)
    fresh: list[JobRef] = field(default_factory=list)
    """Jobs found in step with their table's latest version."""
    failed: dict[JobRef, CatalogRow] = field(default_factory=dict)
    """Jobs put in ``error`` because their source went away (durable)."""
    probed: int = 0
    changed_tables: int = 0
    every_tick: bool = False
    """A table is to be probed again on the next tick whatever happens: commit
    notifications are off, or it has a new job without an iteration."""
    due_at: float = math.inf
    """The earliest time a job not planned now turns due with nothing announced: a
    retry, a periodic interval, a table's sweep. Finished iterations, notices and
    the change log are events, not times."""


class TriggerSelection:
    """Probes tables and plans iterations; keeps the specs and locations it parsed."""

    def __init__(
        self,
        tables: Tables,
        max_versions: int | None = None,
        dirty: DirtyTables | None = None,
        max_rows: Callable[[int], int] = lambda _account: 0,
        identity_interval: float = 60.0,
    ) -> None:
        self.tables = tables
        self.probe = tables.probe
        self.max_versions = max_versions
        self.max_rows = max_rows
        """Change rows one tail iteration of an account may read (0: no bound)."""
        self._change_rows: dict[tuple[str, int], int | None] = {}
        """Change rows per (location, version): commits never change, so read once."""
        self.dirty = dirty
        """Commit notifications: probe only what they name (None: probe every table)."""
        self._specs: dict[JobRef, tuple[str, JobSpec]] = {}
        self._views_of: dict[JobRef, tuple[CatalogRow, Retry | None, bool, TableRef, JobView]] = {}
        """Each live job's view as of the last tick, with the row, retry and flight it
        was made of: a tick builds views only for the jobs where one of them changed
        (rows are immutable, so a changed job is a new row object)."""
        self._locations: dict[TableRef, str] = {}
        self.latest: dict[TableRef, int] = {}
        """Each table's latest version as its last probe found it (job lag, metrics)."""
        self._commit_times: dict[tuple[TableRef, int], float | None] = {}
        self.identity_interval = identity_interval
        """How often an unchanged table's identity is read again: a table dropped and
        re-created at its jobs' watermark version looks unchanged to the probe."""
        self._identity_checked: dict[TableRef, float] = {}
        self.watched: frozenset[tuple[str, str]] = frozenset()
        """(database, table) of every table with a live job, as of the last round: a
        commit notice for one of them wakes the service."""

    def spec(self, row: CatalogRow) -> JobSpec:
        """The job's parsed spec (parsed again only when it changed)."""
        cached = self._specs.get(row.row_id)
        if cached is None or cached[0] != row.job_spec:
            cached = (row.job_spec, row.spec())
            self._specs[row.row_id] = cached
        return cached[1]

    def forget(self, ref: JobRef) -> None:
        self._specs.pop(ref, None)

    def select(
        self,
        rows: Mapping[JobRef, CatalogRow],
        in_flight: set[JobRef],
        retries: Mapping[JobRef, Retry],
        now: float,
    ) -> Selected:
        selected = Selected()
        due: list[tuple[TableRef, list[JobView], int | None]] = []
        by_table = self._views(rows, in_flight, retries)
        joined = {w.name for views in by_table.values() for v in views for w in v.joined}
        self.watched = frozenset((t.database, t.table) for t in by_table) | frozenset(
            (database, table) for database, _, table in (n.partition(".") for n in joined)
        )
        for table, views in by_table.items():
            should, since = probe_from(views, now)
            name = (table.database, table.table)
            if should and (self.dirty is None or self.dirty.due(name, since, now)):
                due.append((table, views, since))
            else:
                self._wants(table, views, set(), now, selected)
        # one round of probes for every due table with a watermark (concurrent off-host)
        asked = [(self._location(t), since) for t, _, since in due if since is not None]
        answers = iter(self.probe.changed_since_all(asked))
        for table, views, since in due:
            changed = True if since is None else next(answers)
            planned = len(selected.plans)
            self._select_table(table, views, since, changed, rows, now, selected)
            members = {m.ref for p in selected.plans[planned:] for m in p.members}
            self._wants(table, views, members | set(selected.failed), now, selected)
        self._joined_tails(by_table, now, selected)
        return selected

    def _joined_tails(
        self, by_table: Mapping[TableRef, list[JobView]], now: float, selected: Selected
    ) -> None:
        """An empty tail (its watermark to itself) for every eligible job not planned
        this round whose joined tables moved past the versions its target reflects:
        its iteration reads their changes (:meth:`Consumer.joined_sources`). Only for
        a job in step with its own table: one behind it gets a tail of its own table
        in its turn (a default job's catch-up), which reads them too, and an empty
        tail in flight would hold that turn up."""
        planned = {m.ref for p in selected.plans for m in p.members} | set(selected.failed)
        for table, views in by_table.items():
            for view in views:
                if (
                    not view.joined
                    or view.watermark is None
                    or view.watermark != self.latest.get(table)
                    or view.ref in planned
                    or not is_eligible(view, now)
                    or not self._joined_moved(view, now)
                ):
                    continue
                selected.plans.append(
                    IterationPlan(
                        table=table,
                        kind=IterationKind.TAIL,
                        to_version=view.watermark,
                        members=(Member(view.ref, view.job_id, view.watermark),),
                        priority=view.priority,
                        planned_at=now,
                    )
                )
                if view.ref in selected.fresh:
                    selected.fresh.remove(view.ref)

    def _joined_moved(self, view: JobView, now: float) -> bool:
        """Whether a joined table of the job has a version its target does not reflect,
        or is another table than the one it reflects (re-created: read again once per
        ``identity_interval``), or cannot be found (its iteration then says so)."""
        for watch in view.joined:
            if watch.location is None or watch.version is None:
                return True
            changed = self.probe.changed_since(watch.location, watch.version)
            if changed is None:  # gone from there: look it up again next time
                self._locations = {t: p for t, p in self._locations.items() if p != watch.location}
                return True
            if changed:
                return True
            database, _, table = watch.name.partition(".")
            checked = TableRef(-1, database, table)  # its identity, whoever reads it
            if watch.table_id is not None and self._identity_due(checked, now):
                current = self.probe.table_id(watch.location)
                if current is not None and current != watch.table_id:
                    return True
        return False

    def _joined_of(self, row: CatalogRow, spec: JobSpec) -> tuple[JoinedWatch, ...]:
        """The tables the job reads beside its source, where they are, and the version
        of each its status says its target reflects (:attr:`JobView.joined`)."""
        consumer = spec.iteration.consumer
        try:
            sources = get_consumer_type(consumer.type).joined_sources(consumer.options)
        except Exception as exc:
            log.debug("no joined tables of job %s: %s", row.key, exc)
            return ()
        if not sources:
            return ()
        marks = joined_marks(row.job_status)
        found: list[JoinedWatch] = []
        for source in sources:
            ref = TableRef(row.account_id, source.database, source.table)
            try:
                location: str | None = self._location(ref)
            except Exception as exc:
                log.debug("joined table %s of job %s not found: %s", source.name, row.key, exc)
                location = None
            mark = marks.get(source.name)
            found.append(
                JoinedWatch(
                    source.name,
                    location,
                    None if mark is None else mark.version,
                    None if mark is None else mark.table_id,
                )
            )
        return tuple(found)

    def _wants(
        self,
        table: TableRef,
        views: Sequence[JobView],
        planned: set[JobRef],
        now: float,
        selected: Selected,
    ) -> None:
        """When the table's jobs not planned this round want the next round (see
        :attr:`Selected.every_tick` and :attr:`Selected.due_at`); a planned job's
        finished iteration wakes the service itself."""
        eligible = False
        for view in views:
            if view.ref in planned:
                continue
            if is_eligible(view, now):
                if view.watermark is None or self.dirty is None:
                    selected.every_tick = True
                    return
                eligible = True
            else:
                at = eligible_at(view)
                if at is not None and at < selected.due_at:
                    selected.due_at = at
        if eligible and self.dirty is not None:
            sweep = self.dirty.next_sweep((table.database, table.table))
            selected.due_at = min(selected.due_at, sweep)

    def _views(
        self,
        rows: Mapping[JobRef, CatalogRow],
        in_flight: set[JobRef],
        retries: Mapping[JobRef, Retry],
    ) -> dict[TableRef, list[JobView]]:
        by_table: dict[TableRef, list[JobView]] = {}
        cache, self._views_of = self._views_of, {}
        for ref, row in rows.items():
            if not row.is_live or row.job_state == JobState.PAUSED:
                continue
            retry = retries.get(ref)
            busy = ref in in_flight
            held = cache.get(ref)
            if held is not None and held[0] is row and held[1] is retry and held[2] == busy:
                self._views_of[ref] = held  # the row, its retry and its flight as last tick
                by_table.setdefault(held[3], []).append(held[4])
                continue
            spec = self.spec(row)
            view = JobView(
                ref=row.row_id,
                job_id=row.job_id,
                kind=spec.trigger.kind,
                priority=spec.iteration.priority,
                interval_s=spec.trigger.interval_s,
                share=spec.trigger.share,
                watermark=row.watermark,
                watermark_ts=None if row.watermark_ts is None else row.watermark_ts.timestamp(),
                in_flight=busy,
                blocked_until=None if retry is None else retry.not_before,
                failed=row.job_state == JobState.ERROR,
                joined=self._joined_of(row, spec),
            )
            table = TableRef(row.account_id, row.database, row.table)
            self._views_of[ref] = (row, retry, busy, table, view)
            by_table.setdefault(table, []).append(view)
        return by_table

    def _select_table(
        self,
        table: TableRef,
        views: list[JobView],
        since: int | None,
        changed: bool | None,
        rows: Mapping[JobRef, CatalogRow],
        now: float,
        selected: Selected,
    ) -> None:
        """Plan one probed table: ``changed`` says whether it has a version after
        ``since`` (None: it no longer holds ``since``)."""
        selected.probed += 1
        name = (table.database, table.table)
        location = self._location(table)
        if changed is False and self._identity_due(table, now):
            # read from the first commit only: where log clean-up removed it, skip
            current = self.probe.table_id(location)
            if current is not None and any(rows[v.ref].table_id != current for v in views):
                views = self._same_source(table, views, rows, selected)
        if not changed:
            found: int | None = since
            if changed is None:
                # the version the jobs stand on is gone: dropped or replaced
                self._locations.pop(table, None)
                views = self._same_source(table, views, rows, selected)
                found = None
                self.latest.pop(table, None)
            elif since is not None:
                self.latest[table] = since
            if self.dirty is not None:
                self.dirty.probed(name, found, now)
            selected.fresh += [v.ref for v in views if is_eligible(v, now)]
            return
        latest = self.probe.latest_version(location)
        if latest is None:
            self.latest.pop(table, None)
        else:
            self.latest[table] = latest
        if self.dirty is not None:
            self.dirty.probed(name, latest, now)
        views = self._same_source(table, views, rows, selected, latest)
        if latest is None or not views:
            return
        selected.changed_tables += 1
        table_plan = plan_table(
            table,
            views,
            latest,
            now,
            max_versions=self.max_versions,
            max_rows=self.max_rows(table.account_id),
            change_rows=lambda version: self._rows_of(location, version),
        )
        selected.plans += table_plan.iterations
        selected.fresh += table_plan.fresh

    def _identity_due(self, table: TableRef, now: float) -> bool:
        """Whether to read an unchanged table's identity now (at its first probe after
        a start, then once per ``identity_interval``)."""
        if now - self._identity_checked.get(table, float("-inf")) < self.identity_interval:
            return False
        self._identity_checked[table] = now
        return True

    def _rows_of(self, location: str, version: int) -> int | None:
        """A version's change rows, from its commit file (read once per version)."""
        key = (location, version)
        if key not in self._change_rows:
            if len(self._change_rows) >= 100_000:
                self._change_rows.clear()
            self._change_rows[key] = self.probe.change_rows(location, version)
        return self._change_rows[key]

    def commit_time(self, table: TableRef, version: int) -> float | None:
        """When ``version`` of the table was committed (read once per version)."""
        key = (table, version)
        if key not in self._commit_times:
            if len(self._commit_times) >= 100_000:
                self._commit_times.clear()
            self._commit_times[key] = self.probe.commit_time(self._location(table), version)
        return self._commit_times[key]

    def _location(self, table: TableRef) -> str:
        if table not in self._locations:
            self._locations[table] = self.tables.location(table.database, table.table)
        return self._locations[table]

    def _same_source(
        self,
        table: TableRef,
        views: Sequence[JobView],
        rows: Mapping[JobRef, CatalogRow],
        selected: Selected,
        latest: int | None = 0,
    ) -> list[JobView]:
        """The views whose jobs still follow the table they were registered on.

        The others go to ``error`` (permanent) with a message saying to
        re-register: their source was dropped, or replaced by a table with a new
        identity (a TRUNCATE-like re-create), whose versions do not continue the
        ones their watermarks count.
        """
        current = None if latest is None else self._table_id(table)
        if current is None:
            self._fail(views, rows, selected, ErrorCode.SOURCE_NOT_DELTA, source_gone(table))
            return []
        keep = [v for v in views if rows[v.ref].table_id == current]
        for view in views:
            if view not in keep:
                message = (
                    f"source {table} was replaced by a new table (id {current}; the job was "
                    f"registered on id {rows[view.ref].table_id}), so its changes cannot follow "
                    "the job's watermark; resync the job (or re-register it) to sync from the "
                    "new table"
                )
                self._fail([view], rows, selected, ErrorCode.SOURCE_REPLACED, message)
        return keep

    def _table_id(self, table: TableRef) -> str | None:
        """The source's current identity; None when it does not exist."""
        table_id = self.probe.table_id(self._location(table))
        if table_id is not None:
            return table_id
        self.tables.forget()
        try:  # the first commit file was cleaned up: ask Delta
            return self.tables.describe(table.database, table.table).table_id
        except SourceTableError:
            return None

    @staticmethod
    def _fail(
        views: Sequence[JobView],
        rows: Mapping[JobRef, CatalogRow],
        selected: Selected,
        code: ErrorCode,
        message: str,
    ) -> None:
        status = JobStatus.failure(int(code), message).to_json()
        failed = [v for v in views if not v.in_flight and not v.failed]
        for view in failed:
            selected.failed[view.ref] = replace(
                rows[view.ref], job_state=JobState.ERROR, job_status=status
            )
        if failed:
            log.error("job(s) %s: %s", [rows[v.ref].job_id for v in failed], message)


SELECTION_JOB_GROUP = "lakeprop-trigger-selection"
"""Job group of the selection phase: it must never launch a Spark job."""


@contextmanager
def selection_job_group(spark: SparkSession) -> Iterator[None]:
    """Run selection in its own job group: it must never launch a Spark job."""
    context = spark.sparkContext
    context.setJobGroup(SELECTION_JOB_GROUP, "lakeprop trigger selection")
    try:
        yield
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        context.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
