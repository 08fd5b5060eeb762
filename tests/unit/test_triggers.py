"""Trigger selection and backoff, without Spark."""

from __future__ import annotations

import pytest

from lakeprop.engine.retry import retry_delay
from lakeprop.engine.triggers import (
    IterationKind,
    JobView,
    TableRef,
    is_eligible,
    plan_table,
    probe_from,
)
from lakeprop.spec import TriggerKind

T = TableRef(1, "db", "t")
NOW = 1000.0


def job(ref: str, kind: TriggerKind = TriggerKind.DEFAULT, **kw: object) -> JobView:
    return JobView(ref=ref, job_id=hash(ref) % 1000, kind=kind, **kw)  # type: ignore[arg-type]


def summary(jobs: list[JobView], latest: int | None) -> list[tuple[str, int, list[tuple]]]:
    plan = plan_table(T, jobs, latest, NOW)
    return [
        (p.kind.value, p.to_version, sorted((m.ref, m.from_version) for m in p.members))
        for p in plan.iterations
    ]


def test_backoff_doubles_from_5s_to_5min() -> None:
    assert [retry_delay(n) for n in range(0, 9)] == [0, 5, 10, 20, 40, 80, 160, 300, 300]
    assert retry_delay(1000) == 300


def test_new_job_alone_syncs_to_latest_with_a_snapshot() -> None:
    assert summary([job("a")], 7) == [("snapshot", 7, [("a", None)])]


def test_new_default_job_syncs_to_the_groups_watermark() -> None:
    jobs = [job("old", watermark=4, watermark_ts=NOW), job("new")]
    assert summary(jobs, 9) == [("snapshot", 4, [("new", None)]), ("tail", 9, [("old", 4)])]


def test_new_greedy_job_syncs_to_latest_even_with_a_group() -> None:
    jobs = [job("old", watermark=4), job("g", TriggerKind.GREEDY)]
    assert summary(jobs, 9)[0] == ("snapshot", 9, [("g", None)])


def test_new_job_does_not_block_the_others_initial_sync_in_flight() -> None:
    jobs = [job("old", watermark=4), job("new", in_flight=True)]
    assert summary(jobs, 6) == [("tail", 6, [("old", 4)])]


def test_default_jobs_share_one_iteration() -> None:
    jobs = [job("a", watermark=3), job("b", watermark=3, priority=5)]
    plan = plan_table(T, jobs, 5, NOW)
    (it,) = plan.iterations
    assert (it.kind, it.from_version, it.to_version, it.priority) == (IterationKind.TAIL, 3, 5, 5)


def test_one_lagging_job_rides_along_with_the_group() -> None:
    jobs = [
        job("a", watermark=8),
        job("b", watermark=8),
        job("lag1", watermark=2),
        job("lag2", watermark=5),
    ]
    assert summary(jobs, 10) == [
        ("tail", 10, [("a", 8), ("b", 8), ("lag1", 2)]),
    ]


def test_a_lagging_job_catches_up_alone_while_the_group_is_busy() -> None:
    jobs = [job("a", watermark=8, in_flight=True), job("lag", watermark=2)]
    assert summary(jobs, 10) == [("tail", 8, [("lag", 2)])]


def test_only_one_lagging_job_at_a_time() -> None:
    jobs = [
        job("a", watermark=8, in_flight=True),
        job("lag1", watermark=2, in_flight=True),
        job("lag2", watermark=3),
    ]
    assert summary(jobs, 10) == []


def test_a_group_at_the_latest_version_lets_a_laggard_catch_up() -> None:
    jobs = [job("a", watermark=10), job("lag", watermark=6)]
    plan = plan_table(T, jobs, 10, NOW)
    assert summary(jobs, 10) == [("tail", 10, [("lag", 6)])]
    assert plan.fresh == ["a"]


def test_greedy_jobs_each_get_their_own_iteration() -> None:
    jobs = [job("g1", TriggerKind.GREEDY, watermark=1), job("g2", TriggerKind.GREEDY, watermark=2)]
    assert summary(jobs, 3) == [("tail", 3, [("g1", 1)]), ("tail", 3, [("g2", 2)])]


def periodic(ref: str, ts: float, share: bool = False, wm: int = 1) -> JobView:
    return job(
        ref, TriggerKind.PERIODIC, interval_s=60.0, share=share, watermark=wm, watermark_ts=ts
    )


def test_periodic_job_waits_for_its_interval() -> None:
    assert not is_eligible(periodic("p", NOW - 59), NOW)
    assert is_eligible(periodic("p", NOW - 60), NOW)
    assert summary([periodic("p", NOW - 30)], 5) == []
    assert summary([periodic("p", NOW - 61)], 5) == [("tail", 5, [("p", 1)])]


