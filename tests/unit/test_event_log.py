"""The event table's writer: rows held in memory, appended on a thread of their own at
most once per interval, and what is left at a stop (no Spark: a table that records)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from lakeprop.service.events import EventLog
from lakeprop.service.observer import BatchTimings
from lakeprop.state.events import EventRecord, EventTable


class Recording(EventTable):
    """An event table that keeps each append; the first one waits for ``go``."""

    def __init__(self) -> None:
        self.appends: list[list[EventRecord]] = []
        self.go = threading.Event()
        self.failures = 0

    def append(self, events: Sequence[EventRecord]) -> None:
        self.go.wait(30)
        if self.failures:
            self.failures -= 1
            raise OSError("storage unreachable")
        self.appends.append(list(events))


def event(n: int) -> EventRecord:
    return EventRecord(at=datetime(2026, 11, 29), kind="verdict", level="INFO", message=str(n))


def test_events_are_appended_once_an_interval_off_the_runner_thread_and_at_a_stop() -> None:
    now = [0.0]
    table = Recording()
    log = EventLog(table, flush_interval=10.0, instance="a", clock=lambda: now[0])
    log._add([event(1)])
    log.batch(BatchTimings(1), None)  # within the interval: nothing
    assert log._flushing is None

    now[0] = 10.0
    log.batch(BatchTimings(2), None)  # the append starts, and waits on the table
    running = log._flushing
    assert running is not None and running.is_alive()
    log._add([event(2)])
    now[0] = 25.0
    log.batch(BatchTimings(3), None)  # still appending: no second append beside it
    assert log._flushing is running

    table.go.set()
    assert log.close() == 1  # the first append ends, then the rest goes
    assert [[e.message for e in rows] for rows in table.appends] == [["1"], ["2"]]
    assert {e.instance for rows in table.appends for e in rows} == {"a"}


def test_a_failed_append_keeps_its_rows_for_the_next() -> None:
    table = Recording()
    table.go.set()
    table.failures = 1
    log = EventLog(table, flush_interval=10.0)
    log._add([event(1), event(2)])
    assert log.flush() == 0
    log._add([event(3)])
    assert log.flush() == 3
    assert [e.message for e in table.appends[0]] == ["1", "2", "3"]
