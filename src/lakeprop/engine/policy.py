"""Which queued iteration runs next: the scheduler's policy, pure (no threads, no Spark).

A policy is a function of the queue and of the tables whose tail is running;
the scheduler (:mod:`lakeprop.engine.scheduler`) calls it whenever a worker is
free and runs what it picks. A new policy is a new function here, tested
without Spark; fairness, quotas and backpressure plug in the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from typing import Protocol, TypeVar

from lakeprop.engine.model import IterationPlan, TableRef


class Queued(Protocol):
    """What a policy sees of a queued task."""

    @property
    def plan(self) -> IterationPlan: ...

    @property
    def seq(self) -> int:
        """Arrival order."""
        ...


Q = TypeVar("Q", bound=Queued)

Policy = Callable[[Sequence[Q], Set[TableRef]], Q | None]
"""(queued tasks, tables with a running tail) -> the task to run next, or None."""


def runnable(queued: Sequence[Q], busy_tables: Set[TableRef]) -> list[Q]:
    """The tasks that may start now: a table's tails run one at a time, in order."""
    return [q for q in queued if not (q.plan.serial and q.plan.table in busy_tables)]


def priority_first(queued: Sequence[Q], busy_tables: Set[TableRef]) -> Q | None:
    """Highest priority first, then first come; a table's tails one at a time."""
    return min(runnable(queued, busy_tables), key=lambda q: (-q.plan.priority, q.seq), default=None)
