"""The event table's writer: rows held in memory, appended on a thread of their own
once an interval and what is left at a stop; events that may be in the table already
inserted where their id is not (no Spark: a table that records)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

from devkit.waiting import assert_eventually
from lakeprop.service.events import SWEEP_INTERVAL, EventLog
from lakeprop.service.observer import BatchTimings
from lakeprop.state.events import EventRecord, EventTable


class Recording(EventTable):
    """An event table that keeps each write; each waits for ``go``."""

    def __init__(self) -> None:
        self.appends: list[list[EventRecord]] = []
        self.inserts: list[list[EventRecord]] = []
        self.deletes: list[datetime] = []
        self.go = threading.Event()
        self.failures = 0

    def append(self, events: Sequence[EventRecord]) -> None:
        self.go.wait(30)
        if self.failures:
            self.failures -= 1
            raise OSError("storage unreachable")
        self.appends.append(list(events))

    def insert_new(self, events: Sequence[EventRecord]) -> None:
        self.go.wait(30)
        self.inserts.append(list(events))

    def delete_before(self, cutoff: datetime) -> None:
        self.deletes.append(cutoff)


def event(n: int) -> EventRecord:
    return EventRecord(
        at=datetime(2026, 11, 29), kind="verdict", level="INFO", message=str(n), event_id=str(n)
    )


def messages(writes: list[list[EventRecord]]) -> list[list[str]]:
    return [[e.message for e in rows] for rows in writes]


def test_events_are_appended_once_an_interval_on_a_thread_of_their_own_and_at_a_stop() -> None:
    table = Recording()
    log = EventLog(table, flush_interval=0.01, instance="a").start()
    log._add([event(1)])
    log.batch(BatchTimings(1), None)  # a micro-batch's end appends nothing itself
    table.go.set()  # no micro-batch follows: the interval's thread appends

    def appended() -> None:
        assert messages(table.appends) == [["1"]]

    assert_eventually(appended, timeout=10)
    log._add([event(2)])
    log.close()  # the thread ends; what is left goes
    assert messages(table.appends)[-1] == ["2"] and table.inserts == []
    assert {e.instance for rows in table.appends for e in rows} == {"a"}


def test_a_failed_append_is_retried_as_rows_the_table_may_hold() -> None:
    table = Recording()
    table.go.set()
    table.failures = 1
    log = EventLog(table, flush_interval=10.0)
    log._add([event(1), event(2)])
    assert log.flush() == 0  # the commit may have landed all the same
    log._add([event(3)])
    assert log.flush() == 3
    assert table.appends == [] and messages(table.inserts) == [["1", "2", "3"]]


def test_replayed_verdicts_are_inserted_where_their_id_is_not() -> None:
    table = Recording()
    table.go.set()
    log = EventLog(table, flush_interval=10.0)
    log._add([event(1)])
    assert log.flush() == 1
    log._add([event(1)], uncertain=True)  # a replay of the same message
    log._add([event(2)])
    assert log.flush() == 2
    assert messages(table.appends) == [["1"]] and messages(table.inserts) == [["1", "2"]]


def test_events_past_the_retention_are_deleted_once_an_hour() -> None:
    now = [1_000_000.0]
    table = Recording()
    log = EventLog(table, flush_interval=10.0, clock=lambda: now[0], retention=86400.0)
    assert log.sweep()
    now[0] += SWEEP_INTERVAL / 2
    assert not log.sweep()
    now[0] += SWEEP_INTERVAL
    assert log.sweep()
    assert table.deletes == [
        datetime.fromtimestamp(1_000_000.0 - 86400.0),
        datetime.fromtimestamp(now[0] - 86400.0),
    ]
    assert not EventLog(table, flush_interval=10.0).sweep()  # no retention: kept for ever
    follower = EventLog(table, flush_interval=10.0, retention=86400.0, leads=lambda: False)
    assert not follower.sweep()  # with several instances, the leader sweeps


def test_a_table_this_process_created_is_swept_once_the_retention_has_passed_since() -> None:
    now = [1_000_000.0]
    table = Recording()
    table.created = True  # by ensure(), before the log starts
    log = EventLog(table, flush_interval=3600.0, clock=lambda: now[0], retention=2 * SWEEP_INTERVAL)
    log.start()
    assert not log.sweep()  # nothing in it can be past the retention: no delete run
    now[0] += SWEEP_INTERVAL
    assert not log.sweep()
    now[0] += SWEEP_INTERVAL
    assert log.sweep()
    assert table.deletes == [datetime.fromtimestamp(now[0] - 2 * SWEEP_INTERVAL)]
    assert log.close() == 0 and table.appends == []


def test_a_flush_before_a_slot_goes_waits_for_an_append_under_way() -> None:
    table = Recording()
    log = EventLog(table, flush_interval=10.0)
    log._add([event(1)])
    first = threading.Thread(target=log.flush)
    first.start()  # the interval's append, waiting on the table

    def appending() -> None:
        assert log._writing.locked()

    assert_eventually(appending, timeout=10)
    log._add([event(2)])
    handing = threading.Thread(target=log.handing_over)
    handing.start()
    table.go.set()
    first.join(10)
    handing.join(10)
    assert messages(table.appends) == [["1"], ["2"]]  # both in the table before the slot goes
