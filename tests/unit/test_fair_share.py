"""Fair share across accounts: weights, no starvation, priority and the serial rule
within an account (the policy alone, no threads, no Spark)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from lakeprop.engine.model import IterationKind, IterationPlan, Member, TableRef
from lakeprop.engine.policy import FairShare, Load
from lakeprop.spec import JobKey


@dataclass(frozen=True)
class Task:
    plan: IterationPlan
    seq: int


def task(
    seq: int,
    account: int,
    table: str = "t",
    priority: int = 0,
    kind: IterationKind = IterationKind.SNAPSHOT,
) -> Task:
    ref = (JobKey(account, "db", table, f"j{seq}"), seq)
    plan = IterationPlan(
        TableRef(account, "db", table),
        kind,
        5,
        (Member(ref, seq, 0),),
        priority,
        0.0,
        f"it{seq}",
    )
    return Task(plan, seq)


def simulate(policy: FairShare, queued: list[Task], workers: int, steps: int) -> list[int]:
    """Run ``steps`` starts on ``workers`` slots where each iteration takes one
    round; the accounts of the tasks started, in order."""
    started: list[int] = []
    running: list[Task] = []
    while len(started) < steps:
        if len(running) == workers:
            running.pop(0)  # the oldest finishes
        load = Load(running=Counter(t.plan.table.account_id for t in running))
        pick = policy(queued, load)  # called, as by the scheduler, for a free worker
        if pick is None:
            running.pop(0)
            continue
        queued.remove(pick)
        running.append(pick)
        started.append(pick.plan.table.account_id)
    return started


def test_a_lone_iteration_waits_for_one_running_iteration_not_for_the_backlog() -> None:
    policy = FairShare(weight=lambda _a: 1.0)
    queued = [task(i, account=1, table=f"t{i}") for i in range(1000)]
    simulate(policy, queued, workers=2, steps=10)  # account 1 holds both workers
    lone = task(5000, account=2)
    queued.append(lone)
    # the first worker to free up (account 1 down to 1 running) goes to account 2
    assert policy(queued, Load(running=Counter({1: 1}))) == lone


def test_workers_are_shared_by_weight() -> None:
    weights = {1: 3.0, 2: 1.0}
    policy = FairShare(weight=lambda a: weights[a])
    queued = [task(i, account=1 + i % 2, table=f"t{i}") for i in range(400)]
    started = simulate(policy, queued, workers=4, steps=200)
    counts = Counter(started)
    assert counts[1] == 150 and counts[2] == 50, counts


def test_an_idle_account_earns_no_credit_while_away() -> None:
    policy = FairShare(weight=lambda _a: 1.0)
    queued = [task(i, account=1, table=f"t{i}") for i in range(100)]
    simulate(policy, queued, workers=1, steps=50)  # account 1 alone for a while
    queued += [task(1000 + i, account=2, table=f"u{i}") for i in range(50)]
    started = simulate(policy, queued, workers=1, steps=20)
    # from then on the two alternate: account 2 does not get 50 in a row
    assert Counter(started) == Counter({1: 10, 2: 10}), started


def test_priority_and_arrival_order_hold_within_an_account() -> None:
    policy = FairShare(weight=lambda _a: 1.0)
    low, high, later_high = (
        task(0, account=1, table="a", priority=1),
        task(1, account=1, table="b", priority=7),
        task(2, account=1, table="c", priority=7),
    )
    assert policy([low, high, later_high], Load()) == high


def test_a_tables_tails_run_one_at_a_time_whatever_the_share() -> None:
    policy = FairShare(weight=lambda _a: 1.0)
    tail = task(0, account=2, table="a", kind=IterationKind.TAIL)
    other = task(1, account=1, table="b", kind=IterationKind.TAIL)
    busy = Load(busy_tables={TableRef(2, "db", "a")}, running=Counter({1: 3}))
    # account 2 has the better share, but its only task's table has a running tail
    assert policy([tail, other], busy) == other
    assert policy([tail], busy) is None


def test_an_account_at_its_concurrency_cap_waits_and_others_go_ahead() -> None:
    policy = FairShare(weight=lambda _a: 1.0, cap=lambda a: 2 if a == 1 else 0)
    capped, free = task(0, account=1, table="a"), task(1, account=2, table="b")
    at_cap = Load(running=Counter({1: 2, 2: 5}))
    assert policy([capped, free], at_cap) == free
    assert policy([capped], at_cap) is None
    assert policy([capped], Load(running=Counter({1: 1}))) == capped


def test_backpressure_pauses_an_account_above_80_percent_and_resumes_it_under_50() -> None:
    now = [100.0]
    policy = FairShare(
        weight=lambda _a: 1.0, budget=lambda a: 1000 if a == 1 else 0, clock=lambda: now[0]
    )
    mine, theirs = task(0, account=1, table="a"), task(1, account=2, table="b")

    def pick(cached_rows_of_account_1: int) -> Task | None:
        load = Load(
            running=Counter({1: 1, 2: 1}), cached_rows={1: cached_rows_of_account_1, 2: 10**9}
        )
        return policy([mine, theirs], load)

    assert pick(800) == mine  # at 80 %: not above it
    assert pick(801) == theirs and policy.paused == {1: 100.0}
    now[0] = 130.0
    assert pick(600) == theirs and policy.paused == {1: 100.0}  # between: still paused
    assert policy([mine], Load(cached_rows={1: 600})) is None  # waits even with a free worker
    now[0] = 140.0
    assert pick(499) == mine and policy.paused == {}
    # account 2 has no budget: any amount in flight leaves it running
    assert policy([theirs], Load(cached_rows={2: 10**9})) == theirs
    # the history's paused_seconds: the part of a wait that fell in the pause (100..140)
    assert policy.paused_between(1, 90.0, 150.0) == 40.0
    assert policy.paused_between(1, 120.0, 130.0) == 10.0
    assert policy.paused_between(1, 140.0, 150.0) == 0.0
    assert policy.paused_between(2, 90.0, 150.0) == 0.0
    now[0] = 200.0
    assert pick(900) == theirs  # paused again, since 200: an open pause counts up to the end
    assert policy.paused_between(1, 130.0, 210.0) == 10.0 + 10.0
