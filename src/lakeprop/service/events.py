"""The event table's writer: what the runner did, as rows of :mod:`lakeprop.state.events`.

An observer of the runner (:class:`~lakeprop.service.observer.RunnerObserver`):
each finished iteration, job error, expectation count and verdict becomes an
:class:`~lakeprop.state.events.EventRecord` in memory, and the rows go to the
table in one append every ``flush_interval`` seconds and at a stop, so that a
busy service pays one small commit every few seconds, not one a micro-batch.
The appends run on a thread of their own, on their own interval (an error
event reaches the table within it even when no micro-batch follows), so that
a large one (a bulk of registrations makes one verdict each) never holds a
micro-batch up.

Each event is written once. Every event has an id made of what it is about (a
log message's coordinates, an iteration and its job), never of when it was
made. Events that may be in the table already (the verdicts of a replayed
micro-batch or of a slot taken over, the rows of an append that failed) are
inserted only where their id is not; the rest, nearly all, are a blind append.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

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

SWEEP_INTERVAL = 3600.0
"""How often the events past ``events.retention`` are deleted."""


class EventLog:
    """Buffers the runner's events and appends them to the event table."""

    def __init__(
        self,
        table: EventTable,
        flush_interval: float,
        instance: str | None = None,
        clock: Callable[[], float] | None = None,
        retention: float | None = None,
        leads: Callable[[], bool] = lambda: True,
    ) -> None:
        self.table = table
        self.flush_interval = flush_interval
        self.retention = retention
        """Seconds events are kept (None: for ever)."""
        self.leads = leads
        """Whether this instance applies the retention (with several, the leader)."""
        self._swept_at: float | None = None
        self._created_at: float | None = None
        """When the table this process created was created (by :attr:`clock`)."""
        self.instance = instance
        self.clock = clock or time.time
        self._pending: list[EventRecord] = []
        """Events new to the table: a blind append."""
        self._uncertain: list[EventRecord] = []
        """Events the table may hold already: inserted where their id is not."""
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        """One append at a time: a flush before a slot goes waits for one under way."""
        self._stopping = threading.Event()
        self._flushing: threading.Thread | None = None

    def start(self) -> EventLog:
        """Start appending once an interval, on a thread of its own (once the table
        is ensured)."""
        if self.table.created and self._created_at is None:
            self._created_at = self.clock()
        if self._flushing is None:
            self._flushing = threading.Thread(
                target=self._every_interval, name="lakeprop-events", daemon=True
            )
            self._flushing.start()
        return self

    def _every_interval(self) -> None:
        while not self._stopping.wait(self.flush_interval):
            self.flush()
            if not self._stopping.is_set():
                self.sweep()

    def sweep(self) -> bool:
        """Delete the events past the retention, once an hour; whether it did."""
        now = self.clock()
        if (
            self.retention is None
            or (self._swept_at is not None and now - self._swept_at < SWEEP_INTERVAL)
            or not self.leads()
        ):
            return False
        self._swept_at = now
        created = self._created_at
        if created is not None and now - created < self.retention:
            return False  # a table this process created holds no event that old yet
        try:
            self.table.delete_before(datetime.fromtimestamp(now - self.retention))
        except Exception as exc:
            log.warning("event table retention: %s", exc)
        return True

    # -- the observer -------------------------------------------------------------------

    def batch(self, timings: BatchTimings, tick: TickSummary | None) -> None:
        pass

    def handing_over(self) -> None:
        self.flush()  # the next owner finds this instance's verdicts in the table

    def results(self, results: Sequence[IterationResult]) -> None:
        self._add([event for result in results for event in iteration_events(result)])

    def verdicts(self, verdicts: Sequence[Verdict], replayed: bool = False) -> None:
        self._add([verdict_event(v) for v in verdicts], uncertain=replayed)

    def handover(self, handover: SlotChanges) -> None:
        pass

    # -- the table ----------------------------------------------------------------------

    def _add(self, events: list[EventRecord], uncertain: bool = False) -> None:
        if self.instance is not None:
            events = [_owned(e, self.instance) for e in events]
        with self._lock:
            if uncertain:
                self._uncertain += events
            else:
                self._pending += events

    def close(self) -> int:
        """At a stop: end the interval's thread (an append under way finishes),
        then append the rest."""
        self._stopping.set()
        if self._flushing is not None:
            self._flushing.join()
        return self.flush()

    def flush(self) -> int:
        """Append what is pending; the rows written. A failed append keeps them for
        the next flush, as rows the table may hold already (the commit may have
        landed): events are not worth stopping the service for."""
        with self._writing:
            with self._lock:
                pending, self._pending = self._pending, []
                uncertain, self._uncertain = self._uncertain, []
            if not pending and not uncertain:
                return 0
            try:
                if uncertain:  # rare (a replay, a handover, a failed append): one MERGE
                    self.table.insert_new(uncertain + pending)
                else:
                    self.table.append(pending)
            except Exception as exc:
                log.warning(
                    "event table write of %d row(s) failed: %s", len(pending) + len(uncertain), exc
                )
                with self._lock:
                    self._uncertain = uncertain + pending + self._uncertain
                return 0
            return len(pending) + len(uncertain)


def _owned(event: EventRecord, instance: str) -> EventRecord:
    return replace(event, instance=instance)


def _joined(result: IterationResult) -> dict[str, Any]:
    """``joined``: for each member that reads tables beside its source (a join), by job
    id, the version of each its write reflects; nothing when no member does."""
    joined = {
        str(m.job_id): {name: mark.version for name, mark in sorted(m.joined.items())}
        for m in result.members
        if m.joined
    }
    return {"joined": joined} if joined else {}


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
        event_id=f"{ITERATION}/{plan.iteration_id}",
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
                    **_joined(result),
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
        of_job = f"{plan.iteration_id}/{member.job_id}"
        if not member.ok:
            events.append(
                replace(
                    job,
                    event_id=f"{JOB_ERROR}/{of_job}",
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
                    event_id=f"{EXPECTATION}/{of_job}/{rule.name}",
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
    topic, partition, offset = verdict.coordinates
    return EventRecord(
        at=datetime.now(),
        kind=VERDICT,
        event_id=f"{VERDICT}/{topic}/{partition}/{offset}/{verdict.request_id or ''}",
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
