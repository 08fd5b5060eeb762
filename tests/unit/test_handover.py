"""The cluster hand-over without Spark: which slots are drained, forgotten and taken
over, what a take-over writes, and what an instance records while it shares."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pytest

from devkit.specs import job_row
from lakeprop.changelog import LogRecord
from lakeprop.engine.ownership import Signature, SlotChanges, SoleOwner
from lakeprop.membership.topics import Claim
from lakeprop.service.handover import Handover, HandoverParts
from lakeprop.spec import JobKey, JobRef
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome, Verdict
from lakeprop.state.shared import Signed

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 1)


def row(table: str, job_id: int, *, watermark: int | None = 3, offset: int = 1) -> CatalogRow:
    key = JobKey(0, "db", table, f"job{job_id}")
    return job_row(key, job_id, watermark=watermark, at=T0, log_offset=offset)


class Owner(SoleOwner):
    """An instance of a cluster whose slot of a table is its name's last digit."""

    clustered = True
    instance = "me"
    slots = 10

    def __init__(self, served: set[int]) -> None:
        self.served_slots = set(served)
        self.changes = SlotChanges()
        self.adopted: list[set[int]] = []
        self.released: list[set[int]] = []
        self.clean: list[bool] = []

    def slot(self, database: str, table: str) -> int:
        return int(table[-1])

    def serves(self, database: str, table: str) -> bool:
        return self.slot(database, table) in self.served_slots

    def may_write(self, database: str, table: str) -> bool:
        return self.serves(database, table)

    def writes_slot(self, slot: int) -> bool:
        return slot in self.served_slots

    def sign(self, database: str | None = None, table: str | None = None) -> Signature:
        return Signature("writer-me", 7, "me@3")

    def pending(self) -> SlotChanges:
        changes, self.changes = self.changes, SlotChanges()
        return changes

    def fenced(self, claims: Iterable[Claim]) -> list[Signature]:
        return [Signature(f"writer-before-{c.slot}", 2**62, "") for c in claims]

    def serve(self, slots: Iterable[int]) -> None:
        self.served_slots |= set(slots)

    def adopt(self, slots: Iterable[int]) -> None:
        self.adopted.append(set(slots))
        self.served_slots |= set(slots)

    def drained(self, slots: Iterable[int], clean: bool = True) -> None:
        self.released.append(set(slots))
        self.clean.append(clean)
        self.served_slots -= set(slots)


@dataclass
class Catalog:
    """The catalog as memory holds it, and as its table holds it."""

    memory: dict[JobRef, CatalogRow]
    table: list[CatalogRow]
    path: str = "/state/catalog"
    adopted: list[tuple[list[CatalogRow], list[CatalogRow], list[JobRef]]] = field(
        default_factory=list
    )
    staged: dict[JobRef, CatalogRow] = field(default_factory=dict)
    flushes: int = 0

    def by_id(self) -> Mapping[JobRef, CatalogRow]:
        return self.memory

    def rows(self) -> list[CatalogRow]:
        return list(self.memory.values())

    def durable_rows(self, wanted: Callable[[CatalogRow], bool]) -> list[CatalogRow]:
        return [r for r in self.table if wanted(r)]

    def adopt(self, durable: list[CatalogRow], ahead: list[CatalogRow], gone: list[JobRef]) -> None:
        self.adopted.append((durable, ahead, gone))

    def stage(self, rows: Mapping[JobRef, CatalogRow]) -> None:
        self.staged.update(rows)

    def flush(self) -> int:
        self.flushes += 1
        return 0


@dataclass
class History:
    reached: dict[tuple[int, str | None], tuple[int, datetime]]
    path: str = "/state/history"

    def latest_success(self) -> dict[tuple[int, str | None], tuple[int, datetime]]:
        return self.reached


@dataclass
class Scheduler:
    ends: bool = True
    cancelled: list[tuple[set[JobRef], str]] = field(default_factory=list)

    def cancel(self, refs: set[JobRef], reason: str) -> None:
        self.cancelled.append((set(refs), reason))

    def wait_ended(self, refs: set[JobRef], timeout: float) -> bool:
        return self.ends


@dataclass
class Outcomes:
    recorded: list[Verdict] = field(default_factory=list)

    def record(self, verdicts: list[Verdict], batch_id: int) -> None:
        self.recorded += verdicts


@dataclass
class Setup:
    owner: Owner
    catalog: Catalog
    history: History
    scheduler: Scheduler
    outcomes: Outcomes
    handover: Handover
    events: list[Any]


def setup(served: set[int], memory: list[CatalogRow], table: list[CatalogRow]) -> Setup:
    events: list[Any] = []
    owner = Owner(served)
    catalog = Catalog({r.row_id: r for r in memory}, table)
    history = History({})
    scheduler = Scheduler()
    outcomes = Outcomes()
    parts = HandoverParts(
        catalog,  # type: ignore[arg-type]
        history,  # type: ignore[arg-type]
        outcomes,  # type: ignore[arg-type]
        scheduler,  # type: ignore[arg-type]
        record_results=lambda: events.append("recorded") or 0,
        forget=lambda refs: events.append(("forget", sorted(refs))),
        fence=lambda path, fenced: events.append(("fence", path, fenced)),
    )
    return Setup(owner, catalog, history, scheduler, outcomes, Handover(owner, parts), events)


