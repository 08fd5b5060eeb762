"""Which queued iteration runs next: the scheduler's policy, pure (no threads, no Spark).

A policy is a function of the queue and of what is running (:class:`Load`);
the scheduler (:mod:`lakeprop.engine.scheduler`) calls it whenever a worker is
free and runs what it picks. A new policy is a new function here, tested
without Spark. Two ship: :func:`priority_first`, one queue for everyone, and
:class:`FairShare`, weighted fair queuing across accounts (the service's).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Load:
    """What is running: the tables with a running tail, and iterations per account."""

    busy_tables: Set[TableRef] = frozenset()
    running: Mapping[int, int] = field(default_factory=dict)
    cached_rows: Mapping[int, int] = field(default_factory=dict)
    """Rows the account's running iterations hold cached (their change sets)."""


Policy = Callable[[Sequence[Q], Load], Q | None]
"""(queued tasks, what is running) -> the task to run next, or None."""


def runnable(queued: Sequence[Q], busy_tables: Set[TableRef]) -> list[Q]:
    """The tasks that may start now: a table's tails run one at a time, in order."""
    return [q for q in queued if not (q.plan.serial and q.plan.table in busy_tables)]


def _first(candidates: Sequence[Q]) -> Q | None:
    return min(candidates, key=lambda q: (-q.plan.priority, q.seq), default=None)


def priority_first(queued: Sequence[Q], load: Load) -> Q | None:
    """Highest priority first, then first come; a table's tails one at a time."""
    return _first(runnable(queued, load.busy_tables))


class FairShare:
    """Weighted fair queuing across accounts; priority, then arrival, within one.

    A free worker goes to the account with the fewest running iterations per
    unit of weight, so under contention accounts hold workers in proportion to
    their weights, and an account with one queued iteration waits for one
    running iteration to end, never for another account's backlog. Between
    accounts level on that, the one served least goes first: each start
    advances its account's virtual time by ``1 / weight``, and an account that
    comes back after being idle starts level with the least-served active one
    (idling earns no credit). An account at its cap of concurrent iterations
    waits while the others go ahead. A table's tails still run one at a time.

    Backpressure (TiCDC's memory control per area, counted in rows): an account whose running
    iterations hold more than ``PAUSE_AT`` of its ``budget`` of cached rows is
    paused, its new iterations wait, until they hold less than ``RESUME_BELOW``
    of it. Other accounts are not affected. :attr:`paused` says since when.
    """

    PAUSE_AT = 0.8
    RESUME_BELOW = 0.5
    PAUSES_KEPT = 64

    def __init__(
        self,
        weight: Callable[[int], float],
        cap: Callable[[int], int] = lambda _account: 0,
        budget: Callable[[int], int] = lambda _account: 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.weight = weight
        self.cap = cap
        """Concurrent iterations an account may have (0: no cap)."""
        self.budget = budget
        """Rows an account's running iterations may hold cached (0: no budget)."""
        self.clock = clock
        self.virtual: dict[int, float] = {}
        self.paused: dict[int, float] = {}
        """Accounts under backpressure, and since when (``clock`` time)."""
        self.pauses: dict[int, deque[tuple[float, float]]] = {}
        """Each account's latest ended pauses, (since, until), oldest first."""

    def pressure(self, load: Load) -> None:
        """Pause accounts above ``PAUSE_AT`` of their budget, resume those under
        ``RESUME_BELOW`` (between the two an account stays as it was)."""
        for account in {*load.cached_rows, *self.paused}:
            budget = self.budget(account)
            cached = load.cached_rows.get(account, 0)
            if budget and cached > self.PAUSE_AT * budget:
                self.paused.setdefault(account, self.clock())
            elif not budget or cached < self.RESUME_BELOW * budget:
                since = self.paused.pop(account, None)
                if since is not None:
                    ended = self.pauses.setdefault(account, deque(maxlen=self.PAUSES_KEPT))
                    ended.append((since, self.clock()))

    def paused_between(self, account: int, start: float, end: float) -> float:
        """Seconds of ``start..end`` during which ``account`` was paused."""
        spans = [*self.pauses.get(account, ())]
        if account in self.paused:
            spans.append((self.paused[account], end))
        return float(sum(max(0.0, min(until, end) - max(since, start)) for since, until in spans))

    def __call__(self, queued: Sequence[Q], load: Load) -> Q | None:
        by_account: dict[int, list[Q]] = {}
        for q in runnable(queued, load.busy_tables):
            by_account.setdefault(q.plan.table.account_id, []).append(q)
        self._track(
            {q.plan.table.account_id for q in queued} | {a for a, n in load.running.items() if n}
        )

        self.pressure(load)

        def capped(account: int) -> bool:
            cap = self.cap(account)
            return account in self.paused or (bool(cap) and load.running.get(account, 0) >= cap)

        eligible = [a for a in by_account if not capped(a)]
        if not eligible:
            return None
        account = min(
            eligible,
            key=lambda a: (load.running.get(a, 0) / self.weight(a), self.virtual[a], a),
        )
        self.virtual[account] += 1.0 / self.weight(account)
        return _first(by_account[account])

    def _track(self, active: set[int]) -> None:
        """Forget idle accounts; start newly active ones at the least-served level."""
        for account in set(self.virtual) - active:
            del self.virtual[account]
        floor = min(self.virtual.values(), default=0.0)
        for account in active:
            self.virtual.setdefault(account, floor)