def test_shared_periodic_jobs_share_an_iteration_and_others_do_not() -> None:
    jobs = [periodic("s1", 0, True), periodic("s2", 0, True, wm=2), periodic("own", 0)]
    assert summary(jobs, 5) == [
        ("tail", 5, [("s1", 1), ("s2", 2)]),
        ("tail", 5, [("own", 1)]),
    ]


def test_failed_in_flight_and_backed_off_jobs_are_not_eligible() -> None:
    assert not is_eligible(job("e", watermark=1, failed=True), NOW)
    assert not is_eligible(job("f", watermark=1, in_flight=True), NOW)
    assert not is_eligible(job("b", watermark=1, blocked_until=NOW + 1), NOW)
    assert is_eligible(job("b", watermark=1, blocked_until=NOW), NOW)


def test_unchanged_table_marks_eligible_jobs_fresh_without_iterations() -> None:
    jobs = [job("a", watermark=5), job("g", TriggerKind.GREEDY, watermark=5)]
    plan = plan_table(T, jobs, 5, NOW)
    assert plan.iterations == [] and sorted(plan.fresh) == ["a", "g"]


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ([], (False, None)),
        ([job("a", watermark=4), job("b", watermark=2)], (True, 2)),
        ([job("a", watermark=4), job("new")], (True, None)),
        ([job("a", watermark=4, in_flight=True)], (False, None)),
        ([periodic("p", NOW - 10)], (False, None)),
    ],
)
def test_probe_from(jobs: list[JobView], expected: tuple[bool, int | None]) -> None:
    assert probe_from(jobs, NOW) == expected


def test_no_versions_no_plan() -> None:
    assert summary([job("a")], None) == []


def test_a_new_trigger_kind_is_an_enum_value_and_a_planner() -> None:
    """A toy kind, "laggard": only jobs at least 5 versions behind get a tail."""
    from enum import Enum

    from lakeprop.engine.triggers import PLANNERS, TableState

    class ToyKind(str, Enum):
        LAGGARD = "laggard"

    def plan_laggard(state: TableState) -> list:
        behind = state.behind(ToyKind.LAGGARD)  # type: ignore[arg-type]
        return [
            state.tail([j])
            for j in behind
            if j.watermark is not None and state.latest - j.watermark >= 5
        ]

    planners = {**PLANNERS, ToyKind.LAGGARD: plan_laggard}
    jobs = [job("near", ToyKind.LAGGARD, watermark=8), job("far", ToyKind.LAGGARD, watermark=2)]  # type: ignore[arg-type]
    plan = plan_table(T, jobs, 10, NOW, planners)  # type: ignore[arg-type]
    assert [(p.kind, p.to_version, [m.ref for m in p.members]) for p in plan.iterations] == [
        (IterationKind.TAIL, 10, ["far"])
    ]
    # without its planner the kind plans nothing (and breaks nothing)
    assert plan_table(T, jobs, 10, NOW).iterations == []


def test_a_backlog_of_many_rows_is_cut_where_the_row_bound_falls_and_a_version_is_never_split() -> (
    None
):
    rows = {1: 10, 2: 10, 3: 10, 4: 50, 5: None}.get  # None: a commit file gone (counts 0)
    jobs = [job("a", watermark=0), job("g", TriggerKind.GREEDY, watermark=3)]
    plan = plan_table(T, jobs, 5, NOW, max_versions=10, max_rows=25, change_rows=rows)
    # 10 + 10 fit, a third 10 does not; 50 alone is over the bound but goes whole
    assert sorted((p.from_version, p.to_version) for p in plan.iterations) == [(0, 2), (3, 4)]
    # the version bound still applies, and no row bound means the whole backlog
    bounded = plan_table(T, jobs, 5, NOW, max_versions=1, max_rows=1000, change_rows=rows)
    assert sorted(p.to_version for p in bounded.iterations) == [1, 4]
    unbounded = plan_table(T, jobs, 5, NOW, max_versions=10, change_rows=rows)
    assert [p.to_version for p in unbounded.iterations] == [5, 5]


def test_a_backlog_is_caught_up_in_bounded_tails() -> None:
    jobs = [job("a", watermark=3), job("b", watermark=3), job("g", TriggerKind.GREEDY, watermark=1)]
    plan = plan_table(T, jobs, 100, NOW, max_versions=10)
    assert [(p.from_version, p.to_version) for p in plan.iterations] == [(1, 11), (3, 13)]
    # one bound more and the group is level with the latest version: no bound reached
    assert [p.to_version for p in plan_table(T, jobs, 12, NOW, max_versions=10).iterations] == [
        11,
        12,
    ]
