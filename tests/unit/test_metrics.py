"""The metrics the runner reports and the per-job gauges, without Spark."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from prometheus_client import CollectorRegistry, generate_latest

from lakeprop.changelog import LogRecord
from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberResult,
    TableRef,
)
from lakeprop.engine.ownership import SlotChanges, SlotOwner
from lakeprop.engine.scheduler import AccountLoad
from lakeprop.membership.slots import slot_of
from lakeprop.membership.topics import Claim
from lakeprop.service.metrics import AccountGauges, ClusterGauges, JobGauges, ServiceMetrics
from lakeprop.service.observer import BatchTimings, TickSummary
from lakeprop.state.outcomes import Outcome, Verdict
from lakeprop.state.status import JobState
from tests.unit.test_membership import Clock, _seat
from tests.unit.test_watermarks import REF, ROW

TABLE = TableRef(1, "db", "t")


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_tick_reports_its_phases_probes_and_selection_jobs() -> None:
    jobs = iter([0, 0, 0, 2])
    metrics = ServiceMetrics(selection_jobs=lambda: next(jobs))
    r = metrics.registry
    timings = BatchTimings(3, {"results": 0.02, "log": 0.3, "selection": 0.001})
    metrics.batch(timings, TickSummary(5, 2, 2, 1))
    metrics.batch(BatchTimings(4, {"log": 0.2}), None)
    assert sample(r, "lakeprop_ticks_total") == 2
    assert sample(r, "lakeprop_tables_probed_total") == 5
    assert sample(r, "lakeprop_tables_changed_total") == 2
    assert sample(r, "lakeprop_tick_phase_seconds_count", phase="log") == 2
    assert sample(r, "lakeprop_tick_phase_seconds_sum", phase="log") == 0.5
    assert sample(r, "lakeprop_tick_phase_seconds_bucket", phase="log", le="0.25") == 1
    assert sample(r, "lakeprop_selection_spark_jobs_total") == 0
    metrics.batch(BatchTimings(5, {}), None)
    assert sample(r, "lakeprop_selection_spark_jobs_total") == 2


def test_iterations_report_duration_wait_rows_and_errors_by_code() -> None:
    metrics = ServiceMetrics()
    r = metrics.registry
    plan = IterationPlan(TABLE, IterationKind.TAIL, 6, (Member(REF, 7, 3),), 0, 99.5)
    ok = MemberResult(REF, 7, "replica", 4)
    failed = MemberResult(REF, 8, "secondary_index", 0, 2101, "boom")
    metrics.results(
        [
            IterationResult(plan, IterationKind.TAIL, 100.0, 101.5, 10, 1, "", [ok], spark_jobs=6),
            IterationResult(plan, IterationKind.TAIL, 102.0, 102.5, 3, 1, "", [ok, failed]),
        ]
    )
    assert sample(r, "lakeprop_iteration_seconds_count", kind="tail", outcome="success") == 1
    assert sample(r, "lakeprop_iteration_seconds_sum", kind="tail", outcome="success") == 1.5
    assert sample(r, "lakeprop_iteration_seconds_count", kind="tail", outcome="partial") == 1
    assert sample(r, "lakeprop_iteration_queue_wait_seconds_sum", kind="tail") == 0.5 + 2.5
    assert sample(r, "lakeprop_iteration_rows_read_total", kind="tail") == 13
    assert sample(r, "lakeprop_consumer_rows_written_total", consumer="replica") == 8
    assert sample(r, "lakeprop_consumer_rows_written_total", consumer="secondary_index") == 0
    assert sample(r, "lakeprop_iteration_spark_jobs_total", kind="tail") == 6
    assert sample(r, "lakeprop_job_errors_total", code="2101") == 1


def test_verdicts_count_by_outcome_and_rejects_by_code() -> None:
    metrics = ServiceMetrics()
    r = metrics.registry
    record = LogRecord("t", 0, 1, datetime(2026, 1, 1), None, b"{}")
    metrics.verdicts(
        [
            Verdict(record, Outcome.APPLIED),
            Verdict(record, Outcome.APPLIED),
            Verdict(record, Outcome.REJECTED, error_code=1001),
        ]
    )
    assert sample(r, "lakeprop_verdicts_total", outcome="applied") == 2
    assert sample(r, "lakeprop_verdicts_total", outcome="rejected") == 1
    assert sample(r, "lakeprop_verdicts_total", outcome="not_found") == 0
    assert sample(r, "lakeprop_rejects_total", code="1001") == 1


def test_job_gauges_read_watermark_lag_and_state_at_scrape_time() -> None:
    behind = replace(ROW, watermark=3, job_state=JobState.RUNNING)
    other_key = replace(ROW.key, job_name="k")
    in_step = replace(ROW, job_name="k", job_id=8, watermark=6, job_state=JobState.COMPLETED)
    new = replace(ROW, job_name="n", job_id=9, watermark=None, job_state=JobState.COMPLETED)
    dropped = replace(ROW, job_name="d", job_id=10, drop_at=datetime(2026, 1, 2))
    rows = {REF: behind, (other_key, 8): in_step, ("n", 9): new, ("d", 10): dropped}
    asked: list[int] = []

    def commit_time(table: TableRef, version: int) -> float:
        asked.append(version)
        return 1000.0 + version

    registry = CollectorRegistry()
    registry.register(JobGauges(lambda: rows, {TABLE: 6}.get, commit_time, clock=lambda: 1010.0))
    labels = {"account": "1", "database": "db", "table": "t", "job": "j", "job_id": "7"}
    assert registry.get_sample_value("lakeprop_job_watermark", labels) == 3
    assert registry.get_sample_value("lakeprop_job_lag_versions", labels) == 3
    # the oldest commit it has not consumed is version 4, committed at 1004
    assert registry.get_sample_value("lakeprop_job_lag_seconds", labels) == 6
    assert registry.get_sample_value("lakeprop_job_state", {**labels, "state": "running"}) == 1
    k = {**labels, "job": "k", "job_id": "8"}
    assert registry.get_sample_value("lakeprop_job_lag_versions", k) == 0
    assert registry.get_sample_value("lakeprop_job_lag_seconds", k) == 0
    assert registry.get_sample_value("lakeprop_jobs", {"state": "completed"}) == 2
    assert registry.get_sample_value("lakeprop_jobs", {"state": "running"}) == 1
    assert registry.get_sample_value("lakeprop_jobs", {"state": "error"}) == 0
    text = generate_latest(registry).decode()
    assert 'job="d"' not in text  # dropped jobs are not exported
    watermarks = [line for line in text.splitlines() if line.startswith("lakeprop_job_watermark{")]
    assert len(watermarks) == 2  # a new job has no watermark yet
    assert set(asked) == {4}  # only the behind job needs a commit time


def test_account_gauges_show_the_schedulers_share_and_backpressure() -> None:
    registry = CollectorRegistry()
    loads = {
        1: AccountLoad(5, 2, 1200, 1700.5, cached_bytes=48_000),
        2: AccountLoad(0, 1, 30, None),
    }
    registry.register(AccountGauges(lambda: loads))
    one, two = {"account": "1"}, {"account": "2"}
    assert sample(registry, "lakeprop_account_iterations_queued", **one) == 5
    assert sample(registry, "lakeprop_account_iterations_running", **one) == 2
    assert sample(registry, "lakeprop_account_rows_in_flight", **one) == 1200
    assert sample(registry, "lakeprop_account_bytes_in_flight", **one) == 48_000
    assert sample(registry, "lakeprop_account_bytes_in_flight", **two) == 0
    assert sample(registry, "lakeprop_account_paused_since_seconds", **one) == 1700.5
    assert sample(registry, "lakeprop_account_paused_since_seconds", **two) == 0
    assert sample(registry, "lakeprop_account_rows_in_flight", **two) == 30


def test_cluster_gauges_show_this_instances_slots_tables_fence_and_handovers() -> None:
    clock = Clock()
    seat = _seat(clock)  # assigned slots 3 and 5 of 8
    seat.instance = "node-a"
    owner = SlotOwner(seat)
    owner.adopt({3})  # slot 5 is still being taken over
    names = (f"t{i}" for i in range(1000))
    on_3 = [t for t in names if slot_of("db", t, 8) == 3][:2]
    on_5 = next(t for t in (f"u{i}" for i in range(1000)) if slot_of("db", t, 8) == 5)
    rows = [
        replace(ROW, table=on_3[0]),
        replace(ROW, table=on_3[0], job_name="k", job_id=8),
        replace(ROW, table=on_3[1], job_name="m", job_id=9),
        replace(ROW, table=on_3[1], job_name="d", job_id=10, drop_at=datetime(2026, 1, 2)),
        replace(ROW, table=on_5, job_name="n", job_id=11),
    ]
    metrics = ServiceMetrics()
    r = metrics.registry
    r.register(ClusterGauges(owner, lambda: rows))
    assert sample(r, "lakeprop_cluster_member", member="node-a") == 1
    assert sample(r, "lakeprop_cluster_slots", state="assigned") == 2
    assert sample(r, "lakeprop_cluster_slots", state="served") == 1
    assert sample(r, "lakeprop_cluster_tables_served") == 2
    assert sample(r, "lakeprop_cluster_jobs_served") == 3  # the dropped job is not live
    assert sample(r, "lakeprop_cluster_self_fenced") == 0
    assert sample(r, "lakeprop_cluster_leader") == 0  # slot 0 is elsewhere
    clock.now += 10  # a pause past the session timeout: it serves nothing until vouched for
    assert sample(r, "lakeprop_cluster_self_fenced") == 1
    assert sample(r, "lakeprop_cluster_slots", state="served") == 0
    metrics.handover(SlotChanges(frozenset({1}), {5: Claim(5, 9), 6: Claim(6, 2)}, frozenset()))
    metrics.handover(SlotChanges(lost=frozenset({3})))
    assert sample(r, "lakeprop_cluster_slot_handovers_total", direction="gained") == 2
    assert sample(r, "lakeprop_cluster_slot_handovers_total", direction="revoked") == 1
    assert sample(r, "lakeprop_cluster_slot_handovers_total", direction="lost") == 1
