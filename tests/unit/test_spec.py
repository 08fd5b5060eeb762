"""Job key, trigger spec, iteration detail and the update_spec merge (no Spark)."""

from __future__ import annotations

import pytest

from lakeprop.consumers import UnknownConsumerError
from lakeprop.errors import InvalidIdentifierError, InvalidSpecError
from lakeprop.spec import JobKey, JobSpec, TriggerKind, TriggerSpec, merge_spec, parse_duration

REPLICA = {"type": "replica", "options": {"primary_key": ["id"]}}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (10, 10.0),
        ("10s", 10.0),
        ("500ms", 0.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        (" 2.5s ", 2.5),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value, "x") == seconds


@pytest.mark.parametrize("value", ["", "10x", "-1s", 0, True, None, "1e3s", float("nan")])
def test_bad_durations(value: object) -> None:
    with pytest.raises(InvalidSpecError, match="x must"):
        parse_duration(value, "x")


def test_job_key_validates_every_part() -> None:
    assert str(JobKey(1, "db", "t", "j")) == "1/db.t/j"
    assert JobKey(1, "db", "t", "j").message_key == b"1/db/t/j"
    with pytest.raises(InvalidIdentifierError, match=r"job\.table"):
        JobKey(1, "db", "t x", "j")
    with pytest.raises(InvalidSpecError, match="account_id"):
        JobKey(-1, "db", "t", "j")
    with pytest.raises(InvalidSpecError, match="account_id must be an integer"):
        JobKey(True, "db", "t", "j")  # type: ignore[arg-type]


def test_trigger_kinds() -> None:
    assert TriggerSpec.from_json({}) == TriggerSpec(TriggerKind.DEFAULT)
    assert TriggerSpec.from_json({"kind": "greedy"}).kind is TriggerKind.GREEDY
    periodic = TriggerSpec.from_json({"kind": "periodic", "interval": "10s", "share": "true"})
    assert periodic == TriggerSpec(TriggerKind.PERIODIC, 10.0, True)
    with pytest.raises(InvalidSpecError, match="interval is required"):
        TriggerSpec.from_json({"kind": "periodic"})
    with pytest.raises(InvalidSpecError, match="only to periodic"):
        TriggerSpec.from_json({"kind": "greedy", "interval": "1s"})
    with pytest.raises(InvalidSpecError, match="unknown field"):
        TriggerSpec.from_json({"kind": "default", "every": 3})
    with pytest.raises(InvalidSpecError, match="share must be true or false"):
        TriggerSpec.from_json({"kind": "periodic", "interval": 1, "share": "yes"})


def test_spec_round_trips_canonically() -> None:
    raw = {
        "trigger": {"kind": "periodic", "interval": "1m", "share": False},
        "iteration": {"priority": 3, "consumer": REPLICA},
    }
    spec = JobSpec.from_json(raw)
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.canonical() == JobSpec.from_json(spec.to_json()).canonical()
    assert spec.to_json()["trigger"] == {"kind": "periodic", "interval": 60.0, "share": False}


def test_iteration_detail_errors() -> None:
    with pytest.raises(InvalidSpecError, match="iteration is required"):
        JobSpec.from_json({"trigger": {}})
    with pytest.raises(InvalidSpecError, match="priority must be an integer"):
        JobSpec.from_json({"iteration": {"priority": "high", "consumer": REPLICA}})
    with pytest.raises(UnknownConsumerError, match=r"registered types: \[.*'replica'.*\]"):
        JobSpec.from_json({"iteration": {"consumer": {"type": "mystery"}}})


def test_replica_options() -> None:
    def spec(options: dict[str, object]) -> JobSpec:
        return JobSpec.from_json(
            {"iteration": {"consumer": {"type": "replica", "options": options}}}
        )

    assert spec({"primary_key": ["id"], "columns": ["id", "v"]}).iteration.consumer.options == {
        "primary_key": ["id"],
        "columns": ["id", "v"],
        "target_database": None,
        "target_table": None,
    }
    with pytest.raises(InvalidSpecError, match="must include the primary key"):
        spec({"primary_key": ["id"], "columns": ["v"]})
    with pytest.raises(InvalidSpecError, match="not a valid identifier"):
        spec({"primary_key": ["id; drop"]})
    with pytest.raises(InvalidSpecError, match="unknown option"):
        spec({"primary_key": ["id"], "where": "1=1"})
    with pytest.raises(InvalidSpecError, match="lists a column twice"):
        spec({"primary_key": ["id", "ID"]})


CURRENT = {
    "trigger": {"kind": "periodic", "interval": 30.0, "share": True},
    "iteration": {
        "priority": 5,
        "consumer": {
            "type": "replica",
            "options": {"primary_key": ["id"], "columns": ["id", "a"], "target_table": "t"},
        },
    },
}


def test_merge_fills_empty_fields_from_the_current_spec() -> None:
    merged = merge_spec(CURRENT, {"iteration": {"priority": 7}})
    assert merged == {**CURRENT, "iteration": {**CURRENT["iteration"], "priority": 7}}


def test_merge_null_means_keep() -> None:
    merged = merge_spec(CURRENT, {"trigger": {"interval": None}, "iteration": {"priority": None}})
    assert merged == CURRENT


def test_merge_same_trigger_kind_keeps_other_fields() -> None:
    merged = merge_spec(CURRENT, {"trigger": {"interval": "5m"}})
    assert merged["trigger"] == {"kind": "periodic", "interval": "5m", "share": True}


def test_merge_new_trigger_kind_replaces_the_trigger() -> None:
    merged = merge_spec(CURRENT, {"trigger": {"kind": "greedy"}})
    assert merged["trigger"] == {"kind": "greedy"}
    assert JobSpec.from_json(merged).trigger == TriggerSpec(TriggerKind.GREEDY)


def test_merge_consumer_options_key_by_key() -> None:
    merged = merge_spec(CURRENT, {"iteration": {"consumer": {"options": {"columns": ["id"]}}}})
    assert merged["iteration"]["consumer"] == {
        "type": "replica",
        "options": {"primary_key": ["id"], "columns": ["id"], "target_table": "t"},
    }


def test_merge_new_consumer_type_replaces_the_consumer() -> None:
    new = {"type": "other", "options": {"x": 1}}
    merged = merge_spec(CURRENT, {"iteration": {"consumer": new}})
    assert merged["iteration"] == {"priority": 5, "consumer": new}


def test_merge_empty_update_is_identity() -> None:
    assert merge_spec(CURRENT, {}) == CURRENT
