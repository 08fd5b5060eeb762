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


def join_spec(db: str = "db", joined: str = "db", trigger: str = "greedy", **more: Any) -> JobSpec:
    options = {"query": QUERY.format(db=db, joined=joined), "keys": {"o": ["id"], "c": ["id"]}}
    return JobSpec.from_json(
        {
            "trigger": {"kind": trigger},
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
    def __init__(self, latest: dict[str, int], ids: dict[str, str] | None = None) -> None:
        self.latest = latest
        self.ids = {"/w/db/customers": "cid"} if ids is None else ids
        self.asked: list[str] = []

    def changed_since(self, location: str, version: int) -> bool | None:
        self.asked.append(location)
        return self.latest[location] > version if location in self.latest else None

    def changed_since_all(self, queries: list[tuple[str, int]]) -> list[bool | None]:
        return [self.changed_since(*q) for q in queries]

    def latest_version(self, location: str) -> int | None:
        return self.latest.get(location)

    def table_id(self, location: str) -> str | None:
        return self.ids.get(location, "oid")


class Tables:
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def location(self, database: str, table: str) -> str:
        return f"/w/{database}/{table}"


def select(
    latest: dict[str, int],
    current: CatalogRow,
    in_flight: bool = False,
    ids: dict[str, str] | None = None,
):
    selection = TriggerSelection(Tables(Probe(latest, ids)))  # type: ignore[arg-type]
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
    # re-created under the job and back at the version it reflects: another identity
    again, _ = select(
        {"/w/db/orders": 3, "/w/db/customers": 4}, current, ids={"/w/db/customers": "new"}
    )
    assert [(p.from_version, p.to_version) for p in again.plans] == [(3, 3)]


def test_explain_names_the_versions_keys_technique_and_the_layout_each_lookup_needs() -> None:
    from lakeprop.consumers.join_view.explain import Layout, explain, lookup_columns
    from lakeprop.consumers.join_view.options import parse_options

    view = parse_options(
        {
            "query": "SELECT o.id, c.name, r.label FROM db.orders AS o "
            "JOIN db.customers AS c ON o.customer_id = c.id "
            "LEFT JOIN db.regions AS r ON c.region_id = r.id AND c.zone = r.zone",
            "keys": {"o": ["id"], "c": ["id"], "r": ["id", "zone"]},
        }
    )
    assert lookup_columns(view, "c") == ("id", "region_id", "zone")
    assert lookup_columns(view, "o") == ("customer_id",)
    assert lookup_columns(view, "r") == ("id", "zone")
    lines = explain(
        view,
        {"o": "version 7", "c": "version 3", "r": "no version yet"},
        {"o": Layout(), "c": Layout(clustered=("id",)), "r": None},
    )
    text = "\n".join(lines)
    assert "  o = db.orders: first table (the job's source), at version 7" in lines
    assert "  c = db.customers: INNER JOIN ON `o`.`customer_id` = `c`.`id`, at version 3" in lines
    assert "LEFT JOIN ON `c`.`region_id` = `r`.`id` AND `c`.`zone` = `r`.`zone`" in text
    assert [line for line in lines if line.startswith("  __")] == [
        "  __o__id = o.id",
        "  __c__id = c.id",
        "  __r__id = r.id",
        "  __r__zone = r.zone",
    ]
    assert "technique: incremental from every table's change feed" in text
    assert "MERGEd on o's key alone" in text  # every join meets its table's whole key
    assert (
        "  db.orders (looked up by customer_id): warning: neither clustered nor partitioned "
        "on customer_id; each iteration that reads it scans it whole "
        "(ALTER TABLE ... CLUSTER BY (customer_id))"
    ) in lines
    assert "  db.customers (looked up by id, region_id, zone): clustered on id: " in text
    assert "  db.regions (looked up by id, zone): layout unknown" in text
    partitioned = explain(view, {}, {"r": Layout(partitioned=("zone",))})
    assert any("db.regions (looked up by id, zone): partitioned on zone" in x for x in partitioned)


def test_a_table_another_accounts_join_reads_is_no_target_of_this_one() -> None:
    result = apply_commands(
        [],
        [
            register(1, JobKey(7, "sales", "orders", "v"), join_spec("sales", "sales_eu")),
            register(
                2,
                JobKey(8, "raw", "t", "c"),
                replica(target_database="sales_eu", target_table="customers"),
            ),
        ],
        check_ok,
        tenants=tenants(CONFIG.replace("max_live_jobs = 0", 'databases = ["raw", "sales_eu"]')),
    )
    assert [(v.outcome, v.error_code) for v in result.verdicts] == [
        (Outcome.APPLIED, 0),
        (Outcome.REJECTED, ErrorCode.TARGET_NOT_ALLOWED),
    ]


def test_a_join_behind_its_own_table_waits_for_its_turn_not_an_empty_tail() -> None:
    """A default join lagging its group, while another laggard catches up: no empty tail
    for it (in flight, it would be the one catching up and hold the others back)."""
    join = replace(row(), job_spec=join_spec(trigger="default").canonical())  # at 3, table at 5
    leader = replace(join, job_name="l", job_id=1, job_spec=replica().canonical(), watermark=5)
    other = replace(join, job_name="k", job_id=2, job_spec=replica().canonical(), watermark=3)
    rows = {r.row_id: r for r in (join, leader, other)}
    selection = TriggerSelection(Tables(Probe({"/w/db/orders": 5, "/w/db/customers": 9})))  # type: ignore[arg-type]
    found = selection.select(rows, {leader.row_id, other.row_id}, {}, now=10.0)
    assert found.plans == []


def test_the_graph_draws_a_join_from_each_table_it_reads() -> None:
    from lakeprop.pipeline import render

    graph = Graph()
    graph.add(JOIN, join_spec())
    label = lambda key: key.job_name  # noqa: E731
    assert render.text(graph, label) == "db.orders\n  └─ v (v) → db.orders_v (joins db.customers)"
    drawn = render.mermaid(graph, label)
    assert 't0 -->|"v: v"| t2' in drawn and 't1 -->|"v: v"| t2' in drawn, drawn


def test_the_history_records_the_joined_versions_beside_the_range() -> None:
    current = row()
    plan = IterationPlan(
        TableRef(0, "db", "orders"), IterationKind.TAIL, 5, (Member(current.row_id, 9, 3),), 0, 1.0
    )
    member = MemberResult(current.row_id, 9, "join_view")
    member.joined = {"db.customers": JoinedMark(6, "cid"), "db.addresses": JoinedMark(2, "aid")}
    record = IterationResult(plan, IterationKind.TAIL, 1.0, 2.0, members=[member]).record({})
    (recorded,) = record.members
    assert (record.from_version, record.to_version) == (3, 5)
    assert json.loads(recorded.joined or "") == {"db.addresses": 2, "db.customers": 6}
    plain = IterationResult(
        plan, IterationKind.TAIL, 1.0, 2.0, members=[MemberResult(current.row_id, 9, "replica")]
    )
    assert plain.record({}).members[0].joined is None
