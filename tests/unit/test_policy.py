"""The scheduler's policy: which queued iteration runs next (pure, no threads, no Spark)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lakeprop.engine.model import IterationKind, IterationPlan, Member, TableRef
from lakeprop.engine.policy import Load, Q, priority_first, runnable
from lakeprop.spec import JobKey


@dataclass(frozen=True)
class Task:
    plan: IterationPlan
    seq: int


def task(seq: int, table: str, priority: int = 0, kind: IterationKind = IterationKind.TAIL) -> Task:
    ref = (JobKey(1, "db", table, f"j{seq}"), seq)
    plan = IterationPlan(
        TableRef(1, "db", table), kind, 5, (Member(ref, seq, 0),), priority, 0.0, f"it{seq}"
    )
    return Task(plan, seq)


def test_higher_priority_first_then_first_come() -> None:
    queue = [task(0, "a", 1), task(1, "b", 5), task(2, "c", 5)]
    assert priority_first(queue, Load()) == queue[1]


def test_a_tables_tails_wait_for_its_running_tail_but_snapshots_do_not() -> None:
    busy = {TableRef(1, "db", "a")}
    tail, snapshot, other = (
        task(0, "a", 9),
        task(1, "a", 1, IterationKind.SNAPSHOT),
        task(2, "b", 0),
    )
    assert runnable([tail, snapshot, other], busy) == [snapshot, other]
    assert priority_first([tail, snapshot, other], Load(busy)) == snapshot


def test_nothing_to_run() -> None:
    assert priority_first([], Load()) is None
    assert priority_first([task(0, "a")], Load({TableRef(1, "db", "a")})) is None


def test_a_new_policy_is_only_a_function() -> None:
    """A toy policy, shortest table name first, plugs in without touching the scheduler."""

    def shortest_table_first(queued: Sequence[Q], load: Load) -> Q | None:
        candidates = runnable(queued, load.busy_tables)
        return min(candidates, key=lambda q: len(q.plan.table.table), default=None)

    queue = [task(0, "orders", 9), task(1, "t", 0), task(2, "items", 5)]
    assert shortest_table_first(queue, Load()) == queue[1]
    assert shortest_table_first(queue, Load({TableRef(1, "db", "t")})) == queue[2]