def verdict(table: str, offset: int) -> Verdict:
    record = LogRecord("log", 0, offset, T0, None, None)
    return Verdict(record, Outcome.APPLIED, key=JobKey(0, "db", table, "j"))


def test_one_instance_has_nothing_to_hand_over_and_keeps_everything() -> None:
    handover = setup({0}, [row("t1", 1)], []).handover
    handover.ownership = SoleOwner()
    assert handover.run() is None
    rows = {r.row_id: r for r in [row("t1", 1), row("t2", 2)]}
    assert handover.served(rows) == rows
    verdicts = [verdict("t1", 1), verdict("t2", 2)]
    assert handover.ours(verdicts) == verdicts
    assert handover.signed() is None


def test_a_revoked_slot_is_drained_recorded_flushed_and_released() -> None:
    s = setup({1, 2}, [row("t1", 1), row("t2", 2)], [])
    s.owner.changes = SlotChanges(revoking=frozenset({1}))
    assert s.handover.run() == SlotChanges(revoking=frozenset({1}))
    (cancelled, reason), *_ = s.scheduler.cancelled
    assert cancelled == {row("t1", 1).row_id} and "moves to another instance" in reason
    assert s.events == ["recorded"]
    assert s.catalog.flushes == 1
    assert s.owner.released == [{1}] and s.owner.clean == [True]


def test_a_drain_whose_iterations_did_not_end_is_handed_over_as_unclean() -> None:
    s = setup({1, 2}, [row("t1", 1)], [])
    s.scheduler.ends = False
    s.owner.changes = SlotChanges(revoking=frozenset({1}))
    s.handover.run()
    assert s.owner.released == [{1}] and s.owner.clean == [False]


def test_a_lost_slot_has_its_iterations_cancelled_and_nothing_recorded() -> None:
    s = setup({1, 2}, [row("t1", 1), row("t2", 2)], [])
    s.owner.changes = SlotChanges(lost=frozenset({2}))
    s.handover.run()
    assert s.scheduler.cancelled == [({row("t2", 2).row_id}, "its table moved to another instance")]
    assert s.events == [] and s.catalog.flushes == 0


def test_a_gained_slot_is_served_at_once_and_its_writers_are_fenced_by_the_seal() -> None:
    durable = row("t3", 3, watermark=5)
    behind = row("t3", 4, watermark=1)  # the history shows its job reached 8
    ahead_in_memory = replace(row("t3", 5), log_offset=9)  # a message the table lacks
    s = setup({1}, [row("t3", 3), behind, ahead_in_memory], [durable, behind, row("t3", 5)])
    s.history.reached = {(4, None): (8, T0)}
    s.owner.changes = SlotChanges(gained={3: Claim(3, 42)})
    kept = verdict("t3", 7)
    assert s.handover.ours([kept]) == []  # slot 3 is not ours yet: held back
    s.handover.run()

    # the rows as the tables hold them, rolled forward, and the tables served: this
    # micro-batch's selection plans their iterations
    ((durable_rows, ahead, gone),) = s.catalog.adopted
    assert durable_rows == [durable, replace(behind, watermark=8, watermark_ts=T0)]
    assert ahead == [ahead_in_memory]
    assert gone == []
    assert s.catalog.staged == {r.row_id: r for r in durable_rows}
    assert s.events == [("forget", sorted(r.row_id for r in (*durable_rows, *ahead)))]
    assert s.owner.serves("db", "t3")
    # nothing is fenced, recorded or vouched for before the seal
    assert s.outcomes.recorded == [] and s.owner.adopted == []

    s.handover.seal()
    fenced = [Signed("writer-before-3", 2**62)]
    assert sorted(s.events[1:]) == [
        ("fence", "/state/catalog", fenced),
        ("fence", "/state/history", fenced),
    ]
    assert s.outcomes.recorded == [kept]  # the verdict held back is recorded now
    assert s.owner.adopted == [{3}]
    s.handover.seal()  # sealed once
    assert len(s.events) == 3


def test_a_take_over_whose_micro_batch_failed_before_its_seal_is_sealed_first_thing() -> None:
    s = setup({1}, [row("t3", 3)], [row("t3", 3)])
    s.owner.changes = SlotChanges(gained={3: Claim(3, 42)})
    s.handover.run()  # ... and the micro-batch fails before the seal
    s.owner.changes = SlotChanges(revoking=frozenset({1}))
    s.handover.run()
    fences = [e for e in s.events if e[0] == "fence"]
    assert len(fences) == 2 and s.events.index(fences[0]) < s.events.index("recorded")
    assert s.owner.adopted == [{3}]


def test_a_clustered_instance_sees_records_and_signs_only_for_its_slots() -> None:
    s = setup({1}, [], [])
    rows = {r.row_id: r for r in [row("t1", 1), row("t2", 2)]}
    assert list(s.handover.served(rows).values()) == [row("t1", 1)]
    assert s.handover.ours([verdict("t1", 1), verdict("t2", 2)]) == [verdict("t1", 1)]
    assert {k: list(v) for k, v in s.handover.unrecorded.items()} == {2: [verdict("t2", 2)]}
    assert s.handover.signed() == Signed("writer-me", 7, "me@3")
