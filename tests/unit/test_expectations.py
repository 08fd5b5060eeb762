"""Expectations as a job's spec carries them, a chain's origins, and the events an
iteration makes (no Spark)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pyspark.sql.types import LongType, StructField, StructType, TimestampType

from lakeprop import expectations
from lakeprop.engine.expect import Tally
from lakeprop.engine.model import (
    IterationKind,
    IterationPlan,
    IterationResult,
    Member,
    MemberResult,
    TableRef,
)
from lakeprop.errors import InvalidConsumerOptionsError
from lakeprop.expectations import Expectation
from lakeprop.pipeline.freshness import Origin, Origins
from lakeprop.service.events import iteration_events
from lakeprop.spec import JobKey, JobSpec, merge_spec
from lakeprop.state.history import RuleCount
from lakeprop.state.status import JoinedMark


def replica(**options: Any) -> dict[str, Any]:
    return {
        "iteration": {
            "consumer": {"type": "replica", "options": {"primary_key": ["id"], **options}}
        }
    }


RULES = [
    {"name": "amount_known", "check": " amount IS NOT NULL ", "action": "drop"},
    {"name": "one_per_id", "unique": ["id"], "action": "fail"},
    {"name": "small", "check": "amount < 100"},
]


def test_rules_are_validated_and_stored_beside_the_consumer_options() -> None:
    spec = JobSpec.from_json(replica(expectations=RULES))
    options = spec.iteration.consumer.options
    assert options["primary_key"] == ["id"]
    assert options["expectations"] == [
        {"name": "amount_known", "check": "amount IS NOT NULL", "action": "drop"},
        {"name": "one_per_id", "unique": ["id"], "action": "fail"},
        {"name": "small", "check": "amount < 100", "action": "warn"},
    ]
    assert expectations.of(options) == (
        Expectation("amount_known", "drop", check="amount IS NOT NULL"),
        Expectation("one_per_id", "fail", unique=("id",)),
        Expectation("small", "warn", check="amount < 100"),
    )
    assert expectations.columns(expectations.of(options)) == ["id"]


def test_the_rows_a_job_keeps_are_those_every_drop_rule_lets_in() -> None:
    named = {"name": "named", "check": "name <> '' -- set", "action": "drop"}
    assert expectations.keeping(expectations.parse([*RULES, named])) == (
        "coalesce((amount IS NOT NULL\n), false) AND coalesce((name <> '' -- set\n), false)"
    )
    assert expectations.keeping(expectations.parse(RULES[1:])) is None  # no rule drops


def test_a_job_without_rules_keeps_its_options_and_its_write_identity() -> None:
    plain = JobSpec.from_json(replica()).iteration.consumer
    emptied = JobSpec.from_json(replica(expectations=[])).iteration.consumer
    assert plain == emptied
    assert "expectations" not in plain.options


def test_an_update_replaces_the_rules_and_an_empty_list_removes_them() -> None:
    current = JobSpec.from_json(replica(expectations=RULES)).to_json()
    update: dict[str, Any] = {"iteration": {"consumer": {"options": {"expectations": []}}}}
    merged = JobSpec.from_json(merge_spec(current, update))
    assert "expectations" not in merged.iteration.consumer.options


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("amount > 0", "must be a list of rules"),
        ([{"check": "x > 0"}], "name must be a string"),
        ([{"name": "1bad", "check": "x > 0"}], "is not a valid identifier"),
        ([{"name": "a", "check": "x > 0", "action": "stop"}], "action must be one of"),
        ([{"name": "a"}], "exactly one of check"),
        ([{"name": "a", "check": "x > 0", "unique": ["x"]}], "exactly one of check"),
        ([{"name": "a", "check": "  "}], "non-empty SQL text"),
        ([{"name": "a", "unique": ["x"], "action": "drop"}], "cannot drop"),
        ([{"name": "a", "unique": []}], "non-empty list of columns"),
        ([{"name": "a", "unique": ["x", "X"]}], "lists a column twice"),
        ([{"name": "a", "check": "x > 0", "when": "always"}], "unknown field"),
        ([{"name": "a", "check": "x > 0"}, {"name": "A", "check": "x < 9"}], "names A twice"),
    ],
)
def test_bad_rules_are_named(rules: object, message: str) -> None:
    with pytest.raises(InvalidConsumerOptionsError, match=message):
        JobSpec.from_json(replica(expectations=rules))


def test_origins_credit_each_version_of_a_table_with_the_commit_it_reflects() -> None:
    events, scd1 = ("db", "events"), ("db", "scd1")
    restored: list[tuple[str, str]] = []

    def restore(table: tuple[str, str]) -> list[tuple[int, Origin]]:
        restored.append(table)
        return [(3, Origin(events, 50.0))] if table == scd1 else []

    origins = Origins(restore)
    # after a restart: what the history recorded of the writes to the table
    assert origins.upstream(scd1, 3) == Origin(events, 50.0) and restored == [scd1]
    assert Origin(events, 50.0).name == "db.events"
    origins.wrote(scd1, 4, Origin(events, 60.0))
    origins.wrote(scd1, 5, Origin(events, 70.0))
    # a reader that read version 4 while 5 was written: what 4 reflects, not the latest
    assert origins.upstream(scd1, 4) == Origin(events, 60.0)
    assert origins.upstream(scd1, 5) == Origin(events, 70.0) and restored == [scd1]
    # a version between two writes (a commit of no job's, say): the write before it
    origins.wrote(scd1, 8, Origin(events, 80.0))
    assert origins.upstream(scd1, 7) == Origin(events, 70.0) and restored == [scd1]
    # newer than any write seen (another instance wrote it): the history is asked again
    assert origins.upstream(scd1, 9) == Origin(events, 80.0) and restored == [scd1, scd1]
    # a reader further behind than the versions kept: credited with none, not a wrong one
    for version in range(10, 10 + Origins.KEPT):
        origins.wrote(scd1, version, Origin(events, float(version)))
    assert origins.upstream(scd1, 5) is None
    assert origins.upstream(("db", "other"), 1) is None
    # after a restart the upstream wrote first, then a slower reader reads an older
    # version: what the history recorded of it
    again = Origins(restore)
    again.wrote(scd1, 6, Origin(events, 90.0))
    assert again.upstream(scd1, 4) == Origin(events, 50.0)


def test_an_iteration_tells_its_events() -> None:
    key = JobKey(3, "db", "orders", "clean")
    table = TableRef(3, "db", "orders")
    plan = IterationPlan(
        table=table,
        kind=IterationKind.TAIL,
        to_version=6,
        members=(Member((key, 7), 7, 4),),
        priority=0,
        planned_at=time.time(),
    )
    result = IterationResult(plan=plan, kind=IterationKind.TAIL, started_at=10.0, ended_at=11.5)
    result.rows_read = 12
    member = MemberResult((key, 7), 7, "replica", rows_written=10)
    member.expectations = [RuleCount("amount_known", "drop", 2), RuleCount("small", "warn", 0)]
    failed = MemberResult((JobKey(3, "db", "orders", "feed"), 8), 8, "replica")
    failed.error_code, failed.error_msg = 10702, "expectation one_per_id failed"
    result.members = [member, failed]

    events = iteration_events(result)
    assert [(e.kind, e.level, e.job_name) for e in events] == [
        ("iteration", "ERROR", None),
        ("expectation", "WARN", "clean"),
        ("expectation", "INFO", "clean"),
        ("job_error", "ERROR", "feed"),
    ]
    first = events[0]
    assert first.message.startswith("tail of db.orders versions 5..6: 2 job(s), 12 row(s) read")
    assert json.loads(first.details or "")["outcome"] == "partial"
    assert "joined" not in json.loads(first.details or "")  # no member reads a joined table
    member.joined = {"db.prices": JoinedMark(4, "t1")}
    assert json.loads(iteration_events(result)[0].details or "")["joined"] == {
        str(member.job_id): {"db.prices": 4}
    }
    assert json.loads(events[1].details or "") == {
        "expectation": "amount_known",
        "action": "drop",
        "failed": 2,
    }
    assert events[3].error_code == 10702 and events[3].iteration_id == plan.iteration_id


def test_a_members_rule_counts_are_summed_over_its_versions_of_the_change_set() -> None:
    """The change set's read counts each member's rules per commit version; a member
    takes the versions after its start: counts added, the least low and the greatest
    high of the keys written (a version that wrote none has no bound)."""
    rules = (
        Expectation("priced", "drop", check="amount >= 0"),
        Expectation("named", "warn", check="name IS NOT NULL"),
        Expectation("one_per_id", "fail", unique=("id",)),
    )
    tally = Tally(rules, prefix="_tally3_")

    def version(broke: int, unnamed: int, kept: int, rows: int, low: Any, high: Any) -> Any:
        values = (broke, unnamed, kept, rows, low, high)
        names = ("0", "1", "kept", "all", "low0", "high0")
        return {f"_tally3_{n}": v for n, v in zip(names, values, strict=True)}

    per_version = {
        4: version(1, 0, 2, 3, 5, 9),
        5: version(0, 2, 4, 4, None, None),  # only deletes: no key written
        6: version(2, 1, 0, 2, 3, 7),
        7: version(0, 0, 1, 1, 11, 11),
    }
    assert tally.over(per_version, 4) == {
        "0": 2,
        "1": 3,
        "kept": 5,
        "all": 7,
        "low0": 3,
        "high0": 11,
    }
    assert tally.over(per_version, 3)["all"] == 10
    assert tally.over(per_version, 7) == {
        "0": None,
        "1": None,
        "kept": None,
        "all": None,
        "low0": None,
        "high0": None,
    }
    # keys Python orders as Spark does merge; others are counted over the slice
    schema = StructType([StructField("ID", LongType()), StructField("at", TimestampType())])
    assert tally.mergeable(schema)
    assert not Tally((Expectation("once", "warn", unique=("at",)),)).mergeable(schema)
    assert Tally(rules[:2]).mergeable(StructType([]))  # no unique rule: nothing to merge
