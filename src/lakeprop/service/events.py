"""The event table's writer: what the runner did, as rows of :mod:`lakeprop.state.events`.

An observer of the runner (:class:`~lakeprop.service.observer.RunnerObserver`):
each finished iteration, job error, expectation count and verdict becomes an
:class:`~lakeprop.state.events.EventRecord` in memory, and the rows go to the
table in one append every ``flush_interval`` seconds and at a stop, so that a
busy service pays one small commit every few seconds, not one a micro-batch.
The append runs on a thread of its own (started by the first micro-batch after
the interval), so that a large one (a bulk of registrations makes one verdict
each) never holds a micro-batch up.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from lakeprop.engine.model import IterationResult
from lakeprop.engine.ownership import SlotChanges
from lakeprop.service.observer import BatchTimings, TickSummary
from lakeprop.state.events import (
    ERROR,
    EXPECTATION,
    INFO,
    ITERATION,
    JOB_ERROR,
    VERDICT,
    WARN,
    EventRecord,
    EventTable,
)
from lakeprop.state.outcomes import Outcome, Verdict

log = logging.getLogger(__name__)


class EventLog:
    """Buffers the runner's events and appends them to the event table."""

    def __init__(
        self,
        table: EventTable,
        flush_interval: float,
        instance: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.table = table
        self.flush_interval = flush_interval
        self.instance = instance
        self.clock = clock or time.time
        self._pending: list[EventRecord] = []
        self._lock = threading.Lock()
        self._flushed_at = self.clock()
        self._flushing: threading.Thread | None = None

    # -- the observer -------------------------------------------------------------------

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None:
        if self.clock() - self._flushed_at < self.flush_interval:
            return
        if self._flushing is not None and self._flushing.is_alive():
            return  # the last append still runs: the rows wait for the next one
        self._flushed_at = self.clock()
        self._flushing = threading.Thread(target=self.flush, name="lakeprop-events", daemon=True)
        self._flushing.start()

    def results(self, results: Sequence[IterationResult]) -> None:
        self._add([event for result in results for event in iteration_events(result)])

    def verdicts(self, verdicts: Sequence[Verdict]) -> None:
        self._add([verdict_event(v) for v in verdicts])

    def handover(self, handover: SlotChanges) -> None:
        pass

    # -- the table ----------------------------------------------------------------------

    def _add(self, events: list[EventRecord]) -> None:
        if self.instance is not None:
            events = [_owned(e, self.instance) for e in events]
        with self._lock:
            self._pending += events

    def close(self) -> int:
        """At a stop: wait for an append under way, then append the rest."""
        if self._flushing is not None:
            self._flushing.join()
        return self.flush()

    def flush(self) -> int:
        """Append what is pending; the rows appended. A failed append keeps them for
        the next flush (events are not worth stopping the service for)."""
        with self._lock:
            pending, self._pending = self._pending, []
        self._flushed_at = self.clock()
        if not pending:
            return 0
        try:
            self.table.append(pending)
        except Exception as exc:
            log.warning("event table append of %d row(s) failed: %s", len(pending), exc)
            with self._lock:
                self._pending = pending + self._pending
            return 0
        return len(pending)


def _owned(event: EventRecord, instance: str) -> EventRecord:
    return replace(event, instance=instance)


def iteration_events(result: IterationResult) -> list[EventRecord]:
    """An iteration's events: the iteration, each member's error, each rule's count."""
    plan = result.plan
    at = datetime.fromtimestamp(result.ended_at or result.started_at)
    table = plan.table
    seconds = max(0.0, result.ended_at - result.started_at)
    versions = (
        f"versions {plan.from_version + 1}..{plan.to_version}"
        if result.kind.value == "tail" and plan.from_version is not None
        else f"version {plan.to_version}"
    )
    written = sum(m.rows_written for m in result.members)
    level = INFO if result.outcome == "success" else (WARN if result.canceled else ERROR)
    base = EventRecord(
        at=at,
        kind=ITERATION,
        level=level,
        message="",
        account_id=table.account_id,
        database=table.database,
        table=table.table,
    )
    events = [
        replace(
            base,
            message=(
                f"{result.kind.value} of {table.database}.{table.table} {versions}: "
                f"{len(result.members)} job(s), {result.rows_read} row(s) read, {written} "
                f"written, {result.outcome} in {seconds:.2f} s ({result.path})"
            ),
            iteration_id=plan.iteration_id,
            details=json.dumps(
                {
                    "kind": result.kind.value,
                    "from_version": plan.from_version,
                    "to_version": plan.to_version,
                    "rows_read": result.rows_read,
                    "rows_written": written,
                    "outcome": result.outcome,
                    "seconds": round(seconds, 3),
                    "path": result.path,
                    "resync_reason": result.resync_reason or None,
                }
            ),
        )
    ]
    for member in result.members:
        job = replace(
            base,
            job_name=member.ref[0].job_name,
            job_id=member.job_id,
            iteration_id=plan.iteration_id,
        )
        if not member.ok:
            events.append(
                replace(
                    job,
                    kind=JOB_ERROR,
                    level=ERROR,
                    message=member.error_msg[:4000],
                    error_code=member.error_code,
                )
            )
        for rule in member.expectations:
            events.append(
                replace(
                    job,
                    kind=EXPECTATION,
                    level=WARN if rule.failed else INFO,
                    message=f"expectation {rule.name} ({rule.action}): {rule.failed} failed",
                    details=json.dumps(
                        {"expectation": rule.name, "action": rule.action, "failed": rule.failed}
                    ),
                )
            )
    return events


def verdict_event(verdict: Verdict) -> EventRecord:
    """A verdict on a change log message, as an event."""
    key = verdict.key
    rejected = verdict.outcome is Outcome.REJECTED
    return EventRecord(
        at=datetime.now(),
        kind=VERDICT,
        level=WARN if rejected else INFO,
        message=f"{verdict.op or 'message'} {verdict.outcome.value}"
        + (f": {verdict.detail}" if verdict.detail else ""),
        account_id=None if key is None else key.account_id,
        database=None if key is None else key.database,
        table=None if key is None else key.table,
        job_name=None if key is None else key.job_name,
        job_id=verdict.job_id,
        error_code=verdict.error_code or None,
        details=json.dumps(
            {"request_id": verdict.request_id, "coordinates": verdict.record.coordinates}
        ),
    )
