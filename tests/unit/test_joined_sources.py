"""Jobs that read tables beside their source (a join), without Spark: the graph
reads their joined tables too, a tenant's scope covers them, the job's status keeps
the versions its target reflects through failures, and trigger selection makes the
job due when only a joined table moved."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Any

from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberResult,
    TableRef,
)
from lakeprop.engine.selection import TriggerSelection
from lakeprop.engine.watermarks import advance
from lakeprop.errors import ErrorCode
from lakeprop.pipeline.graph import Graph, Node
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome
from lakeprop.state.status import EMPTY_STATUS, JobState, JobStatus, JoinedMark, joined_marks
from tests.unit.test_catalog_apply import check_ok, register
from tests.unit.test_tenants import CONFIG, tenants

QUERY = (
    "SELECT o.id, c.name FROM {db}.orders AS o "
    "LEFT JOIN {joined}.customers AS c ON o.customer_id = c.id"
)


def join_spec(db: str = "db", joined: str = "db", **more: Any) -> JobSpec:
    options = {"query": QUERY.format(db=db, joined=joined), "keys": {"o": ["id"], "c": ["id"]}}
    return JobSpec.from_json(
        {
            "trigger": {"kind": "greedy"},
            "iteration": {"consumer": {"type": "join_view", "options": options | more}},
        }
    )


def replica(**options: Any) -> JobSpec:
    return JobSpec.from_json(
        {
            "iteration": {
                "consumer": {"type": "replica", "options": {"primary_key": ["id"]} | options}
            }
        }
    )


JOIN = JobKey(0, "db", "orders", "v")  # db.orders + db.customers -> db.orders_v


def test_a_join_reads_its_joined_table_in_the_graph() -> None:
    copy = JobKey(0, "db", "raw", "c")  # db.raw -> db.customers
    graph = Graph()
    graph.add(copy, replica(target_table="customers"))
    graph.add(JOIN, join_spec())
    assert graph.readers(("db", "customers")) == [JOIN]
    assert graph.upstream(JOIN) == [copy] and graph.downstream(copy) == [JOIN]
    node = Node.stored(JOIN, join_spec().canonical())
    assert node.joined == (("db", "customers"),) and node == graph.nodes[JOIN]
    # a job writing the joined table from the join's target closes a cycle through it
    back = JobKey(0, "db", "orders_v", "back")
    assert graph.cycle_with(back, replica(target_table="customers")) == [back, JOIN]
    assert graph.other_writers(back, replica(target_table="customers")) == [copy]


def test_a_joined_table_outside_the_accounts_scope_is_rejected() -> None:
    result = apply_commands(
        [],
        [
            register(1, JobKey(7, "sales", "orders", "ok"), join_spec("sales", "sales_eu")),
            register(2, JobKey(7, "sales", "orders", "no"), join_spec("sales", "finance")),
        ],
        check_ok,
        tenants=tenants(CONFIG),
    )
    outcomes = [(v.outcome, v.error_code) for v in result.verdicts]
    assert outcomes == [(Outcome.APPLIED, 0), (Outcome.REJECTED, ErrorCode.OUT_OF_SCOPE)]
    assert "(its joined table finance.customers)" in result.verdicts[1].detail


MARKS = {"db.customers": JoinedMark(4, "cid")}


def row(watermark: int | None = 3, marks: dict[str, JoinedMark] | None = None) -> CatalogRow:
    status = JobStatus(joined=MARKS if marks is None else marks).to_json()
    return CatalogRow(
        0, "db", "orders", "v", 9, "oid", join_spec().canonical(), JobState.COMPLETED,
        watermark, None, status, datetime(2026, 1, 1), None, None, 0, 1,
    )  # fmt: skip


def outcome(kind: IterationKind, code: int = 0, joined: dict[str, JoinedMark] | None = None):
    current = row()
    plan = IterationPlan(
        TableRef(0, "db", "orders"), kind, 5, (Member(current.row_id, 9, 3),), 0, 1.0
    )
    member = MemberResult(current.row_id, 9, "join_view", 0, code, "boom" if code else "")
    member.joined = joined
    result = IterationResult(plan, kind, 1.0, 2.0, members=[member])
    changed = advance({current.row_id: current}, [result], {}, 3.0, retry_base=1, retry_cap=2)
    return joined_marks(changed[current.row_id].job_status)


def test_the_status_keeps_the_joined_versions_through_failures() -> None:
    later = {"db.customers": JoinedMark(6, "cid")}
    assert outcome(IterationKind.TAIL, joined=later) == later
    assert outcome(IterationKind.TAIL, code=ErrorCode.SPARK_JOB_FAILED) == MARKS
    assert outcome(IterationKind.TAIL, code=ErrorCode.CONSUMER_FAILED) == MARKS
    assert outcome(IterationKind.SNAPSHOT) == {}  # a snapshot that did not say starts over
    # a job without joined tables has the status it had before them
    assert "joined" not in json.loads(EMPTY_STATUS)
    assert joined_marks("not json") == {} and joined_marks('{"joined": {"x": 1}}') == {}


class Probe:
    def __init__(self, latest: dict[str, int]) -> None:
        self.latest = latest
        self.asked: list[str] = []

    def changed_since(self, location: str, version: int) -> bool | None:
        self.asked.append(location)
        return self.latest[location] > version if location in self.latest else None

    def changed_since_all(self, queries: list[tuple[str, int]]) -> list[bool | None]:
        return [self.changed_since(*q) for q in queries]

    def latest_version(self, location: str) -> int | None:
        return self.latest.get(location)

    def table_id(self, location: str) -> str | None:
        return "oid"


class Tables:
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def location(self, database: str, table: str) -> str:
        return f"/w/{database}/{table}"


def select(latest: dict[str, int], current: CatalogRow, in_flight: bool = False):
    selection = TriggerSelection(Tables(Probe(latest)))  # type: ignore[arg-type]
    flying = {current.row_id} if in_flight else set()
    return selection.select({current.row_id: current}, flying, {}, now=10.0), selection


def test_a_join_is_due_when_only_its_joined_table_moved() -> None:
    current = row()
    quiet, selection = select({"/w/db/orders": 3, "/w/db/customers": 4}, current)
    assert quiet.plans == [] and quiet.fresh == [current.row_id]
    assert ("db", "customers") in selection.watched
    moved, _ = select({"/w/db/orders": 3, "/w/db/customers": 5}, current)
    (plan,) = moved.plans
    assert (plan.kind, plan.from_version, plan.to_version) == (IterationKind.TAIL, 3, 3)
    assert [m.ref for m in plan.members] == [current.row_id] and moved.fresh == []
    both, _ = select({"/w/db/orders": 4, "/w/db/customers": 5}, current)
    (plan,) = both.plans  # its own tail reads the joined table's changes too
    assert (plan.from_version, plan.to_version) == (3, 4)
    busy, _ = select({"/w/db/orders": 3, "/w/db/customers": 5}, current, in_flight=True)
    assert busy.plans == []
    # without a recorded version (a resync ran, a status from before), it goes to look
    unknown, _ = select(
        {"/w/db/orders": 3, "/w/db/customers": 4}, replace(current, job_status=EMPTY_STATUS)
    )
    assert [(p.from_version, p.to_version) for p in unknown.plans] == [(3, 3)]
    gone, _ = select(
        {"/w/db/orders": 3}, current
    )  # the joined table went away: its iteration says so
    assert [(p.from_version, p.to_version) for p in gone.plans] == [(3, 3)]
