"""The pipeline graph, and what the catalog does with it: cycles rejected, drops
cascaded or refused (no Spark)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from lakeprop.changelog import Command, LogRecord, Operation
from lakeprop.errors import ErrorCode
from lakeprop.pipeline import render
from lakeprop.pipeline.graph import Graph, Node, describe_cycle
from lakeprop.spec import JobKey, JobSpec
from lakeprop.state.apply import apply_commands
from lakeprop.state.job_row import CatalogRow
from lakeprop.state.outcomes import Outcome

T0 = datetime(2026, 11, 29, 12, 0, 0)


def spec(consumer: str = "replica", **options: Any) -> JobSpec:
    base: dict[str, Any] = {
        "replica": {"primary_key": ["id"]},
        "aggregate_view": {"group_by": [], "aggregates": [{"fn": "count", "as": "n"}]},
        "kafka_changefeed": {
            "topic": "t",
            "bootstrap_servers": "127.0.0.1:9092",
            "primary_key": ["id"],
        },
    }[consumer]
    return JobSpec.from_json(
        {"iteration": {"consumer": {"type": consumer, "options": base | options}}}
    )


def key(table: str, name: str = "j", database: str = "db") -> JobKey:
    return JobKey(0, database, table, name)


def graph(*jobs: tuple[JobKey, JobSpec]) -> Graph:
    g = Graph()
    for k, s in jobs:
        g.add(k, s)
    return g


A = key("a", "x")  # db.a -> db.a_x
B = key("a_x", "y")  # db.a_x -> db.a_x_y
C = key("a_x_y", "z")  # db.a_x_y -> db.a_x_y_z


def test_a_job_reading_another_jobs_target_is_its_downstream() -> None:
    g = graph((A, spec()), (B, spec()), (C, spec("aggregate_view")))
    assert g.downstream(A) == [B]
    assert g.upstream(B) == [A]
    assert g.below(A) == [B, C]
    assert g.above(C) == [B, A]
    assert g.upstream(A) == [] and g.downstream(C) == []


def test_tables_are_matched_by_name_whatever_their_case_and_target_options() -> None:
    named = key("src", "x")
    reader = key("Shared_Out", "y", database="Other")
    g = graph(
        (named, spec(target_database="other", target_table="shared_out")),
        (reader, spec()),
    )
    assert g.downstream(named) == [reader]


def test_a_kafka_change_feed_is_no_table_and_feeds_no_job() -> None:
    feed = key("a", "feed")
    g = graph((feed, spec("kafka_changefeed")), (key("a_feed", "r"), spec()))
    assert g.downstream(feed) == []


def test_a_cycle_is_named_in_the_order_the_data_flows() -> None:
    g = graph((A, spec()), (B, spec()))
    closing = key("a_x_y", "back")
    back = spec(target_table="a")
    cycle = g.cycle_with(closing, back)
    assert cycle == [closing, A, B]
    assert describe_cycle(cycle, g, back) == (
        "db.a_x_y -[back]-> db.a -[x]-> db.a_x -[y]-> db.a_x_y"
    )
    assert g.cycle_with(key("a", "self"), spec(target_table="a")) == [key("a", "self")]
    assert g.cycle_with(C, spec()) is None


def test_an_update_is_checked_without_its_own_old_edge() -> None:
    g = graph((A, spec()), (B, spec()))
    # B re-aimed at its own upstream's source closes a cycle; aimed elsewhere it does not
    assert g.cycle_with(B, spec(target_table="a")) == [B, A]
    assert g.cycle_with(B, spec(target_table="elsewhere")) is None


def test_nodes_read_from_the_stored_spec_match_the_validated_ones() -> None:
    s = spec(target_table="out")
    assert Node.stored(A, s.canonical()) == Graph().node_for(A, s)


# -- the catalog ------------------------------------------------------------------------


def rec(offset: int) -> LogRecord:
    return LogRecord("log", offset % 3, offset, T0 + timedelta(seconds=offset), None, None)


def register(offset: int, k: JobKey, s: JobSpec) -> Command:
    return Command(Operation.REGISTER, f"r{offset}", k, rec(offset), spec=s)


def unregister(offset: int, k: JobKey, cascade: bool = False) -> Command:
    return Command(Operation.UNREGISTER, f"r{offset}", k, rec(offset), cascade=cascade)


def check_ok(k: JobKey, s: JobSpec) -> str:
    return f"id-of-{k.table}"


def chain() -> list[CatalogRow]:
    result = apply_commands(
        [], [register(1, A, spec()), register(2, B, spec()), register(3, C, spec())], check_ok
    )
    assert [v.outcome for v in result.verdicts] == [Outcome.APPLIED] * 3
    return list(result.upserts.values())


def test_a_register_that_closes_a_cycle_is_rejected_naming_it() -> None:
    rows = chain()
    result = apply_commands(
        rows, [register(4, key("a_x_y_z", "back"), spec(target_table="a"))], check_ok
    )
    (verdict,) = result.verdicts
    assert verdict.outcome is Outcome.REJECTED
    assert verdict.error_code == ErrorCode.PIPELINE_CYCLE
    assert (
        "db.a_x_y_z -[back]-> db.a -[x]-> db.a_x -[y]-> db.a_x_y -[z]-> db.a_x_y_z"
        in verdict.detail
    )
    assert not result.upserts


def test_a_cycle_made_within_one_batch_is_rejected_too() -> None:
    one = key("p", "q", database="d")  # d.p -> d.p_q
    two = key("p_q", "r", database="d")  # d.p_q -> d.p
    result = apply_commands(
        [], [register(1, one, spec()), register(2, two, spec(target_table="p"))], check_ok
    )
    assert [v.outcome for v in result.verdicts] == [Outcome.APPLIED, Outcome.REJECTED]


def test_an_update_that_closes_a_cycle_is_rejected() -> None:
    rows = chain()
    update = Command(
        Operation.UPDATE_SPEC,
        "u",
        C,
        rec(9),
        spec_update={"iteration": {"consumer": {"options": {"target_table": "a"}}}},
    )
    (verdict,) = apply_commands(rows, [update], check_ok).verdicts
    assert verdict.outcome is Outcome.REJECTED and verdict.error_code == ErrorCode.PIPELINE_CYCLE


def test_dropping_a_job_others_read_needs_cascade() -> None:
    rows = chain()
    refused = apply_commands(rows, [unregister(10, B)], check_ok)
    (verdict,) = refused.verdicts
    assert verdict.outcome is Outcome.REJECTED
    assert verdict.error_code == ErrorCode.DOWNSTREAM_JOBS
    assert str(C) in verdict.detail and "cascade" in verdict.detail
    assert not refused.upserts

    dropped = apply_commands(rows, [unregister(11, A, cascade=True)], check_ok)
    (verdict,) = dropped.verdicts
    assert verdict.outcome is Outcome.APPLIED
    assert f"2 job(s) downstream: {B}, {C}" in verdict.detail
    assert {r.key for r in dropped.upserts.values() if not r.is_live} == {A, B, C}
    assert {ref[0] for ref in dropped.cancel} == {A, B, C}
    # the downstream rows keep their own messages' coordinates: a replay of those skips
    by_key = {r.key: r for r in dropped.upserts.values()}
    before = {r.key: r for r in rows}
    assert (by_key[B].log_partition, by_key[B].log_offset) == (
        before[B].log_partition,
        before[B].log_offset,
    )
    assert (
        apply_commands(dropped.upserts.values(), [register(2, B, spec())], check_ok).upserts == {}
    )


def test_the_last_job_of_a_chain_drops_alone() -> None:
    result = apply_commands(chain(), [unregister(12, C)], check_ok)
    assert [v.outcome for v in result.verdicts] == [Outcome.APPLIED]
    assert [r.key for r in result.upserts.values()] == [C]


# -- drawing -----------------------------------------------------------------------------


def drawn_chain() -> tuple[Graph, Any]:
    feed = key("a_x_y", "feed")
    g = graph((A, spec()), (B, spec()), (feed, spec("kafka_changefeed")))
    label = render.labels(
        [(A, "replica", "completed"), (B, "replica", "paused"), (feed, "kafka_changefeed", "error")]
    )
    return g, label


def test_the_graph_is_drawn_as_text_mermaid_and_dot() -> None:
    g, label = drawn_chain()
    assert render.text(g, label).splitlines() == [
        "db.a",
        "  └─ x (replica, completed) → db.a_x",
        "       └─ y (replica, paused) → db.a_x_y",
        "            └─ feed (kafka_changefeed, error) → (no table)",
    ]
    siblings = graph((A, spec()), (key("a", "z"), spec()), (B, spec()), (key("a_z", "w"), spec()))
    assert render.text(siblings, lambda k: "replica").splitlines() == [
        "db.a",
        "  ├─ x (replica) → db.a_x",
        "  │    └─ y (replica) → db.a_x_y",
        "  └─ z (replica) → db.a_z",
        "       └─ w (replica) → db.a_z_w",
    ]
    assert render.mermaid(g, label).splitlines() == [
        "flowchart LR",
        '  t0["db.a"]',
        '  t1["db.a_x"]',
        '  t2["db.a_x_y"]',
        '  t3[/"kafka_changefeed, error"/]',
        '  t0 -->|"x: replica, completed"| t1',
        '  t1 -->|"y: replica, paused"| t2',
        '  t2 -->|"feed: kafka_changefeed, error"| t3',
    ]
    assert render.dot(g, label).splitlines() == [
        "digraph lakeprop {",
        "  rankdir=LR;",
        "  node [shape=box];",
        '  t0 [label="db.a"];',
        '  t1 [label="db.a_x"];',
        '  t2 [label="db.a_x_y"];',
        '  t3 [label="kafka_changefeed, error", shape=parallelogram];',
        '  t0 -> t1 [label="x: replica, completed"];',
        '  t1 -> t2 [label="y: replica, paused"];',
        '  t2 -> t3 [label="feed: kafka_changefeed, error"];',
        "}",
    ]


def test_a_selection_keeps_one_jobs_chains_or_one_databases_jobs() -> None:
    other = key("elsewhere", "solo", database="o")
    g = graph((A, spec()), (B, spec()), (other, spec()))
    assert set(render.selected(g, job=B).nodes) == {A, B}
    assert set(render.selected(g, database="O").nodes) == {other}
    assert set(render.selected(g).nodes) == {A, B, other}


def test_a_cascade_never_drops_another_accounts_jobs_nor_do_they_hold_the_owner_up() -> None:
    theirs = JobKey(7, "db", "a_x", "theirs")  # account 7 reads account 0's target
    rows = apply_commands([], [register(1, A, spec()), register(2, theirs, spec())], check_ok)
    assert [v.outcome for v in rows.verdicts] == [Outcome.APPLIED] * 2
    live = list(rows.upserts.values())
    # account 0 still updates its own job, keeping its target
    (updated,) = apply_commands(
        live, [update(3, A, {"primary_key": ["id", "k"]})], check_ok
    ).verdicts
    assert updated.outcome is Outcome.APPLIED, updated.detail
    # and moves it elsewhere: account 7's job keeps reading the table as it was left
    (moved,) = apply_commands(live, [update(3, A, {"target_table": "moved"})], check_ok).verdicts
    assert moved.outcome is Outcome.APPLIED, moved.detail
    for cascade in (False, True):
        dropped = apply_commands(live, [unregister(4, A, cascade=cascade)], check_ok)
        (verdict,) = dropped.verdicts
        assert verdict.outcome is Outcome.APPLIED, verdict.detail
        assert {r.key for r in dropped.upserts.values()} == {A}  # theirs stays live
        assert "1 job(s) of other accounts" in verdict.detail
        assert str(theirs) not in verdict.detail  # another account's jobs are not named


def update(offset: int, k: JobKey, options: dict[str, Any], consumer: str | None = None) -> Command:
    change: dict[str, Any] = {"options": options} | ({"type": consumer} if consumer else {})
    return Command(
        Operation.UPDATE_SPEC,
        f"u{offset}",
        k,
        rec(offset),
        spec_update={"iteration": {"consumer": change}},
    )


def test_two_jobs_whose_targets_collide_are_one_too_many() -> None:
    # eu/x_all and eu_x/all both default to the target eu_x_all
    first, second = key("eu", "x_all"), key("eu_x", "all")
    result = apply_commands([], [register(1, first, spec()), register(2, second, spec())], check_ok)
    applied, refused = result.verdicts
    assert applied.outcome is Outcome.APPLIED
    assert refused.outcome is Outcome.REJECTED and refused.error_code == ErrorCode.TARGET_TAKEN
    assert f"db.eu_x_all, the target of job {first}" in refused.detail
    assert {r.key for r in result.upserts.values()} == {first}
    rows = list(result.upserts.values())
    # in a later batch, in another database through target options, in another case,
    # of another consumer type, or from another account: still the one target
    for offset, (k, s) in enumerate(
        [
            (second, spec()),
            (key("t", "j", database="other"), spec(target_database="DB", target_table="EU_X_ALL")),
            (key("t", "agg"), spec("aggregate_view", target_table="eu_X_all")),
            (JobKey(7, "db", "eu_x", "all"), spec()),
        ],
        start=3,
    ):
        (verdict,) = apply_commands(rows, [register(offset, k, s)], check_ok).verdicts
        assert verdict.outcome is Outcome.REJECTED, (k, verdict.detail)
        assert verdict.error_code in (ErrorCode.TARGET_TAKEN, ErrorCode.TARGET_NOT_ALLOWED)
    # an update onto the taken target is refused too; the job's own target is its own
    other = key("t", "solo")
    rows = (
        list(apply_commands(rows, [register(10, other, spec())], check_ok).upserts.values()) + rows
    )
    (verdict,) = apply_commands(
        rows, [update(11, other, {"target_table": "eu_x_all"})], check_ok
    ).verdicts
    assert verdict.error_code == ErrorCode.TARGET_TAKEN and str(first) in verdict.detail
    (verdict,) = apply_commands(
        rows, [update(12, first, {"primary_key": ["id", "v"]})], check_ok
    ).verdicts
    assert verdict.outcome is Outcome.APPLIED


def test_an_update_that_would_strand_the_readers_of_its_target_is_refused() -> None:
    rows = chain()
    for offset, change in enumerate(
        [
            update(20, B, {"target_table": "elsewhere"}),
            update(
                21,
                B,
                {"topic": "t", "bootstrap_servers": "127.0.0.1:9092", "primary_key": ["id"]},
                "kafka_changefeed",
            ),
        ]
    ):
        (verdict,) = apply_commands(rows, [change], check_ok).verdicts
        assert verdict.outcome is Outcome.REJECTED, offset
        assert verdict.error_code == ErrorCode.DOWNSTREAM_JOBS
        assert f"stop writing db.a_x_y, which 1 job(s) read: {C}" in verdict.detail
    # the last job of the chain has no readers: it may move its target
    (verdict,) = apply_commands(rows, [update(22, C, {"target_table": "moved"})], check_ok).verdicts
    assert verdict.outcome is Outcome.APPLIED


def test_a_job_of_a_catalog_with_an_old_collision_still_updates_keeping_its_target() -> None:
    # two writers of db.eu_x_all, from before one writer per target was the rule
    first, second = key("eu", "x_all"), key("eu_x", "all")
    rows = list(apply_commands([], [register(1, first, spec())], check_ok).upserts.values())
    rows += list(apply_commands([], [register(2, second, spec())], check_ok).upserts.values())
    (verdict,) = apply_commands(
        rows, [update(3, second, {"primary_key": ["id", "v"]})], check_ok
    ).verdicts
    assert verdict.outcome is Outcome.APPLIED, verdict.detail
    (verdict,) = apply_commands(
        rows, [update(4, second, {"target_table": "own"})], check_ok
    ).verdicts
    assert verdict.outcome is Outcome.APPLIED, verdict.detail  # and may move off it


def test_another_accounts_table_is_found_whatever_the_case_of_its_name() -> None:
    rows = list(apply_commands([], [register(1, A, spec())], check_ok).upserts.values())
    # account 7 would write DB.A, account 0's source
    intruder = JobKey(7, "other", "t", "w")
    (verdict,) = apply_commands(
        rows, [register(2, intruder, spec(target_database="DB", target_table="A"))], check_ok
    ).verdicts
    assert verdict.outcome is Outcome.REJECTED
    assert verdict.error_code == ErrorCode.TARGET_NOT_ALLOWED
    assert str(A) not in verdict.detail  # account 0's job is not named to account 7
